"""The CUDA-graph decode engine on a GPU: same tokens as generate() (greedy), seeded sampling,
and the graph really used (no silent fall-back to eager)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparserl.model import decode as dec  # noqa: E402

from tests.model.test_decode import _model, _prompts, _trim, forward_logp, up_to_end  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_decode_matches_generate(tiny_hf_config, dtype) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and a CUDA build of torch; torch sees no GPU here")
    lm = _model(tiny_hf_config).to("cuda", dtype=dtype)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    embeds, mask = embeds.to("cuda", dtype=dtype), mask.to("cuda")
    pad = tiny_hf_config.pad_token_id
    hf = dec.decode(lm, embeds, mask, 48, eos_id=tiny_hf_config.eos_token_id, pad_id=pad, temperature=0, engine="hf")
    eos = hf[1, 20].item()  # row 1 stops by its 21st token
    hf = dec.decode(lm, embeds, mask, 48, eos_id=eos, pad_id=pad, temperature=0, engine="hf")
    gr = dec.decode(lm, embeds, mask, 48, eos_id=eos, pad_id=pad, temperature=0, engine="graph", check_every=8)
    assert type(lm).__name__ not in dec._GRAPH_BROKEN, "capture failed and the engine fell back to eager"
    a, b = _trim(gr, eos, pad), _trim(hf, eos, pad)
    if dtype is torch.float32:
        assert a == b
    else:  # bf16: different kernels may break near-ties; the first tokens must agree
        assert all(x[:8] == y[:8] for x, y in zip(a, b)), (a, b)
    torch.manual_seed(5)
    s1 = dec.decode(lm, embeds, mask, 48, eos_id=eos, pad_id=pad, temperature=1.0, top_p=0.9, engine="graph")
    torch.manual_seed(5)
    s2 = dec.decode(lm, embeds, mask, 48, eos_id=eos, pad_id=pad, temperature=1.0, top_p=0.9, engine="graph")
    assert torch.equal(s1, s2)


def test_graph_decode_returns_the_samplers_log_probs(tiny_hf_config) -> None:
    """The captured step records each drawn token's log-probability; a full forward over prompt +
    completion gives the same numbers (float32 model, temperature 0.7)."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    lm = _model(tiny_hf_config).to("cuda")
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    embeds, mask = embeds.to("cuda"), mask.to("cuda")
    pad, eos = tiny_hf_config.pad_token_id, tiny_hf_config.eos_token_id
    torch.manual_seed(5)
    ids, logp = dec.decode(lm, embeds, mask, 32, eos_id=eos, pad_id=pad, temperature=0.7, engine="graph",
                           return_logp=True)
    assert type(lm).__name__ not in dec._GRAPH_BROKEN
    torch.manual_seed(5)
    assert torch.equal(dec.decode(lm, embeds, mask, 32, eos_id=eos, pad_id=pad, temperature=0.7, engine="graph"), ids)
    want, live = forward_logp(lm, embeds, mask, ids, 0.7), up_to_end(ids, eos)
    torch.testing.assert_close(logp[live], want[live], atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("attention", ["sdpa", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bucketed_graph_decode_matches_generate(tiny_hf_config, dtype, attention, monkeypatch) -> None:
    """The bucketed engine with CUDA graphs: a new bucket every 16 positions (graphs captured per
    bucket), rows leaving the batch, and the same tokens as generate(); seeded sampling repeats,
    and the recorded log-probabilities are a full forward's. With SDPA and with the split-key
    Triton kernels and the fused step (compiled in the eager warm-up steps, then captured)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and a CUDA build of torch; torch sees no GPU here")
    from sparserl.model import bucketed
    from sparserl.model.bucketed import BucketedDecode

    compiled_while_capturing: list[bool] = []
    monkeypatch.setattr(bucketed, "ATTENTION", attention)
    if attention == "triton":
        pytest.importorskip("triton")
        from sparserl.model import decode_attention
        from sparserl.model import decode_attention_kernels as kern
        from sparserl.model import decode_fused_kernels as fk

        monkeypatch.setattr(decode_attention, "CHUNK", 16)  # spans of 16-80 positions: 1-5 chunks per row
        for fn in (kern.partial_softmax, kern.merge_chunks, fk.add_rms_norm, fk.qk_rope_store, fk.silu_mul):
            # Triton 3.x: every compile goes through _do_compile
            if hasattr(fn, "_do_compile"):
                def spy(*a, _orig=fn._do_compile, **k):
                    compiled_while_capturing.append(torch.cuda.is_current_stream_capturing())
                    return _orig(*a, **k)
                monkeypatch.setattr(fn, "_do_compile", spy)
    monkeypatch.setattr(bucketed, "CAPTURE_BROKEN", set())  # a failed capture here must not turn other tests eager

    lm = _model(tiny_hf_config).to("cuda", dtype=dtype)
    e, m = _prompts(tiny_hf_config.hidden_size, lengths=(6, 9, 3), seed=3)
    embeds = torch.cat([e[:1]] * 12 + [e[1:2]] * 2 + [e[2:]] * 2).to("cuda", dtype=dtype)
    mask = torch.cat([m[:1]] * 12 + [m[1:2]] * 2 + [m[2:]] * 2).to("cuda")
    pad = tiny_hf_config.pad_token_id
    probe = dec.decode(lm, embeds, mask, 60, eos_id=tiny_hf_config.vocab_size + 1, pad_id=pad, temperature=0,
                       engine="hf")
    eos = next(int(t) for t in probe[0, 4:] if int(t) not in probe[12:].reshape(-1).tolist())
    hf = dec.decode(lm, embeds, mask, 60, eos_id=eos, pad_id=pad, temperature=0, engine="hf")
    run = BucketedDecode(lm, embeds, mask, 60, eos, pad, (0.0, 0, 1.0), bucket=16)
    assert run.attention == attention and run.fused == (attention == "triton")
    ids, _ = run.run(graph=True, check_every=8)
    assert not run.broken and run.graphs, "capture failed and the engine fell back to eager"
    assert not any(compiled_while_capturing), "a Triton kernel compiled during a graph capture"
    assert run.compactions == [4], run.compactions
    a, b = _trim(ids, eos, pad), _trim(hf, eos, pad)
    if dtype is torch.float32:
        assert a == b
    else:  # bf16: different kernels may break near-ties; the first tokens must agree
        assert all(x[:8] == y[:8] for x, y in zip(a, b)), (a, b)
    if dtype is torch.bfloat16:
        return
    torch.manual_seed(5)
    s1, lp = dec.decode(lm, embeds, mask, 60, eos_id=eos, pad_id=pad, temperature=0.7, engine="bucketed",
                        return_logp=True)
    torch.manual_seed(5)
    s2 = dec.decode(lm, embeds, mask, 60, eos_id=eos, pad_id=pad, temperature=0.7, engine="bucketed")
    assert torch.equal(s1, s2)
    want, live = forward_logp(lm, embeds, mask, s1, 0.7), up_to_end(s1, eos)
    torch.testing.assert_close(lp[live], want[live], atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("engine", ["graph", "bucketed"])
def test_the_header_grammar_holds_inside_captured_decode_steps(engine, tiny_tokenizer, tiny_hf_config) -> None:
    """The constraint's mask and state update run inside the captured step (graph and bucketed
    engines, 64 rows so the bucketed engine compacts): every completion of a random model is a header
    prefix or a whole header, and the graph was really used. Kills a state buffer that the captured
    graph does not update (rows would stay at the start: only 'FORMAT: ' again and again), and
    states scrambled by the bucketed engine's compaction."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU and a CUDA build of torch; torch sees no GPU here")
    from sparserl.model.header_grammar import START, HeaderGrammar, run

    lm = _model(tiny_hf_config).to("cuda")
    embeds, mask = _prompts(tiny_hf_config.hidden_size, lengths=tuple(4 + i % 9 for i in range(64)))
    embeds, mask = embeds.to("cuda"), mask.to("cuda")
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    c = HeaderGrammar.for_tokenizer(tiny_tokenizer).constraint(64, "cuda")
    torch.manual_seed(1)
    ids = dec.decode(lm, embeds, mask, 160, eos_id=eos, pad_id=pad, temperature=1.0, engine=engine, check_every=8,
                     constraint=c)
    assert dec.LAST_ENGINE["engine"] == engine and type(lm).__name__ not in dec._GRAPH_BROKEN
    texts = tiny_tokenizer.batch_decode(ids, skip_special_tokens=True)
    for text in texts:
        assert text.startswith("FORMAT: ") and run(START, text) is not None, text[:200]
    assert len({t[:40] for t in texts}) > 8  # the rows moved on, each its own way
