"""Split-key attention for one decode step (flash-decoding), in Triton.

The bucketed engine's decode step attends ``g`` query rows per key head (grouped-query
attention) over up to a few thousand cache positions. torch's SDPA takes it to its
memory-efficient kernel, whose 64-row query tiles serve 2-4 query rows, and which gives each
(row, key head) one block that walks every key: on an H200 at batch 256 that kernel ran at
about 2.7x its memory bound and took 56% of the decode's device time
(docs/results.md, 'How fast is decoding?').

Here the keys of each (row, key head) are cut into chunks of ``chunk`` positions, one program
per (row, key head, chunk), so a step has ``B * Hkv * span / chunk`` programs reading its keys
and values once. Each program keeps an online softmax (running max, sum and weighted values, in
float32) for the ``g`` query rows, padded to 16 rows for the matrix units (scores and weighted
sums are ``tl.dot`` products of float32-widened inputs: TF32 for a bf16 model, whose q, k and v
are exact in TF32 while the softmax weights are rounded to it once, and IEEE float32 for a
float32 model), and a second kernel merges the chunks. The additive ``bias`` (0 on a valid key,
-inf elsewhere) is the same one SDPA gets; a chunk with no valid key contributes nothing (its
running max stays -inf).

On an H200 (docs/results.md, 'How fast is decoding?') one layer's attention at batch 256 took
30, 83 and 152 us over 256, 1024 and 2048 positions against SDPA's 45, 132 and 247 us (memory
bound: 14, 56 and 112 us). On a CPU the same kernels run in Triton's interpreter
(``TRITON_INTERPRET=1``, which ``tests/conftest.py`` sets where no GPU is), where tests compare
them with SDPA and with a float64 reference. The bucketed engine uses them by default on a GPU
(``SPARSERL_DECODE_ATTENTION=auto``).
"""

from __future__ import annotations

import os

import torch

CHUNK = 256
"""Cache positions per program (a power of two, >= 16; the last chunk of a span is masked)."""
BLOCK_N = 64
"""Keys per inner step of a program."""
NUM_WARPS = 4
NUM_STAGES = 3
"""The partial kernel's launch settings (Triton's defaults)."""


def available() -> bool:
    """Whether Triton can be imported here (the GPU image has it; the CPU tests install it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def unsupported(group: int, head_dim: int, device: torch.device) -> str | None:
    """Why these kernels cannot serve a model with ``group`` query heads per key head and
    ``head_dim`` on ``device`` (None: they can)."""
    if group & (group - 1) or head_dim & (head_dim - 1) or head_dim < 16:
        return f"query heads per key head {group} and head size {head_dim} must be powers of two (head size >= 16)"
    if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "CPU tensors run only in Triton's interpreter (TRITON_INTERPRET=1 before Triton is imported)"
    return None


def _kernels():
    from sparserl.model import decode_attention_kernels as kern

    return kern.partial_softmax, kern.merge_chunks


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): a Triton block size."""
    return 1 << max(0, (n - 1).bit_length())


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, span: int,
                     scale: float, chunk: int | None = None, num_warps: int | None = None,
                     num_stages: int | None = None) -> torch.Tensor:
    """Attention of ``q`` (B, Hkv, g, d) over the first ``span`` positions of ``k``/``v``
    (B, Hkv, S >= span, d), with the additive ``bias`` (B, 1, 1, span) (0 or -inf): SDPA's result
    for one decode step, in q's dtype. ``g`` and ``d`` must be powers of two (the decoders here:
    g = 1-8, d = 64 or 128). ``num_warps``/``num_stages``: the partial kernel's launch settings
    (None: NUM_WARPS, NUM_STAGES; benchmarks/decode_attention_bench.py sweeps them)."""
    B, n_kv, G, D = q.shape
    why = unsupported(G, D, q.device)
    if why:
        raise ValueError(f"split-key decode attention: {why}")
    if k.stride(-1) != 1 or v.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q, k and v need a contiguous last dimension")
    chunk = chunk or CHUNK
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"the chunk must be a power of two >= 16 (a matrix product's depth), got {chunk}")
    bias2 = bias.reshape(B, span)
    n_chunks = -(-span // chunk)
    dev = q.device
    m = torch.empty(B * n_kv * n_chunks * G, dtype=torch.float32, device=dev)
    l_sum = torch.empty_like(m)
    acc = torch.empty(B * n_kv * n_chunks * G * D, dtype=torch.float32, device=dev)
    out = torch.empty((B, n_kv, G, D), dtype=q.dtype, device=dev)
    partial, merge = _kernels()
    partial[(B * n_kv, n_chunks)](
        q, k, v, bias2, m, l_sum, acc,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias2.stride(0),
        span, n_kv, n_chunks, float(scale),
        G=G, GP=max(16, G), D=D, CHUNK=chunk, BLOCK_N=min(BLOCK_N, chunk), IEEE=q.dtype == torch.float32,
        num_warps=num_warps or NUM_WARPS, num_stages=num_stages or NUM_STAGES)
    merge[(B * n_kv,)](m, l_sum, acc, out, out.stride(0), out.stride(1), out.stride(2), n_kv, n_chunks,
                       G=G, D=D, NC=next_pow2(-(-k.shape[2] // chunk)))  # from the cache's size: one compile per decode
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, span: int,
              scale: float) -> torch.Tensor:
    """The same attention in float64 PyTorch (tests)."""
    s = torch.matmul(q.double(), k[:, :, :span].double().transpose(-1, -2)) * scale + bias.double()
    return torch.matmul(torch.softmax(s, -1), v[:, :, :span].double()).to(q.dtype)


__all__ = ["BLOCK_N", "CHUNK", "NUM_STAGES", "NUM_WARPS", "available", "decode_attention", "next_pow2", "reference",
           "unsupported"]
