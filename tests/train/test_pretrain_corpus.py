"""Pre-training on a built corpus (``--corpus``): held-out perplexity per package, a wall-clock
budget that ends with a checkpoint, the model presets and the MFU arithmetic."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.model.config import TinyModelConfig  # noqa: E402
from sparserl.train.pretrain import PretrainConfig, pretrain  # noqa: E402
from sparserl.train.throughput import matmul_params, mfu, peak_tflops  # noqa: E402
from tests.corpus.test_pack import make_corpus  # noqa: E402

SHAPE = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=32)


def cfg(out, corpus, **kw) -> PretrainConfig:
    base = dict(out=str(out), corpus_dir=str(corpus), vocab_size=400, shape=SHAPE, seq_len=32, batch_size=4,
                steps=8, lr=3e-3, warmup_steps=2, eval_every=4, save_every=4, heldout_tokens=2000, device="cpu")
    return PretrainConfig(**(base | kw))


def test_pretrain_on_a_built_corpus_reports_each_heldout_package(tmp_path) -> None:
    """Each held-out package's perplexity; the headline over the packages held out whole only, the shares of
    packages trained on apart. Kills: the headline pooled over the shares too (a share of near-copies of
    training files made it look low), the shares listed among the packages held out whole."""
    make_corpus(tmp_path / "c")
    r = pretrain(cfg(tmp_path / "run", tmp_path / "c", steps=4, eval_every=2, save_every=2))
    assert r["steps"] == 4 and r["heldout_whole_packages"] == ["beta"]
    ppl, share = r["heldout_ppl_by_package"], r["heldout_share_ppl_by_package"]
    assert set(ppl) == {"beta"} and set(share) == {"alpha"}
    assert all(1 < v < 400 for v in (*ppl.values(), *share.values()))
    assert r["eval/heldout_ppl"] == ppl["beta"] == r["eval/heldout_ppl/beta"]
    assert r["eval/heldout_share_ppl"] == share["alpha"] == r["eval/heldout_share_ppl/alpha"]
    assert r["mfu"] is None and r["peak_tflops"] is None and r["tokens_per_s"] > 0  # no peak known for a CPU
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rows if "eval/heldout_ppl/beta" in m] == [2, 4]
    # the built corpus was tokenised once into run/pack; a resumed run uses that pack as it is
    pack_json = tmp_path / "run" / "pack" / "pack.json"
    before = pack_json.stat().st_mtime_ns
    r2 = pretrain(cfg(tmp_path / "run", tmp_path / "c", steps=6, eval_every=2, save_every=2, resume=True))
    assert r2["steps"] == 6 and pack_json.stat().st_mtime_ns == before


def test_a_run_folders_pack_is_made_again_for_another_corpus_or_settings(tmp_path) -> None:
    """A run into a folder holding an earlier run's pack (``pretrain --force``) packs again when the corpus or the
    pack's settings differ, and a resumed run refuses a pack that differs in one line. Kills: OUT/pack reused
    whatever corpus, vocabulary, seed or tokenizer it was made from; the manifest's hash or the settings not
    recorded or not compared."""
    import hashlib

    c1, c2, run = tmp_path / "c1", tmp_path / "c2", tmp_path / "run"
    make_corpus(c1, files=40)
    make_corpus(c2, files=40, seed=1)
    small = dict(steps=2, eval_every=2, save_every=2)
    pack_json = run / "pack" / "pack.json"

    def made() -> tuple[str, int, int]:
        info = json.loads(pack_json.read_text())
        return info["manifest_sha256"], info["settings"]["vocab_size"], info["settings"]["seed"]

    def sha(corpus) -> str:
        return hashlib.sha256((corpus / "manifest.jsonl").read_bytes()).hexdigest()

    pretrain(cfg(run, c1, **small))
    assert made() == (sha(c1), 400, 0)
    r = pretrain(cfg(run, c1, vocab_size=500, **small))
    assert made() == (sha(c1), 500, 0)
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(run / "model").vocab_size == json.loads(pack_json.read_text())["vocab_size"]
    pretrain(cfg(run, c2, vocab_size=500, seed=3, **small))
    assert made() == (sha(c2), 500, 3) and r["corpus"] == str(run / "pack")
    with pytest.raises(SparseRLError,
                       match=r"was packed with other settings \(vocab_size 500, not 400; seed 3, not 0\)"):
        pretrain(cfg(run, c2, resume=True, steps=4, eval_every=2, save_every=2))


def test_minutes_budget_ends_with_a_checkpoint_and_decayed_lr(tmp_path) -> None:
    """On a pack given directly. Kills: a budget that is ignored (runs all 100000 steps), a stop
    without a last save and evaluation, a learning rate that decays over the steps instead."""
    from sparserl.corpus.pack import PackConfig, pack

    make_corpus(tmp_path / "c")
    pack(PackConfig(corpus=str(tmp_path / "c"), out=str(tmp_path / "p"), vocab_size=400, max_mib=0))
    c = cfg(tmp_path / "run", tmp_path / "p", steps=100_000, minutes=0.15, warmup_steps=1, eval_every=10_000,
            save_every=10_000)
    r = pretrain(c)
    assert r["stopped"] == "minutes" and 2 <= r["steps"] < 100_000
    assert set(r["heldout_ppl_by_package"]) == {"beta"} and set(r["heldout_share_ppl_by_package"]) == {"alpha"}
    st = torch.load(tmp_path / "run" / "state.pt", weights_only=False)
    assert st["step"] == r["steps"] and st["elapsed_s"] >= 9.0
    assert r["charts/lr"] < 0.9 * c.lr  # decayed over the budget, not over 100000 steps
    from transformers import AutoModelForCausalLM

    assert sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model").parameters()) \
        == r["params"]


def test_bad_corpus_folders(tmp_path) -> None:
    """Kills: a corpus with no package held out whole trained on, its headline perplexity over shares of
    packages the model trains on; a pack of a corpus built under the earlier rules (no corpus_version) trained
    on."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(SparseRLError, match="neither a built corpus"):
        pretrain(cfg(tmp_path / "run", tmp_path / "empty"))
    make_corpus(tmp_path / "c", files=40)
    (tmp_path / "c" / "summary.json").write_text(json.dumps({"corpus_version": 2, "heldout_packages": []}))
    with pytest.raises(SparseRLError, match="no package is held out whole") as e:
        pretrain(cfg(tmp_path / "run", tmp_path / "c"))
    assert "\n" not in str(e.value)
    from sparserl.corpus.pack import PackConfig, pack

    make_corpus(tmp_path / "c2", files=40)
    pack(PackConfig(corpus=str(tmp_path / "c2"), out=str(tmp_path / "p"), vocab_size=400, max_mib=0))
    info = json.loads((tmp_path / "p" / "pack.json").read_text())
    del info["corpus_version"]
    (tmp_path / "p" / "pack.json").write_text(json.dumps(info))
    with pytest.raises(SparseRLError, match="packed from a corpus built under corpus rules 1, not 2"):
        pretrain(cfg(tmp_path / "run2", tmp_path / "p"))
    assert not (tmp_path / "run2" / "tokens").exists() or not any((tmp_path / "run2" / "tokens").iterdir()), \
        "an old pack is refused before its streams are decompressed"
    with pytest.raises(SparseRLError, match="no such folder"):
        cfg(tmp_path / "run", tmp_path / "missing")
    with pytest.raises(SparseRLError, match="unknown model preset"):
        cfg(tmp_path / "run", tmp_path / "empty", preset="huge")


def test_presets_sizes() -> None:
    """The base preset is Qwen3-shaped at 150-300M parameters; the default stays about 29M."""
    from transformers import AutoModelForCausalLM

    from sparserl.model.config import PRESETS, hf_config

    sizes = {}
    for name, shape in PRESETS.items():
        with torch.device("meta"):
            m = AutoModelForCausalLM.from_config(hf_config(8192, shape))
        sizes[name] = sum(p.numel() for p in m.parameters())
        assert type(m).__name__ == "Qwen3ForCausalLM"
    assert 150e6 <= sizes["base"] <= 300e6 and 28e6 <= sizes["default"] <= 31e6


def test_mfu_arithmetic() -> None:
    """6 N tokens/s over the peak; a tied embedding counts once, an untied input embedding not at all."""
    from transformers import AutoModelForCausalLM

    from sparserl.model.config import hf_config

    tied = AutoModelForCausalLM.from_config(hf_config(300, SHAPE))
    untied = AutoModelForCausalLM.from_config(hf_config(300, SHAPE, tie_word_embeddings=False))
    n_tied = sum(p.numel() for p in tied.parameters())
    assert matmul_params(tied) == n_tied
    assert matmul_params(untied) == sum(p.numel() for p in untied.parameters()) - 300 * 64 == n_tied
    assert math.isclose(mfu(200_000_000, 400_000, 989.0), 6 * 2e8 * 4e5 / 989e12)
    assert mfu(1, 1.0, None) is None
    assert peak_tflops("NVIDIA H200") == 989.0 and peak_tflops("NVIDIA GH200 480GB") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_tflops("Tesla T4") is None


@pytest.mark.slow(seconds=11)
def test_base_preset_trains_a_few_steps_on_cpu(tmp_path) -> None:
    """The ~210M base preset end to end at a tiny window: forward, backward, checkpoint, perplexity."""
    make_corpus(tmp_path / "c")
    r = pretrain(cfg(tmp_path / "run", tmp_path / "c", preset="base", seq_len=16, batch_size=1, steps=2,
                     eval_every=2, heldout_tokens=64))
    assert 150e6 <= r["params"] <= 300e6 and r["steps"] == 2 and r["eval/heldout_ppl"] > 1


def test_cli_corpus_errors_are_one_line(tmp_path, cli) -> None:
    """A folder that is neither a corpus nor a pack, and one whose manifest lists nothing: one
    'error:' line each, and no run folder left holding a half-made model."""
    from tests.conftest import one_line_error

    (tmp_path / "empty").mkdir()
    one_line_error(cli("pretrain", "--corpus", tmp_path / "empty", "--out", tmp_path / "run"), "neither a built corpus")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "manifest.jsonl").write_text("\n")
    one_line_error(cli("pretrain", "--corpus", tmp_path / "bare", "--out", tmp_path / "run2"), "nothing usable")
    assert not (tmp_path / "run2" / "model").exists()
