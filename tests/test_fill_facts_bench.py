"""benchmarks/fill_facts.py: which of a held-out set's samples the card's facts would change, and the correct share
before and after with the filled kernels' verdicts (CPU; the harness's judging itself runs on a GPU). Mutations
killed: a sample with the card's facts counted as filled, a correct sample's verdict dropped from the share after
the fill, a filled kernel's new verdict not counted, another system's samples let through ``--system``, and
``--judge`` without a GPU or a missing file passing silently, and a set evaluated with a second temperature
(``--system-temperature``) refused for want of its checkpoints."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict
from pathlib import Path

from sparserl.eval.compare import EvalConfig, family_set
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from tests.conftest import load_benchmark

bench = load_benchmark("fill_facts")
ROWS = 6000  # the set's skewed matrix has 6 long rows


def _point(**kw) -> dict:
    """A point of csr_adaptive_spec (the template that spells its facts) with a table of the 6 long rows."""
    return {"rpw": 32, "items": 8, "long_len": 1024, "seg": 1024, "block": 256, **kw}


def _run(tmp_path: Path, **config) -> Path:
    run = tmp_path / "run"
    (run / "eval-families").mkdir(parents=True)
    cfg = asdict(EvalConfig(matrices="families", family_rows=ROWS, out=str(run / "eval-families"), **config))
    (run / "eval-families" / "eval.json").write_text(json.dumps({"config": cfg, "op": "spmv"}))
    spec = get_template("spmv", "csr_adaptive_spec")
    here = matrix_card(dict(family_set(ROWS))["skewed"])
    other = matrix_card(generate("skewed", ROWS, seed=1))  # another draw's 6 long rows
    garbled, n = re.subn(r"c_long_row\[6\] = \{[^}]*\}", "c_long_row[6] = {- c, 0}",  # as a policy garbles it
                         spec.render(_point(rpw=64), other))
    assert n == 1  # the table of long rows is there to garble
    samples = [("base", spec.render(_point(), here), "none"),                   # the card's facts: kept
               ("base", spec.render(_point(block=128), other), "incorrect"),   # filled
               ("base", garbled, "compile_error"),                              # filled
               ("base", "FORMAT: CSR\nnot a kernel", "contract_error"),        # nothing to fill
               ("other", spec.render(_point(), other), "incorrect")]
    (run / "eval-families" / "completions.jsonl").write_text("".join(
        json.dumps({"system": s, "matrix": f"skewed_{ROWS}", "verdict": v, "completion": c}) + "\n"
        for s, c, v in samples))
    return run


def test_the_samples_the_fill_changes_are_counted_with_their_verdicts(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path)
    assert bench.main([str(run), "--system", "base", "--out", str(tmp_path / "f.json")]) == 0
    got = json.loads((tmp_path / "f.json").read_text())
    assert (got["samples"], got["correct_before"], got["filled"]) == (4, 1, 2)
    assert got["filled_by_template"] == {"csr_adaptive_spec": 2}
    assert got["filled_verdicts_before"] == {"incorrect": 1, "compile_error": 1}
    assert "correct_after" not in got  # nothing judged: no figure after the fill
    assert "the fill changes 2 (csr_adaptive_spec 2)" in capsys.readouterr().out


def test_the_share_after_counts_the_filled_kernels_new_verdicts() -> None:
    """``tally`` with judged verdicts: a filled sample that passes adds one, one that still fails adds none, and
    the samples not filled keep theirs."""
    samples = [{"verdict": "none"}, {"verdict": "incorrect"}, {"verdict": "compile_error"}, {"verdict": "slow"}]
    filled = [(1, "csr_adaptive_spec", "a"), (2, "csr_adaptive_spec", "b")]
    got = bench.tally(samples, filled, {1: "none", 2: "incorrect"})
    assert (got["correct_before"], got["correct_after"]) == (2, 3)
    assert got["correct_share_after"] == 0.75
    assert got["filled_verdicts_after"] == {"none": 1, "incorrect": 1}


def test_judge_without_a_gpu_and_a_missing_set_are_errors(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path)
    if importlib.util.find_spec("cupy") is None:  # with CuPy (a GPU machine) the judging would run
        assert bench.main([str(run), "--system", "base", "--judge"]) == 2
        assert "no GPU visible" in capsys.readouterr().err
    assert bench.main([str(run), "--set", "test"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert bench.main([str(run), "--system", "nobody"]) == 2
    assert "no samples of nobody" in capsys.readouterr().err


def test_compile_says_whether_each_filled_kernel_compiles(tmp_path: Path, capsys) -> None:
    """``--compile`` compiles the filled kernels with nvcc (no GPU): the two filled ones do. Kills the count taken
    from the samples as written (one of them garbled, which nvcc refuses) instead of the filled kernels."""
    run = _run(tmp_path)
    assert bench.main([str(run), "--system", "base", "--compile", "--out", str(tmp_path / "f.json")]) == 0
    got = json.loads((tmp_path / "f.json").read_text())
    assert got["filled_compiled"] == 2 and [j["compiled"] for j in got["judged"]] == [True, True]
    assert "2 of the 2 filled kernels compile" in capsys.readouterr().out


def test_a_set_sampled_at_a_second_temperature_reads_without_its_checkpoints(tmp_path: Path) -> None:
    """A run with ``SECOND_TEMPERATURE`` evaluated ``base_t0.7`` from a checkpoint the folder does not hold: the set
    is re-made from its seeds and rows alone. Kills the saved config validated with its checkpoints gone (the fill
    refused, ``no checkpoint is named 'base_t0.7'``)."""
    run = _run(tmp_path, checkpoints=("base=/gone", "base_t0.7=/gone"), system_temperatures=("base_t0.7=0.7",))
    assert bench.main([str(run), "--system", "base", "--out", str(tmp_path / "f.json")]) == 0
    assert json.loads((tmp_path / "f.json").read_text())["filled"] == 2
