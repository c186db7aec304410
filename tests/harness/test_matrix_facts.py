"""A matrix's facts named in a kernel (``MATRIX_DIA_RUNS``, ``MATRIX_ROW_LEN``, ``MATRIX_BLOCK_ROW_LEN``): the
harness writes their definitions from the card of the matrix it verifies on (CPU: text and nvcc). Mutations
killed: a definition written from another card (or not at all), a name in a comment taken for a use, a name the
code declares itself (``constexpr int`` or ``#define``) defined again (a materialised text materialised twice), a
text the definitions take over the length limit failing inside the harness, a name without a value for this
matrix let through (or refused with more than one line), a block count for another block shape, a text that names
nothing changed, and the evaluator judging the text as written instead of the materialised one."""

from __future__ import annotations

import pytest

from sparserl.errors import ContractError
from sparserl.harness.compile import find_nvcc
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.extract import extract
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
    (the definition written from each one's card), and refused on a matrix without listed diagonals."""
    ev = Evaluator(HarnessConfig(cache_dir=str(tmp_path), memo=0))
    try:
        text = named_dia(matrix_card(generate("banded", 4003, seed=1, bands=9)))
        for family, rows, params in (("stencil2d", 40_000, {}), ("banded", 30_000, {"bands": 5})):
            res = ev.evaluate(text, ev.register(generate(family, rows, seed=2, **params), family), "spmv")
            assert res.error_kind is ErrorKind.NONE and res.correct, (family, res.message)
        res = ev.evaluate(text, ev.register(generate("random", 20_000, seed=3, nnz_per_row=12), "random"), "spmv")
        assert res.error_kind is ErrorKind.CONTRACT, res.message
    finally:
        ev.close()
