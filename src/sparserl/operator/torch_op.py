"""The operator as a PyTorch custom op: ``torch.ops.sparserl.matmul(x, handle, m)``.

Registered through :func:`torch.library.custom_op` with a fake implementation (output shape only),
so ``torch.compile`` captures it as one node without a graph break, and with an autograd formula
(:func:`torch.library.register_autograd`): the gradient with respect to ``x`` is ``A^T grad``,
computed by the operator's transpose, itself a tuned operator (tuned on the first backward unless
``tune(..., backward=True)`` tuned it already; a symmetric structure finds it in the store). The
values of A are constants to autograd: no gradient flows to them.

Inside ``torch.compile`` call ``op.matmat(X)`` / ``op.matvec(x)`` (Dynamo does not trace a
user-defined ``__matmul__``); ``op @ X`` works in eager mode.

Importing this module registers the op (it is imported the first time an operator sees a tensor).
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import _get_current_dispatch_mode

from sparserl.operator import registry

FLOAT32 = torch.float32
is_compiling = torch.compiler.is_compiling


@torch.library.custom_op("sparserl::matmul", mutates_args=())
def matmul(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    """``A x`` for the operator registered as ``handle`` (A is m x n; x is (n,) or (n, k), float32,
    contiguous, on the operator's GPU); a new tensor of shape (m,) or (m, k)."""
    return registry.lookup(handle).torch_forward(x)


@matmul.register_fake
def _matmul_fake(x: torch.Tensor, handle: int, m: int) -> torch.Tensor:
    return x.new_empty((m, *x.shape[1:]))


def _setup_context(ctx, inputs, output) -> None:
    x, handle, _ = inputs
    ctx.handle = handle
    ctx.n = x.shape[0]
    op = registry.find(handle)  # none for a handle no live operator has (a graph traced with a made-up one);
    # under torch.compile the backward is traced at once, so the check runs then, not at each training step
    ctx.values_version = op.values_version if op is not None else None


def _backward(ctx, grad: torch.Tensor):
    op = registry.lookup(ctx.handle)
    if ctx.values_version is not None and op.values_version != ctx.values_version:  # as for a tensor changed in place
        raise RuntimeError("the operator's values were updated (update_values) after this product was computed: "
                           "its gradient would use the new values; run backward before updating them, or keep "
                           "one operator per set of values")
    transpose = op.transpose()
    grad = grad.contiguous()
    if grad.data_ptr() % 16:  # a view at an offset (a slice of a concatenation): kernels need 16-byte alignment
        grad = grad.clone()
    return torch.ops.sparserl.matmul(grad, transpose.handle, ctx.n), None, None


matmul.register_autograd(_backward, setup_context=_setup_context)


def needs_custom_op(x: torch.Tensor) -> bool:
    """Whether a product must go through the custom op rather than straight to the kernel: when
    autograd records it (``x`` requires grad under grad mode), when ``torch.compile`` or
    ``torch.export`` traces it, when a forward-mode AD level is open, when a Python dispatch or
    function mode is active (``make_fx``, fake tensors, ``FlopCounterMode``: they must see the op),
    and for any tensor subclass. A plain tensor in eager no-grad or inference code skips the
    dispatcher (about 30 us a call)."""
    return (type(x) is not torch.Tensor or (x.requires_grad and torch.is_grad_enabled())
            or is_compiling() or getattr(forward_ad, "_current_level", -1) >= 0
            or _get_current_dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled())


def apply(operator, x: torch.Tensor) -> torch.Tensor:
    """``A x`` through the custom op (differentiable in ``x``, capturable by ``torch.compile``)."""
    return torch.ops.sparserl.matmul(x, operator.handle, operator.shape[0])


_STREAMS: dict[int, object] = {}


def current_stream_pointer(index: int) -> int:
    """PyTorch's current stream on GPU ``index``, as the raw ``cudaStream_t`` (0: the legacy default)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the pointer without a Stream object
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def current_stream(cp, device: torch.device):
    """PyTorch's current stream on ``device`` as a CuPy stream (kernels run where torch's work runs)."""
    return stream_on(cp, device.index if device.index is not None else torch.cuda.current_device())


def stream_on(cp, index: int):
    """PyTorch's current stream on GPU ``index`` as a CuPy stream, made once per stream."""
    ptr = current_stream_pointer(index)
    if ptr == 0:
        return cp.cuda.Stream.null
    stream = _STREAMS.get(ptr)
    if stream is None:
        stream = _STREAMS[ptr] = cp.cuda.ExternalStream(ptr, index)
    return stream
