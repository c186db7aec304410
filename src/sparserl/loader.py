"""Using a generated kernel: ``sparserl.load_kernel(folder)`` -> a callable ``y = A x``.

    kern = sparserl.load_kernel("runs/generate/bcsstk13")
    kern.plan(A)          # scipy CSR, once: converts to the kernel's format and uploads it
    y = kern(x)           # CuPy array or torch CUDA tensor (float32), as many times as needed

``plan`` converts on the host (the conversion cost is in the report) and keeps the device
buffers; ``__call__`` allocates y and runs the harness's own launch path
(:class:`~sparserl.harness.launcher.BoundKernel`: the contract's output policy, then the LAUNCH
lines). The kernel is compiled for the GPU at hand (NVRTC or nvcc, cached).

A kernel is verified on one matrix structure (new values on it are fine: kernels read ``val``), and
a kernel specialised to it (DIA offsets, row bins, long-row lists written into its text) computes
wrong sums on another, without an error. So ``plan`` refuses a matrix of another structure than the
one launch.json names (``other_structure=True`` runs it anyway, unverified), and loading refuses a
kernel.cu that is not the text launch.json was written for (``edited=True`` loads it, unverified).
Loading warns when the folder's kernel was never run on a GPU (compile-only) or was verified on
another GPU architecture.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.harness.extract import Extracted, extract
from sparserl.kernels.contract import Op

log = logging.getLogger(__name__)

X_ALIGN = 256
"""Bytes an x (or X) is aligned to when the kernel runs: the harness verifies and times kernels on an x at a pool
allocation's start plus 1024 bytes, so a kernel may load it as float4; a view off that alignment is copied."""


class SparseKernel:
    """A verified kernel from ``sparserl generate``, ready to run on new vectors."""

    def __init__(self, folder: str | Path, edited: bool = False):
        from sparserl.harness.compile import CompileOptions, compile_source
        from sparserl.harness.device import device_arch, num_sms

        folder = Path(folder)
        for f in ("kernel.cu", "launch.json"):
            if not (folder / f).exists():
                raise SparseRLError(f"{folder} is not a generate output folder (no {f})")
        self.info = json.loads((folder / "launch.json").read_text())
        self.op = Op(self.info["op"])
        self.k = self.info.get("k")
        text = (folder / "kernel.cu").read_text()
        ex = extract(text, self.op)
        if not isinstance(ex, Extracted):
            raise SparseRLError(f"{folder}/kernel.cu: {ex.message}")
        self.header = ex.header
        check_text(folder, self.info, text, edited)
        arch = device_arch()
        for warning in _provenance_warnings(folder, arch):
            log.warning("%s", warning)
        built = compile_source(ex.code, CompileOptions(arch=arch))
        if not built.ok:
            raise SparseRLError(f"{folder}/kernel.cu does not compile here: {built.log[-300:]}")
        self.cubin_path = built.cubin_path
        self.sms = num_sms()
        self.bound = None

    def plan(self, A, other_structure: bool = False) -> "SparseKernel":
        """Convert ``A`` (scipy sparse) to the kernel's format and upload it (once per matrix). ``A`` must have
        the structure the kernel was verified on (its values may differ); ``other_structure=True`` runs it on
        another, unverified (a kernel specialised to its matrix then computes wrong sums, without an error)."""
        from sparserl.harness.launcher import BoundKernel, MatrixOnDevice
        from sparserl.matrices import canonicalize

        A = canonicalize(A)
        check_structure(self.info, A, other_structure)
        bound = BoundKernel.bind(self.header, self.op, self.cubin_path, MatrixOnDevice(A), self.k, self.sms)
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
        if xc.data.ptr % X_ALIGN:  # the harness verified it on an x at least this aligned (vector loads of x)
            xc = xc.copy()
        y = cp.empty((m,) if self.op is Op.SPMV else (m, self.k), dtype=cp.float32)
        self.bound.run(xc, y)
        if is_torch:
            import torch

            return torch.as_tensor(y, device=f"cuda:{y.device.id}")
        return y


def check_structure(info: dict, A, other_structure: bool = False) -> None:
    """Refuse ``A`` when its structure is not the one launch.json ``info`` names (unless ``other_structure``);
    a folder written before launch.json named it is not checked (a warning)."""
    from sparserl.matrices.card import structure_fingerprint

    want = info.get("fingerprint")
    if want is None:
        log.warning("this kernel's launch.json does not name the matrix it was verified on (written by an earlier "
                    "SparseRL): the matrix planned is not checked")
        return
    got = structure_fingerprint(A)
    if got != want and not other_structure:
        shape = " x ".join(map(str, info.get("shape", ()))) or "?"
        raise SparseRLError(f"this kernel was verified on another matrix structure ({shape}, {info.get('nnz', '?')} "
                            f"nonzeros, fingerprint {want[:12]}; this one is {A.shape[0]} x {A.shape[1]}, {A.nnz} "
                            f"nonzeros, {got[:12]}): a kernel specialised to its matrix computes wrong sums on another "
                            "without an error. Run sparserl generate on this matrix, or plan(A, other_structure=True) "
                            "to run it unverified")
    if got != want:
        log.warning("running a kernel verified on another matrix structure (%s) unverified", want[:12])


def check_text(folder: Path, info: dict, text: str, edited: bool = False) -> None:
    """Refuse a kernel.cu that is not the text launch.json was written for (an edit, or a write of two runs
    interrupted between its files: launch.json's matrix and launches would not be this kernel's), unless
    ``edited``: then a warning, and the kernel is unverified."""
    from sparserl.search.store import kernel_sha

    sha = info.get("kernel_sha256")
    if sha is None or kernel_sha(text) == sha:
        return
    what = (f"{folder}/kernel.cu is not the kernel its launch.json was written for (edited since, or a write "
            "interrupted between the folder's files)")
    if not edited:
        raise SparseRLError(f"{what}: run sparserl generate again, or check the kernel with sparserl check-kernel "
                            "and load it with load_kernel(folder, edited=True)")
    log.warning("%s: loaded as asked, unverified", what)


def _provenance_warnings(folder: Path, arch: str) -> list[str]:
    """What a user should know before trusting a folder's kernel, from its report.json (nothing for what it does
    not record): never run on a GPU, verified on another GPU architecture than ``arch``."""
    out = []
    try:
        report = json.loads((folder / "report.json").read_text())
    except (OSError, ValueError):
        return out
    if report.get("verified") is False:
        out.append(f"{folder}/kernel.cu was never run on a GPU (written compile-only): check it with sparserl "
                   "check-kernel before using it")
    verified_on = (report.get("best") or {}).get("arch")
    if report.get("verified") and verified_on and verified_on != arch:
        out.append(f"{folder}/kernel.cu was verified and timed on {verified_on}, and this GPU is {arch}: its "
                   "verdict and speedup are not this GPU's (check it with sparserl check-kernel)")
    return out


def load_kernel(folder: str | Path, edited: bool = False) -> SparseKernel:
    """Load a kernel written by ``sparserl generate`` (needs a GPU and CuPy). A kernel.cu changed since it was
    written is refused unless ``edited`` (then it is unverified)."""
    return SparseKernel(folder, edited)


__all__ = ["SparseKernel", "load_kernel"]
