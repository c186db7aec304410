"""Whether a matrix fits on the GPU before a search spends time on it.

A GPU worker keeps, per matrix (see ``sparserl.harness.worker``): cuSPARSE's CSR copy, each
converted format with a pristine copy to restore it after every launch, the verification
inputs with their fp64 references, and x and y. :func:`device_footprint_bytes` adds up the part
of that any evaluation needs (cuSPARSE's CSR; one conversion at least as large as CSR's values and
indices for the matrix and for its fresh-valued twin, each with a pristine copy; both fp64
references; the vectors); it is a lower bound, so a refusal is certain and a
matrix that passes may still run out of memory in a format that pads heavily (the worker then
reports the failure for that candidate). The GPU's memory comes from ``nvidia-smi`` (no CUDA
context is created in this process); without it the check is skipped. It refuses against the whole
memory, not what is free at the moment: the harness's own workers hold caches they give back when a
matrix needs room (:mod:`sparserl.harness.memory`), so free memory alone refused matrices that fit.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from sparserl.errors import SparseRLError
from sparserl.harness.memory import GiB
from sparserl.harness.verify import VerifyConfig

log = logging.getLogger(__name__)


def device_footprint_bytes(rows: int, cols: int, nnz: int, k: int | None = None,
                           verify: VerifyConfig | None = None) -> int:
    """A lower bound on the GPU memory one matrix takes while kernels are evaluated on it."""
    verify = verify or VerifyConfig()
    kk = k or 1
    csr = 4 * (rows + 1) + 8 * nnz  # row pointers; column indices and fp32 values
    # cuSPARSE's CSR; one conversion (>= CSR's values and indices) of the matrix and of its fresh-valued
    # twin, each with its pristine copy; the fp64 references of both (row pointers, indices, fp64 values)
    matrices = 5 * csr + 2 * (4 * (rows + 1) + 12 * nnz)
    inputs = verify.random_inputs + (3 if verify.adversarial else 0) + 1  # and the non-negative one
    vectors = 4 * kk * (cols + rows) * 2  # x and y, and the poisoned output copy
    verification = inputs * kk * (4 * cols + 8 * rows)  # each input and its fp64 reference
    return matrices + vectors + verification


def _visible_filter(rows: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """nvidia-smi lists every GPU; keep those CUDA_VISIBLE_DEVICES shows this process (by index or UUID)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return rows if env is None else []
    wanted = [w.strip() for w in env.split(",") if w.strip()]
    out = []
    for w in wanted:
        match = [r for r in rows if r[0] == w or r[1] == w or (w.startswith("GPU-") and r[1].startswith(w))]
        if not match:  # MIG or another spelling: do not guess
            return rows
        out += match
    return out


def gpu_memory() -> list[tuple[int, int]] | None:
    """(free, total) memory of each GPU this process can see, in bytes (None when nvidia-smi cannot tell)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=index,uuid,memory.free,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("nvidia-smi failed: %s", exc)
        return None
    if proc.returncode != 0:
        return None
    rows = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            rows.append((parts[0], parts[1], int(parts[2]) << 20, int(parts[3]) << 20))
    return [(r[2], r[3]) for r in _visible_filter(rows)] or None


def check_fits(name: str, rows: int, cols: int, nnz: int, k: int | None = None,
               memory: list[tuple[int, int]] | None = None) -> None:
    """Raise a one-line :class:`SparseRLError` when the matrix cannot fit on the GPUs the harness
    uses: its footprint above a GPU's whole memory. ``memory``: (free, total) bytes per GPU
    (default: asked of nvidia-smi; unknown: no check). Above what is free only now, a warning: the
    harness's own workers count as using what their caches hold, and they let it go when a matrix
    needs room (:mod:`sparserl.harness.memory`); another process's memory they cannot."""
    memory = memory if memory is not None else gpu_memory()
    if not memory:
        log.debug("GPU memory unknown: the size check is skipped")
        return
    need = device_footprint_bytes(rows, cols, nnz, k)
    what = f"{name} ({rows} x {cols}, {nnz} nonzeros{f', k = {k}' if k else ''})"
    total = min(t for _, t in memory)
    if need > total:
        raise SparseRLError(
            f"{what} is too large for the GPU: it needs at least {need / GiB:.1f} GiB there (the matrix and its "
            f"fresh-valued twin converted, with pristine copies and fp64 references; cuSPARSE's copy; verification "
            f"vectors) and the GPU has {total / GiB:.1f} GiB")
    free = min(f for f, _ in memory)
    if need > free:
        log.warning("%s needs at least %.1f GiB on the GPU and %.1f GiB is free now; the harness lets its cached "
                    "matrices and conversions go to make room, but memory held by other processes it cannot",
                    what, need / GiB, free / GiB)
