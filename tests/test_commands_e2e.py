"""Commands that had no successful end-to-end run in the tests: each runs as the console entry point
runs it, on a CPU, and its exit status is asserted (0 on success, 2 on bad input)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.kernels.library import variants


def test_library_render_prints_the_kernel_and_refuses_an_unknown_id(cli) -> None:
    """``sparserl library render ID``: the completion text of that variant, the whole of it. Kills: render
    printing another variant's text, or a cut one; an unknown id exiting 0 or with a traceback."""
    v = variants("spmv", "CSR")[-1]
    res = cli("library", "render", v.id)
    assert res.rc == 0, res.err
    assert res.out.strip() == v.render().strip()
    assert res.out.startswith("FORMAT: CSR") and "spmv_kernel" in res.out
    bad = cli("library", "render", "spmv/no_such_strategy/-/block=1")
    assert bad.rc == 2 and bad.err.strip().startswith("error:") and len(bad.err.strip().splitlines()) == 1, bad.err


def test_rescore_recomputes_a_saved_evaluation(cli, tmp_path: Path) -> None:
    """``sparserl rescore FOLDER`` on an evaluation's eval.json and completions.jsonl: speedup@1 is
    recomputed from the samples (here by hand: sft's samples on m0 are 4.0x and 1.0x, on m1 one
    incorrect (1.0x) and 2.0x, so the geometric mean over matrices of the per-matrix geometric means is
    (2 * sqrt 2) ** 0.5), written to eval.json and eval.md, and eval.md is printed. Kills: the command
    not writing back, or averaging samples arithmetically; a missing folder exiting other than 2."""
    rec = lambda n, best: {"family": "banded", "n": n, "compiled": n, "correct": n, "best_speedup": best,  # noqa: E731
                           "best_format": "DIA", "roofline": 0.5, "kinds": {}}
    result = {"config": {"samples": 2}, "op": "spmv", "k": None,
              "per_matrix": {"cuSPARSE": {"m0": rec(1, 1.0), "m1": rec(1, 1.0)},
                             "sft": {"m0": rec(2, 4.0), "m1": rec(2, 2.0)}},
              "summary": {}, "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1,
                                       "geomean_speedup": 1.4}, "format_confusion_vs_oracle": {}}
    (tmp_path / "eval.json").write_text(json.dumps(result))
    samples = [("m0", "none", 4.0), ("m0", "none", 1.0), ("m1", "incorrect", None), ("m1", "none", 2.0)]
    (tmp_path / "completions.jsonl").write_text("".join(
        json.dumps({"system": "sft", "matrix": m, "verdict": v, "speedup": s}) + "\n" for m, v, s in samples))
    res = cli("rescore", tmp_path)
    assert res.rc == 0, res.err
    saved = json.loads((tmp_path / "eval.json").read_text())["summary"]["sft"]["speedup@1"]
    assert saved == pytest.approx((2.0 * 2 ** 0.5) ** 0.5)
    assert res.out.strip() == (tmp_path / "eval.md").read_text().strip() and "speedup@1" in res.out
    missing = cli("rescore", tmp_path / "nowhere")
    assert missing.rc == 2 and missing.err.strip().startswith("error:"), missing.err


def test_corpus_pack_writes_a_pack_that_opens(cli, tmp_path: Path) -> None:
    """``sparserl corpus pack`` on a small built corpus: exit 0, a pack whose train stream holds the
    tokens the command reports, and a refusal (exit 2, one line) of a folder that is not a corpus.
    Kills: the command's figures not being the pack's; a non-corpus folder packed or a traceback."""
    pytest.importorskip("tokenizers")
    from sparserl.corpus.pack import open_pack
    from tests.corpus.test_pack import make_corpus

    make_corpus(tmp_path / "corpus", files=60)
    res = cli("corpus", "pack", "--corpus", tmp_path / "corpus", "--out", tmp_path / "pack", "--vocab-size", "400",
              "--max-mib", "0", "--library-repeats", "2", "--tokenizer-mb", "1")
    assert res.rc == 0, res.err
    figures = json.loads(res.out[:res.out.rindex("}") + 1])
    pack = open_pack(tmp_path / "pack", scratch=tmp_path / "scratch")
    assert figures["train_tokens"] == pack.train.size > 0, figures
    assert figures["heldout_tokens"] == {name: int(s.size) for name, s in pack.heldout.items()}, figures
    (tmp_path / "empty").mkdir()
    bad = cli("corpus", "pack", "--corpus", tmp_path / "empty", "--out", tmp_path / "pack2")
    assert bad.rc == 2 and bad.err.strip().startswith("error:") and len(bad.err.strip().splitlines()) == 1, bad.err


def test_library_compile_builds_one_formats_variants(cli, tmp_path: Path) -> None:
    """``sparserl library compile --op spmv --format DIA``: exit 0, and the cache then holds one compiled
    kernel per DIA SpMV variant (counted independently of the command's own message). Kills: the
    command exiting 0 without compiling, or compiling another format."""
    from sparserl.harness.compile import find_nvcc

    if find_nvcc() is None:
        pytest.skip("needs nvcc")
    want = variants("spmv", "DIA")
    res = cli("library", "compile", "--op", "spmv", "--format", "DIA", "--cache-dir", tmp_path / "cache", "--jobs", "2")
    assert res.rc == 0, res.err
    built = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix in (".cubin", ".ptx")]
    assert len({p.stem for p in built}) >= len({v.render() for v in want}) > 0, (len(built), len(want))


@pytest.mark.slow(seconds=12)
def test_data_build_evaluate_and_grpo_run_end_to_end_on_a_cpu(cli, tmp_path: Path, tiny_model_dir: Path) -> None:
    """The model-side commands chained as a user on a CPU runs them, each exit 0 with its files:
    ``data build`` (compile-only targets), ``evaluate`` of a checkpoint on its val split (compile-only),
    ``grpo`` for one step. Kills: any of them failing after its argument checks (the tests ran only their
    error paths), or writing a report that does not count the samples it drew."""
    pytest.importorskip("torch")
    data, ev, rl = tmp_path / "data", tmp_path / "eval", tmp_path / "grpo"
    res = cli("data", "build", "--families", "banded,random", "--per-family", "3", "--min-rows", "200",
              "--max-rows", "400", "--ops", "spmv", "--compile-only", "--val-fraction", "0.34", "--test-fraction",
              "0.34", "--out", data)
    assert res.rc == 0, res.err
    rows = {s: (data / f"{s}.jsonl").read_text().splitlines() for s in ("train", "val", "test")}
    assert all(rows.values()), {s: len(r) for s, r in rows.items()}
    val_matrices = {json.loads(r)["matrix"] for r in rows["val"]}
    res = cli("evaluate", "--matrices", data, "--split", "val", "--samples", "2", "--max-new-tokens", "16",
              "-c", f"tiny={tiny_model_dir}", "--compile-only", "--no-plots", "--out", ev)
    assert res.rc == 0, res.err
    per_matrix = json.loads((ev / "eval.json").read_text())["per_matrix"]["tiny"]
    assert len(per_matrix) == len(val_matrices) and all(r["n"] == 2 for r in per_matrix.values()), per_matrix
    res = cli("grpo", "--model", tiny_model_dir, "--matrices", data, "--steps", "1", "--matrices-per-step", "2",
              "--samples-per-matrix", "2", "--max-new-tokens", "16", "--compile-only", "--device", "cpu", "--out", rl)
    assert res.rc == 0, res.err
    steps = [json.loads(ln) for ln in (rl / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "reward/mean" in s]  # a step-0 row holds the held-out figures only
    assert [s["step"] for s in trained] == [1] and (rl / "checkpoint").is_dir(), steps
