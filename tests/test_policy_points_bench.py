"""benchmarks/policy_points.py: a policy's samples on the families that are a search template's point (CPU).
Mutations killed: every sample taken for a point (free text, another draw's long-row table), the verdict ignored
(an incorrect point counted correct) or a slow one (correct, stopped early) counted wrong, a point written twice
counted as two distinct ones, another system's samples let through, and a file of several systems or a
matrix the families set has not passing silently."""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.eval.compare import family_set
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from tests.conftest import load_benchmark

bench = load_benchmark("policy_points")
ROWS = 6000


def _completions(tmp_path: Path) -> Path:
    here = matrix_card(dict(family_set(ROWS))["skewed"])
    other = matrix_card(generate("skewed", ROWS, seed=1))
    spec = get_template("spmv", "csr_adaptive_spec")
    point = {"rpw": 32, "items": 8, "long_len": 1024, "seg": 1024, "block": 256}
    vector = get_template("spmv", "csr_vector").render({"tpr": 8, "block": 256}, here)
    head, body = vector.split("\n\n", 1)
    samples = [("base", "Here:\n```cuda\n" + head + "\n\n// eight lanes\n" + body + "```", "none"),  # a point
               ("base", spec.render(point, here), "incorrect"),                    # a point, judged wrong
               ("base", spec.render(point, other), "incorrect"),                   # another draw's rows: no point
               ("base", head + "\n\n" + body.replace("(TPR - 1)", "(TPR - 2)", 1), "incorrect"),  # its own code
               ("base", spec.render(point, here), "slow"),                         # a point, correct (slow)
               ("other", vector, "none")]
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps({"system": s, "matrix": f"skewed_{ROWS}", "verdict": v, "completion": c}) + "\n"
                            for s, c, v in samples))
    return path


def test_counts_the_samples_that_are_template_points(tmp_path: Path) -> None:
    path = _completions(tmp_path)
    out = tmp_path / "points.json"
    assert bench.main([str(path), "--family-rows", str(ROWS), "--system", "base", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["total"] == {"samples": 5, "correct": 2, "points": 3, "points_correct": 2, "distinct_points": 2}
    assert got["matrices"][f"skewed_{ROWS}"]["templates"] == {"csr_vector": 1, "csr_adaptive_spec": 2, "None": 2}
    assert got["system"] == "base" and got["completions"] == "completions.jsonl"


def test_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    path = _completions(tmp_path)
    assert bench.main([str(path), "--family-rows", str(ROWS)]) == 2
    assert "choose one with --system" in capsys.readouterr().err
    assert bench.main([str(path), "--family-rows", str(ROWS), "--system", "nobody"]) == 2
    assert "no samples of system 'nobody'" in capsys.readouterr().err
    assert bench.main([str(path), "--family-rows", "7000", "--system", "base"]) == 2
    assert "no family matrix of 7000 rows is named skewed_6000" in capsys.readouterr().err
    assert bench.main([str(tmp_path / "none.jsonl")]) == 2
    assert "is not a file" in capsys.readouterr().err
