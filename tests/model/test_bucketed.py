"""The bucketed decode engine (CPU, eager): the same tokens and log-probabilities as generate()
and as a full forward, across bucket boundaries, with rows leaving the batch as they finish,
for Qwen3 (grouped-query attention, q/k norms), Llama and LoRA-wrapped models."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from sparserl.model import bucketed  # noqa: E402
from sparserl.model import decode as dec  # noqa: E402
from sparserl.model.decode import decode, pick_engine  # noqa: E402

from tests.model.test_decode import _model, _prompts, _trim, forward_logp, up_to_end  # noqa: E402


def _llama(cfg):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    lc = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
    lc._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(lc).eval()


def _lora(lm):
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                       task_type="CAUSAL_LM"))
    for n, p in lm.named_parameters():  # non-zero adapters, so that a path that skipped them would differ
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    return lm.eval()


def _bucketed(lm, embeds, mask, n, eos, pad, bucket, temperature=0.0, top_k=0):
    run = bucketed.BucketedDecode(lm, embeds, mask, n, eos, pad, (temperature, top_k, 1.0), bucket=bucket)
    ids, logp = run.run(graph=False, check_every=4)
    return ids, logp, run


@pytest.mark.parametrize("family", ["qwen3", "qwen3-lora", "llama"])
def test_bucketed_decode_matches_generate_greedy(tiny_hf_config, family) -> None:
    lm = _llama(tiny_hf_config) if family == "llama" else _model(tiny_hf_config)
    if family.endswith("lora"):
        lm = _lora(lm)
    assert bucketed.supports(lm)
    embeds, mask = _prompts(lm.get_input_embeddings().weight.shape[1], lengths=(7, 4, 9, 2, 8, 5, 9, 6))
    pad = tiny_hf_config.pad_token_id
    probe = decode(lm, embeds, mask, 30, eos_id=tiny_hf_config.vocab_size + 1, pad_id=pad, temperature=0, engine="hf")
    # an end-of-sequence token that some rows reach early and others late (or never): the batch shrinks
    eos = int(probe[0, 3])
    hf = decode(lm, embeds, mask, 30, eos_id=eos, pad_id=pad, temperature=0, engine="hf")
    ids, _, run = _bucketed(lm, embeds, mask, 30, eos, pad, bucket=4)  # a new bucket every 4 positions
    assert _trim(ids, eos, pad) == _trim(hf, eos, pad)
    via_decode = decode(lm, embeds, mask, 30, eos_id=eos, pad_id=pad, temperature=0, engine="bucketed")
    assert dec.LAST_ENGINE["engine"] == "bucketed"  # it ran, not a fall-back that happens to agree
    assert torch.equal(via_decode, ids[:, :via_decode.shape[1]]) and via_decode.shape == ids.shape


def test_finished_rows_leave_the_batch(tiny_hf_config) -> None:
    """Twelve rows that end at their third token and four that keep going: at the first check the
    running batch shrinks to the four, which then produce exactly generate()'s tokens."""
    lm = _model(tiny_hf_config)
    e, m = _prompts(tiny_hf_config.hidden_size, lengths=(6, 9), seed=3)
    embeds, mask = torch.cat([e[:1]] * 12 + [e[1:]] * 4), torch.cat([m[:1]] * 12 + [m[1:]] * 4)
    pad = tiny_hf_config.pad_token_id
    probe = decode(lm, embeds, mask, 40, eos_id=tiny_hf_config.vocab_size + 1, pad_id=pad, temperature=0, engine="hf")
    eos = next(int(t) for t in probe[0, 2:] if int(t) not in probe[12].tolist())
    ends_at = probe[0].tolist().index(eos)
    ids, _, run = _bucketed(lm, embeds, mask, 40, eos, pad, bucket=8)
    assert run.compactions == [4] and ends_at < 4, (run.compactions, ends_at)
    hf = decode(lm, embeds, mask, 40, eos_id=eos, pad_id=pad, temperature=0, engine="hf")
    assert _trim(ids, eos, pad) == _trim(hf, eos, pad) and ids.shape[1] == 40
    after = (ids == eos).long().cumsum(1) - (ids == eos).long() > 0
    assert after[:12].any() and (ids[after] == pad).all()


@pytest.mark.parametrize("temperature,top_k,attention", [
    (0.7, 0, "sdpa"), (1.3, 20, "sdpa"), (0.7, 0, "matmul"), (1.3, 20, "matmul"),
    # no Triton case: its kernels are checked against sdpa and an fp64 reference in test_decode_attention,
    # and the engine with them in test_decode_fused; a decode in the interpreter here took the longest
])
def test_bucketed_log_probs_are_the_samplers(tiny_hf_config, temperature, top_k, attention, monkeypatch) -> None:
    """Each drawn token's log-probability under softmax(filter(logits / T)), as one full forward over
    prompt + completion computes it; seeded runs draw the same tokens; 0 after each row's end."""
    monkeypatch.setattr(bucketed, "ATTENTION", attention)
    lm = _lora(_model(tiny_hf_config))
    embeds, mask = _prompts(tiny_hf_config.hidden_size, lengths=(7, 4, 9, 3, 6, 8, 2, 5, 9))
    pad = tiny_hf_config.pad_token_id
    torch.manual_seed(5)
    probe, _, _ = _bucketed(lm, embeds, mask, 20, tiny_hf_config.vocab_size + 1, pad, 4, temperature, top_k)
    eos = int(probe[1, 3])
    torch.manual_seed(5)
    ids, logp, run = _bucketed(lm, embeds, mask, 20, eos, pad, 4, temperature, top_k)
    assert run.attention == attention, "the engine fell back to another attention"
    torch.manual_seed(5)
    again, _, _ = _bucketed(lm, embeds, mask, 20, eos, pad, 4, temperature, top_k)
    assert torch.equal(again, ids)
    want = forward_logp(lm, embeds, mask, ids, temperature, top_k)
    live = up_to_end(ids, eos)
    assert (~live).any() and live.any()
    torch.testing.assert_close(logp[live], want[live], atol=2e-4, rtol=1e-4)
    assert float(logp[~live].abs().max()) == 0.0


def test_engine_choice_prefers_bucketed_where_supported(tiny_hf_config) -> None:
    lm = _model(tiny_hf_config)
    assert pick_engine(lm, torch.device("cpu")) == "bucketed"
    assert pick_engine(lm, torch.device("cuda")) == "bucketed"
    assert pick_engine(lm, torch.device("cuda"), "graph") == "graph"
    other = copy.deepcopy(tiny_hf_config)
    other.layer_types = ["sliding_attention"] * other.num_hidden_layers
    lm2 = _model(tiny_hf_config)
    lm2.config.layer_types = other.layer_types
    assert not bucketed.supports(lm2)
    assert pick_engine(lm2, torch.device("cuda"), "bucketed") != "bucketed"


def test_a_model_whose_layers_do_not_fit_falls_back(tiny_hf_config, caplog, monkeypatch) -> None:
    """A supported family whose modules then refuse the engine's calls: decoding still succeeds
    through the next engine, with a warning, and that model class is not tried again."""
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    pad, eos = tiny_hf_config.pad_token_id, tiny_hf_config.eos_token_id

    def refuse(*a, **k):
        raise TypeError("q_proj takes other inputs")

    want = decode(lm, embeds, mask, 5, eos_id=eos, pad_id=pad, temperature=0, engine="static")
    monkeypatch.setattr(bucketed.DecoderView, "qkv", refuse)
    try:
        with caplog.at_level("WARNING"):
            out = decode(lm, embeds, mask, 5, eos_id=eos, pad_id=pad, temperature=0)
        assert torch.equal(out, want) and "bucketed decode engine does not fit" in caplog.text
        assert pick_engine(lm, torch.device("cpu")) == "static"
    finally:
        dec._BUCKETED_BROKEN.discard(type(lm).__name__)


@pytest.mark.parametrize("family", ["qwen3-lora", "llama"])
def test_compaction_keeps_each_rows_state(tiny_hf_config, family) -> None:
    """Twelve rows that end early and four *different* prompts that keep going: after the batch
    shrinks, each survivor still produces generate()'s tokens in its own global row, and the
    recorded log-probabilities are a full forward's (a survivor given another's cache, positions,
    mask, last token or output row would differ)."""
    lm = _llama(tiny_hf_config) if family == "llama" else _lora(_model(tiny_hf_config))
    d = lm.get_input_embeddings().weight.shape[1]
    e, m = _prompts(d, lengths=(6, 9, 3, 7, 2), seed=3)
    order = [0] * 6 + [1, 2] + [0] * 6 + [3, 4]  # survivors at global rows 6, 7, 14, 15
    embeds, mask = e[order], m[order]
    pad = tiny_hf_config.pad_token_id
    probe = decode(lm, embeds, mask, 40, eos_id=tiny_hf_config.vocab_size + 1, pad_id=pad, temperature=0, engine="hf")
    live = probe[[6, 7, 14, 15]].reshape(-1).tolist()
    eos = next(int(t) for t in probe[0, 1:4] if int(t) not in live)
    hf = decode(lm, embeds, mask, 40, eos_id=eos, pad_id=pad, temperature=0, engine="hf")
    ids, logp, run = _bucketed(lm, embeds, mask, 40, eos, pad, bucket=4)
    assert run.compactions == [4], run.compactions
    assert _trim(ids, eos, pad) == _trim(hf, eos, pad)
    want, alive = forward_logp(lm, embeds, mask, ids), up_to_end(ids, eos)
    torch.testing.assert_close(logp[alive], want[alive], atol=2e-4, rtol=1e-4)


def test_fused_projections_keep_their_biases(tiny_hf_config) -> None:
    """Qwen2 (biases on q, k and v, the fused path): the log-probabilities of a full forward."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    qc = Qwen2Config(vocab_size=tiny_hf_config.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     eos_token_id=tiny_hf_config.eos_token_id, pad_token_id=tiny_hf_config.pad_token_id)
    qc._attn_implementation = "sdpa"
    lm = AutoModelForCausalLM.from_config(qc).eval()
    for n, p in lm.named_parameters():
        if n.endswith("bias"):
            torch.nn.init.normal_(p, std=1.0)
    assert bucketed.supports(lm) and all(f is not None and f[1] is not None
                                         for f in bucketed.DecoderView(lm).fused)
    embeds, mask = _prompts(64, lengths=(7, 4, 9, 2))
    pad, never = tiny_hf_config.pad_token_id, tiny_hf_config.vocab_size + 1
    ids, logp, _ = _bucketed(lm, embeds, mask, 12, never, pad, 4)
    assert torch.equal(ids, decode(lm, embeds, mask, 12, eos_id=never, pad_id=pad, temperature=0, engine="hf"))
    torch.testing.assert_close(logp, forward_logp(lm, embeds, mask, ids), atol=2e-4, rtol=1e-4)


def test_a_runtime_error_falls_back_for_that_call_only(tiny_hf_config, monkeypatch) -> None:
    """A RuntimeError (a shape or CUDA failure that may not recur) falls back for this call and
    leaves the engine in use for the next; a TypeError (the modules take other inputs) retires it."""
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    pad, eos = tiny_hf_config.pad_token_id, tiny_hf_config.eos_token_id
    real = bucketed.DecoderView.qkv
    calls = {"n": 0}

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")
        return real(self, *a, **k)

    monkeypatch.setattr(bucketed.DecoderView, "qkv", flaky)
    decode(lm, embeds, mask, 5, eos_id=eos, pad_id=pad, temperature=0)
    assert dec.LAST_ENGINE["engine"] == "static" and type(lm).__name__ not in dec._BUCKETED_BROKEN
    decode(lm, embeds, mask, 5, eos_id=eos, pad_id=pad, temperature=0)
    assert dec.LAST_ENGINE["engine"] == "bucketed"
