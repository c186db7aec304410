"""Using a generated kernel: ``sparserl.load_kernel(folder)`` -> a callable ``y = A x``.

    kern = sparserl.load_kernel("runs/generate/bcsstk13")
    kern.plan(A)          # scipy CSR, once: converts to the kernel's format and uploads it
    y = kern(x)           # CuPy array or torch CUDA tensor (float32), as many times as needed

``plan`` converts on the host (the conversion cost is in the report) and keeps the device
buffers; ``__call__`` allocates y and runs the harness's own launch path
(:class:`~sparserl.harness.launcher.BoundKernel`: the contract's output policy, then the LAUNCH
lines). The kernel is compiled for the GPU at hand (NVRTC or nvcc, cached).
"""

from __future__ import annotations

import json
from pathlib import Path


from sparserl.errors import SparseRLError
from sparserl.harness.extract import Extracted, extract
from sparserl.kernels.contract import Op


class SparseKernel:
    """A verified kernel from ``sparserl generate``, ready to run on new vectors."""

    def __init__(self, folder: str | Path):
        from sparserl.harness.compile import CompileOptions, compile_source
        from sparserl.harness.device import device_arch, num_sms

        folder = Path(folder)
        for f in ("kernel.cu", "launch.json"):
            if not (folder / f).exists():
                raise SparseRLError(f"{folder} is not a generate output folder (no {f})")
        self.info = json.loads((folder / "launch.json").read_text())
        self.op = Op(self.info["op"])
        self.k = self.info.get("k")
        ex = extract((folder / "kernel.cu").read_text(), self.op)
        if not isinstance(ex, Extracted):
            raise SparseRLError(f"{folder}/kernel.cu: {ex.message}")
        self.header = ex.header
        built = compile_source(ex.code, CompileOptions(arch=device_arch()))
        if not built.ok:
            raise SparseRLError(f"{folder}/kernel.cu does not compile here: {built.log[-300:]}")
        self.cubin_path = built.cubin_path
        self.sms = num_sms()
        self.bound = None

    def plan(self, A) -> "SparseKernel":
        """Convert ``A`` (scipy sparse) to the kernel's format and upload it (once per matrix)."""
        from sparserl.harness.launcher import BoundKernel, MatrixOnDevice
        from sparserl.matrices import canonicalize

        bound = BoundKernel.bind(self.header, self.op, self.cubin_path, MatrixOnDevice(canonicalize(A)), self.k,
                                 self.sms)
        if isinstance(bound, str):
            raise SparseRLError(f"this kernel cannot run on that matrix: {bound}")
        self.bound = bound
        return self

    @property
    def shape(self) -> tuple[int, int]:
        """(m, n) of the planned matrix."""
        if self.bound is None:
            raise SparseRLError("call plan(A) first")
        return self.bound.dev.data.shape

    def __call__(self, x):
        """``y = A x`` (SpMV, x of n) or ``Y = A X`` (SpMM, X of n x k, row-major)."""
        import cupy as cp

        if self.bound is None:
            raise SparseRLError("call plan(A) first")
        is_torch = type(x).__module__.startswith("torch")
        xc = cp.asarray(x)  # zero-copy for torch CUDA tensors (__cuda_array_interface__)
        if xc.dtype != cp.float32:
            raise SparseRLError(f"x must be float32, got {xc.dtype}")
        m, n = self.shape
        want = (n,) if self.op is Op.SPMV else (n, self.k)
        if tuple(xc.shape) != want:
            raise SparseRLError(f"x has shape {tuple(xc.shape)}, the planned matrix needs {want}")
        xc = cp.ascontiguousarray(xc)
        y = cp.empty((m,) if self.op is Op.SPMV else (m, self.k), dtype=cp.float32)
        self.bound.run(xc, y)
        if is_torch:
            import torch

            return torch.as_tensor(y, device=f"cuda:{y.device.id}")
        return y


def load_kernel(folder: str | Path) -> SparseKernel:
    """Load a kernel written by ``sparserl generate`` (needs a GPU and CuPy)."""
    return SparseKernel(folder)


__all__ = ["SparseKernel", "load_kernel"]
