"""Templates: explicit spaces, the library's points as seeds, checks and neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.errors import SparseRLError
from sparserl.kernels.library import all_variants
from sparserl.kernels.templates import get_template, templates
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card


@pytest.fixture(scope="module")
def card():
    return matrix_card(generate("banded", 4000, seed=1, bands=9))


def test_library_points_are_seeds_with_the_same_id_and_text(card) -> None:
    """Every library variant is a seed of its template, with the same text, and the same id but for
    the FORMAT parameters a strategy fixes (``zero_y=0``: rendered on every point, not a dimension)."""
    from sparserl.kernels.templates.library import FIXED_FORMAT_PARAMS, variant_point

    lib = {}
    for v in all_variants():
        name, point = variant_point(v)
        cid = get_template(v.op, name).candidate(point).id
        assert cid == v.id or any(k in FIXED_FORMAT_PARAMS for k, _ in v.format_params), (cid, v.id)
        lib[cid] = v.render()
    seen = set()
    for t in templates():
        for p in t.seeds(card, 8 if t.op.value == "spmm" else None):
            cand = t.candidate(p)
            if cand.id in lib:
                assert t.render(p, card) == lib[cand.id], cand.id
                seen.add(cand.id)
    spmv_ids = {i for i in lib if i.startswith("spmv/")}
    assert spmv_ids <= seen


def test_templates_that_replace_a_library_strategy_hold_and_render_its_points(card) -> None:
    lib = [v for v in all_variants() if v.strategy in ("csr_adaptive", "csr_lanes")]
    assert lib
    for v in lib:
        t = get_template(v.op, v.strategy)
        assert t.check(v.params, card) is None, v.id
        assert t.candidate(v.params).id == v.id and t.render(v.params, card) == v.render()


def test_wider_library_spaces_keep_the_merge_tile_in_shared_memory(card) -> None:
    t = get_template("spmv", "csr_merge")
    assert {64, 512} <= set(t.param("block").values) and 15 in t.param("ipt").values
    assert t.check({"block": 512, "ipt": 11}, card) is None
    assert "shared memory" in t.check({"block": 512, "ipt": 15}, card)


def test_check_refuses_points_outside_the_space_and_invalid_groups(card) -> None:
    t = get_template("spmv", "csr_vector")
    assert t.check({"tpr": 8, "block": 128}, card) is None
    assert "not one of" in t.check({"tpr": 3, "block": 128}, card)
    assert "takes parameters" in t.check({"tpr": 8}, card)
    sell = get_template("spmv", "sell_lanes")
    bad = {"C": 128, "sigma": 64, "block": 128}
    assert sell.check(bad, card) is not None  # sigma must be 1 or a multiple of C


def test_neighbours_are_one_step_and_valid(card) -> None:
    t = get_template("spmv", "csr_vector")
    nb = t.neighbours({"tpr": 8, "block": 128}, card)
    assert {"tpr": 4, "block": 128} in nb and {"tpr": 16, "block": 128} in nb and {"tpr": 8, "block": 256} in nb
    assert all(t.check(p, card) is None for p in nb)
    rng = np.random.default_rng(0)
    for _ in range(10):
        p = t.random_point(rng, card)
        assert p is not None and t.check(p, card) is None


def test_spmm_points_need_k_a_multiple_of_vec(card) -> None:
    t = get_template("spmm", "csr_rows")
    assert t.check({"g": 8, "vec": 4, "block": 128}, card, 6) is not None
    assert t.check({"g": 8, "vec": 4, "block": 128}, card, 8) is None


def test_spmm_lanes_per_row_reach_every_power_of_two_by_mutation(card) -> None:
    """The SpMM strategies' lane groups include 4 and 16 (16 x 4 columns: k = 64 in one pass), one
    mutation step from the library's 8 and 32; the seeds stay the library's points."""
    t = get_template("spmm", "csr_rows")
    assert t.param("g").values == (2, 4, 8, 16, 32)
    assert {"g": 16, "vec": 4, "block": 128} in t.neighbours({"g": 8, "vec": 4, "block": 128}, card, 64)
    assert t.check({"g": 16, "vec": 4, "block": 128}, card, 64) is None
    assert all(p["g"] in (2, 8, 32) for p in t.seeds(card, 64))


def test_unknown_template_is_a_one_line_error() -> None:
    with pytest.raises(SparseRLError, match="templates are"):
        get_template("spmv", "nope")


def test_every_point_a_template_check_accepts_renders(card) -> None:
    """A point that passes its template's check must render (the search skips, and counts, those
    that do not; bsr_group's check once let g < C through, which its renderer refuses)."""
    import itertools

    assert "block width" in get_template("spmv", "bsr_group").check({"R": 8, "C": 8, "g": 4, "block": 256}, card)
    for t in templates():
        k = 32 if t.op.value == "spmm" else None
        for values in itertools.product(*(p.values for p in t.space)):
            q = dict(zip((p.name for p in t.space), values))
            if t.check(q, card, k) is None:
                t.render(q, card)  # raises on a template bug
