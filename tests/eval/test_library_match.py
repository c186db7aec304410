"""Where samples come from against the library: exact variants, library bodies with other numbers,
library bodies under headers none of their variants has, new bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.eval.library_match import (LibraryMatch, library_match, library_match_table, markdown, message_shape,
                                         shares)
from sparserl.kernels.library import get_variant, variants

VECTOR = "spmv/csr_vector/-/tpr=8,block=256"
BSR = "spmv/bsr_group/R=2,C=2/g=32,block=128"


@pytest.mark.parametrize("op", ["spmv", "spmm"])
def test_every_library_variant_is_library(op: str) -> None:
    vs = variants(op)
    assert vs and all(library_match(v.render(), op) is LibraryMatch.LIBRARY for v in vs)


def test_whitespace_does_not_matter_but_the_code_does() -> None:
    text = get_variant(VECTOR).render()
    assert library_match(text.replace("\n", "\n\n").replace("    ", "\t") + "\n\n", "spmv") is LibraryMatch.LIBRARY
    head, body = text.split("\n\n", 1)
    assert "(TPR - 1)" in body
    changed = head + "\n\n" + body.replace("(TPR - 1)", "(TPR - 2)", 1)
    assert changed != text and library_match(changed, "spmv") is LibraryMatch.NEW
    assert library_match("FORMAT: CSR\nLAUNCH: grid=1, block=1\n", "spmv") is LibraryMatch.NEW
    assert library_match("", "spmv") is LibraryMatch.NEW


def test_a_completion_is_read_as_the_harness_reads_it() -> None:
    """Chatter, fences and markdown on the header do not make a library kernel new: the harness runs it as one."""
    text = get_variant(VECTOR).render()
    head, body = text.split("\n\n", 1)
    wrapped = "Here is the kernel.\n\n```cuda\n" + head.replace("FORMAT:", "**FORMAT:**") + "\n" + body + "```\nDone."
    assert wrapped != text and library_match(wrapped, "spmv") is LibraryMatch.LIBRARY
    assert library_match("FORMAT: NOPE\nLAUNCH: grid=1, block=32\n\n" + body, "spmv") is LibraryMatch.NEW  # no such format


def test_a_library_body_with_other_numbers_is_params() -> None:
    """Other PARAMS values, or other FORMAT numbers, under the same names and LAUNCH lines: the
    numbers the library did not choose (the LAUNCH lines and the code read them by name)."""
    text = get_variant(VECTOR).render()
    assert library_match(text.replace("PARAMS: TPR=8, BLOCK=256", "PARAMS: TPR=4, BLOCK=512"), "spmv") is LibraryMatch.PARAMS
    bsr = get_variant(BSR).render()
    assert library_match(bsr.replace("FORMAT: BSR R=2 C=2", "FORMAT: BSR R=2 C=4"), "spmv") is LibraryMatch.PARAMS
    # the 2x2 and the 4x4 variants share one body: a 4x4 header over it is a library variant
    assert library_match(bsr.replace("R=2 C=2", "R=4 C=4").replace("BLOCK=128", "BLOCK=256"), "spmv") is LibraryMatch.LIBRARY


def test_a_library_body_under_a_header_none_of_its_variants_has_is_a_mismatch() -> None:
    bsr = get_variant(BSR).render()
    head, body = bsr.split("\n\n", 1)
    assert "LAUNCH: grid=ceil_div(mb, BLOCK / G), block=BLOCK" in head
    literal = head.replace("grid=ceil_div(mb, BLOCK / G), block=BLOCK", "grid=ceil_div(mb, 4), block=128")
    assert library_match(literal + "\n\n" + body, "spmv") is LibraryMatch.MISMATCH  # numbers written twice again
    renamed = head.replace("PARAMS: G=32, BLOCK=128", "PARAMS: G=32, BLOCK=128, EXTRA=1")
    assert library_match(renamed + "\n\n" + body, "spmv") is LibraryMatch.MISMATCH
    no_params = "FORMAT: BSR R=2 C=2\nLAUNCH: grid=ceil_div(mb, 4), block=128\n\n" + body
    assert library_match(no_params, "spmv") is LibraryMatch.MISMATCH  # the body's names are not defined: no compile
    assert library_match(bsr, "spmm") is LibraryMatch.NEW  # an SpMV body is not in the SpMM library


def test_a_sample_without_the_comments_is_still_the_library_body() -> None:
    """The policy is taught the kernels without their comments: such a sample is the library variant, and one
    with other numbers under its PARAMS is a params sample. Kills: comments counted as part of the body."""
    from sparserl.data.targets import without_comments

    lib = get_variant(VECTOR).render()
    bare = without_comments(lib)
    assert bare != lib and library_match(bare, "spmv") is LibraryMatch.LIBRARY
    other = bare.replace("PARAMS: TPR=8, BLOCK=256", "PARAMS: TPR=16, BLOCK=512")
    assert library_match(other, "spmv") is LibraryMatch.PARAMS
    assert library_match(bare.replace("{", "{ x += 1;", 1), "spmv") is LibraryMatch.NEW  # code, not comments


def test_table_counts_samples_and_correct_ones_per_class() -> None:
    lib = get_variant(VECTOR).render()
    other = lib.replace("PARAMS: TPR=8, BLOCK=256", "PARAMS: TPR=16, BLOCK=512")
    head, body = lib.split("\n\n", 1)
    mixed = head.replace("grid=ceil_div(m, BLOCK / TPR)", "grid=ceil_div(m, 32)") + "\n\n" + body
    t = library_match_table([("a", lib, True), ("a", lib, False), ("a", mixed, False), ("a", other, True),
                          ("b", "junk", False)], "spmv")
    none = {"failures": {}, "messages": {}, "template_bodies": {}}
    assert t["a"] == {"library": {"samples": 2, "correct": 1, **none}, "params": {"samples": 1, "correct": 1, **none},
                      "mismatch": {"samples": 1, "correct": 0, **none}, "new": {"samples": 0, "correct": 0, **none}}
    assert t["b"]["new"] == {"samples": 1, "correct": 0, **none} and t["b"]["library"]["samples"] == 0
    md = markdown(t)
    assert md[0] == "## Samples against the library"
    assert "| a | 2 (50%), 50% correct | 1 (25%), 100% correct | 1 (25%), 0% correct | 0 |" in md
    assert "| b | 0 | 0 | 0 | 1 (100%), 0% correct |" in md
    assert markdown({}) == [] and not any(line.startswith("Not correct") for line in md)  # no verdicts given
    assert shares(t["a"]) == {"library_share": 0.5, "params_share": 0.25, "mismatch_share": 0.25, "new_share": 0.0}
    assert shares(None) == {} and shares({"library": {"samples": 0, "correct": 0}}) == {}


ADAPTIVE = {"rpw": 32, "items": 8, "long_len": 256, "seg": 4096, "block": 256}
"""A point of ``csr_adaptive_spec`` (the template that spells its matrix's facts: SHORT_MAX, LONG_ROWS, LONG_PIECES
and the tables of long rows) its check accepts for the skewed cards of these tests: their rows longer than 256 in a
table, one piece each (grid=12 for 12 long rows)."""


def test_a_template_body_is_told_apart_whatever_its_facts_say() -> None:
    """A specialised template's render (``csr_adaptive_spec``, which spells its facts) is ``new`` (no library body)
    and its template's body, also with its facts changed (another long-row table) or with an empty facts block; a
    change in the code after the facts is no template's body; the table counts them per template and the markdown
    says so. Kills a classifier that compares the facts too (a copied body with a wrong table would count
    as the policy's own code), one that ignores the code after them, and the count left out of the table."""
    from sparserl.eval.library_match import template_body
    from sparserl.kernels.templates import get_template
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    card = matrix_card(generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002))
    text = get_template("spmv", "csr_adaptive_spec").render(ADAPTIVE, card)
    assert library_match(text, "spmv") is LibraryMatch.NEW and template_body(text, "spmv") == "csr_adaptive_spec"
    table_start = text.index("__constant__ int c_long_row[12] = {") + len("__constant__ int c_long_row[12] = {")
    other_facts = text[:table_start] + "\n    7, " + text[table_start:]
    assert template_body(other_facts, "spmv") == "csr_adaptive_spec"
    altered = text.replace("if (!HAS_LONG || b - a <= LONG_LEN) {", "if (b - a <= LONG_LEN) {")
    assert altered != text and template_body(altered, "spmv") is None
    assert template_body(get_variant(VECTOR).render(), "spmv") is None  # a library body is no template's here
    t = library_match_table([("a", text, False, "incorrect"), ("a", other_facts, True, "none"),
                             ("a", altered, False, "incorrect")], "spmv")
    assert t["a"]["new"]["samples"] == 3
    assert t["a"]["new"]["template_bodies"] == {"csr_adaptive_spec": {"samples": 2, "correct": 1, "facts_compared": 0,
                                                                      "facts_as_card": 0, "facts_as_card_correct": 0}}
    assert ("New bodies that are a search template's body, its facts aside (a): csr_adaptive_spec 2 (1 correct); "
            "the other 1 are no template's body exactly (code of the policy's own, or a body altered).") in markdown(t)


def _generic(card):
    """``csr_adaptive`` (a generic template: no facts of its matrix) at its first seed point for ``card``."""
    from sparserl.kernels.templates import get_template

    t = get_template("spmv", "csr_adaptive")
    return t.render(next(iter(t.seeds(card, None))), card)


def test_a_specialised_samples_facts_are_compared_with_its_own_card() -> None:
    """A ``csr_adaptive_spec`` kernel rendered for one skewed matrix has that card's long rows, not another draw's
    (the samples of a policy that writes a training matrix's rows); numbers the template has no point for, a card
    the template's check refuses at the sample's numbers, a generic template's body and no card compare nothing;
    the table counts the comparisons per template and the markdown says how many facts were the card's. Kills a
    comparison that always says yes (the other draw), the sample's numbers ignored (rendered at a seed point
    instead: BLOCK=100 would compare), the template's check skipped (the random card would compare), and the
    comparisons left out of the table."""
    from sparserl.eval.library_match import facts_as_card, specialised_facts
    from sparserl.kernels.templates import get_template
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    here, there = (matrix_card(generate("skewed", 6000, seed=s, long_len=2000, long_fraction=0.002)) for s in (1, 2))
    spec = get_template("spmv", "csr_adaptive_spec")
    text = spec.render(ADAPTIVE, here)
    assert facts_as_card(text, "spmv", here) is True
    assert facts_as_card(text, "spmv", there) is False  # the long rows of one draw on another
    assert facts_as_card(spec.render({**ADAPTIVE, "block": 128}, there), "spmv", there) is True
    assert facts_as_card(text.replace("BLOCK=256", "BLOCK=100"), "spmv", here) is None  # no point of the template
    scattered = matrix_card(generate("random", 3001, seed=1, nnz_per_row=16))  # no row longer than 256: seg unused
    assert spec.check(ADAPTIVE, scattered, None) is not None and facts_as_card(text, "spmv", scattered) is None
    assert facts_as_card(text, "spmv", None) is None
    generic = _generic(here)
    assert facts_as_card(generic, "spmv", here) is None and specialised_facts(generic, "spmv") is None
    name, facts = specialised_facts(text, "spmv")
    assert name == "csr_adaptive_spec" and "208, 864, 1494" in facts and "ceil_div" not in facts
    t = library_match_table([("a", text, True, "none", "", here), ("a", text, False, "incorrect", "", there),
                             ("a", text, True, "none", "", None)], "spmv")
    assert t["a"]["new"]["template_bodies"] == {"csr_adaptive_spec": {"samples": 3, "correct": 2, "facts_compared": 2,
                                                                      "facts_as_card": 1, "facts_as_card_correct": 1}}
    assert "csr_adaptive_spec 3 (2 correct; facts as the card's in 1 of 2, 1 of them correct)" in "\n".join(markdown(t))


def test_failures_are_counted_by_verdict_per_class() -> None:
    """Kills: a correct sample counted as a failure, verdicts pooled across classes, the line left out."""
    lib = get_variant(VECTOR).render()
    t = library_match_table([("a", lib, True, "none"), ("a", lib, False, "incorrect"), ("a", "junk", False, "contract_error"),
                             ("a", "more junk", False, "contract_error"), ("a", "x", False, "compile_error")], "spmv")
    assert t["a"]["library"]["failures"] == {"incorrect": 1}
    assert t["a"]["new"]["failures"] == {"contract_error": 2, "compile_error": 1}  # most common first
    assert list(t["a"]["new"]["failures"]) == ["contract_error", "compile_error"]
    md = markdown(t)
    assert ("Not correct, by the harness's verdict (a): library: incorrect 1; new: contract_error 2, "
            "compile_error 1.") in md


def test_failure_messages_count_together_by_shape() -> None:
    """Kills: messages of one cause split by the names and numbers in them, a correct sample's message counted,
    the most common shape not first, messages pooled across kinds or classes, the markdown lines left out."""
    lib = get_variant(VECTOR).render()
    sig = "kernel 'spmv_{}' takes (int, float*) but the contract for spmv CSR is (int, const int*, {} more)"
    t = library_match_table([("a", "j1", False, "contract_error", sig.format("x", 3)),
                             ("a", "j2", False, "contract_error", sig.format("yy", 12) + "\nsecond line"),
                             ("a", "j3", False, "contract_error", "unknown name 'BLOCKS' in LAUNCH"),
                             ("a", "j4", False, "compile_error", "error: identifier 'q' is undefined"),
                             ("a", "j5", True, "none", "ran fine"),
                             ("a", lib, False, "incorrect", "y[3] = 1.5, expected 2.5")], "spmv")
    new = t["a"]["new"]["messages"]
    assert list(new) == ["contract_error", "compile_error"]
    assert new["contract_error"][0] == {"shape": message_shape(sig.format("x", 3)), "count": 2,
                                        "example": sig.format("x", 3)}
    assert new["contract_error"][1]["count"] == 1 and "BLOCKS" in new["contract_error"][1]["example"]
    assert t["a"]["library"]["messages"] == {"incorrect": [{"shape": "y[N] = N, expected N", "count": 1,
                                                            "example": "y[3] = 1.5, expected 2.5"}]}
    assert message_shape("a 'b' \"c\" `d` 12 3.5\nrest") == "a '…' '…' '…' N N"
    one = library_match_table([("a", f"j{i}", False, "compile_error", f"error {c}") for i, c in enumerate("xyzyy")],
                              "spmv", top_messages=1)  # numbers aside, distinct words stay distinct
    assert one["a"]["new"]["messages"]["compile_error"] == [{"shape": "error y", "count": 3, "example": "error y"}]
    md = markdown(t)
    assert f"- new, contract_error: 2 x `{sig.format('x', 3)}`" in md
    assert "- library, incorrect: 1 x `y[3] = 1.5, expected 2.5`" in md


def test_rescore_adds_the_table_from_saved_completions(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    from sparserl.eval.rescore import rescore

    lib = get_variant(VECTOR).render()
    rec = {"family": "banded", "n": 2, "compiled": 2, "correct": 1, "best_speedup": 2.0, "best_format": "CSR",
           "roofline": 0.5, "kinds": {}}
    result = {"config": {"samples": 2}, "op": "spmv", "k": None, "per_matrix": {"sft": {"m0": rec}},
              "summary": {}, "paper": {"source": "x", "gpu": "V100", "compile_rate": 0.5, "pass_at_1": 0.1,
                                       "geomean_speedup": 1.4}, "format_confusion_vs_oracle": {}}
    (tmp_path / "eval.json").write_text(json.dumps(result))
    lines = [{"system": "sft", "matrix": "m0", "verdict": "none", "speedup": 2.0, "completion": lib},
             {"system": "sft", "matrix": "m0", "verdict": "incorrect", "speedup": None, "completion": "junk",
              "message": "y[7] = 0, expected 1"}]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = rescore(tmp_path)
    assert out["library_match"]["sft"]["library"] == {"samples": 1, "correct": 1, "failures": {}, "messages": {},
                                                      "template_bodies": {}}
    assert out["library_match"]["sft"]["new"] == {"samples": 1, "correct": 0, "failures": {"incorrect": 1},
                                                  "template_bodies": {},
                                                  "messages": {"incorrect": [{"shape": "y[N] = N, expected N",
                                                                              "count": 1,
                                                                              "example": "y[7] = 0, expected 1"}]}}
    md = (tmp_path / "eval.md").read_text()
    assert "## Samples against the library" in md and "| sft | 1 (50%), 100% correct | 0 | 0 | 1 (50%), 0% correct |" in md
    assert "Not correct, by the harness's verdict (sft): new: incorrect 1." in md


def test_fill_facts_writes_the_cards_facts_into_a_specialised_kernel_and_nothing_else() -> None:
    """A ``csr_adaptive_spec`` kernel written with one skewed draw's long rows, judged on another draw with as many,
    gets the other draw's rows: exactly the template at the sample's own numbers for that card. Nothing is filled
    where the facts are the card's already, where there is no card, where the body is a generic template's, where
    the numbers are no point of the template, where the template's check refuses the card (a random matrix: seg
    unused; a skewed one with more long rows than a table holds: the long-row kernel would search, and seg is over
    long_len), or where the header differs from the template's at that point (a LAUNCH line of the policy's own, or
    a card with another count of long rows: its grid is another). Kills: the template's check skipped (the
    template rendered at numbers it cannot search with), the header left unchecked (the LAUNCH sample filled), the
    sample's numbers ignored (a seed point's kernel returned: block 256 for a block-128 sample), a fill that
    returns the facts unchanged, and a sample filled although its facts were the card's."""
    from sparserl.eval.library_match import facts_as_card, fill_facts
    from sparserl.kernels.templates import get_template
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    here, there = (matrix_card(generate("skewed", 6000, seed=s, long_len=2000, long_fraction=0.002)) for s in (1, 2))
    spec = get_template("spmv", "csr_adaptive_spec")
    point = {**ADAPTIVE, "block": 128}
    text = spec.render(point, here)
    filled = fill_facts(text, "spmv", there)
    assert filled == spec.render(point, there)
    assert facts_as_card(filled, "spmv", there) is True and facts_as_card(text, "spmv", there) is False
    assert "208, 864" in text and "208, 864" not in filled
    assert fill_facts(text, "spmv", here) is None  # the card's facts already
    assert fill_facts(text, "spmv", None) is None
    assert fill_facts(text.replace("BLOCK=128", "BLOCK=100"), "spmv", there) is None  # no point of the template
    scattered = matrix_card(generate("random", 3001, seed=1, nnz_per_row=16))  # no row longer than 256
    assert spec.check(point, scattered, None) is not None and fill_facts(text, "spmv", scattered) is None
    crowded = matrix_card(generate("skewed", 2100, seed=1, long_len=300, long_fraction=0.98))  # over 2048 long rows
    assert spec.check(point, crowded, None) is not None and fill_facts(text, "spmv", crowded) is None
    more = matrix_card(generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.004))
    assert spec.check(point, more, None) is None and fill_facts(text, "spmv", more) is None  # another grid line
    launch = next(line for line in text.splitlines() if line.startswith("LAUNCH:"))
    own = text.replace(launch, launch.replace("block=BLOCK", "block=128"))
    assert own != text and fill_facts(own, "spmv", there) is None  # a header the template does not write
    assert fill_facts(_generic(here), "spmv", there) is None


def test_template_point_is_the_point_whose_kernel_the_text_is() -> None:
    """A template's kernel as a policy writes it (chatter, a fence, comments) is that template's point; the same
    body with other numbers of the space is that other point; other code, another LAUNCH line, a number outside
    the space, a point the check refuses for the card (rendered all the same), or another card's facts spelt in
    (``csr_adaptive_spec``) are no point; a kernel that names its facts (``csr_split_spec``) is its point on each
    card it applies to. Kills: a match by header alone (the altered code), by body alone (the other LAUNCH line),
    the check skipped (a HYB width wider than the stencil's rows), the facts block left out of the comparison (the
    other draw's table)."""
    from sparserl.eval.library_match import template_point
    from sparserl.kernels.templates import get_template, templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    here, there = (matrix_card(generate("skewed", 6000, seed=s, long_len=2000, long_fraction=0.002)) for s in (1, 2))
    every = templates("spmv")
    vector = get_template("spmv", "csr_vector")
    text = vector.render({"tpr": 8, "block": 256}, here)
    head, body = text.split("\n\n", 1)
    written = "Here it is:\n```cuda\n" + head + "\n\n// eight lanes a row\n" + body.replace(";\n", ";  // step\n", 2) + "```\n"
    t, point = template_point(written, "spmv", every, here)
    assert t is vector and point == {"tpr": 8, "block": 256}
    assert template_point(text.replace("TPR=8", "TPR=4"), "spmv", every, here)[1] == {"tpr": 4, "block": 256}
    assert "(TPR - 1)" in body
    assert template_point(head + "\n\n" + body.replace("(TPR - 1)", "(TPR - 2)", 1), "spmv", every, here) is None
    launch = head.split("\n")[-1]
    assert launch.startswith("LAUNCH:") and "BLOCK / TPR" in launch
    assert template_point(head.replace("BLOCK / TPR", "BLOCK") + "\n\n" + body, "spmv", every, here) is None
    assert template_point(text.replace("TPR=8", "TPR=3"), "spmv", every, here) is None
    spec = get_template("spmv", "csr_adaptive_spec")
    own = spec.render(ADAPTIVE, here)
    assert template_point(own, "spmv", every, here) == (spec, ADAPTIVE)
    assert spec.check(ADAPTIVE, there, None) is None and spec.render(ADAPTIVE, there) != own
    assert template_point(own, "spmv", every, there) is None  # one draw's long rows on another
    scattered = matrix_card(generate("random", 3001, seed=1, nnz_per_row=16))
    assert spec.check(ADAPTIVE, scattered, None) is not None and template_point(own, "spmv", every, scattered) is None
    split = get_template("spmv", "csr_split_spec")
    sp = next(p for p in split.seeds(here, None) if split.check(p, there, None) is None)
    named = split.render(sp, here)
    assert named == split.render(sp, there) and "MATRIX_LONG_ROWS" in named
    assert template_point(named, "spmv", every, here) == (split, sp) == template_point(named, "spmv", every, there)
    hyb = get_template("spmv", "hyb_vec")  # its text does not depend on the card; its check does
    wide = {"width": 32, "block": 128, "batches": 4}
    blocks, stencil = (matrix_card(generate("block", 4000, seed=1, block=8, blocks_per_row=4)),
                       matrix_card(generate("stencil2d", 4900, seed=1)))
    assert hyb.check(wide, blocks, None) is None and hyb.check(wide, stencil, None) is not None
    assert hyb.render(wide, stencil) == hyb.render(wide, blocks)
    assert template_point(hyb.render(wide, blocks), "spmv", every, blocks) == (hyb, wide)
    assert template_point(hyb.render(wide, blocks), "spmv", every, stencil) is None
    assert template_point("", "spmv", every, here) is None


def test_template_point_reads_code_line_by_line_as_the_compiler_does() -> None:
    """Two texts whose code is the same words but not the same lines to the compiler are not the same point: a
    ``#pragma unroll`` joined onto the loop it names (the pragma then swallows the loop), and a comment ending in a
    backslash (which comments out the next line). A line continued by a backslash is the line joined. For SpMM the
    check sees ``k``: a ``vec`` that does not divide it is no point. Kills: the code compared with its line breaks
    collapsed, continued lines read as two, ``k`` not passed to the check."""
    from sparserl.eval.library_match import template_point
    from sparserl.kernels.templates import get_template, templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    card = matrix_card(generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002))
    every = templates("spmv")
    text = get_template("spmv", "csr_vector").render({"tpr": 8, "block": 256}, card)
    assert "    #pragma unroll\n    for (int off" in text
    joined = text.replace("    #pragma unroll\n    for (int off", "    #pragma unroll for (int off", 1)
    assert template_point(joined, "spmv", every, card) is None
    line = "        for (int j = start + lane; j < end; j += TPR)"
    assert line in text
    swallowed = text.replace(line, "        // lanes stride over the row \\\n" + line, 1)
    assert template_point(swallowed, "spmv", every, card) is None
    continued = text.replace(line, "        for (int j = start + lane; \\\n j < end; j += TPR)", 1)
    assert template_point(continued, "spmv", every, card)[1] == {"tpr": 8, "block": 256}
    rows = get_template("spmm", "csr_rows")
    point = {"g": 4, "vec": 4, "block": 128}
    spmm = rows.render(point, card)
    assert template_point(spmm, "spmm", templates("spmm"), card, 32) == (rows, point)
    assert template_point(spmm, "spmm", templates("spmm"), card, 30) is None  # vec=4 does not divide k=30
