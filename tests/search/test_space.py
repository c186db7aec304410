"""The candidate space: seeds first and valid, moves one step, refused formats never proposed."""

from __future__ import annotations

import pytest

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.kernels.templates import templates
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.search.space import (
    CandidateSpace,
    Provenance,
    select_templates,
    text_id,
    text_proposal,
)


@pytest.fixture(scope="module")
def card():
    return matrix_card(generate("random", 3000, seed=2, nnz_per_row=8))


def test_seeds_selector_first_then_round_robin_all_valid_no_duplicates(card) -> None:
    tmpls = templates("spmv")
    space = CandidateSpace(card, Op.SPMV, None, tmpls)
    seeds = list(space.seeds([("csr_merge", {"block": 256, "ipt": 7}, "selector")]))
    assert seeds[0].id == "spmv/csr_merge/-/block=256,ipt=7" and seeds[0].note == "selector"
    # every template's first seed comes before any template's second one
    seeded = [t for t in tmpls if t.seeds(card, None)]
    assert len(seeded) < len(tmpls), "some specialised template has no seed on a random matrix (no diagonals)"
    first_round = [p.template for p in seeds[1:1 + len(seeded)]]
    assert set(first_round) == {t.name for t in seeded}
    by_name = {t.name: t for t in tmpls}
    for p in seeds:
        assert p.provenance is Provenance.SEED
        assert by_name[p.template].check(p.param_dict, card, None) is None
        assert by_name[p.template].render(p.param_dict, card) == p.text
    ids = [p.id for p in seeds]
    assert len(ids) - 1 == len(set(ids[1:])), "template seeds hold no duplicates"
    expected = sum(len(t.seeds(card, None)) for t in tmpls)
    assert len(seeds) == expected + 1  # the selector's point again among the seeds: the loop drops it


def test_neighbours_move_one_parameter_one_step(card) -> None:
    space = CandidateSpace(card, Op.SPMV, None, templates("spmv"))
    parent = space.point("sell_lanes", {"C": 32, "sigma": 64, "block": 128}, Provenance.SEED)
    t = space.by_name["sell_lanes"]
    nbs = space.neighbours(parent)
    assert nbs
    for p in nbs:
        assert p.provenance is Provenance.MUTATION and p.parent == parent.id
        changed = [n for n in p.param_dict if p.param_dict[n] != parent.param_dict[n]]
        assert len(changed) == 1
        par = t.param(changed[0])
        assert abs(par.values.index(p.param_dict[changed[0]]) - par.values.index(parent.param_dict[changed[0]])) == 1
        assert t.check(p.param_dict, card, None) is None


def test_switches_carry_shared_parameters_into_other_templates(card) -> None:
    space = CandidateSpace(card, Op.SPMV, None, templates("spmv"))
    parent = space.point("csr_vector", {"tpr": 8, "block": 256}, Provenance.SEED)
    sw = space.switches(parent)
    fits = {t.name for t in templates("spmv") if t.seeds(card, None)}
    assert {p.template for p in sw} == fits - {"csr_vector"}
    for p in sw:
        assert p.provenance is Provenance.SWITCH and p.parent == parent.id
        if "block" in p.param_dict and 256 in space.by_name[p.template].param("block").values:
            assert p.param_dict["block"] == 256, p.id  # the shared value carried over


def test_refused_formats_are_never_proposed(card) -> None:
    calls = []

    def accepts(fmt, params):
        calls.append((fmt, tuple(sorted(params.items()))))
        return fmt in ("CSR", "COO")

    space = CandidateSpace(card, Op.SPMV, None, templates("spmv"), accepts=accepts)
    seeds = list(space.seeds())
    assert seeds and {p.text.split()[1] for p in seeds} == {"CSR", "COO"}
    assert "DIA" in space.refused and space.refused["DIA"] >= 1
    rng_pts = list(space.random(tries=200))
    assert all(p.text.split()[1] in ("CSR", "COO") for p in rng_pts)
    assert ("DIA", ()) in calls and ("CSR", ()) in calls


def test_the_host_check_converts_each_format_once(monkeypatch) -> None:
    from sparserl.request import context
    from sparserl.request.context import MatrixContext

    A = generate("banded", 500, seed=0, bands=3)
    real, calls = context.accepts, []

    def counting(A_, fmt, params=None, limits=None):
        calls.append((fmt, tuple(sorted((params or {}).items()))))
        return real(A_, fmt, params, limits)

    monkeypatch.setattr(context, "accepts", counting)
    check = MatrixContext(A, "banded", Op.SPMV).accepts
    answers = [check("DIA", {}), check("DIA", {}), check("SELL", {"C": 8, "sigma": 1}), check("SELL", {"sigma": 1, "C": 8})]
    assert answers == [True, True, True, True]
    assert calls == [("DIA", ()), ("SELL", (("C", 8), ("sigma", 1)))]


def test_random_points_are_valid(card) -> None:
    space = CandidateSpace(card, Op.SPMM, 8, templates("spmm"), seed=3)
    pts = list(space.random(tries=50))
    assert len(pts) >= 40
    for p in pts:
        assert space.by_name[p.template].check(p.param_dict, card, 8) is None


def test_unknown_template_is_a_one_line_error() -> None:
    with pytest.raises(SparseRLError, match="templates are"):
        select_templates(Op.SPMV, ("csr_vector", "no_such"))


def test_text_proposals_are_cleaned_and_named_by_their_text() -> None:
    from sparserl.kernels.library import variants

    v = variants("spmv", "CSR")[0].render()
    a = text_proposal("Sure, here:\n```cuda\n" + v + "```\nEnjoy", Op.SPMV, Provenance.POLICY_SAMPLE)
    b = text_proposal(v.replace("\n", "\n\n"), Op.SPMV, Provenance.POLICY_SAMPLE)
    assert a.text.startswith("FORMAT:") and "Enjoy" not in a.text
    assert a.id == b.id == text_id(v)
    assert a.id.startswith("text/")


def test_every_library_variant_is_a_point_of_its_template() -> None:
    """``variant_point`` hands the selector's choice (a library variant) to the search as a template point.

    Kills: a FORMAT parameter the strategy fixes passed through (COO's ``zero_y``: the template refused
    the point, and the selector's choice was silently never tried), a variant's value outside its
    template's domain (a library point the search cannot reach)."""
    from sparserl.kernels.library import all_variants
    from sparserl.kernels.templates.library import variant_point

    by_name = {(t.op, t.name): t for t in templates()}
    for v in all_variants():
        name, params = variant_point(v)
        t = by_name[(v.op, name)]
        assert set(params) == {p.name for p in t.space}, v.id
        assert all(params[p.name] in p.values for p in t.space), v.id


def test_the_selectors_choice_for_a_skewed_spmm_is_a_valid_first_seed(monkeypatch) -> None:
    """On a power-law graph at k = 128 the selector picks a COO kernel that leaves Y unzeroed (here on a
    small graph: the warps-of-work bound lowered to what it has); the search takes it as its first seed.
    Kills: the fixed ``zero_y`` handed to the template (the point refused)."""
    import scipy.sparse as sp

    from sparserl.request import library
    from sparserl.request.context import MatrixContext
    from sparserl.search.run import _selector_point

    A = sp.csr_array(generate("powerlaw", 20_000, seed=2, mean_degree=4))
    monkeypatch.setattr(library, "SKEWED_SPMM_WARPS", A.nnz // 128)  # 128 entries a group: the bound's pick
    ctx = MatrixContext(A, "powerlaw", Op.SPMM, 128)
    name, params, note = _selector_point(ctx)
    space = CandidateSpace(matrix_card(A), Op.SPMM, 128, templates("spmm"))
    seeds = list(space.seeds([(name, params, note)]))
    assert name == "coo_runs_stored" and seeds[0].note == "selector"
    assert seeds[0].id == "spmm/coo_runs_stored/-/g=32,vec=4,nzpg=128,block=256"
    assert seeds[0].text.startswith("FORMAT: COO zero_y=0\n")
