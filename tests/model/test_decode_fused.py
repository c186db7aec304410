"""The fused Triton kernels of the bucketed decode step (model/decode_fused.py): each one against
the PyTorch ops it replaces (bit for bit in bf16, where both round the same float32 values; to
float32 rounding for float32 models), and the engine's fused step against its unfused one. On a
CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 there); the
``gpu`` test repeats the op checks on the GPU, where exp and rsqrt are the hardware's."""

from __future__ import annotations

import copy
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="Triton is in the dev extra and on the GPU image")

import torch.nn.functional as F  # noqa: E402

from sparserl.model import bucketed, decode_attention  # noqa: E402
from sparserl.model import decode_fused as fu  # noqa: E402

from tests.model.test_bucketed import _bucketed, _llama, _lora  # noqa: E402
from tests.model.test_decode import _model, _prompts  # noqa: E402

_CPU_OK = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                             reason="CPU tensors need Triton's interpreter (tests/conftest.py sets it where no GPU is)")


def _rms(n: int, dtype, device="cpu"):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    norm = Qwen3RMSNorm(n, eps=1e-6).to(device=device, dtype=dtype)
    torch.nn.init.normal_(norm.weight, 1.0, 0.3)
    return norm


def _check(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        bad = got != want
        assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} differ, max {float((got - want).abs().max())}"
    elif got.dtype is torch.bfloat16:  # a last-bit difference at most (PyTorch's bf16 tolerance)
        torch.testing.assert_close(got, want)
    else:
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)


def _op_cases(device: str, exact_bf16: bool) -> None:
    g = torch.Generator(device="cpu").manual_seed(0)
    for dt in (torch.bfloat16, torch.float32):
        exact = dt is torch.bfloat16 and exact_bf16
        norm = _rms(96, dt, device)
        x = torch.randn(5, 2, 96, generator=g).to(device, dt)[:, 1]  # rows with a stride of 192
        r = torch.randn(5, 96, generator=g).to(device, dt) * 4
        out, s = fu.add_rms_norm(x, r, norm)
        _check(s, x + r, exact=True)  # one rounded addition
        _check(out, norm(x + r), exact)
        out, s = fu.add_rms_norm(x, None, norm)
        assert s is x
        _check(out, norm(x), exact)
        gu = torch.randn(7, 2 * 3000, generator=g).to(device, dt) * 3  # wider than one block, odd size
        gate, up = gu.chunk(2, dim=-1)
        _check(fu.silu_mul(gate, up), F.silu(gate) * up, exact)
        # what a diverging model produces: NaN stays NaN, infinities and overflow as PyTorch rounds them
        big = torch.finfo(dt).max
        special = torch.tensor([[float("nan"), float("inf"), -float("inf"), big, -big, 0.0, -0.0, 1e-40]], dtype=dt,
                               device=device)
        twos = torch.full_like(special, 2.0)
        torch.testing.assert_close(fu.silu_mul(special, twos), F.silu(special) * twos, atol=0, rtol=0, equal_nan=True)
        rows = torch.randn(3, 96, generator=g).to(device, dt)
        rows[1, 5] = float("nan")
        rows[2, 7] = big
        out, s = fu.add_rms_norm(rows, rows, norm)  # row 1 all NaN; row 2's sum overflows to inf
        want = norm(rows + rows)
        torch.testing.assert_close(s, rows + rows, atol=0, rtol=0, equal_nan=True)
        torch.testing.assert_close(out[1:], want[1:], atol=0, rtol=0, equal_nan=True)
        _check(out[:1], want[:1], exact)
        assert out[1].isnan().all() and out[2, 7].isnan() and not out[2, :7].isnan().any()


@_CPU_OK
def test_norm_and_activation_round_like_pytorch() -> None:
    """The residual sum and RMS norm, and the gated activation: bf16 results equal PyTorch's bit for
    bit (strided rows, a row wider than one block); float32 within rounding."""
    _op_cases("cpu", exact_bf16=True)


@_CPU_OK
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("heads", [(2, 1, 32), (6, 3, 16)])
def test_rotary_and_cache_writes_are_the_unfused_steps(tiny_hf_config, dtype, qk_norm, heads) -> None:
    """Queries rotated as DecoderView.qkv rotates them (after the q/k norms when the model has them);
    keys and values land in the cache at the step's column and nowhere else. Head counts that are
    not powers of two (6 and 3: the kernel pads them to 8 and 4 and masks the rest)."""
    cfg = copy.deepcopy(tiny_hf_config)
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = heads
    lm = _model(cfg).to(dtype)
    view = bucketed.DecoderView(lm)
    attn = view.layers[0].self_attn
    if not qk_norm:
        attn.q_norm = attn.k_norm = None
    B, L, D = 3, 24, view.head_dim
    x = torch.randn(B, 1, tiny_hf_config.hidden_size).to(dtype)
    view.rope_table(L, x)
    pos = torch.tensor([[5], [0], [17]])
    col = torch.tensor([9])
    cos, sin = view.angles(x, pos)
    q_ref, k_ref, v_ref = view.qkv(0, x, cos, sin)  # (B, H, 1, D)
    q, k, v = view.project(0, x[:, 0])
    K = torch.zeros(B, view.n_kv, L, D, dtype=dtype)
    V = torch.zeros_like(K)
    qo = fu.qk_rope_store(q, k, v, attn, view.table, pos, col, K, V, D)
    exact = dtype is torch.bfloat16
    _check(qo, q_ref[:, :, 0], exact)
    _check(K[:, :, 9], k_ref[:, :, 0], exact)
    _check(V[:, :, 9], v_ref[:, :, 0], exact=True)  # copied
    K[:, :, 9] = 0
    V[:, :, 9] = 0
    assert not K.any() and not V.any(), "a write landed outside the step's column"


def test_unfusable_says_why(tiny_hf_config) -> None:
    """Layers the kernels do not know keep the unfused step, with the reason."""
    lm = _model(tiny_hf_config)
    layers, norm = list(lm.model.layers), lm.model.norm
    assert fu.unfusable(layers, norm) is None
    layers[1].mlp.act_fn = torch.nn.GELU()
    assert "GELU" in fu.unfusable(layers, norm)
    lm = _model(tiny_hf_config)
    layers = list(lm.model.layers)
    layers[0].post_attention_layernorm = torch.nn.LayerNorm(tiny_hf_config.hidden_size)
    assert "LayerNorm" in fu.unfusable(layers, norm)
    lm = _model(tiny_hf_config)
    layers = list(lm.model.layers)
    layers[0].self_attn.k_norm = None
    assert "only one" in fu.unfusable(layers, norm)


@_CPU_OK
@pytest.mark.slow(seconds=16)
@pytest.mark.parametrize("family,dtype", [("qwen3-lora", torch.float32), ("llama", torch.bfloat16)])
# Qwen3 in bf16, bit for bit, is test_fused_step_with_biases_and_rows_leaving's case (with biases)
def test_fused_step_samples_what_the_unfused_step_samples(tiny_hf_config, monkeypatch, family, dtype) -> None:
    """The engine with the Triton attention, fused step against unfused (same seed, temperature 1):
    the same tokens; bf16 log-probabilities bit for bit, float32 ones within rounding. LoRA
    adapters on q, v and down projections stay applied (the gate/up product is fused only for
    plain layers)."""
    monkeypatch.setattr(bucketed, "ATTENTION", "triton")
    monkeypatch.setattr(decode_attention, "CHUNK", 16)
    lm = _llama(tiny_hf_config) if family == "llama" else _model(tiny_hf_config)
    if family.endswith("lora"):
        lm = _lora(lm)
    lm = lm.to(dtype)
    embeds, mask = _prompts(lm.get_input_embeddings().weight.shape[1], lengths=(7, 4, 9))
    embeds = embeds.to(dtype)
    args = (lm, embeds, mask, 12, tiny_hf_config.vocab_size + 1, tiny_hf_config.pad_token_id, 4, 1.0, 0)
    torch.manual_seed(5)
    ids, logp, run = _bucketed(*args)
    assert run.fused and run.attention == "triton"
    monkeypatch.setattr(bucketed.BucketedDecode, "_fusable", lambda self: False)
    torch.manual_seed(5)
    ids2, logp2, run2 = _bucketed(*args)
    assert not run2.fused
    assert torch.equal(ids, ids2)
    if dtype is torch.bfloat16:
        assert torch.equal(logp, logp2)
    else:
        torch.testing.assert_close(logp, logp2, atol=1e-5, rtol=1e-5)


@_CPU_OK
@pytest.mark.slow(seconds=11)
def test_fused_step_with_biases_and_rows_leaving(tiny_hf_config, monkeypatch) -> None:
    """Qwen3 with q/k/v/o biases in bf16, greedy, six rows that end early and two that go on: the
    batch shrinks to two at the first check (the fused step's cache writes then land in the
    gathered cache), and the fused step decodes what the unfused one does, bit for bit."""
    monkeypatch.setattr(decode_attention, "CHUNK", 16)
    cfg = copy.deepcopy(tiny_hf_config)
    cfg.attention_bias = True
    lm = _model(cfg)
    for layer in lm.model.layers:  # non-zero biases, so that a path that dropped them would differ
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            torch.nn.init.normal_(proj.bias, std=0.5)
    lm = lm.to(torch.bfloat16)
    e, m = _prompts(cfg.hidden_size, lengths=(6, 9), seed=3)
    embeds, mask = torch.cat([e[:1]] * 6 + [e[1:]] * 2).to(torch.bfloat16), torch.cat([m[:1]] * 6 + [m[1:]] * 2)
    pad = cfg.pad_token_id
    monkeypatch.setattr(bucketed, "ATTENTION", "sdpa")  # the probe: PyTorch's step (the interpreter is slow)
    probe, _, _ = _bucketed(lm, embeds, mask, 8, cfg.vocab_size + 1, pad, 8)
    eos = next(int(t) for t in probe[0, 1:4] if int(t) not in probe[6].tolist())  # row 0 ends by its 4th token
    monkeypatch.setattr(bucketed, "ATTENTION", "triton")
    ids, logp, run = _bucketed(lm, embeds, mask, 8, eos, pad, 8)
    assert run.fused and run.compactions == [2], run.compactions
    monkeypatch.setattr(bucketed.BucketedDecode, "_fusable", lambda self: False)
    ids2, logp2, run2 = _bucketed(lm, embeds, mask, 8, eos, pad, 8)
    assert not run2.fused and run2.compactions == [2]
    assert torch.equal(ids, ids2) and torch.equal(logp, logp2)


def test_the_fused_step_needs_the_triton_attention(tiny_hf_config, monkeypatch) -> None:
    """With sdpa the step stays PyTorch's (the fused step goes with the Triton setting)."""
    monkeypatch.setattr(bucketed, "ATTENTION", "sdpa")
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size, lengths=(3, 5))
    _, _, run = _bucketed(lm, embeds, mask, 4, tiny_hf_config.vocab_size + 1, tiny_hf_config.pad_token_id, 4)
    assert run.attention == "sdpa" and not run.fused


@pytest.mark.gpu
def test_fused_kernels_on_the_gpu() -> None:
    """The op checks on CUDA tensors: the GPU's exp and rsqrt are not the CPU's, so bf16 results may
    differ from PyTorch's in the last bit of a few elements; float32 ones stay within rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and a CUDA build of torch; torch sees no GPU here")
    _op_cases("cuda", exact_bf16=False)
    g = torch.Generator(device="cpu").manual_seed(1)
    norm = _rms(512, torch.bfloat16, "cuda")
    x = torch.randn(256, 512, generator=g).to("cuda", torch.bfloat16)
    r = torch.randn(256, 512, generator=g).to("cuda", torch.bfloat16)
    out, _ = fu.add_rms_norm(x, r, norm)
    want = norm(x + r)
    ulp = (want.float().abs() * 2 ** -7).clamp(min=1e-30)
    off = out != want
    assert float(off.float().mean()) < 1e-2 and bool(((out.float() - want.float()).abs() <= ulp)[off].all())
