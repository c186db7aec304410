"""Training throughput as model FLOPs utilisation (MFU).

MFU = 6 * N * tokens/s / peak, where N counts the parameters that take part in a matrix product
per token: every parameter, less the input embedding unless it is tied to the LM head (a tied
matrix is counted once, as the head's product; an embedding lookup costs no FLOPs). The 6 is
2 FLOPs per multiply-add times three passes (forward, and backward for inputs and weights).
Attention's own products (the ``T^2`` term) are not counted, as in the usual definition, so
MFU at long windows understates the work done a little.

Peak figures are dense bf16 tensor-core throughput from the vendor's data sheets (no sparsity):
an H100 or H200 (SXM) does 989 TFLOP/s, an A100 312.
"""

from __future__ import annotations

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
"""Dense bf16 peak by GPU name (TFLOP/s)."""


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name`` (as ``torch.cuda.get_device_name`` says), or None."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in device_name.upper():
            return PEAK_BF16_TFLOPS[key]
    return None


def matmul_params(model) -> int:
    """N of the 6N rule: parameters, less an untied input embedding."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    return total if tied else total - emb.numel()


def mfu(n_params: int, tokens_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation, 6 * N * tokens/s over ``peak`` TFLOP/s (None without a peak)."""
    if not peak:
        return None
    return 6.0 * n_params * tokens_per_s / (peak * 1e12)
