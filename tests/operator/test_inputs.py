"""The checks every operator input passes before the GPU is touched, on NumPy arrays, CPU tensors
and the metadata of device arrays: each bad input is one line that says what to pass instead.

Mutations this kills: a check dropped or its condition inverted (the bad case would pass), a
float64 or integer input converted silently, a transposed (strided) view accepted, a view whose
first element is off a 16-byte boundary accepted (the float4 kernels would fault), values of
another length accepted, an output overlapping its input accepted, a structure check that
compares anything but the fingerprint."""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.errors import SparseRLError
from sparserl.matrices import generate
from sparserl.matrices.card import structure_fingerprint
from sparserl.operator.inputs import (
    ArrayInfo,
    check_operand,
    check_structure,
    check_values,
    describe,
    overlaps,
)

N = 10


def gpu_array(shape=(N,), dtype="float32", contiguous=True, device=0, ptr=4096) -> ArrayInfo:
    """What describe() reads from a CuPy array or a CUDA tensor."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return ArrayInfo("cupy", tuple(shape), dtype, contiguous, device, size, ptr)


def one_line(exc) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


def test_a_good_operand_passes() -> None:
    check_operand(gpu_array(), "x", (N,), 0)
    check_operand(gpu_array((N, 4)), "X", (N, 4), 0)


@pytest.mark.parametrize("info,match", [
    (gpu_array(dtype="float64"), "float64.*astype"),
    (gpu_array(dtype="int64"), "int64"),
    (gpu_array(dtype="float16"), "float16"),
    (gpu_array((N + 1,)), r"shape \(11,\).*needs \(10,\)"),
    (gpu_array((N, 1)), r"shape \(10, 1\)"),
    (gpu_array(contiguous=False), "not contiguous.*ascontiguousarray"),
    (gpu_array(device=1), "cuda:1, the operator on cuda:0"),
    (gpu_array(ptr=4096 + 4), r"4 bytes past a 16-byte boundary.*x\.copy\(\)"),
    (ArrayInfo("torch", (N,), "float32", True, 0, 4 * N, 4096 + 8), r"8 bytes past.*x\.clone\(\)"),
])
def test_bad_operands_are_one_line_errors(info, match) -> None:
    with pytest.raises(SparseRLError, match=match) as e:
        check_operand(info, "x", (N,), 0)
    one_line(e)


def test_numpy_inputs_are_host_memory() -> None:
    info = describe(np.zeros(N, np.float32))
    assert info.kind == "numpy" and info.device is None
    with pytest.raises(SparseRLError, match="NumPy array in host memory") as e:
        check_operand(info, "x", (N,), 0)
    one_line(e)


def test_other_objects_are_refused() -> None:
    with pytest.raises(SparseRLError, match="is a list"):
        describe([1.0] * N)


def test_torch_cpu_tensors_and_their_dtype_and_layout() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(N, 4, dtype=torch.float64)
    info = describe(t, "X")
    assert info == ArrayInfo("torch", (N, 4), "float64", True, None, N * 4 * 8, 0)
    with pytest.raises(SparseRLError, match=r"CPU tensor.*X\.to\('cuda:0'\)") as e:
        check_operand(info, "X", (N, 4), 0)
    one_line(e)
    assert not describe(torch.zeros(4, N).t()).contiguous  # a transposed view is strided
    assert describe(torch.zeros(N, dtype=torch.int32)).dtype == "int32"
    # the dtype message names torch's own fix
    with pytest.raises(SparseRLError, match=r"X\.float\(\)"):
        check_operand(ArrayInfo("torch", (N, 4), "float64", True, 0), "X", (N, 4), 0)
    with pytest.raises(SparseRLError, match=r"X\.contiguous\(\)"):
        check_operand(ArrayInfo("torch", (N, 4), "float32", False, 0), "X", (N, 4), 0)


def test_new_values() -> None:
    check_values(gpu_array((N,)), N, 0)
    check_values(describe(np.zeros(N, np.float32)), N, 0)  # host values are uploaded once
    for info, match in [(gpu_array((N - 1,)), "10 nonzeros"), (gpu_array((N,), "float64"), "float64"),
                        (describe(np.zeros(N, np.int32)), "int32"), (gpu_array((N,), contiguous=False), "contiguous"),
                        (gpu_array((N, 1)), "shape"), (gpu_array(device=2), "cuda:2")]:
        with pytest.raises(SparseRLError, match=match) as e:
            check_values(info, N, 0)
        one_line(e)


def test_an_output_overlapping_its_input() -> None:
    x = gpu_array((N,), ptr=4096)
    assert overlaps(x, gpu_array((N,), ptr=4096 + 4 * (N - 1)))
    assert not overlaps(x, gpu_array((N,), ptr=4096 + 4 * N))
    assert not overlaps(x, gpu_array((N,), ptr=4096, device=1))


def test_structure_mismatch_is_detected_by_fingerprint() -> None:
    A = generate("powerlaw", 400, seed=0)
    tuned = structure_fingerprint(A)
    check_structure(tuned, structure_fingerprint(A * 2.0))  # new values: the same structure
    B = A.tolil()
    B[0, np.setdiff1d(np.arange(A.shape[1]), A.indices[A.indptr[0]:A.indptr[1]])[0]] = 1.0  # one more nonzero
    assert B.nnz == A.nnz + 1
    with pytest.raises(SparseRLError, match="structure differs.*sparserl.tune") as e:
        check_structure(tuned, structure_fingerprint(B.tocsr()))
    one_line(e)
