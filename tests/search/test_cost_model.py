"""The cost model: trained from a real best-known store on a synthetic landscape, saved and loaded,
refused with one line when its file is of another version or layout (the search then keeps the
selector's order), a one-line error when a store is too small, and the search's order: the
selector's choice and the model's picks first, the rest in predicted order."""

from __future__ import annotations

import gzip
import json
import logging
import math
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("lightgbm")

from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from sparserl.matrices.card import card_and_features  # noqa: E402
from sparserl.search import cost_quality as cq  # noqa: E402
from sparserl.search.cost_model import (  # noqa: E402
    PACKAGED_MODEL,
    CostModel,
    CostModelError,
    MatrixMeasurements,
    TrainConfig,
    load_measurements,
    store_measurements,
    train,
)
from sparserl.search.loop import SearchConfig, run_search  # noqa: E402
from sparserl.search.ranker import ModelRanker, Ranker, make_ranker  # noqa: E402
from sparserl.search.space import CandidateSpace, Provenance, normalised, select_templates  # noqa: E402
from sparserl.search.store import BestStore, VerifiedKernel, harness_version  # noqa: E402
from tests.search.doubles import CUSPARSE_US, FakeTimingDouble  # noqa: E402

TEMPLATES = ("csr_scalar", "csr_vector", "ell_rows", "dia_rows", "sell_lanes", "coo_atomic")
TRAIN = [("random_4", "random", {"nnz_per_row": 4}), ("random_24", "random", {"nnz_per_row": 24}),
         ("random_12", "random", {"nnz_per_row": 12}), ("banded_3", "banded", {"bands": 3}),
         ("banded_11", "banded", {"bands": 11}), ("stencil2d", "stencil2d", {}), ("powerlaw", "powerlaw", {}),
         ("skewed", "skewed", {}), ("empty_rows", "empty_rows", {"nnz_per_row": 6})]
TEST = [("random_8", "random", {"nnz_per_row": 8}), ("banded_5", "banded", {"bands": 5})]


def law(template: str, p: dict, card) -> float:
    """The synthetic truth: log(time / cuSPARSE's) of a point on a matrix, from its card."""
    mean = max(card.row_len_mean, 0.5)
    spread = math.log(card.row_len_max / mean)
    if template == "csr_vector":
        return 0.3 * abs(math.log2(p["tpr"]) - math.log2(mean)) + 0.05 * (p["block"] == 128)
    if template == "csr_scalar":
        return 0.2 + 0.15 * math.log2(mean)
    if template == "ell_rows":
        return 0.6 * spread - 0.1 + 0.05 * (p["rpt"] == 2)
    if template == "dia_rows":
        return -0.6 + 1.5 * (1 - card.diag_fill) + 0.05 * p["rpt"]
    if template == "sell_lanes":
        return 0.1 + 0.1 * abs(math.log2(p["C"]) - 5) + 0.02 * math.log2(p["sigma"]) + 0.3 * spread
    return 0.5


def matrix(name: str, fam: str, params: dict):
    A = generate(fam, 2500, seed=7, **params)
    card, feats = card_and_features(A)
    space = CandidateSpace(card, Op.SPMV, None, select_templates(Op.SPMV, TEMPLATES))
    return name, A, card, feats, list(space.all_points())


def synthetic_time(card, p) -> float:
    return CUSPARSE_US * math.exp(law(p.template, p.param_dict, card))


@pytest.fixture(scope="module")
def train_mats():
    return [matrix(*m) for m in TRAIN]


@pytest.fixture(scope="module")
def test_mats():
    return [matrix(*m) for m in TEST]


def fill_store(path: Path, mats) -> None:
    with BestStore(path) as st:
        for name, _, card, feats, points in mats:
            st.add_matrix(card, name, features=feats)
            for p in points:
                t = synthetic_time(card, p)
                st.record(VerifiedKernel(
                    fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200", regime="cold",
                    text=p.text, time_us=t, cusparse_us=CUSPARSE_US, speedup=CUSPARSE_US / t, roofline=None,
                    format=None, template=p.template, candidate_id=p.id, provenance="seed", parent_id=None,
                    model=None, run_id="r", harness_version=harness_version()))


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, train_mats) -> Path:
    p = tmp_path_factory.mktemp("store") / "s.db"
    fill_store(p, train_mats)
    return p


@pytest.fixture(scope="module")
def model(store_path) -> CostModel:
    """A regression model (log time over cuSPARSE's): the search's use of a model, whatever its target."""
    with BestStore(store_path) as st:
        data = store_measurements(st)
    return train(data, TrainConfig(trees=150, target="ratio"))


def measured(name, card, feats, points) -> MatrixMeasurements:
    return MatrixMeasurements(name=name, family="random", op="spmv", k=None, arch="sm_90", regime="cold",
                              card=card, features=feats, cusparse_us=CUSPARSE_US,
                              times={p.id: synthetic_time(card, p) for p in points})


def test_trains_from_a_store_and_ranks_matrices_it_has_not_seen(store_path, model, test_mats) -> None:
    """Fitted on the store's verified times of 9 matrices, it ranks two unseen ones well.
    Mutations killed: targets not aligned with their rows, a matrix's features taken from another
    matrix, parameters left out of the rows (every point of a template would tie)."""
    with BestStore(store_path) as st:
        data = store_measurements(st)
    assert len(data) == len(TRAIN) and all(m.features is not None for m in data)
    assert sum(len(m.points()) for m in data) == model.meta["trained_on"]["measurements"]
    for name, _, card, feats, points in test_mats:
        s = cq.score_model(model, [measured(name, card, feats, points)])[0]
        assert s.recall and s.tau > 0.8, (name, s)
        assert s.regret == 1.0


def test_save_and_load_give_the_same_predictions(model, test_mats, tmp_path: Path) -> None:
    _, _, card, feats, points = test_mats[0]
    pts = [(p.template, p.param_dict) for p in points]
    path = model.save(tmp_path / "m.json.gz")
    with gzip.open(path) as fh:
        assert json.load(fh)["format"] == "sparserl-cost-model"
    back = CostModel.load(path)
    assert back.meta == model.meta
    np.testing.assert_array_equal(back.predict_points(card, feats, "spmv", None, pts),
                                  model.predict_points(card, feats, "spmv", None, pts))


def _rewrite(src: Path, dst: Path, change) -> Path:
    blob = json.loads(gzip.decompress(src.read_bytes()))
    change(blob)
    dst.write_bytes(gzip.compress(json.dumps(blob).encode()))
    return dst


def _search_ids(A, card, ranker, budget: int = 12) -> list[str]:
    ev = FakeTimingDouble(lambda text: 10.0 + len(text) % 11)
    res = run_search(A, "m", "spmv", None, SearchConfig(budget=budget, parallel=1), ev, card=card, progress=False,
                     selector_point=("csr_vector", {"tpr": 4, "block": 128}, "selector"), ranker=ranker)
    return [e.proposal.id for e in sorted(res.entries, key=lambda e: e.order)]


@pytest.mark.parametrize("change", [
    lambda b: b.update(format_version=b["format_version"] + 1),
    lambda b: b.update(layout=b["layout"] + 1),
    lambda b: b.update(feature_names=b["feature_names"][:-1]),
    lambda b: b.update(format="something else"),
], ids=["format-version", "layout-version", "feature-names", "not-a-model"])
def test_a_model_of_another_version_or_layout_falls_back_with_one_line(model, test_mats, tmp_path, caplog,
                                                                        change) -> None:
    """Mutations killed: no version check, no layout check (a model fed rows of another layout
    would rank at random), a refusal that raises past the search or logs a traceback."""
    good = model.save(tmp_path / "good.json.gz")
    bad = _rewrite(good, tmp_path / "bad.json.gz", change)
    with pytest.raises(CostModelError) as exc:
        CostModel.load(bad)
    assert "\n" not in str(exc.value)
    _, A, card, feats, _ = test_mats[0]
    with caplog.at_level(logging.INFO, logger="sparserl.search.ranker"):
        r = make_ranker(str(bad), card, feats, "spmv", None)
    assert type(r) is Ranker
    warnings = [x for x in caplog.records if x.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage() and warnings[0].exc_info is None
    assert "selector's order" in warnings[0].getMessage()
    assert _search_ids(A, card, r) == _search_ids(A, card, None)  # today's order exactly


def test_junk_and_missing_files_fall_back_too(test_mats, tmp_path, caplog) -> None:
    _, _, card, feats, _ = test_mats[0]
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes(b"\x1f\x8b not gzip at all")
    for path in (junk, tmp_path / "missing.json.gz"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparserl.search.ranker"):
            assert type(make_ranker(str(path), card, feats, "spmv", None)) is Ranker
        assert len(caplog.records) == 1


def test_without_lightgbm_the_search_keeps_its_order(model, test_mats, tmp_path, monkeypatch, caplog) -> None:
    """The search works without the search extra: one line, then the selector's order."""
    path = model.save(tmp_path / "fresh.json.gz")  # a file no earlier test loaded (loads are cached)
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # import lightgbm now raises ImportError
    _, A, card, feats, _ = test_mats[0]
    with caplog.at_level(logging.WARNING, logger="sparserl.search.ranker"):
        r = make_ranker(str(path), card, feats, "spmv", None)
    assert type(r) is Ranker and len(caplog.records) == 1 and "lightgbm is not installed" in caplog.text


def test_too_few_measurements_is_one_line_that_says_how_many(train_mats, tmp_path, capsys) -> None:
    """Mutations killed: training on whatever there is, a message without the numbers needed."""
    from tests.search.test_cli import run_cli

    path = tmp_path / "small.db"
    fill_store(path, train_mats[:3])
    with BestStore(path) as st:
        data = store_measurements(st)
    n = sum(len(m.points()) for m in data)
    with pytest.raises(CostModelError, match=rf"{n} verified measurements on 3 matrices; training a cost model "
                                             r"needs at least 200 on 4 matrices"):
        train(data)
    code, out, err = run_cli(["best", "cost-model", "--store", str(path), "--out", str(tmp_path / "m.json.gz")],
                             capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "at least 200 on 4 matrices" in err
    assert not (tmp_path / "m.json.gz").exists()


def test_held_out_families_are_never_trained_on(train_mats) -> None:
    """Mutation killed: training on every matrix it is given (a held-out family's name included)."""
    data = [measured(n if i else "circuit_2500", c, f, p) for i, (n, _, c, f, p) in enumerate(train_mats)]
    m = train(data, TrainConfig(trees=5))
    assert m.meta["trained_on"]["held_out_left_out"] == 1
    assert m.meta["trained_on"]["matrices"] == len(train_mats) - 1


def _best_per_template(model, card, feats, space) -> list[tuple[str, dict]]:
    """Independently of the ranker: every template's best predicted valid point, best first."""
    import itertools

    best = []
    for t in space.templates:
        pts = [dict(zip([p.name for p in t.space], v)) for v in itertools.product(*(p.values for p in t.space))]
        pts = [q for q in pts if t.check(q, card, None) is None]
        s = model.predict_points(card, feats, "spmv", None, [(t.name, q) for q in pts])
        best.append((float(s.min()), t.name, pts[int(np.argmin(s))]))
    return [(n, q) for _, n, q in sorted(best, key=lambda x: x[0])]


def test_first_candidates_are_the_selector_then_the_models_picks_across_templates(model, test_mats) -> None:
    """Mutations killed: picks left out, picks all from one template, picks before the selector."""
    name, A, card, feats, _ = test_mats[0]
    ranker = ModelRanker(model, card, feats, "spmv", None)
    space = CandidateSpace(card, Op.SPMV, None, select_templates(Op.SPMV, TEMPLATES))
    expect = [space.point(n, q, Provenance.MODEL).id for n, q in _best_per_template(model, card, feats, space)
              if not ranker.refused(space.by_name[n].format, q)][:4]
    ev = FakeTimingDouble(lambda text: 20.0)
    cfg = SearchConfig(budget=10, parallel=1, templates=TEMPLATES)
    res = run_search(A, name, "spmv", None, cfg, ev, card=card, progress=False, ranker=ranker,
                     selector_point=("csr_scalar", {"block": 128}, "selector"))
    order = sorted(res.entries, key=lambda e: e.order)
    assert order[0].proposal.note == "selector" and order[0].proposal.id == "spmv/csr_scalar/-/block=128"
    picks = order[1:5]
    assert [e.proposal.id for e in picks] == expect
    assert all(e.proposal.provenance is Provenance.MODEL and "predicted" in e.proposal.note for e in picks)
    assert len({e.proposal.template for e in picks}) == 4


def test_the_order_follows_the_model(model, test_mats) -> None:
    """Round one and a parent's mutations come in predicted order with a model, and not without
    one. Mutation killed: a search that ignores its ranker (this test then fails on both counts)."""
    name, A, card, feats, points = test_mats[0]
    sel = ("sell_lanes", {"C": 32, "sigma": 64, "block": 256}, "selector")
    sel_text = normalised(next(p.text for p in points if p.template == "sell_lanes" and p.param_dict == sel[1]))
    ranker = ModelRanker(model, card, feats, "spmv", None)

    def run(r) -> list:
        ev = FakeTimingDouble(lambda text: 10.0 if normalised(text) == sel_text else 50.0)  # the selector's stays best
        cfg = SearchConfig(budget=40, parallel=1, templates=TEMPLATES, model_picks=0, explore=0.0, switch=0.0,
                           beam=1, seed_share=0.2)
        res = run_search(A, name, "spmv", None, cfg, ev, card=card, progress=False, ranker=r, selector_point=sel)
        return sorted(res.entries, key=lambda e: e.order)

    def scores(entries) -> list[float]:
        return list(ranker.scores([(e.proposal.template, e.proposal.param_dict) for e in entries]))

    for r, follows in ((ranker, True), (None, False)):
        entries = run(r)
        first_round = [e for e in entries if e.proposal.provenance is Provenance.SEED][1:len(TEMPLATES)]
        moves = [e for e in entries if e.proposal.provenance is Provenance.MUTATION]
        assert len(moves) >= 4 and all(e.proposal.parent == "spmv/sell_lanes/C=32,sigma=64/block=256" for e in moves)
        assert (scores(moves) == sorted(scores(moves))) is follows
        assert (scores(first_round) == sorted(scores(first_round))) is follows, [e.proposal.id for e in first_round]


def test_search_array_follows_its_cost_model_setting(model, test_mats, tmp_path) -> None:
    """Mutation killed: a search set up without its configured model (or with one under 'none')."""
    from sparserl.request.context import MatrixContext
    from sparserl.search.run import search_array

    path = model.save(tmp_path / "mine.json.gz")
    name, A, card, feats, _ = test_mats[0]
    ids = {}
    for spec in (str(path), "none"):
        ev = FakeTimingDouble(lambda text: 10.0 + len(text) % 11)
        res = search_array(MatrixContext(A, name, Op.SPMV), SearchConfig(budget=12, parallel=1, cost_model=spec), ev,
                           None, progress=False)
        ids[spec] = [e.proposal for e in sorted(res.entries, key=lambda e: e.order)]
    assert sum(p.provenance is Provenance.MODEL for p in ids[str(path)]) == 4
    assert not any(p.provenance is Provenance.MODEL for p in ids["none"])
    assert ids[str(path)][0].note == ids["none"][0].note == "selector"


def test_default_is_your_own_model_else_the_packaged_one(model, test_mats, tmp_path, monkeypatch) -> None:
    from sparserl.search.cost_model import default_model_path, user_model_path

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    assert default_model_path() == PACKAGED_MODEL
    model.save(user_model_path())
    assert default_model_path() == user_model_path() == tmp_path / "cache" / "cost_model.json.gz"
    _, _, card, feats, _ = test_mats[0]
    r = make_ranker("default", card, feats, "spmv", None)
    assert isinstance(r, ModelRanker) and r.model.meta == model.meta


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
SPMM_DATA = RESULTS / "2026-12-04" / "cost-model-spmm" / "measurements_spmm_trainable_gpu.jsonl.gz"
SPMV_DATA = RESULTS / "2026-12-02" / "cost-model" / "templates_speed_measurements.jsonl"


def test_each_operator_has_its_own_default_model(model, test_mats, tmp_path, monkeypatch, caplog) -> None:
    """An SpMM search looks for the SpMM model (the user's own, else a packaged one) and an SpMV
    search for the SpMV one; with no SpMM model anywhere, one line and the selector's order.
    Mutations killed: one default path for both operators (an SpMM search would find the SpMV
    model, or an SpMV search the user's SpMM model), the user's SpMM model ignored."""
    from sparserl.search.cost_model import default_model_path, packaged_model_path, user_model_path

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    assert default_model_path("spmv") == PACKAGED_MODEL
    assert default_model_path("spmm") == packaged_model_path("spmm") != PACKAGED_MODEL
    A = generate("powerlaw", 3000, seed=2)
    card, feats = card_and_features(A)
    if not packaged_model_path("spmm").is_file():
        with caplog.at_level(logging.WARNING, logger="sparserl.search.ranker"):
            assert type(make_ranker("default", card, feats, "spmm", 64)) is Ranker
        assert "no cost model for spmm" in caplog.text
    spmm = train(load_measurements(SPMM_DATA), TrainConfig(trees=5))
    assert spmm.meta["ops"] == ["spmm"]
    spmm.save(user_model_path("spmm"))
    assert user_model_path("spmm") == tmp_path / "cache" / "cost_model_spmm.json.gz"
    assert default_model_path("spmm") == user_model_path("spmm") and default_model_path("spmv") == PACKAGED_MODEL
    r = make_ranker("default", card, feats, "spmm", 64)
    assert isinstance(r, ModelRanker) and r.model.meta == spmm.meta
    _, _, tcard, tfeats, _ = test_mats[0]
    r = make_ranker("default", tcard, tfeats, "spmv", None)
    assert isinstance(r, ModelRanker) and r.model.meta["ops"] == ["spmv"]


def test_best_cost_model_fits_one_model_per_operator(tmp_path, monkeypatch, capsys) -> None:
    """Data of both operators: a model for each, written where searches look, each fitted on its own
    operator; --out with both is refused in one line unless --op picks one; an operator with too
    little data is skipped with one line while the other is written. Mutations killed: one model
    fitted on both operators, the SpMM model written over the SpMV one, --op ignored."""
    from sparserl.search.cost_model import user_model_path
    from tests.search.test_cli import run_cli

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    both = ["best", "cost-model", "--data", str(SPMV_DATA), "--data", str(SPMM_DATA), "--trees", "3"]
    code, out, err = run_cli(both, capsys)
    assert code == 0, err
    assert CostModel.load(user_model_path("spmv")).meta["ops"] == ["spmv"]
    assert CostModel.load(user_model_path("spmm")).meta["ops"] == ["spmm"]
    assert out.count("wrote ") == 2
    code, out, err = run_cli(both + ["--out", str(tmp_path / "one.json.gz")], capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "--op" in err
    assert not (tmp_path / "one.json.gz").exists()
    code, out, err = run_cli(both + ["--op", "spmm", "--out", str(tmp_path / "one.json.gz")], capsys)
    assert code == 0 and CostModel.load(tmp_path / "one.json.gz").meta["ops"] == ["spmm"]
    code, out, err = run_cli(both + ["--op", "spmx"], capsys)
    assert code == 2 and err.startswith("error: --op must be spmv or spmm") and err.count("\n") == 1
    few = tmp_path / "few.jsonl"  # one SpMM matrix: too little for a model of its own
    with gzip.open(SPMM_DATA, "rt") as fh:
        few.write_text(fh.readline())
    (tmp_path / "cache" / "cost_model_spmm.json.gz").unlink()
    code, out, err = run_cli(["best", "cost-model", "--data", str(SPMV_DATA), "--data", str(few), "--trees", "3"],
                             capsys)
    assert code == 0 and "no spmm model: " in out and "on 1 matrices" in out and out.count("wrote ") == 1
    assert not user_model_path("spmm").exists()


def test_a_matrix_far_outside_the_trained_sizes_keeps_the_selectors_order(model, test_mats, tmp_path,
                                                                          caplog) -> None:
    """A tree model predicts past its training sizes as at the nearest size seen; the ranker
    then stands aside. Mutation killed: a model applied to any matrix whatever its size."""
    from dataclasses import replace

    path = model.save(tmp_path / "sized.json.gz")
    lo, hi = model.meta["trained_on"]["nnz_range"]
    _, _, card, feats, _ = test_mats[0]
    assert isinstance(make_ranker(str(path), replace(card, nnz=hi * 3), feats, "spmv", None), ModelRanker)
    with caplog.at_level(logging.INFO, logger="sparserl.search.ranker"):
        r = make_ranker(str(path), replace(card, nnz=hi * 5), feats, "spmv", None)
    assert type(r) is Ranker and "trained on matrices of" in caplog.text
    assert type(make_ranker(str(path), replace(card, nnz=lo // 5), feats, "spmv", None)) is Ranker


def test_the_packaged_model_loads_and_fits_this_layout() -> None:
    """Fails when the feature layout, a template's parameters or the file format change without
    the packaged model being trained again (sparserl best cost-model --data ... --out PACKAGED)."""
    m = CostModel.load(PACKAGED_MODEL)
    assert "spmv" in m.meta["ops"] and m.meta["target"] == "blend"
    assert PACKAGED_MODEL.stat().st_size < 600_000  # two parts (generated matrices; with the real ones too)
    assert m.real_part is not None and m.meta["real_part_max_nnz"] > 100_000
    assert "suitesparse" in m.real_part.meta["trained_on"]["families"]
    from sparserl.matrices.generators import HELD_OUT_FAMILIES

    assert not set(m.meta["trained_on"]["families"]) & set(HELD_OUT_FAMILIES)
    assert not any(s.startswith("/") for s in m.meta["trained_on"]["sources"])  # no paths of a machine


def test_ranking_figures_on_a_perfect_and_a_reversed_order(test_mats) -> None:
    name, _, card, feats, points = test_mats[0]
    m = measured(name, card, feats, points)
    by_time = sorted(m.times, key=m.times.get)
    good = cq.rank_score(m, by_time, predicted=[m.times[c] for c in by_time])
    bad = cq.rank_score(m, by_time[::-1], predicted=[-m.times[c] for c in by_time[::-1]])
    assert good.recall and good.near and good.regret == 1.0 and good.tau == pytest.approx(1.0)
    assert not bad.recall and bad.regret > 1.0 and bad.tau == pytest.approx(-1.0)
    assert bad.regret == pytest.approx(m.times[by_time[-5]] / m.times[by_time[0]])


def test_templates_speed_measurements_in_git_load_with_their_cards() -> None:
    """The measurements the packaged model was trained on: every matrix with its card and features."""
    from sparserl.search.cost_model import load_measurements

    path = Path(__file__).resolve().parents[2] / "benchmarks/results/2026-12-02/cost-model/" \
        "templates_speed_measurements.jsonl"
    data = load_measurements(path)
    assert len(data) == 7 and all(m.features is not None and len(m.points()) >= 50 for m in data)
    assert {m.card.nnz for m in data} >= {4_000_000, 107_171_875}


def test_the_data_script_writes_measurements_the_trainer_reads(tmp_path) -> None:
    """benchmarks/cost_model_data.py's per-matrix record, with the GPU's timing stood in for by the
    double: every oracle point and the mutations evaluated, cuSPARSE's time kept, read back by the
    trainer's loader with its card and features. Mutation killed: a record the loader cannot read,
    or times keyed by ids that are not template points."""
    from sparserl.search.cost_model import load_measurements
    from tests.conftest import load_benchmark

    mod = load_benchmark("cost_model_data")
    A = generate("powerlaw", 3000, seed=1)
    card, feats = card_and_features(A)
    ev = FakeTimingDouble(lambda text: 10.0 + len(text) % 17)
    row = mod.measure(ev, "powerlaw_3000", "powerlaw", A, card, feats, Op.SPMV, None, 6, 0, math.inf, False)
    assert row["complete"] and row["evaluated"] == row["planned"] >= 60 and row["cusparse_us"] == CUSPARSE_US
    assert sum(c["provenance"] in ("mutation", "random") for c in row["candidates"]) == 6
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(row | {"cusparse_us": None}) + "\n")
    [m] = load_measurements(path)  # a record with nothing verified (compile-only) is skipped
    assert m.card == card and m.features == feats and len(m.points()) == row["evaluated"]
    assert all(m.times[c["id"]] == c["time_us"] for c in row["candidates"])
    assert set(mod.FAMILIES) & {"circuit", "kkt", "fem_mixed", "road"} == set()


def test_the_data_script_measures_spmm_at_each_width(tmp_path) -> None:
    """``--op spmm --ks``: each (matrix, k) is its own record, named with its width, holding SpMM
    template points that the loader reads back with op and k; SpMV refuses --ks, and bad widths are
    refused. Mutations killed: k not passed to the harness (the records say k=None or SpMV ids),
    one name for both widths (--resume would skip the second), --ks silently ignored for SpMV."""
    from sparserl.search.cost_model import load_measurements
    from tests.conftest import load_benchmark

    mod = load_benchmark("cost_model_data")
    A = generate("banded", 3000, seed=1)
    card, feats = card_and_features(A)
    rows = []
    for k in (32, 128):
        ev = FakeTimingDouble(lambda text: 10.0 + len(text) % 17)
        name = mod.measured_name("banded_3000", k)
        rows.append(mod.measure(ev, name, "banded", A, card, feats, Op.SPMM, k, 2, 0, math.inf, False))
    assert [r["matrix"] for r in rows] == ["banded_3000_k32", "banded_3000_k128"]
    assert [(r["op"], r["k"]) for r in rows] == [("spmm", 32), ("spmm", 128)]
    assert all(c["id"].startswith("spmm/") for r in rows for c in r["candidates"])
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ms = load_measurements(path)
    assert [(m.op, m.k) for m in ms] == [("spmm", 32), ("spmm", 128)] and all(len(m.points()) > 20 for m in ms)
    args = SimpleNamespace(op="spmm", ks="32,128")
    assert mod.k_list(args) == [32, 128] and mod.k_list(SimpleNamespace(op="spmm", ks="")) == [64]
    assert mod.k_list(SimpleNamespace(op="spmv", ks="")) == [None] and mod.measured_name("a_10", None) == "a_10"
    for bad in (SimpleNamespace(op="spmv", ks="64"), SimpleNamespace(op="spmm", ks="0"),
                SimpleNamespace(op="spmm", ks="6x")):
        with pytest.raises(SystemExit):
            mod.k_list(bad)


def test_rank_grades_step_down_three_percent_at_a_time() -> None:
    """Hand-derived: the fastest and anything within 3% of it get 9, one less per further 3%, 0 from
    about 31% slower on. Mutations killed: the step or the number of grades changed, the floor dropped."""
    from sparserl.search.cost_model import RANK_GRADES, RANK_STEP, rank_grade

    assert (RANK_STEP, RANK_GRADES) == (1.03, 10)
    assert [rank_grade(t, 100.0) for t in (100.0, 102.9, 103.0, 103.1, 106.2, 130.0, 134.4, 200.0, 1e6)] == \
        [9, 9, 8, 8, 7, 1, 0, 0, 0]


def test_the_rank_target_puts_the_fastest_first_on_matrices_it_has_not_seen(store_path, test_mats,
                                                                           tmp_path: Path) -> None:
    """A LambdaRank fit (one group per matrix) on the same store: lower predictions are faster
    (the scores are negated), it finds the best of both unseen matrices in its top 5, and it saves
    and loads with its target. Mutations killed: scores not negated (the slowest first), groups not
    one per matrix (LightGBM refuses sizes that do not add up), grades reversed."""
    with BestStore(store_path) as st:
        data = store_measurements(st)
    ranked = train(data, TrainConfig(trees=150, target="rank"))
    assert ranked.target == "rank"
    for name, _, card, feats, points in test_mats:
        s = cq.score_model(ranked, [measured(name, card, feats, points)])[0]
        assert s.recall and s.regret < 1.02, (name, s)
        assert s.tau > 0.1, (name, s)  # a ranking fit orders the top; the whole order only loosely
    again = CostModel.load(ranked.save(tmp_path / "rank.json.gz"))
    name, _, card, feats, points = test_mats[0]
    pts = [(p.template, p.param_dict) for p in points]
    assert again.target == "rank"
    np.testing.assert_allclose(again.predict_points(card, feats, "spmv", None, pts),
                               ranked.predict_points(card, feats, "spmv", None, pts))
    ranker = ModelRanker(again, card, feats, "spmv", None)
    assert ranker.note(*pts[0]).startswith("cost model: ranking score ")


@pytest.fixture(scope="module")
def blended(store_path) -> CostModel:
    with BestStore(store_path) as st:
        data = store_measurements(st)
    return train(data, TrainConfig(trees=150, target="blend"))


def test_the_blend_is_the_weighted_sum_of_its_two_fits_pointwise(blended, test_mats, tmp_path: Path) -> None:
    """Hand-derived from its parts: the blend's score is w_rank * -rank_score / s_rank + w_gap *
    gap / s_gap, each spread the mean within-matrix standard deviation of that fit's scores on the
    training matrices; a point's score does not depend on the other points scored with it (the
    search scores points in batches); it ranks both unseen matrices' fastest in its top 5 and saves
    and loads with both boosters. Mutations killed: the ranking score not negated, the weights or
    spreads swapped, a spread taken over each batch (the score of a point would change with its
    batch), the second booster not saved."""
    from sparserl.search import cost_features as cf

    assert blended.target == "blend" and blended.meta["blend"]["weights"] == [0.3, 0.7]
    s_rank, s_gap = blended.meta["blend"]["scales"]
    assert s_rank > 0 and s_gap > 0 and s_rank != s_gap
    name, _, card, feats, points = test_mats[0]
    pts = [(p.template, p.param_dict) for p in points]
    X = cf.rows(card, feats, "spmv", None, pts, blended.meta["vocab"])
    rank, gap = blended.booster.predict(X), blended.gap_booster.predict(X)
    expect = 0.3 * -rank / s_rank + 0.7 * gap / s_gap
    got = blended.predict_points(card, feats, "spmv", None, pts)
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    np.testing.assert_allclose(blended.predict_points(card, feats, "spmv", None, pts[:3]), got[:3], rtol=1e-12)
    for name, _, card, feats, points in test_mats:
        s = cq.score_model(blended, [measured(name, card, feats, points)])[0]
        assert s.recall and s.regret < 1.02 and s.tau > 0.5, (name, s)
    again = CostModel.load(blended.save(tmp_path / "blend.json.gz"))
    assert again.meta == blended.meta and again.gap_text == blended.gap_text
    np.testing.assert_array_equal(again.predict_points(card, feats, "spmv", None, pts),
                                  blended.predict_points(card, feats, "spmv", None, pts))
    assert ModelRanker(again, card, feats, "spmv", None).note(*pts[0]).startswith("cost model: score ")


def test_the_blend_spreads_are_the_fits_mean_spread_within_a_training_matrix(blended, store_path) -> None:
    """Recomputed from the training rows. Mutation killed: a spread over all rows at once (it would
    hold the differences between matrices, which the ranking fit does not even have)."""
    from sparserl.search import cost_features as cf
    from sparserl.search.cost_model import design

    with BestStore(store_path) as st:
        data = store_measurements(st)
    X, _, _ = design(data, blended.meta["vocab"], "gap")
    sizes = np.cumsum([len(m.points()) for m in data])[:-1]
    for booster, sign, spread in ((blended.booster, -1.0, blended.meta["blend"]["scales"][0]),
                                  (blended.gap_booster, 1.0, blended.meta["blend"]["scales"][1])):
        per = [np.std(sign * part) for part in np.split(booster.predict(X), sizes)]
        assert spread == pytest.approx(float(np.mean(per)), rel=1e-9)
    assert X.shape[1] == len(cf.feature_names())


def test_the_gap_target_is_log_time_over_the_matrix_fastest(train_mats) -> None:
    """Hand-derived: each matrix's fastest candidate has target 0, the others log(t / t_fastest).
    Mutation killed: the gap taken over cuSPARSE's time or over the fastest of all matrices."""
    from sparserl.search import cost_features as cf
    from sparserl.search.cost_model import design

    data = [measured(n, c, f, p) for n, _, c, f, p in train_mats[:2]]
    _, y, _ = design(data, cf.vocabulary(), "gap")
    parts = np.split(y, [len(data[0].points())])
    for m, part in zip(data, parts):
        t = np.array([t for *_, t in m.points()])
        np.testing.assert_allclose(part, np.log(t / t.min()))


def test_a_blend_file_without_its_second_booster_falls_back_with_one_line(blended, test_mats, tmp_path,
                                                                         caplog) -> None:
    """Mutation killed: a blend model loaded without its regression booster (it would fail in the
    middle of a search, or rank by one half with the other's spread)."""
    good = blended.save(tmp_path / "blend.json.gz")
    for i, change in enumerate((lambda b: b.pop("gap_booster"), lambda b: b["blend"].pop("scales"))):
        bad = _rewrite(good, tmp_path / f"bad{i}.json.gz", change)
        with pytest.raises(CostModelError, match="blend cost model without") as exc:
            CostModel.load(bad)
        assert "\n" not in str(exc.value)
        _, _, card, feats, _ = test_mats[0]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparserl.search.ranker"):
            assert type(make_ranker(str(bad), card, feats, "spmv", None)) is Ranker
        assert len(caplog.records) == 1 and "selector's order" in caplog.text


def test_a_model_file_of_format_one_still_loads(model, test_mats, tmp_path) -> None:
    """A one-booster file written before the blend (format version 1) loads and predicts as before.
    Mutation killed: a loader that reads the newest format only."""
    path = _rewrite(model.save(tmp_path / "m.json.gz"), tmp_path / "v1.json.gz",
                    lambda b: b.update(format_version=1))
    old = CostModel.load(path)
    _, _, card, feats, points = test_mats[0]
    pts = [(p.template, p.param_dict) for p in points]
    np.testing.assert_array_equal(old.predict_points(card, feats, "spmv", None, pts),
                                  model.predict_points(card, feats, "spmv", None, pts))


def test_the_default_fit_is_the_blend_chosen_by_leave_one_family_out() -> None:
    """The defaults chosen by leave-one-family-out cross-validation over the 58 trainable matrices
    (the last section of benchmarks/results/2026-12-02/cost-model/README.md), and the packaged model
    fitted with them: the ranking half with truncation level 20 and gains 2**g - 1, weighed 0.3
    against the regression of log(t / t_fastest). Mutations killed: the default target put back to
    rank, the truncation level or the gains put back (10, linear), the weight changed, the packaged
    model not refitted."""
    cfg = TrainConfig()
    assert (cfg.target, cfg.rank_truncation, cfg.rank_gain, cfg.blend_rank_weight) == ("blend", 20, "exponential", 0.3)
    m = CostModel.load(PACKAGED_MODEL)
    assert m.meta["target"] == "blend" and m.meta["format_version"] == 3
    assert {k: m.meta["config"][k] for k in ("rank_truncation", "rank_gain", "blend_rank_weight")} == \
        {"rank_truncation": 20, "rank_gain": "exponential", "blend_rank_weight": 0.3}
    assert "[lambdarank_truncation_level: 20]" in m.booster_text
    assert "[label_gain: 0,1,3,7,15,31,63,127,255,511]" in m.booster_text
    assert "[objective: regression]" in m.gap_text


def test_folds_keep_matrices_named_alike_together_and_balance_the_rest() -> None:
    """``grouped_folds`` is pure and deterministic, puts a group (``bcsstk29``, ``bcsstk33``) in one
    fold, and balances fold sizes. Mutations killed: a group split across folds (a model scored on a
    matrix whose sibling it was fitted on), a fold left empty, and an order that depends on the input's."""
    names = ["bcsstk29", "bcsstk33", "bcsstk13", "1138_bus", "watt_1", "watt_2", "lp_a", "soc-x", "ca-y", "Ca-z"]
    f = cq.grouped_folds(names, 3)
    assert cq.name_group("1138_bus") == "1138_bus" and cq.name_group("Ca-z") == "ca"
    assert len({f[0], f[1], f[2]}) == 1 and f[4] == f[5] and f[8] == f[9]
    assert sorted(f.count(i) for i in range(3)) == [3, 3, 4]
    shuffled = names[::-1]
    g = cq.grouped_folds(shuffled, 3)
    assert {n: x for n, x in zip(names, f)} == {n: x for n, x in zip(shuffled, g)}
    with pytest.raises(ValueError, match="2 folds"):
        cq.grouped_folds(names, 1)
    # fold sizes count matrices, not groups: a group of 5 and three of 1 make folds of 5 and 3 (6 and 2 by groups)
    g = cq.grouped_folds(["aa1", "aa2", "aa3", "aa4", "aa5", "bb", "cc", "dd"], 2)
    assert sorted(g.count(i) for i in range(2)) == [3, 5]


def test_cross_fit_never_scores_a_matrix_with_a_model_fitted_on_it(test_mats, monkeypatch) -> None:
    """Each scored matrix's model was fitted on the training set and the other folds only, and every
    matrix is scored once. Mutation killed: the scored fold left in its own fit."""
    fitted_on: list[set[str]] = []

    def fit(data, cfg, where=""):
        names = {m.name for m in data}
        fitted_on.append(names)
        return SimpleNamespace(names=names)

    mats = [measured(f"{base}{i}", card, feats, points)
            for i, (base, (_, _, card, feats, points)) in enumerate(zip(("aa", "aa", "bb", "cc"), test_mats * 2))]
    scored: list[tuple[str, set[str]]] = []
    monkeypatch.setattr(cq, "score_model",
                        lambda model, ms, k=cq.K: [scored.append((m.name, model.names)) or m.name for m in ms])
    kept: list[tuple[int, set[str], list[str]]] = []
    # mats[0] again in the training set (under another family): it must still never be in its own fit
    out = cq.cross_fit([mats[3], replace(mats[0], family="store")], mats[:3], 2, TrainConfig(), fit,
                       on_model=lambda f, model, names: kept.append((f, model.names, names)))
    assert len(kept) == 2 and sorted(n for _, _, names in kept for n in names) == ["aa0", "aa1", "bb2"]
    for _, fitted, names in kept:  # each fold's model is handed over with the matrices it scored, never fitted on
        assert not set(names) & fitted
    assert sorted(out) == ["aa0", "aa1", "bb2"] and len(fitted_on) == 2
    for name, names in scored:
        assert name not in names and "cc3" in names
    assert {n for n, names in scored if "aa0" in names} == {"bb2"}  # aa0 and aa1 share a fold


def _real(name: str, fam: str, params: dict, rows: int = 150) -> MatrixMeasurements:
    """A 'real' matrix (family suitesparse) whose candidates follow the synthetic law reversed: a
    fit on it must rank unlike a fit on the generated matrices."""
    A = generate(fam, rows, seed=11, **params)
    card, feats = card_and_features(A)
    space = CandidateSpace(card, Op.SPMV, None, select_templates(Op.SPMV, TEMPLATES))
    return MatrixMeasurements(name=name, family="suitesparse", op="spmv", k=None, arch="sm_90", regime="cold",
                              card=card, features=feats, cusparse_us=CUSPARSE_US,
                              times={p.id: CUSPARSE_US * math.exp(-law(p.template, p.param_dict, card))
                                     for p in space.all_points()})


@pytest.fixture(scope="module")
def real_mats():
    return [_real(f"{n}_ss", fam, params) for n, fam, params in TRAIN[:6]]  # named apart from the generated ones


def test_real_matrices_get_a_part_of_their_own_up_to_their_size(train_mats, test_mats, real_mats, tmp_path) -> None:
    """Generated and real matrices together: the generated ones' fit serves matrices larger than
    every real one, the fit on all of them the rest; the part survives a save and a load; one kind
    of data alone, a real matrix larger than every generated one, or ``real_part=False``, fits one
    model. Mutations killed: the parts swapped (a small real matrix ranked by the generated fit), the
    real part dropped on save, the size limit taken from the generated matrices or made strict (a
    matrix of exactly the largest real size), the held-out count lost, and a split that leaves the
    sizes between the largest generated and the largest real matrix to a fit that never saw them."""
    gen = [measured(name, card, feats, points) for name, _, card, feats, points in train_mats]
    cfg = TrainConfig(trees=60, target="ratio")
    model = train(gen + real_mats, cfg)
    real_top, gen_low = max(m.card.nnz for m in real_mats), min(m.card.nnz for m in gen)
    top = max(real_top, gen_low)  # the real part also ranks what lies below every generated matrix
    assert real_top < gen_low and model.real_part is not None and model.meta["real_part_max_nnz"] == top
    assert model.meta["trained_on"]["matrices"] == len(gen) and model.real_part.meta["trained_on"]["matrices"] == 15
    assert "real matrices too" in model.describe()
    small = _real("real_probe", "random", {"nnz_per_row": 8})
    assert small.card.nnz <= real_top
    pts = [(t, p) for _, t, p, _ in small.points()]
    by_real = model.real_part.predict_points(small.card, small.features, "spmv", None, pts)
    np.testing.assert_array_equal(model.predict_points(small.card, small.features, "spmv", None, pts), by_real)
    assert cq.score_model(model, [small])[0].tau > 0.5  # the reversed law, learned from the real matrices
    name, _, card, feats, points = test_mats[0]
    big = measured(name, card, feats, points)
    assert big.card.nnz > top
    assert cq.score_model(model, [big])[0].tau > 0.5  # the generated law for the larger matrix
    assert model.outside(small.card) is None and model.part_for(big.card) is model
    back = CostModel.load(model.save(tmp_path / "gated.json.gz"))
    assert back.real_part is not None and back.meta == model.meta
    np.testing.assert_array_equal(back.predict_points(small.card, small.features, "spmv", None, pts), by_real)
    for data, c in ((gen, cfg), (real_mats, cfg),
                    (gen + real_mats, replace(cfg, real_part=False))):
        assert train(data, c).real_part is None
    card_at = SimpleNamespace(nnz=top)
    assert model.part_for(card_at) is model.real_part and model.part_for(SimpleNamespace(nnz=top + 1)) is model
    circuit = replace(gen[0], name="circuit_1", family="circuit")  # a held-out family: left out, and counted
    assert train(gen + real_mats + [circuit], cfg).meta["trained_on"]["held_out_left_out"] == 1
    # a real matrix larger than every generated one: one model on all (a generated-only part could not rank
    # the matrices between them)
    huge = replace(real_mats[0], card=replace(real_mats[0].card, nnz=10 * max(m.card.nnz for m in gen)))
    one = train(gen + real_mats + [huge], cfg)
    assert one.real_part is None and one.outside(replace(huge.card, nnz=huge.card.nnz - 1)) is None
    broken = _rewrite(tmp_path / "gated.json.gz", tmp_path / "broken.json.gz", lambda b: b.pop("real_part_max_nnz"))
    with pytest.raises(CostModelError, match="real part but no size"):
        CostModel.load(broken)


def test_fold_models_are_written_for_one_target_and_map_each_real_matrix_to_a_fit_without_it(
        train_mats, real_mats, tmp_path, monkeypatch, capsys) -> None:
    """``cost_model_quality.py --suitesparse-folds 2 --fold-models DIR`` end to end on made-up
    measurements: every real matrix is mapped to a model of the asked target whose real part was
    fitted on the other fold only; --fold-models with two targets or --xgboost is refused. Mutations
    killed: the map built from the fitted matrices instead of the scored ones, models of another
    target kept, and the refusals dropped."""
    from tests.conftest import load_benchmark

    bench = load_benchmark("cost_model_quality")
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(measured(n, c, f, p).to_json()) + "\n" for n, _, c, f, p in train_mats))
    real = tmp_path / "real.jsonl"
    real.write_text("".join(json.dumps(m.to_json()) + "\n" for m in real_mats))
    folds = tmp_path / "folds"
    base = ["cost_model_quality.py", "--data", str(gen), "--suitesparse-data", str(real), "--suitesparse-folds", "2",
            "--trees", "10", "--min-measurements", "50", "--fold-models", str(folds), "--out", str(tmp_path / "q.json")]
    for extra in (["--targets", "ratio,rank"], ["--xgboost"]):
        monkeypatch.setattr(sys, "argv", base + extra)
        with pytest.raises(SystemExit):
            bench.main()
        assert "--fold-models writes the models of one LightGBM target" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", base + ["--targets", "ratio"])
    assert bench.main() == 0
    by = json.loads((folds / "by_matrix.json").read_text())
    assert sorted(by) == sorted(m.name for m in real_mats) and len(set(by.values())) == 2
    for name, f in by.items():
        model = CostModel.load(folds / f)
        assert model.target == "ratio" and model.real_part is not None
        assert model.real_part.meta["trained_on"]["matrices"] == len(train_mats) + 3  # the other fold's 3
        others = {n for n, g in by.items() if g == f}
        assert name in others and len(others) == 3  # this fold's matrices: scored by it, not fitted on


def test_a_free_text_kernel_read_as_a_point_counts_as_that_point(tmp_path) -> None:
    """A policy's kernel stored under its text's id, which the search read as a template point (its template
    recorded), is that point's measurement too; one not read so (no template), or whose text is not the point's
    kernel, counts only as free text (which the model does not train on). Mutations killed: such kernels left out
    of the points (the search's dedup then hides the point's time from the model), every text with a template
    name counted as a point without reading it."""
    A = generate("random", 3000, seed=5)
    card, feats = card_and_features(A)
    space = CandidateSpace(card, Op.SPMV, None, select_templates(Op.SPMV, ("csr_vector",)))
    first, second, third = list(space.seeds())[:3]
    head, body = first.text.split("\n\n", 1)
    rows = [(head + "\n\n// the policy's\n" + body, "csr_vector", 11.0),       # read as the point: counts as it
            (second.text + "// kept as text\n", None, 12.0),                     # not read so: free text only
            (third.text.replace("(TPR - 1)", "(TPR - 2)") + "\n", "csr_vector", 13.0)]  # not the point's code
    with BestStore(tmp_path / "s.db") as st:
        st.add_matrix(card, "random_3000", features=feats)
        for i, (text, template, t) in enumerate(rows):
            st.record(VerifiedKernel(
                fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200", regime="cold", text=text,
                time_us=t, cusparse_us=CUSPARSE_US, speedup=CUSPARSE_US / t, roofline=None, format="CSR",
                template=template, candidate_id=f"text/{i:016d}", provenance="policy-sample", parent_id=None,
                model="m", run_id="r", harness_version=harness_version()))
        (m,) = store_measurements(st)
    assert m.times == {"text/0000000000000000": 11.0, first.id: 11.0, "text/0000000000000001": 12.0,
                       "text/0000000000000002": 13.0}
    assert [(cid, t) for cid, _, _, t in m.points()] == [(first.id, 11.0)]


# ---------------------------------------------------------------------------------------------
# measurements files that are not measurements; GPU architectures; a fit that replaces the packaged model


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(train_mats, i: int = 0, **change) -> dict:
    name, _, card, feats, points = train_mats[i]
    return measured(name, card, feats, points).to_json() | change


def _with_candidates(row: dict, change) -> dict:
    cands = [dict(c) for c in row["candidates"]]
    change(cands)
    return row | {"candidates": cands}


@pytest.mark.parametrize("bad", [
    lambda r: [1, 2],
    lambda r: "a string",
    lambda r: r | {"cusparse_us": 0},
    lambda r: r | {"cusparse_us": -3.0},
    lambda r: r | {"cusparse_us": "12"},
    lambda r: _with_candidates(r, lambda c: c[3].update(time_us=0)),
    lambda r: _with_candidates(r, lambda c: c[3].update(time_us=1e-9)),
    lambda r: _with_candidates(r, lambda c: c[3].update(time_us=float("nan"))),
    lambda r: _with_candidates(r, lambda c: c[3].update(time_us=float("inf"))),
    lambda r: _with_candidates(r, lambda c: c[3].pop("time_us")),
    lambda r: _with_candidates(r, lambda c: c.append(dict(c[3], time_us=c[3]["time_us"] / 2))),
    lambda r: _with_candidates(r, lambda c: c.append({"id": c[3]["id"], "ok": False, "verdict": "incorrect"})),
    lambda r: _with_candidates(r, lambda c: c.append([c[3]["id"], 1.0])),
], ids=["list", "string", "cusparse-zero", "cusparse-negative", "cusparse-text", "time-zero", "time-1e-9",
        "time-nan", "time-inf", "ok-without-time", "id-twice", "id-twice-as-failed", "candidate-list"])
def test_a_malformed_measurements_file_is_one_line_naming_its_file_and_line(train_mats, tmp_path, capsys,
                                                                            bad) -> None:
    """Each bad record on line 2 of a file: a one-line CostModelError naming the file and line 2, and
    ``best cost-model`` (``--target ratio`` too, which divides by cuSPARSE's time) one ``error:`` line
    and no model. Mutations killed: a line that is not an object read with ``.get`` (an AttributeError
    traceback), cuSPARSE's or a candidate's time of 0, a negative, NaN, infinite or absurdly short one
    accepted (a ZeroDivisionError under ``--target ratio``, or a fit on nonsense), a verified candidate
    without its time dropped silently, a repeated candidate id overwriting the earlier time, the
    line number left out of the message."""
    from tests.search.test_cli import run_cli

    good = _row(train_mats)
    path = _jsonl(tmp_path / "bad.jsonl", [good, bad(_row(train_mats, 1))])
    with pytest.raises(CostModelError) as exc:
        load_measurements(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: line 2: ") and "\n" not in msg and "Error" not in msg, msg
    assert len(load_measurements(_jsonl(tmp_path / "good.jsonl", [good]))) == 1  # the good line alone reads
    for target in ("blend", "ratio"):
        out = tmp_path / f"m_{target}.json.gz"
        code, _, err = run_cli(["best", "cost-model", "--data", str(path), "--target", target, "--out", str(out),
                                "--min-measurements", "1"], capsys)
        assert code == 2 and err.startswith(f"error: {path}: line 2: ") and err.count("\n") == 1, err
        assert not out.exists()


def test_a_record_without_a_cusparse_time_is_still_skipped_and_free_text_kept(train_mats, tmp_path) -> None:
    """What the loader read before stays readable: a compile-only record (cuSPARSE's time null) is
    skipped, a failed candidate needs no time, free-text ids count as candidates. Mutation killed: a
    validation that refuses the compile-only records benchmarks/cost_model_data.py writes."""
    row = _with_candidates(_row(train_mats), lambda c: c.extend([{"id": "text/0", "ok": True, "time_us": 9.0},
                                                                 {"id": "text/1", "ok": False}]))
    [m] = load_measurements(_jsonl(tmp_path / "m.jsonl", [row, _row(train_mats, 1, cusparse_us=None)]))
    assert m.times["text/0"] == 9.0 and m.failed["text/1"] == "failed"


def test_a_model_of_another_architecture_falls_back_with_one_warning(model, test_mats, tmp_path, caplog) -> None:
    """A model fitted on sm_90 times, asked to order a search on sm_80: one warning line naming both, and
    the selector's order exactly; on sm_90, or where no architecture is known (no GPU), the model. Through
    search_array, the evaluator's architecture decides. Mutations killed: no architecture check (the sm_90
    model orders any GPU's search, as before), search_array not passing the evaluator's architecture, a
    compile-only search (no architecture) refused its model, the fallback logged below a warning."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.request.context import MatrixContext
    from sparserl.search.run import search_array

    path = model.save(tmp_path / "sm90.json.gz")
    assert model.meta["archs"] == model.archs == ["sm_90"]
    name, A, card, feats, _ = test_mats[0]
    with caplog.at_level(logging.INFO, logger="sparserl.search.ranker"):
        r = make_ranker(str(path), card, feats, "spmv", None, "sm_80")
    assert type(r) is Ranker
    warnings = [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "selector's order" in warnings[0], warnings
    assert "sm_90" in warnings[0] and "sm_80" in warnings[0]
    assert _search_ids(A, card, r) == _search_ids(A, card, None)
    for arch in ("sm_90", None):
        assert isinstance(make_ranker(str(path), card, feats, "spmv", None, arch), ModelRanker)

    class NoGpu(FakeTimingDouble):
        has_gpu = False

    picks = {}
    for ev in (FakeTimingDouble(lambda t: 10.0, arch="sm_90"), FakeTimingDouble(lambda t: 10.0, arch="sm_80"),
               NoGpu(lambda t: 10.0, arch="sm_80")):
        res = search_array(MatrixContext(A, name, Op.SPMV), SearchConfig(budget=12, parallel=1, cost_model=str(path)),
                           ev, None, progress=False)
        picks[(ev.arch, ev.has_gpu)] = sum(e.proposal.provenance is Provenance.MODEL for e in res.entries)
    assert picks == {("sm_90", True): 4, ("sm_80", True): 0, ("sm_80", False): 4}
    assert Evaluator(HarnessConfig(compile_only=True)).arch is None  # compile-only: no architecture


def test_your_own_model_of_another_architecture_gives_way_to_the_packaged_one(model, test_mats, tmp_path,
                                                                               monkeypatch, caplog) -> None:
    """``default`` with a user's own model fitted on sm_80: an sm_80 search uses it, an sm_90 search the
    packaged model (fitted on sm_90), a GPU the packaged one was not fitted on either keeps the selector's
    order with one warning. Mutation killed: a user's model of one GPU shadowing the packaged model on
    every other (a fit on one machine would take the model away from the others)."""
    from sparserl.search.cost_model import user_model_path

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    user_model_path().parent.mkdir(parents=True)
    _rewrite(model.save(tmp_path / "m.json.gz"), user_model_path(), lambda b: b.update(archs=["sm_80"]))
    _, _, card, feats, _ = test_mats[0]
    packaged = CostModel.load(PACKAGED_MODEL)
    r = make_ranker("default", card, feats, "spmv", None, "sm_80")
    assert isinstance(r, ModelRanker) and r.model.archs == ["sm_80"]
    r = make_ranker("default", card, feats, "spmv", None, "sm_90")
    assert isinstance(r, ModelRanker) and r.model.meta == packaged.meta
    with caplog.at_level(logging.WARNING, logger="sparserl.search.ranker"):
        assert type(make_ranker("default", card, feats, "spmv", None, "sm_100")) is Ranker
    assert len(caplog.records) == 1 and "sm_80" in caplog.text and "sm_100" in caplog.text


def test_measurements_of_two_architectures_are_not_pooled(train_mats, tmp_path, monkeypatch, capsys) -> None:
    """The same matrices timed on sm_90 and sm_80: ``train`` and ``best cost-model`` refuse them together
    with one line naming both; ``--arch`` fits on that architecture's times alone and records it; an
    architecture the data lacks is one line. Mutations killed: measurements of several architectures
    pooled into one fit (each matrix twice with conflicting labels), --arch ignored, the refusal dropped
    when --arch is not given."""
    from tests.search.test_cli import run_cli

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    rows = [_row(train_mats, i) for i in range(len(train_mats))]
    a = _jsonl(tmp_path / "a.jsonl", rows)
    b = _jsonl(tmp_path / "b.jsonl", [r | {"arch": "sm_80"} for r in rows])
    both = load_measurements(a) + load_measurements(b)
    with pytest.raises(CostModelError, match=r"2 GPU architectures \(sm_80, sm_90\)") as exc:
        train(both, TrainConfig(trees=3))
    assert "\n" not in str(exc.value)
    out = tmp_path / "m.json.gz"
    base = ["best", "cost-model", "--data", str(a), "--data", str(b), "--trees", "3", "--out", str(out)]
    code, _, err = run_cli(base, capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "sm_80, sm_90" in err, err
    assert "--arch" in err and not out.exists()
    code, _, err = run_cli(base + ["--arch", "sm_75"], capsys)
    assert code == 2 and err.count("\n") == 1 and "no measurements of sm_75" in err, err
    code, printed, err = run_cli(base + ["--arch", "sm_80"], capsys)
    assert code == 0, err
    m = CostModel.load(out)
    assert m.archs == ["sm_80"] and m.meta["trained_on"]["matrices"] == len(rows)
    assert m.meta["trained_on"]["measurements"] == sum(len(x.points()) for x in load_measurements(b))


def test_a_fit_that_replaces_the_packaged_model_says_so_and_compares_their_sizes(train_mats, tmp_path,
                                                                                 monkeypatch, capsys) -> None:
    """``best cost-model`` writing where searches look says that searches now use it instead of the
    packaged model, with both sizes (measurements, matrices, families); written elsewhere (--out), it
    says nothing of the kind; --min-measurements below 1 is one line. The sizes are those of each
    model's largest part (the packaged real part holds every matrix). Mutations killed: the packaged
    model replaced silently, the sizes of the generated part alone, --min-measurements 0 accepted."""
    from sparserl.search.cost_model import user_model_path
    from tests.search.test_cli import run_cli

    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    packaged = CostModel.load(PACKAGED_MODEL)
    real = packaged.real_part.meta["trained_on"]
    assert packaged.size() == (real["measurements"], real["matrices"], sorted(real["families"]))
    assert real["measurements"] > packaged.meta["trained_on"]["measurements"]
    few = _jsonl(tmp_path / "few.jsonl", [_row(train_mats, i) for i in range(4)])
    n = sum(len(m.points()) for m in load_measurements(few))
    code, out, err = run_cli(["best", "cost-model", "--data", str(few), "--trees", "3", "--min-measurements", "1"],
                             capsys)
    assert code == 0, err
    line = next(x for x in out.splitlines() if "searches now use this model" in x)
    assert line.startswith("spmv searches now use this model") and "instead of the packaged one" in line
    assert f"({n} measurements on 4 matrices of 1 families, sm_90)" in line, line
    assert f"({real['measurements']} measurements on {real['matrices']} matrices of {len(real['families'])} " \
           f"families, sm_90)" in line, line
    assert line.endswith(f"delete {user_model_path()} to use the packaged one again"), line
    assert CostModel.load(user_model_path()).size()[0] == n
    code, out, err = run_cli(["best", "cost-model", "--data", str(few), "--trees", "3", "--min-measurements", "1",
                              "--out", str(tmp_path / "elsewhere.json.gz")], capsys)
    assert code == 0 and "searches now use" not in out and (tmp_path / "elsewhere.json.gz").exists()
    for bad in ("0", "-5"):
        code, out, err = run_cli(["best", "cost-model", "--data", str(few), "--min-measurements", bad,
                                  "--out", str(tmp_path / "no.json.gz")], capsys)
        assert code == 2 and err.startswith("error: --min-measurements") and err.count("\n") == 1, err
        assert not (tmp_path / "no.json.gz").exists()
    with pytest.raises(SparseRLError, match="min_measurements"):
        TrainConfig(min_measurements=0)
