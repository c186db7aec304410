"""A matrix's facts named in a kernel (``MATRIX_DIA_RUNS``, ``MATRIX_ROW_LEN``, ``MATRIX_BLOCK_ROW_LEN``,
``MATRIX_LONG_ROWS``, ``MATRIX_LONG_ROW_COUNT``): the harness writes their definitions from the card of the matrix
it verifies on, and the values of those a LAUNCH line reads into it (CPU: text and nvcc). Mutations killed: a
definition written from another card (or not at all), a name in a comment taken for a use, a name the code
declares itself (``constexpr int``, ``__constant__ int`` or ``#define``) defined again (a materialised text
materialised twice), a text the definitions take over the length limit failing inside the harness, a name without
a value for this matrix let through (or refused with more than one line), a block count for another block shape,
long rows of another threshold or out of order, a LAUNCH line left as written (or a text judged otherwise than it
reads once its values are written in), a table the compiler cannot fold,
a text that names nothing changed, and the evaluator judging the text as written instead of the materialised
one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from sparserl.errors import ContractError
from sparserl.harness.compile import find_nvcc
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.extract import ExtractError, extract
from sparserl.harness.matrix_facts import materialise, named_facts
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import Op
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card

POINT = {"block": 128, "v": 2}


def named_dia(card) -> str:
    """dia_window_spec as rendered for ``card``: its offsets named ``MATRIX_DIA_RUNS``, one text for every matrix."""
    return get_template("spmv", "dia_window_spec").render(POINT, card)


def test_the_template_is_one_text_and_the_definition_is_each_cards_runs() -> None:
    from sparserl.matrices.card import offset_runs

    cards = [matrix_card(generate(family, rows, seed=1, **params))
             for family, rows, params in (("stencil2d", 4900, {}), ("banded", 4003, {"bands": 9}))]
    assert named_dia(cards[0]) == named_dia(cards[1])
    for card in cards:
        got = materialise(named_dia(card), Op.SPMV, card)
        runs = ", ".join(f"{a}, {b}" for a, b in offset_runs(card.dia_offsets))
        assert f"__device__ constexpr int MATRIX_DIA_RUNS[] = {{{runs}}};" in got
        assert got.count("MATRIX_DIA_RUNS[] =") == 1
        assert materialise(got, Op.SPMV, card) == got  # declared now: not defined twice


def test_names_in_comments_count_for_nothing_and_a_text_without_names_is_unchanged() -> None:
    card = matrix_card(generate("banded", 4003, seed=1, bands=9))
    assert named_facts(extract(named_dia(card), Op.SPMV).body) == ["MATRIX_DIA_RUNS"]
    plain = get_template("spmv", "dia_window").render(POINT, card)
    commented = plain.replace("\n\n", "\n\n// MATRIX_ROW_LEN and MATRIX_DIA_RUNS are not used here\n", 1)
    assert commented != plain and named_facts(extract(commented, Op.SPMV).body) == []
    assert materialise(commented, Op.SPMV, card) == commented


def test_a_name_the_code_defines_as_a_macro_is_its_own() -> None:
    card = matrix_card(generate("random", 3000, seed=1, nnz_per_row=16))
    own = "FORMAT: CSR\nLAUNCH: grid=1, block=32\n#define MATRIX_ROW_LEN 3\n__global__ void spmv_kernel() {}\n"
    assert named_facts(extract(own, Op.SPMV).body) == [] and materialise(own, Op.SPMV, card) == own


def test_a_fact_the_matrix_lacks_is_one_contract_line() -> None:
    dia = named_dia(matrix_card(generate("banded", 4003, seed=1, bands=9)))
    uneven = matrix_card(generate("powerlaw", 3000, seed=1))
    with pytest.raises(ContractError, match="MATRIX_DIA_RUNS") as exc:
        materialise(dia, Op.SPMV, matrix_card(generate("random", 3000, seed=1, nnz_per_row=16)))
    assert "\n" not in str(exc.value)
    with pytest.raises(ContractError, match="rows differ in length"):
        materialise("FORMAT: CSR\nLAUNCH: grid=1, block=32\n"
                    "__global__ void spmv_kernel() { int k = MATRIX_ROW_LEN; }\n", Op.SPMV, uneven)
    with pytest.raises(ContractError, match="need the matrix"):
        materialise(dia, Op.SPMV, None)


def test_a_block_count_only_under_the_cards_block_shape() -> None:
    card = matrix_card(generate("block", 4000, seed=1, block=8, blocks_per_row=4))
    assert card.block_shape == (8, 8) and card.block_row_len == 4
    body = "\n__global__ void spmv_kernel() { int k = MATRIX_BLOCK_ROW_LEN; (void)k; }\n"
    launch = "LAUNCH: grid=1, block=32"
    got = materialise(f"FORMAT: BSR R=8 C=8\n{launch}{body}", Op.SPMV, card)
    assert "constexpr int MATRIX_BLOCK_ROW_LEN = 4;" in got
    for head in ("FORMAT: BSR R=4 C=4", "FORMAT: CSR"):
        with pytest.raises(ContractError, match="R=8 C=8"):
            materialise(f"{head}\n{launch}{body}", Op.SPMV, card)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_the_evaluator_compiles_the_materialised_kernel_and_refuses_a_missing_fact(tmp_path) -> None:
    ev = Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path)))
    try:
        A = generate("stencil2d", 4900, seed=1)
        text = named_dia(matrix_card(A))
        res = ev.evaluate(text, ev.register(A, "stencil"), "spmv")
        assert res.error_kind is ErrorKind.NO_GPU and res.compiled, res.message  # compiled: only the run is left
        res = ev.evaluate(text, ev.register(generate("random", 3000, seed=1, nnz_per_row=16), "random"), "spmv")
        assert res.error_kind is ErrorKind.CONTRACT and "MATRIX_DIA_RUNS" in res.message and not res.compiled
        from sparserl.harness.extract import MAX_COMPLETION_CHARS

        padded = text + "//" + "x" * (MAX_COMPLETION_CHARS - len(text) - 4) + "\n"  # the definitions take it over
        assert len(padded) < MAX_COMPLETION_CHARS
        res = ev.evaluate(padded, ev.register(A, "stencil"), "spmv")
        assert res.error_kind is ErrorKind.EXTRACT, res.message  # the length limit, not an internal error
        S = skewed()
        split = named_split(matrix_card(S))  # the long rows named in the code and read by the LAUNCH line
        res = ev.evaluate(split, ev.register(S, "skewed"), "spmv")
        assert res.error_kind is ErrorKind.NO_GPU and res.compiled, res.message
        fenced = ("FORMAT: CSR\nPARAMS: LONG_LEN=256\nLAUNCH: grid=MATRIX_LONG_ROW_COUNT + ceil_div(m, 128), "
                  "block=128\n```cuda\nLAUNCH: grid=1, block=1\n__global__ void spmv_kernel() {}\n```\n")
        res = ev.evaluate(fenced, ev.register(S, "skewed"), "spmv")  # judged as written, not as written out
        assert res.error_kind is ErrorKind.CONTRACT and "begins with a header line" in res.message, res.message
    finally:
        ev.close()


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_the_operator_builds_a_named_kernel_for_its_matrix_only(tmp_path) -> None:
    from sparserl.harness.compile import CompileOptions
    from sparserl.operator.tuning import build_kernel

    A = generate("stencil2d", 4900, seed=1)
    text = named_dia(matrix_card(A))
    built = build_kernel(text, Op.SPMV, CompileOptions(arch="sm_90"), tmp_path, A=A)
    assert not isinstance(built, str) and built[0].format == "DIA", built
    assert "need the matrix" in build_kernel(text, Op.SPMV, CompileOptions(arch="sm_90"), tmp_path)


@pytest.mark.gpu
def test_a_named_kernel_is_correct_on_each_matrix_it_is_judged_on(tmp_path) -> None:
    """GPU: one text of dia_window_spec, its offsets named, verified correct on two matrices with other offsets
    (the definition written from each one's card), and refused on a matrix without listed diagonals; the same for
    one text of csr_split_spec, its long rows named (their count read by the LAUNCH line too), on two matrices with
    other long rows, refused on a matrix with none."""
    ev = Evaluator(HarnessConfig(cache_dir=str(tmp_path), memo=0))
    try:
        text = named_dia(matrix_card(generate("banded", 4003, seed=1, bands=9)))
        for family, rows, params in (("stencil2d", 40_000, {}), ("banded", 30_000, {"bands": 5})):
            res = ev.evaluate(text, ev.register(generate(family, rows, seed=2, **params), family), "spmv")
            assert res.error_kind is ErrorKind.NONE and res.correct, (family, res.message)
        res = ev.evaluate(text, ev.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random"), "spmv")
        assert res.error_kind is ErrorKind.CONTRACT, res.message
        split = named_split(matrix_card(skewed()))  # its long rows named, in the code and the LAUNCH line
        for name, A in (("skewed", generate("skewed", 30_000, seed=2)), ("varied", varied())):
            res = ev.evaluate(split, ev.register(A, name), "spmv")
            assert res.error_kind is ErrorKind.NONE and res.correct, (name, res.message)
        res = ev.evaluate(split, ev.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random"), "spmv")
        assert res.error_kind is ErrorKind.CONTRACT and "MATRIX_LONG_ROWS" in res.message, res.message
    finally:
        ev.close()


SPLIT = {"tpr": 4, "unroll": 4, "long_len": 256, "block": 128}
"""A point of ``csr_split_spec`` its check accepts for the skewed matrix below."""


def skewed():
    return generate("skewed", 6000, seed=1)


def named_split(card) -> str:
    """``csr_split_spec`` at :data:`SPLIT` as the template renders it for ``card``: its long rows named (the table and
    its count from the harness, the LAUNCH line reading the count), one text for every matrix with long rows."""
    text = get_template("spmv", "csr_split_spec").render(SPLIT, card)
    assert re.search(r"\d{3}", text.split("extern")[0].split("LAUNCH")[1]) is None, "a number of the card is left"
    return text


def spelt_split(card) -> str:
    """The same kernel with the count and the table spelt, as the template wrote it before it named them."""
    text = materialise(named_split(card), Op.SPMV, card)
    rows = re.search(r"__constant__ int MATRIX_LONG_ROWS\[\d+\] = \{([^}]*)\};\n", text)
    count = len(rows[1].split(","))
    text = text.replace(rows[0], "").replace(f"constexpr int MATRIX_LONG_ROW_COUNT = {count};\n", "")
    text = text.replace("constexpr int LONG_ROWS = MATRIX_LONG_ROW_COUNT;",
                        f"constexpr int LONG_ROWS = {count};\n__constant__ int c_long_row[{count}] = {{{rows[1]}}};")
    assert "MATRIX_LONG_ROW_COUNT" not in text
    return text.replace("MATRIX_LONG_ROWS", "c_long_row")


def varied():
    """3000 rows of 4 entries but four long rows whose lengths fall as their index rises (the card lists them
    longest first, the table is ascending)."""
    import scipy.sparse as sp

    rng, n, long = np.random.default_rng(0), 3000, {10: 300, 50: 900, 300: 500, 2000: 700}
    rows = [r for r in range(n) for _ in range(long.get(r, 4))]
    cols = [c for r in range(n) for c in rng.choice(n, long.get(r, 4), replace=False)]
    return sp.csr_matrix((rng.standard_normal(len(rows)).astype(np.float32), (rows, cols)), shape=(n, n))


def rows_longer(A, length: int) -> list[int]:
    """The rows of ``A`` with more than ``length`` entries, from the matrix itself (not its card)."""
    return [int(r) for r in np.flatnonzero(np.diff(A.indptr) > length)]


def count_only(long_len: int) -> str:
    """A kernel whose LAUNCH reads the count of rows longer than ``long_len`` and whose code names no fact."""
    return (f"FORMAT: CSR\nPARAMS: LONG_LEN={long_len}\nLAUNCH: grid=MATRIX_LONG_ROW_COUNT + 1, block=32\n"
            "__global__ void spmv_kernel() {}\n")


def test_long_rows_are_the_rows_longer_than_the_kernels_long_len_and_the_launch_reads_their_count() -> None:
    """Kills: the table or count from another threshold (``>=`` for ``>``, the card's listing floor), rows not in
    ascending order, the LAUNCH line left as written (or its value not the count), and one matrix's table for
    another's."""
    from sparserl.kernels.contract import evaluate_launches

    mats = [skewed(), generate("skewed", 6100, seed=2), varied()]
    cards = [matrix_card(A) for A in mats]
    assert named_split(cards[0]) == named_split(cards[1]) == named_split(cards[2])
    for A, card in zip(mats, cards):
        rows = rows_longer(A, SPLIT["long_len"])
        assert 2 <= len(rows) < 60 and np.diff(A.indptr).max() > SPLIT["long_len"]
        got = materialise(named_split(card), Op.SPMV, card)
        assert f"__constant__ int MATRIX_LONG_ROWS[{len(rows)}] = {{{', '.join(map(str, rows))}}};" in got
        assert f"constexpr int MATRIX_LONG_ROW_COUNT = {len(rows)};" in got
        ex = extract(got, Op.SPMV)
        assert f"grid={len(rows)} + ceil_div(m, BLOCK / TPR)" in ex.text
        launch = evaluate_launches(ex.header, Op.SPMV, {"m": A.shape[0], "n": A.shape[1], "nnz": A.nnz, "num_sms": 132})
        assert launch[0].grid[0] == len(rows) + -(-A.shape[0] // (SPLIT["block"] // SPLIT["tpr"]))
        assert materialise(got, Op.SPMV, card) == got  # declared and written in now: not again
        edge = int(np.diff(A.indptr)[rows].min())  # a long row's own length: that row is not longer than it
        at_edge = materialise(count_only(edge), Op.SPMV, card)
        assert f"grid={len(rows_longer(A, edge))} + 1," in at_edge
        assert len(rows_longer(A, edge)) < len(rows_longer(A, edge - 1))
    assert rows_longer(mats[0], 256) != rows_longer(mats[1], 256)


def test_a_launch_that_reads_a_fact_is_read_but_launched_only_with_its_value() -> None:
    """Kills: LAUNCH refusing a fact name at parse (the named kernel never reaches the harness) and an unmaterialised
    launch evaluated without the value (a name unknown, or taken as 0)."""
    from sparserl.kernels.contract import evaluate_launches

    ex = extract(named_split(matrix_card(skewed())), Op.SPMV)
    with pytest.raises(ContractError, match="MATRIX_LONG_ROW_COUNT, a matrix's fact") as exc:
        evaluate_launches(ex.header, Op.SPMV, {"m": 6000, "n": 6000, "nnz": 90000, "num_sms": 132})
    assert "\n" not in str(exc.value)
    table = extract("FORMAT: CSR\nLAUNCH: grid=MATRIX_DIA_RUNS, block=32\n__global__ void spmv_kernel() {}\n", Op.SPMV)
    assert table.kind == "contract_error" and "uses MATRIX_DIA_RUNS" in table.message  # a table is no LAUNCH value


def test_a_text_is_judged_as_what_it_is_when_a_launch_value_is_written_in() -> None:
    """A fence keeps a LAUNCH line at the top of the code apart from the header; with only the LAUNCH line's fact
    written in (no definitions between), the text would read that code line as a second LAUNCH line. Kills judging
    the written-out text regardless (two launches for a kernel that has one, the line gone from the code); a
    LAUNCH line holding a form feed (where extract saw no line break and the worker one) is refused first."""
    from sparserl.harness.matrix_facts import extract_with_facts

    card = matrix_card(skewed())
    text = ("FORMAT: CSR\nPARAMS: LONG_LEN=256\nLAUNCH: grid=MATRIX_LONG_ROW_COUNT + ceil_div(m, 128), block=128\n"
            "```cuda\nLAUNCH: grid=1, block=1, kernel=spmv_kernel\n__global__ void spmv_kernel() {}\n```\n")
    ex = extract(text, Op.SPMV)
    assert len(ex.header.launches) == 1 and ex.body.startswith("LAUNCH:")
    with pytest.raises(ContractError, match="begins with a header line") as exc:
        extract_with_facts(ex, Op.SPMV, card)
    assert "\n" not in str(exc.value)
    fed = extract(text.replace("grid=MATRIX", "grid=1 +\x0cMATRIX").replace("```cuda\nLAUNCH: grid=1, block=1, "
                                                                        "kernel=spmv_kernel\n", "```cuda\n"), Op.SPMV)
    assert isinstance(fed, ExtractError) and fed.kind == "contract_error"  # refused before any value is written in


def test_long_rows_need_the_kernels_long_len_and_rows_the_card_lists() -> None:
    card = matrix_card(skewed())
    text = named_split(card)
    with pytest.raises(ContractError, match="give LONG_LEN in PARAMS"):
        materialise(text.replace("LONG_LEN=256, ", ""), Op.SPMV, card)
    longest = card.row_len_max
    over = text.replace("LONG_LEN=256", f"LONG_LEN={longest}")
    with pytest.raises(ContractError, match="no row of this matrix is longer than LONG_LEN") as exc:
        materialise(over, Op.SPMV, card)
    assert "\n" not in str(exc.value)
    assert "grid=0 + 1," in materialise(count_only(longest), Op.SPMV, card)  # a count may be 0: no table is written
    low = card.long_rows_min - 2
    with pytest.raises(ContractError, match=f"not every row longer than LONG_LEN={low}"):
        materialise(text.replace("LONG_LEN=256", f"LONG_LEN={low}"), Op.SPMV, card)


def test_a_table_the_code_declares_is_its_own() -> None:
    card = matrix_card(skewed())
    own = ("FORMAT: CSR\nPARAMS: LONG_LEN=256\nLAUNCH: grid=1, block=32\n"
           "__constant__ int MATRIX_LONG_ROWS[2] = {1, 2};\n"
           "__global__ void spmv_kernel(int* y) { y[0] = MATRIX_LONG_ROWS[0]; }\n")
    assert named_facts(extract(own, Op.SPMV).body) == [] and materialise(own, Op.SPMV, card) == own


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_the_named_long_rows_compile_to_the_spelt_kernels_code(tmp_path) -> None:
    """nvcc: csr_split_spec with its long rows named, materialised, builds as the same kernel with them spelt (same
    registers, spills and shared memory; the same SASS where cuobjdump is found). Kills a definition the compiler
    cannot fold (a table in global memory, a count that is not a compile-time constant)."""
    from sparserl.harness.compile import CompileOptions, compile_source
    from sparserl.kernels.contract import split_completion
    from tests.conftest import load_benchmark

    sass_of = load_benchmark("params_equivalence").sass_of
    card = matrix_card(varied())
    built = {}
    for form, text in (("spelt", spelt_split(card)), ("named", materialise(named_split(card), Op.SPMV, card))):
        r = compile_source(split_completion(text, Op.SPMV)[1], CompileOptions(backend="nvcc", arch="sm_90"),
                           tmp_path / form)
        assert r.ok, r.log
        built[form] = (r.resources_of("spmv_kernel"), sass_of(Path(r.cubin_path).read_bytes(), ("spmv_kernel",)))
    assert built["named"][0] == built["spelt"][0] and built["named"][0] is not None
    assert built["named"][1] == built["spelt"][1]  # None == None without cuobjdump
