"""benchmarks/completion_lengths.py on the CPU: the specialised kernels' lengths in a tokenizer's tokens beside
the library's budget, and bad input as one line. Mutations killed: a count taken in characters or another
tokenizer's tokens, the budget not the one every stage gives, a kernel over the budget not counted, generic
templates counted as specialised, an unknown family or a folder without a tokenizer let through."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from tests.conftest import load_benchmark  # noqa: E402

bench = load_benchmark("completion_lengths")


def test_every_specialised_seed_is_counted_in_the_tokenizers_tokens(tiny_model_dir, tiny_tokenizer, tmp_path) -> None:
    from sparserl.kernels.templates import templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card
    from sparserl.model.budget import completion_budget

    out = tmp_path / "l.json"
    assert bench.main(["--tokenizer", str(tiny_model_dir), "--families", "diagonal,skewed", "--rows", "3000",
                       "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["library_budget"] == completion_budget(tiny_tokenizer, None)
    card = matrix_card(generate("skewed", 3000, seed=0))
    spec = [t for t in templates("spmv") if t.specialised]
    want = sorted((len(tiny_tokenizer(t.render(p, card), add_special_tokens=False)["input_ids"]), t.name)
                  for t in spec for p in t.seed_points(card, None) if t.check(p, card, None) is None)
    seeds = got["families"]["skewed"]["seeds"]
    assert sorted((s["tokens"], s["template"]) for s in seeds) == want and want
    assert all(s["template"].endswith("_spec") for f in got["families"].values() for s in f["seeds"])
    assert got["families"]["skewed"]["over_budget"] == sum(s["tokens"] >= got["library_budget"] for s in seeds)


def test_bad_input_is_one_line(tiny_model_dir, tmp_path, capsys) -> None:
    assert bench.main(["--tokenizer", str(tiny_model_dir), "--families", "nope", "--out", str(tmp_path / "a")]) == 2
    assert bench.main(["--tokenizer", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_judge_gives_the_harness_verdicts_as_written_and_cut_at_the_budget(tiny_model_dir, tmp_path) -> None:
    """Kills: a cut that keeps the whole kernel, verdicts from something other than the harness, a kernel under
    the budget judged as cut."""
    from sparserl.harness.compile import find_nvcc

    if find_nvcc() is None:
        pytest.skip("needs nvcc")
    out = tmp_path / "j.json"
    assert bench.main(["--tokenizer", str(tiny_model_dir), "--families", "lp", "--rows", "3000", "--judge",
                       "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    seeds = got["families"]["lp"]["seeds"]
    assert seeds and all(s["verdict"] == "no_gpu" for s in seeds)  # every seed as written gets through the front
    assert any(s["tokens"] >= got["library_budget"] for s in seeds)  # csr_adaptive_spec: past the budget here too
    for s in seeds:
        if s["tokens"] >= got["library_budget"]:
            assert s["cut_verdict"] in ("static_check", "contract_error", "compile_error", "extract_error"), s
        else:
            assert s["cut_verdict"] == "no_gpu", s
