"""The PyTorch custom op without a GPU: registered under torch.library with a fake implementation
(shapes only), captured by torch.compile as one graph node with no graph break, exported, and a
call whose operator is gone is one line.

Mutations this kills: a fake implementation with the wrong output shape (the traced shapes and
the exported graph's metadata would differ), an op that Dynamo cannot trace (fullgraph fails), an
op registered as mutating its input, a missing autograd registration."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.operator import torch_op  # noqa: E402  (registers torch.ops.sparserl.matmul)

M, N, K = 7, 5, 3


def test_registered_with_a_schema_that_mutates_nothing() -> None:
    schema = torch.ops.sparserl.matmul.default._schema
    assert str(schema) == "sparserl::matmul(Tensor x, SymInt handle, SymInt m) -> Tensor"
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


@pytest.mark.parametrize("shape", [(N,), (N, K)])
def test_the_fake_implementation_gives_the_output_shape(shape) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(shape, device="cuda")  # a fake CUDA tensor: no GPU needed
        y = torch.ops.sparserl.matmul(x, 1, M)
        assert y.shape == (M, *shape[1:]) and y.device.type == "cuda" and y.dtype == torch.float32
    y = torch.ops.sparserl.matmul(torch.empty(shape, device="meta"), 1, M)
    assert y.shape == (M, *shape[1:])


def test_torch_compile_captures_it_as_one_node_without_graph_breaks() -> None:
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, w):
        return torch.relu(torch.ops.sparserl.matmul(x @ w, 42, M))

    compiled = torch.compile(layer, backend=record, fullgraph=True)
    with pytest.raises(SparseRLError, match="no live sparse operator number 42"):
        compiled(torch.ones(N, K), torch.ones(K, K))  # traced in full; running it needs the operator
    assert len(graphs) == 1  # fullgraph=True: a graph break would have raised instead
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.sparserl.matmul.default in targets or torch.ops.sparserl.matmul in targets


def test_export_records_the_shape() -> None:
    class Aggregate(torch.nn.Module):
        def forward(self, x):
            return torch.ops.sparserl.matmul(x, 42, M) * 2.0

    ep = torch.export.export(Aggregate(), (torch.ones(N, K),))
    node = next(n for n in ep.graph.nodes if n.op == "call_function" and "sparserl" in str(n.target))
    assert tuple(node.meta["val"].shape) == (M, K)


def test_autograd_is_registered() -> None:
    x = torch.ones(N, K, requires_grad=True)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = torch.ops.sparserl.matmul(torch.empty(N, K, requires_grad=True), 3, M)
        assert y.requires_grad and y.grad_fn is not None  # a backward formula is attached
    assert x.grad is None


def test_an_operator_that_is_gone_is_one_line() -> None:
    with pytest.raises(SparseRLError) as e:
        torch.ops.sparserl.matmul(torch.ones(N), 10**9, M)
    assert "no live sparse operator" in str(e.value) and "\n" not in str(e.value)
    assert torch_op.apply is not None


def test_only_a_plain_tensor_in_eager_code_with_nothing_to_record_skips_the_custom_op() -> None:
    """Kills a bypass (straight to the kernel, no dispatcher) taken where something must see the op:
    autograd recording, a forward-mode AD level, a dispatch mode (fake tensors, make_fx, FLOP
    counting), a function mode, a tensor subclass; and one never taken."""
    from torch.autograd import forward_ad
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    needs = torch_op.needs_custom_op
    x = torch.ones(4)
    w = torch.ones(4, requires_grad=True)
    assert not needs(x)
    assert needs(w)
    with torch.no_grad():
        assert not needs(w)
    with torch.inference_mode():
        assert not needs(torch.ones(4))
    with forward_ad.dual_level():
        assert needs(x)

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class SeenFn(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        assert needs(x)
    with SeenFn():
        assert needs(x)
    assert needs(torch.nn.Parameter(torch.ones(4), requires_grad=False))  # a subclass
    assert not needs(x)  # and nothing left active
