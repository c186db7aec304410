"""What an operator accepts: the checks every input passes before anything touches the GPU.

:func:`describe` reads an array's kind, shape, dtype, layout and device without copying it (CuPy
arrays, PyTorch tensors, NumPy arrays); the ``check_*`` functions raise a one-line
:class:`~sparserl.errors.SparseRLError` that says what is wrong and what to pass instead. Nothing
here imports CuPy or torch: the checks run (and are tested) on a machine without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparserl.errors import SparseRLError

FLOAT32 = "float32"


@dataclass(frozen=True)
class ArrayInfo:
    """What the checks need to know about an array (read from its metadata, never its data)."""

    kind: str
    """'cupy', 'torch' or 'numpy'."""
    shape: tuple[int, ...]
    dtype: str
    """NumPy's name of the element type ('float32', 'float64', 'int64', ...)."""
    contiguous: bool
    """C-contiguous (row-major, no gaps)."""
    device: int | None
    """CUDA device index, or None for host memory."""
    nbytes: int = 0
    ptr: int = 0
    """Address of the first element (0 for host memory)."""


def _torch_address(t) -> int:
    """A CUDA tensor's address; 0 while ``torch.compile`` traces (a fake tensor has none: the custom op
    checks the real tensor's address when it runs)."""
    import torch

    return 0 if torch.compiler.is_compiling() else int(t.data_ptr())


def describe(a, what: str = "x") -> ArrayInfo:
    """The metadata of ``a``, or a one-line error for something that is not an array we take."""
    module = type(a).__module__
    if module.startswith("cupy"):
        return ArrayInfo("cupy", tuple(a.shape), str(a.dtype), bool(a.flags.c_contiguous), int(a.device.id),
                         int(a.nbytes), int(a.data.ptr))
    if module.startswith("torch"):
        dtype = str(a.dtype).removeprefix("torch.")
        cuda = a.device.type == "cuda"
        return ArrayInfo("torch", tuple(a.shape), dtype, bool(a.is_contiguous()),
                         (a.device.index or 0) if cuda else None, a.numel() * a.element_size(),
                         _torch_address(a) if cuda else 0)
    if isinstance(a, np.ndarray):
        return ArrayInfo("numpy", a.shape, str(a.dtype), bool(a.flags.c_contiguous), None, int(a.nbytes))
    raise SparseRLError(f"{what} is a {type(a).__name__}; pass a CuPy array or a PyTorch CUDA tensor (float32)")


def check_dtype(info: ArrayInfo, what: str) -> None:
    if info.dtype != FLOAT32:
        fix = f"{what}.float()" if info.kind == "torch" else f"{what}.astype(numpy.float32)"
        raise SparseRLError(f"{what} is {info.dtype}; the kernel computes in float32: pass {fix} "
                            "(nothing is converted silently)")


def check_on_device(info: ArrayInfo, what: str, device: int) -> None:
    """A CUDA array on the operator's device."""
    if info.kind == "numpy":
        raise SparseRLError(f"{what} is a NumPy array in host memory; pass it on the GPU: cupy.asarray({what})")
    if info.device is None:
        raise SparseRLError(f"{what} is a CPU tensor; the operator runs on cuda:{device}: pass "
                            f"{what}.to('cuda:{device}')")
    if info.device != device:
        raise SparseRLError(f"{what} is on cuda:{info.device}, the operator on cuda:{device}")


def check_contiguous(info: ArrayInfo, what: str) -> None:
    if not info.contiguous:
        fix = f"{what}.contiguous()" if info.kind == "torch" else f"cupy.ascontiguousarray({what})"
        raise SparseRLError(f"{what} is not contiguous (a strided view); the kernel reads rows in place: "
                            f"pass {fix}")


ALIGN = 16
"""Bytes an operand's first element is aligned to: kernels read and write 16 bytes at a time (float4),
and a misaligned address would be a CUDA fault that ends the process's GPU context."""


def check_operand(info: ArrayInfo, what: str, shape: tuple[int, ...], device: int) -> None:
    """An input or output of ``A @ x``: float32, on the operator's GPU, of ``shape``, contiguous, its
    first element on a 16-byte boundary."""
    check_on_device(info, what, device)
    check_dtype(info, what)
    if info.shape != shape:
        raise SparseRLError(f"{what} has shape {info.shape}; this operator needs {shape}")
    check_contiguous(info, what)
    if info.ptr % ALIGN:
        copy = f"{what}.clone()" if info.kind == "torch" else f"{what}.copy()"
        raise SparseRLError(f"{what} starts {info.ptr % ALIGN} bytes past a {ALIGN}-byte boundary (a view at an "
                            f"offset); the kernels access {ALIGN} bytes at a time: pass {copy}")


def check_values(info: ArrayInfo, nnz: int, device: int) -> None:
    """New values for ``update_values``: float32, ``nnz`` of them, contiguous; on the operator's GPU,
    or a NumPy array (uploaded once)."""
    if info.kind != "numpy":
        check_on_device(info, "values", device)
    check_dtype(info, "values")
    if info.shape != (nnz,):
        raise SparseRLError(f"values has shape {info.shape}; the tuned matrix has {nnz} nonzeros: pass one value "
                            "per nonzero, in its CSR order (rows in order, columns sorted)")
    check_contiguous(info, "values")


def overlaps(a: ArrayInfo, b: ArrayInfo) -> bool:
    """Whether two device arrays share memory (an output that is also an input)."""
    return a.device == b.device and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def check_structure(tuned: str, given: str) -> None:
    """A matrix handed to an operator has the tuned structure (compared by fingerprint)."""
    if given != tuned:
        raise SparseRLError(f"the matrix's structure differs from the tuned one (fingerprint {given[:12]} vs "
                            f"{tuned[:12]}): the kernel is specialised to its structure; tune the new one with "
                            "sparserl.tune")
