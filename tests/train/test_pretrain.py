"""Stage-1 pre-training end to end on a tiny model (CPU): tokenizer from scratch, loss and
held-out perplexity, checkpoint, resume, and continuing from an existing HF checkpoint."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from sparserl.data.corpus import CorpusConfig, build_corpus  # noqa: E402
from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.model.config import TinyModelConfig  # noqa: E402
from sparserl.train.pretrain import PretrainConfig, pretrain  # noqa: E402

SHAPE = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32)
CORPUS = CorpusConfig(max_bytes=300_000, library_repeats=2)


def cfg(out, **kw) -> PretrainConfig:
    base = dict(out=str(out), vocab_size=800, shape=SHAPE, seq_len=64, batch_size=8, steps=40, lr=3e-3,
                warmup_steps=5, eval_every=20, save_every=20, heldout_tokens=4000, corpus=CORPUS)
    return PretrainConfig(**(base | kw))


def test_corpus_is_split_by_file_and_has_the_library() -> None:
    c = build_corpus(CORPUS)
    assert c.stats["header_files"] > 10 and c.stats["library_variants"] >= 90
    assert not set(c.train) & set(c.heldout)
    assert any(t.startswith("FORMAT:") for t in c.train) and any(t.startswith("FORMAT:") for t in c.heldout)


def test_pretrain_from_scratch_resume_and_continue(tmp_path, caplog) -> None:
    import logging

    from transformers import AutoModelForCausalLM

    r = pretrain(cfg(tmp_path / "a"))
    assert r["steps"] == 40 and r["tokens_per_s"] > 0
    metrics = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["losses/train"] for m in metrics if "losses/train" in m]
    ppl = [m["eval/heldout_ppl"] for m in metrics if "eval/heldout_ppl" in m]
    assert losses[-1] < losses[0] and len(ppl) == 2 and ppl[-1] < ppl[0] < 800
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "model")
    assert sum(p.numel() for p in model.parameters()) == r["params"]

    # resume: a longer run picks up at step 40 and ends at 60
    r2 = pretrain(cfg(tmp_path / "a", steps=60, resume=True))
    steps = [json.loads(l)["step"] for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert r2["steps"] == 60 and max(steps) == 60 and 40 in steps

    # continue pre-training an existing HF checkpoint with its own tokenizer (at a continuation's learning rate:
    # 5 steps at the from-scratch 3e-3 can throw the small model off its start, by how the corpus falls);
    # --compile on the CPU runs eagerly and says so (killed by: the warning dropped)
    with caplog.at_level(logging.WARNING, logger="sparserl.train.pretrain"):
        r3 = pretrain(cfg(tmp_path / "b", model=str(tmp_path / "a" / "model"), steps=5, eval_every=5, save_every=5,
                          lr=3e-4, compile=True))
    assert r3["params"] == r["params"] and r3["eval/heldout_ppl"] < ppl[0]
    assert any("runs eagerly" in m for m in caplog.messages), caplog.messages


def test_config_validation(tmp_path) -> None:
    with pytest.raises(SparseRLError):
        cfg(tmp_path, steps=0)
    with pytest.raises(SparseRLError):
        cfg(tmp_path, lr=0)


def test_time_estimate_from_the_first_steps() -> None:
    """Default pre-training on a CPU takes hours: after the first steps it says how long."""
    from sparserl.train.pretrain import PretrainConfig, TimeEstimate

    cfg = PretrainConfig(steps=2000, batch_size=32, seq_len=512)
    slow = TimeEstimate(cfg, torch.device("cpu"), first_step=0)  # 30 s per step, the first 40 s
    assert slow.step(1, 40.0) is not None and slow.said  # one slow step already tells
    fast = TimeEstimate(cfg, torch.device("cpu"), first_step=0)  # 0.2 s per step after a 3 s first step
    said = [fast.step(s, 3.0 + 0.2 * (s - 1)) for s in range(1, 13)]
    assert said[:10] == [None] * 10 and said[11] is None  # warm-up, then 10 timed steps, then only once
    msg = said[10]
    assert msg.startswith(f"{10 * 32 * 512 / 2.0:.0f} tokens/s on cpu: the 2000 steps take about")
    left = (2000 - 11) * 0.2
    assert f"about {int(left) // 60} min {int(left) % 60:02d} s left" in msg and "--steps 200" not in msg
    resumed = TimeEstimate(cfg, torch.device("cpu"), first_step=1500)
    msg = [resumed.step(s, 30.0 * (s - 1500)) for s in range(1501, 1503)][0]
    assert "about 4 h 09 min left" in msg and "--steps 200 --batch-size 8 --seq-len 256" in msg


def test_a_run_bounded_by_minutes_shows_progress_toward_where_it_will_stop() -> None:
    """Hand-derived: 200 steps in the first 60 s of a 180 s budget, at step 200 of at most 1M, will end
    near step 600; the step count bounds it when it comes first; no budget or no rate yet: the step
    count. Mutations killed: the budget ignored (the line said '221/1e+06 (0%) ... about 75h left'
    in a 3-minute run), the estimate allowed past the step count or below the step reached."""
    from sparserl.train.pretrain import expected_steps

    assert expected_steps(1_000_000, 200, 200, 60.0, 120.0) == 600
    assert expected_steps(500, 200, 200, 60.0, 120.0) == 500
    assert expected_steps(1_000_000, 200, 200, 60.0, None) == 1_000_000
    assert expected_steps(1_000_000, 0, 0, 0.0, 180.0) == 1_000_000
    assert expected_steps(1_000_000, 650, 650, 181.0, -1.0) == 650
    assert expected_steps(1_000_000, 300, 100, 30.0, 60.0) == 500  # a resumed run: the rate of this process


def test_an_interrupted_run_keeps_its_steps_and_resumes_from_them(tmp_path, monkeypatch, caplog) -> None:
    """Ctrl-C between checkpoints saved nothing (the README's CPU run checkpoints every 500 steps, so its first
    34 steps were lost and --resume started again at step 1 without a word). Killed mutation: the save on
    an interrupt removed (state.pt absent, the resumed run starts at 0)."""
    import sparserl.train.pretrain as pt

    real = pt._train_step
    calls = {"n": 0}

    def interrupting(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(pt, "_train_step", interrupting)
    with pytest.raises(KeyboardInterrupt):
        pretrain(cfg(tmp_path / "i", steps=12, save_every=100, eval_every=100))
    assert torch.load(tmp_path / "i" / "state.pt", weights_only=False)["step"] == 7
    monkeypatch.setattr(pt, "_train_step", real)
    r = pretrain(cfg(tmp_path / "i", steps=12, save_every=100, eval_every=100, resume=True))
    steps = [json.loads(l)["step"] for l in (tmp_path / "i" / "metrics.jsonl").read_text().splitlines()]
    assert r["steps"] == 12 and 7 in steps  # the resumed run's first record is at step 7 (none there before)
    with caplog.at_level("WARNING"):
        pretrain(cfg(tmp_path / "fresh", steps=2, save_every=100, eval_every=100, resume=True))
    assert "nothing to resume" in caplog.text
