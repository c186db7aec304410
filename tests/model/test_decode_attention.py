"""The split-key decode attention (model/decode_attention.py) against SDPA and a float64 reference:
on a CPU in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where no GPU is), on a
GPU compiled. Masks with whole chunks masked, a cache longer than the span, bf16 and float32."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is in the dev extra and on the GPU image")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.model import bucketed  # noqa: E402
from sparserl.model import decode_attention as da  # noqa: E402


def _case(B, H, G, D, S, span, dtype, device, seed=0, masked_until=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, G, D, generator=g).to(device, dtype)
    k = torch.randn(B, H, S, D, generator=g).to(device, dtype)
    v = torch.randn(B, H, S, D, generator=g).to(device, dtype)
    ok = torch.rand(B, span, generator=g) < 0.6
    ok[:, span - 1] = True  # the step's own position: every row has a valid key
    ok[0, :masked_until] = False  # whole chunks with no valid key
    bias = torch.zeros(B, 1, 1, span, dtype=dtype).masked_fill_(~ok[:, None, None], float("-inf")).to(device)
    return q, k, v, bias


DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                                 reason="CPU tensors need Triton's interpreter (set where no GPU is)")),
    pytest.param("cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("G,D,S,span,chunk,masked_until", [
    (2, 32, 300, 256, 64, 130),    # the tiny model's shape; chunks 0-1 of row 0 hold no valid key
    (1, 16, 128, 128, 128, 0),     # one chunk, no query-head group
    (4, 64, 700, 640, 256, 300),   # Qwen3-8B's group; a cache longer than the span; a partial last chunk
    (8, 128, 256, 200, 64, 0),     # head size 128, span not a multiple of the chunk
])
def test_matches_sdpa_and_a_float64_reference_in_float32(device, G, D, S, span, chunk, masked_until) -> None:
    q, k, v, bias = _case(3, 2, G, D, S, span, torch.float32, device, masked_until=masked_until)
    out = da.decode_attention(q, k, v, bias, span, D ** -0.5, chunk=chunk)
    ref = da.reference(q, k, v, bias, span, D ** -0.5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :span], v[:, :, :span], attn_mask=bias,
                                                            scale=D ** -0.5)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_is_as_close_to_the_reference_as_sdpa(device) -> None:
    """bf16 inputs, float32 scores and sums, one rounding of the output: within bf16's step of the
    float64 result, like SDPA's."""
    q, k, v, bias = _case(4, 2, 2, 64, 512, 384, torch.bfloat16, device, seed=3, masked_until=200)
    out = da.decode_attention(q, k, v, bias, 384, 64 ** -0.5, chunk=128)
    ref = da.reference(q.float(), k.float(), v.float(), bias.float(), 384, 64 ** -0.5).float()
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :384], v[:, :, :384], attn_mask=bias,
                                                            scale=64 ** -0.5).float()
    err, err_sdpa = (out.float() - ref).abs().max().item(), (sdpa - ref).abs().max().item()
    assert out.dtype == torch.bfloat16 and err <= max(1.5 * err_sdpa, 2e-3), (err, err_sdpa)


def test_what_the_kernels_refuse() -> None:
    assert "powers of two" in da.unsupported(3, 64, torch.device("cpu"))
    assert "powers of two" in da.unsupported(2, 96, torch.device("cpu"))
    assert da.unsupported(2, 64, torch.device("cuda")) is None
    q, k, v, bias = _case(1, 1, 3, 16, 64, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match="powers of two"):
        da.decode_attention(q, k, v, bias, 64, 0.25)
    q, k, v, bias = _case(1, 1, 2, 16, 64, 64, torch.float32, "cpu")
    for chunk in (8, 48):
        with pytest.raises(ValueError, match="power of two >= 16"):
            da.decode_attention(q, k, v, bias, 64, 0.25, chunk=chunk)


def test_the_engines_attention_setting(monkeypatch, caplog) -> None:
    """An unknown $SPARSERL_DECODE_ATTENTION is an error; triton without Triton is an error; triton
    where the kernels do not apply decodes with sdpa and says so; auto (the default) takes triton on
    a GPU where it applies and Triton is there, sdpa everywhere else."""
    assert bucketed.ATTENTION == os.environ.get("SPARSERL_DECODE_ATTENTION", "auto")
    monkeypatch.setattr(bucketed, "ATTENTION", "flash")
    with pytest.raises(SparseRLError, match="auto.*sdpa.*matmul.*triton"):
        bucketed.attention_kind(2, 64, torch.device("cpu"))
    monkeypatch.setattr(bucketed, "ATTENTION", "auto")
    assert bucketed.attention_kind(2, 64, torch.device("cuda")) == "triton"
    assert bucketed.attention_kind(2, 64, torch.device("cpu")) == "sdpa"  # even under the interpreter
    assert bucketed.attention_kind(3, 64, torch.device("cuda")) == "sdpa"
    assert "does not apply" not in caplog.text  # auto falls back quietly
    monkeypatch.setattr(bucketed, "ATTENTION", "triton")
    assert bucketed.attention_kind(2, 64, torch.device("cuda")) == "triton"
    assert bucketed.attention_kind(3, 64, torch.device("cuda")) == "sdpa"
    assert "does not apply" in caplog.text
    monkeypatch.setattr(da, "available", lambda: False)
    with pytest.raises(SparseRLError, match="needs Triton"):
        bucketed.attention_kind(2, 64, torch.device("cuda"))
    monkeypatch.setattr(bucketed, "ATTENTION", "auto")
    assert bucketed.attention_kind(2, 64, torch.device("cuda")) == "sdpa"  # no Triton: torch's kernel
