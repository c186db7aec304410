"""benchmarks/header_grammar_cover.py: the counts per verdict on a completions file made here, the
lift check on a tokenizer, and its bad-input lines."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sparserl.kernels.library import variants

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("header_grammar_cover", REPO / "benchmarks" / "header_grammar_cover.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _rows():
    good = variants("spmv", "CSR")[0].render()
    return [
        {"system": "sft", "verdict": "none", "message": "", "completion": good},
        {"system": "sft", "verdict": "contract_error", "message": "unknown format 'EC'",
         "completion": "FORMAT: EC\nLAUNCH: grid=1, block=1\n\ncode"},
        {"system": "sft", "verdict": "contract_error", "message": "kernel 'k' named by LAUNCH is not defined",
         "completion": "FORMAT: CSR\nLAUNCH: grid=1, block=1, kernel=k\n\ncode"},
        {"system": "sft", "verdict": "compile_error", "message": "cut at the token budget",
         "completion": "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, "},  # a header prefix: could have been drawn
        {"system": "library oracle", "verdict": "none", "message": "", "completion": "FORMAT: EC"},  # a baseline
        {"system": "sft", "verdict": "static_check", "message": "unbalanced '{'",  # a runaway number
         "completion": "FORMAT: DIA\nLAUNCH: grid=1, block=1\n\nconstexpr int RUNS[] = {-1204, " + "1" * 40},
        {"system": "sft", "verdict": "static_check", "message": "non-ASCII", "completion": good[:-30] + "\ufffd C;"},
    ]


def test_counts_headers_outside_the_grammar_by_verdict(tmp_path, capsys) -> None:
    """One malformed header of two contract errors is outside; the accepted sample and a sample cut
    inside its header are inside; baselines are not counted; a runaway number and a non-ASCII character
    after a header inside the grammar are counted apart, as the code's. Mutations killed: every contract error
    counted as outside, a cut header counted as outside, baselines counted, the code's rules unchecked."""
    f = tmp_path / "completions.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    out = tmp_path / "cover.json"
    assert bench.main([str(f), "--out", str(out)]) == 0
    got = json.loads(out.read_text())["by_verdict"]
    assert got == {"compile_error": {"samples": 1, "outside": 0, "code_refused": 0},
                   "contract_error": {"samples": 2, "outside": 1, "code_refused": 0},
                   "none": {"samples": 1, "outside": 0, "code_refused": 0},
                   "static_check": {"samples": 2, "outside": 0, "code_refused": 2}}
    assert "| contract_error | 2 | 1 | 0 |" in capsys.readouterr().out


def test_the_lift_follows_every_library_variant(tmp_path, tiny_tokenizer) -> None:
    """With a tokenizer: every library variant's own tokens stay allowed to the header's end."""
    pytest.importorskip("torch")
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(_rows()[0]) + "\n")
    out = tmp_path / "cover.json"
    assert bench.main([str(f), "--tokenizer", str(tmp_path / "tok"), "--out", str(out)]) == 0
    t = json.loads(out.read_text())["tokenizer"]
    assert t["library_variants"] >= 100 and t["library_variants_refused"] == [] and t["states"] > 50


@pytest.mark.parametrize("make, says", [
    (lambda d: [str(d / "none.jsonl")], "no completions file"),
    (lambda d: [str(d / "c.jsonl"), "--tokenizer", str(d)], "holds no tokenizer"),
    (lambda d: [str(d / "bad.jsonl")], "is not an evaluation's completions.jsonl"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, make, says) -> None:
    (tmp_path / "c.jsonl").write_text(json.dumps(_rows()[0]) + "\n")
    (tmp_path / "bad.jsonl").write_text("not json\n")
    assert bench.main(make(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1
