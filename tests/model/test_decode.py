"""Static-cache decoding against ``transformers``' generate(), and the sampling rule (CPU).

The CUDA-graph engine replays exactly the step tested here eagerly; its GPU test is in
``test_decode_gpu.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.model.decode import decode, pick_engine  # noqa: E402
from sparserl.model.sampling import filter_logits, sample_tokens  # noqa: E402
from sparserl.model.policy import LoraSpec, Policy, PolicyConfig  # noqa: E402

from tests.model.test_policy import ENC, samples  # noqa: E402


def _model(cfg, seed=0):
    import copy

    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).eval()  # the fixture's config stays untouched


def _prompts(d: int, lengths=(7, 4, 9), seed=1):
    """Left-padded random prompt embeddings of different lengths, and their mask."""
    g = torch.Generator().manual_seed(seed)
    P = max(lengths)
    embeds = torch.zeros(len(lengths), P, d)
    mask = torch.zeros(len(lengths), P, dtype=torch.long)
    for b, n in enumerate(lengths):
        embeds[b, P - n:] = torch.randn(n, d, generator=g)
        mask[b, P - n:] = 1
    return embeds, mask


def _trim(ids: torch.Tensor, eos: int, pad: int) -> list[list[int]]:
    rows = []
    for r in ids.tolist():
        r = [t for t in r if t != pad]
        rows.append(r[:r.index(eos) + 1] if eos in r else r)
    return rows

def forward_logp(lm, embeds, mask, ids, temperature: float = 1.0, top_k: int = 0):
    """(B, T) log-probabilities of ``ids`` under softmax(filter(logits / temperature)), from one full
    forward over prompt + completion: what a sampler's recorded log-probabilities must equal."""
    B, T = ids.shape
    full = torch.cat([embeds, lm.get_input_embeddings()(ids)], dim=1)
    am = torch.cat([mask, torch.ones_like(ids)], dim=1)
    with torch.no_grad():
        logits = lm(inputs_embeds=full, attention_mask=am, position_ids=(am.cumsum(1) - 1).clamp(min=0)).logits
    P = embeds.shape[1]
    step = (logits[:, P - 1: P - 1 + T].float() / temperature).reshape(B * T, -1)
    return torch.log_softmax(filter_logits(step, top_k), -1).gather(-1, ids.reshape(-1, 1)).reshape(B, T)


def up_to_end(ids, eos: int):
    """True on each row's tokens up to and including its first ``eos``."""
    is_eos = ids == eos
    return ~((is_eos.long().cumsum(1) - is_eos.long()) > 0)



def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    k2 = filter_logits(logits, top_k=2)
    assert torch.isfinite(k2[0, :2]).all() and (k2[0, 2:] < -1e30).all()
    p = filter_logits(logits, top_p=0.75)  # 0.5 + 0.3 reaches 0.75: the two most likely stay
    assert (p[0, :2] == logits[0, :2]).all() and (p[0, 2:] < -1e30).all()
    p1 = filter_logits(logits, top_p=0.01)  # the most likely token is always kept
    assert p1[0, 0] == logits[0, 0] and (p1[0, 1:] < -1e30).all()
    assert torch.equal(filter_logits(logits), logits)


def test_sample_tokens_follows_the_softmax() -> None:
    torch.manual_seed(0)
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = torch.log(probs).expand(40_000, 4)
    draws = sample_tokens(logits, temperature=1.0)
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(freq, probs, atol=0.01), freq
    assert (sample_tokens(logits, temperature=0.0) == 0).all()
    assert (sample_tokens(logits, temperature=1.0, top_k=1) == 0).all()
    hot = torch.bincount(sample_tokens(logits, temperature=2.0), minlength=4).float() / 40_000
    assert hot[3] > 0.08  # a higher temperature flattens the distribution


@pytest.mark.parametrize("lora", [False, True])
def test_static_decode_matches_generate_greedy(tiny_hf_config, lora) -> None:
    lm = _model(tiny_hf_config)
    if lora:
        from peft import LoraConfig, get_peft_model

        lm = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           task_type="CAUSAL_LM")).eval()
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    pad = tiny_hf_config.pad_token_id
    hf = decode(lm, embeds, mask, 24, eos_id=tiny_hf_config.eos_token_id, pad_id=pad, temperature=0, engine="hf")
    # an end-of-sequence token that row 0 reaches at its 6th token, to test stopping and padding
    eos = hf[0, 5].item()
    hf = decode(lm, embeds, mask, 24, eos_id=eos, pad_id=pad, temperature=0, engine="hf")
    st = decode(lm, embeds, mask, 24, eos_id=eos, pad_id=pad, temperature=0, engine="static", check_every=4)
    assert _trim(st, eos, pad) == _trim(hf, eos, pad)
    first = st[0].tolist().index(eos)
    assert first <= 5 and (st[0, first + 1:] == pad).all() and st.shape[1] <= 24


def test_static_decode_under_autocast(tiny_hf_config) -> None:
    """RL samples inside bf16 autocast; the static cache must not see float32 keys with bf16 values."""
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    pad, eos = tiny_hf_config.pad_token_id, tiny_hf_config.eos_token_id
    plain = decode(lm, embeds, mask, 12, eos_id=eos, pad_id=pad, temperature=0, engine="static")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = decode(lm, embeds, mask, 12, eos_id=eos, pad_id=pad, temperature=0, engine="static")
    assert torch.equal(auto, plain)  # the weights' dtype rules, not autocast


def test_static_decode_sampling_is_seeded_and_stops_when_all_finish(tiny_hf_config) -> None:
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    pad, eos = tiny_hf_config.pad_token_id, tiny_hf_config.eos_token_id

    def run(seed):
        torch.manual_seed(seed)
        return decode(lm, embeds, mask, 40, eos_id=eos, pad_id=pad, temperature=1.0, top_k=50, engine="static")

    a, b, c = run(3), run(3), run(4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # with every token as the end-of-sequence token the loop stops after one token
    one = decode(lm, embeds, mask, 40, eos_id=int(a[0, 0]), pad_id=pad, temperature=0, engine="static")
    assert one.shape[1] <= 40 and (one[:, 0] == one[0, 0]).any()


def test_policy_generation_is_the_same_through_either_engine(tiny_tokenizer, tiny_hf_config) -> None:
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC, lora=LoraSpec(r=4)))
    hf = p.generate(samples(), max_new_tokens=20, temperature=0, engine="hf")
    st = p.generate(samples(), max_new_tokens=20, temperature=0, engine="static")
    assert st == hf and all(len(t) > 0 for t in st)


def test_engine_choice(tiny_hf_config) -> None:
    lm = _model(tiny_hf_config)
    assert pick_engine(lm, torch.device("cpu")) == "bucketed"  # a Qwen3 decoder: see test_bucketed.py
    assert pick_engine(lm, torch.device("cpu"), "static") == "static"
    assert pick_engine(lm, torch.device("cpu"), "graph") == "static"  # graphs need CUDA
    assert pick_engine(lm, torch.device("cuda"), "graph") == "graph"
    lm.config.model_type = "not-a-family-the-bucketed-engine-knows"
    assert pick_engine(lm, torch.device("cpu")) == "static" and pick_engine(lm, torch.device("cuda")) == "graph"
    lm.config._attn_implementation = "eager"  # not a model this module drives: its mask would be added, not applied
    assert pick_engine(lm, torch.device("cuda")) == "hf"
    assert pick_engine(lm, torch.device("cpu"), "static") == "hf" and pick_engine(lm, torch.device("cuda"), "graph") == "hf"
    with pytest.raises(SparseRLError, match="decode engine"):
        pick_engine(lm, torch.device("cpu"), "fast")


@pytest.mark.parametrize("engine,temperature,top_k", [("static", 0.7, 0), ("hf", 0.7, 0), ("static", 1.3, 20)])
def test_decode_returns_the_samplers_log_probs(tiny_hf_config, engine, temperature, top_k) -> None:
    """The log-probabilities decode returns are those of softmax(filter(logits / T)) for the drawn
    tokens, recomputed here by one full forward over prompt + completion; 0 after each row's end."""
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    pad = tiny_hf_config.pad_token_id
    torch.manual_seed(5)  # a run that never stops, then one that stops at a token row 1 draws 4th
    probe = decode(lm, embeds, mask, 16, eos_id=tiny_hf_config.vocab_size + 1, pad_id=pad, temperature=temperature,
                   top_k=top_k, engine=engine)
    eos = int(probe[1, 3])
    torch.manual_seed(5)
    ids, logp = decode(lm, embeds, mask, 16, eos_id=eos, pad_id=pad, temperature=temperature, top_k=top_k,
                       engine=engine, return_logp=True)
    assert ids.shape == logp.shape and logp.dtype == torch.float32
    torch.manual_seed(5)
    assert torch.equal(decode(lm, embeds, mask, 16, eos_id=eos, pad_id=pad, temperature=temperature, top_k=top_k,
                              engine=engine), ids)  # asking for log-probs draws the same tokens
    want = forward_logp(lm, embeds, mask, ids, temperature, top_k)
    live = up_to_end(ids, eos)
    assert (~live).any() and live.any()
    torch.testing.assert_close(logp[live], want[live], atol=2e-4, rtol=1e-4)
    assert float(logp[~live].abs().max()) == 0.0
