"""Which devices this process can use: CUDA GPUs for kernels (CuPy) and for the model (torch).

Neutral ground for every stage (inference, training, evaluation): nothing here imports a
trainer, and torch and CuPy are imported only inside the functions that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparserl.errors import SparseRLError

if TYPE_CHECKING:
    import torch


def visible_gpus() -> list[int]:
    """Indices of the CUDA GPUs CuPy sees (empty without CuPy or a GPU): where kernels can run."""
    try:
        import cupy

        return list(range(cupy.cuda.runtime.getDeviceCount()))
    except Exception:
        return []


def gpus_arch(devices: list[int]) -> str | None:
    """The architecture (``sm_XY``) of the CUDA GPUs ``devices``; None without them, or when they differ."""
    try:
        import cupy

        archs = {f"sm_{cupy.cuda.Device(d).compute_capability}" for d in devices}
    except Exception:
        return None
    return archs.pop() if len(archs) == 1 else None


NO_GPU_NOTE = ("no CUDA GPU visible: running compile-only (kernels are compiled and checked, not run, so "
               "nothing is verified or timed)")
"""What every command says when it falls back to compile-only (see :func:`compile_only_or_fallback`)."""


def compile_only_or_fallback(compile_only: bool) -> tuple[bool, str | None]:
    """The one rule every command follows on a machine without a GPU: it falls back to
    compile-only and says so. Returns ``(compile_only to use, note)``; ``note`` is None unless
    a fallback happened (asked for compile-only, or a GPU is visible), else the line to show."""
    if compile_only or visible_gpus():
        return compile_only, None
    return True, NO_GPU_NOTE


def pick_device(name: str) -> "torch.device":
    """The torch device for the model: 'auto' -> cuda when available, else cpu; 'cuda' without a GPU is an error."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SparseRLError("--device cuda asked for, but no CUDA GPU is visible to torch")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise SparseRLError(f"--device must be auto, cpu or cuda[:N], got {name!r}")
    if name.startswith("cuda"):
        cuda_defaults()
    return torch.device(name)


def cuda_defaults() -> None:
    """Process-wide CUDA settings for training and generation: TF32 matmuls, and no cuDNN
    attention. cuDNN's SDPA builds a new execution plan for every new key length, which is
    what KV-cache decoding produces at every step (bf16 generation on the H200 ran several
    times slower than fp32); flash and memory-efficient attention have no such cost."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores (TF32)
    torch.backends.cudnn.allow_tf32 = True
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
