"""benchmarks/facts_copy.py: a policy's specialised samples, their facts against the card, and the teacher's distinct
facts (CPU). Mutations killed: every sample taken to have the card's facts (another draw's long rows), a wrong block
not looked up among the teacher's, a right one not told apart as taught, a teacher row's facts counted under the
wrong family or not at all (distinct facts per template), another system's samples let through ``--system``, and a
missing file or an empty selection passing silently."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sparserl.eval.compare import EvalConfig, family_set
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from tests.conftest import load_benchmark

bench = load_benchmark("facts_copy")
ROWS = 6000  # the set's skewed matrix has 6 long rows


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "eval-families").mkdir(parents=True)
    (run / "sft-data").mkdir()
    cfg = asdict(EvalConfig(matrices="families", family_rows=ROWS, out=str(run / "eval-families")))
    cfg["distinct_from"] = ["/elsewhere/data"]  # the device's paths: not read again
    (run / "eval-families" / "eval.json").write_text(json.dumps({"config": cfg, "op": "spmv"}))
    spec = get_template("spmv", "csr_adaptive_spec")  # the template that spells its facts (its long-row table)
    point = {"rpw": 32, "items": 8, "long_len": 1024, "seg": 1024, "block": 256}  # a table of the 6 long rows
    here = matrix_card(dict(family_set(ROWS))["skewed"])
    taught = matrix_card(generate("skewed", ROWS, seed=1))  # another draw the teacher searched
    powerlaw = matrix_card(generate("powerlaw", ROWS, seed=1))
    samples = [("base", spec.render(point, here), "none"),                    # copied from the card
               ("base", spec.render({**point, "block": 128}, taught), "incorrect"),  # a training matrix's rows
               ("base", spec.render({**point, "rpw": 64}, powerlaw), "incorrect"),   # no long row: LONG_ROWS = 0
               ("other", spec.render(point, taught), "incorrect")]
    (run / "eval-families" / "completions.jsonl").write_text("".join(
        json.dumps({"system": s, "matrix": f"skewed_{ROWS}", "verdict": v, "completion": c}) + "\n"
        for s, c, v in samples))
    rows = [{"family": "best_known", "matrix": f"teacher/skewed_000_{ROWS}.npz", "shape": [ROWS, ROWS],
             "code": spec.render({**point, "block": 128}, taught)},
            {"family": "best_known", "matrix": "teacher/powerlaw_001_9000.npz", "shape": [9000, 9000],
             "code": spec.render({**point, "rpw": 64}, powerlaw)},
            {"family": "skewed", "matrix": f"data/skewed_000_{ROWS}.npz", "shape": [ROWS, ROWS],
             "code": spec.render(point, here)},
            {"family": "skewed", "matrix": "data/x.npz", "shape": [ROWS, ROWS],
             "code": get_template("spmv", "csr_adaptive").render(
                 next(iter(get_template("spmv", "csr_adaptive").seeds(here, None))), here)}]
    (run / "sft-data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_samples_facts_against_the_card_and_the_teacher(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path)
    assert bench.main([str(run), "--system", "base", "--out", str(tmp_path / "f.json")]) == 0
    got = json.loads((tmp_path / "f.json").read_text())
    assert got["samples"] == {"csr_adaptive_spec": {f"skewed_{ROWS}": {
        "samples": 3, "correct": 1, "facts_as_card": 1, "facts_as_card_correct": 1, "facts_as_card_taught": 1,
        "other_facts": 2, "other_facts_correct": 0, "other_facts_from_teacher": 2}}}
    assert got["teacher"] == {"csr_adaptive_spec": {"rows": 3, "distinct_facts": 3, "families": {
        "skewed": {"rows": 2, "distinct_facts": 2}, "powerlaw": {"rows": 1, "distinct_facts": 1}}}}
    assert "csr_adaptive_spec: 3 samples, 1 correct" in capsys.readouterr().out


def test_every_system_by_default_and_bad_input(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path)
    assert bench.main([str(run), "--out", str(tmp_path / "f.json")]) == 0
    got = json.loads((tmp_path / "f.json").read_text())
    assert got["samples"]["csr_adaptive_spec"][f"skewed_{ROWS}"]["samples"] == 4
    assert bench.main([str(run), "--system", "nobody"]) == 2
    assert "no samples of nobody" in capsys.readouterr().err
    assert bench.main([str(run), "--set", "test"]) == 2
    assert "eval-test/eval.json does not exist" in capsys.readouterr().err
