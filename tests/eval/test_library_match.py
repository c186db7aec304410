"""Where samples come from against the library: exact variants, mismatched headers, new bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.eval.library_match import LibraryMatch, library_match, library_match_table, markdown, shares
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import get_variant, variants


@pytest.mark.parametrize("op", ["spmv", "spmm"])
def test_every_library_variant_is_library(op: str) -> None:
    vs = variants(op)
    assert vs and all(library_match(v.render(), op) is LibraryMatch.LIBRARY for v in vs)


def test_whitespace_does_not_matter_but_a_constant_does() -> None:
    text = get_variant("spmv/csr_vector/-/tpr=8,block=256").render()
    assert library_match(text.replace("\n", "\n\n").replace("    ", "\t") + "\n\n", "spmv") is LibraryMatch.LIBRARY
    head, body = text.split("\n\n", 1)
    assert "8" in body
    changed = head + "\n\n" + body.replace("& 7", "& 3", 1)
    assert changed != text and library_match(changed, "spmv") is LibraryMatch.NEW
    assert library_match("FORMAT: CSR\nLAUNCH: grid=1, block=1\n", "spmv") is LibraryMatch.NEW
    assert library_match("", "spmv") is LibraryMatch.NEW


def test_a_completion_is_read_as_the_harness_reads_it() -> None:
    """Chatter, fences and markdown on the header do not make a library kernel new: the harness runs it as one."""
    text = get_variant("spmv/csr_vector/-/tpr=8,block=256").render()
    head, body = text.split("\n\n", 1)
    wrapped = "Here is the kernel.\n\n```cuda\n" + head.replace("FORMAT:", "**FORMAT:**") + "\n" + body + "```\nDone."
    assert wrapped != text and library_match(wrapped, "spmv") is LibraryMatch.LIBRARY
    assert library_match("FORMAT: NOPE\nLAUNCH: grid=1, block=32\n\n" + body, "spmv") is LibraryMatch.NEW  # no such format


def test_a_body_under_another_variants_header_is_a_mismatch() -> None:
    """The failure seen on the GPU: a 2x2 BSR body under a 4x4 header (the launch covers the wrong rows)."""
    two = get_variant("spmv/bsr_group/R=2,C=2/g=32,block=128").render()
    four = get_variant("spmv/bsr_group/R=4,C=4/g=32,block=256").render()
    h2, b2 = split_completion(two, Op.SPMV)
    h4, b4 = split_completion(four, Op.SPMV)
    assert h2 != h4 and b2 != b4 and h4.render().startswith("FORMAT: BSR R=4 C=4\n")
    mixed = h4.render() + "\n\n" + two.split("\n\n", 1)[1]
    assert library_match(mixed, "spmv") is LibraryMatch.MISMATCH
    assert library_match(mixed, "spmm") is LibraryMatch.NEW  # an SpMV body is not in the SpMM library
    # a header the library never writes at all, over a library body: still not the library's kernel
    odd = "FORMAT: BSR R=4 C=4\nLAUNCH: grid=ceil_div(mb, 3), block=96\n\n" + two.split("\n\n", 1)[1]
    assert library_match(odd, "spmv") is LibraryMatch.MISMATCH


def test_table_counts_samples_and_correct_ones_per_class() -> None:
    lib = get_variant("spmv/csr_vector/-/tpr=8,block=256").render()
    two = get_variant("spmv/bsr_group/R=2,C=2/g=32,block=128").render()
    four_head = split_completion(get_variant("spmv/bsr_group/R=4,C=4/g=32,block=256").render(), Op.SPMV)[0].render()
    mixed = four_head + "\n\n" + two.split("\n\n", 1)[1]
    t = library_match_table([("a", lib, True), ("a", lib, False), ("a", mixed, False), ("b", "junk", False)], "spmv")
    assert t["a"] == {"library": {"samples": 2, "correct": 1}, "mismatch": {"samples": 1, "correct": 0},
                      "new": {"samples": 0, "correct": 0}}
    assert t["b"]["new"] == {"samples": 1, "correct": 0} and t["b"]["library"]["samples"] == 0
    md = markdown(t)
    assert md[0] == "## Samples against the library"
    assert "| a | 2 (67%), 50% correct | 1 (33%), 0% correct | 0 |" in md
    assert "| b | 0 | 0 | 1 (100%), 0% correct |" in md
    assert markdown({}) == []
    assert shares(t["a"]) == {"library_share": 2 / 3, "mismatch_share": 1 / 3, "new_share": 0.0}
    assert shares(None) == {} and shares({"library": {"samples": 0, "correct": 0}}) == {}


def test_rescore_adds_the_table_from_saved_completions(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    from sparserl.eval.rescore import rescore

    lib = get_variant("spmv/csr_vector/-/tpr=8,block=256").render()
    rec = {"family": "banded", "n": 2, "compiled": 2, "correct": 1, "best_speedup": 2.0, "best_format": "CSR",
           "roofline": 0.5, "kinds": {}}
    result = {"config": {"samples": 2}, "op": "spmv", "k": None, "per_matrix": {"sft": {"m0": rec}},
              "summary": {}, "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1,
                                       "geomean_speedup": 1.4}, "format_confusion_vs_oracle": {}}
    (tmp_path / "eval.json").write_text(json.dumps(result))
    lines = [{"system": "sft", "matrix": "m0", "verdict": "none", "speedup": 2.0, "completion": lib},
             {"system": "sft", "matrix": "m0", "verdict": "incorrect", "speedup": None, "completion": "junk"}]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = rescore(tmp_path)
    assert out["library_match"]["sft"]["library"] == {"samples": 1, "correct": 1}
    assert out["library_match"]["sft"]["new"] == {"samples": 1, "correct": 0}
    md = (tmp_path / "eval.md").read_text()
    assert "## Samples against the library" in md and "| sft | 1 (50%), 100% correct | 0 | 1 (50%), 0% correct |" in md
