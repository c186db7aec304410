"""The search command's GPU path end to end with a test double of the GPU timing (doubles.py):
outputs in generate's shape, the store written and read back (the known best seeds the next
search), and the benchmark's oracle and ratio arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix
from sparserl.search.loop import SearchConfig
from sparserl.search.run import SearchJob, search_matrix
from sparserl.search.space import Provenance, normalised
from sparserl.search.store import BestStore
from tests.search.doubles import FakeTimingDouble

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mtx(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("m") / "rand.mtx"
    save_matrix(generate("random", 3000, seed=4, nnz_per_row=8), p)
    return p


def csr_vector_time(vid: str) -> float:
    """A library variant's time by its id: csr_vector's faster with more lanes per row up to 8, and
    with block 256, everything else 60 us (a made-up landscape with one fastest kernel, whatever
    order the cost model tries them in)."""
    if not vid.startswith("spmv/csr_vector/"):
        return 60.0
    for tpr, t in ((2, 30.0), (4, 20.0), (8, 10.0), (16, 15.0), (32, 25.0)):
        if f"tpr={tpr}," in vid:
            return t - (1.0 if "block=256" in vid else 0.0)
    return 60.0


def test_search_writes_generates_report_shape_and_the_store(mtx: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the store's sampled coordinates come from the encoding module
    texts = {normalised(v.render()): v.id for v in variants("spmv")}
    ev = FakeTimingDouble(lambda t: csr_vector_time(texts.get(normalised(t), "")))
    job = SearchJob(matrix=str(mtx), search=SearchConfig(budget=40), store=str(tmp_path / "s.db"),
                    out=str(tmp_path / "out"))  # a seed round over every template, then csr_vector's
    rep, res = search_matrix(job, evaluator=ev)
    assert res.timed and res.best.proposal.id == "spmv/csr_vector/-/tpr=8,block=256"
    assert rep.verified is True and rep.verdict == "correct, 11.11x faster than cuSPARSE"
    out = tmp_path / "out"
    assert (out / "kernel.cu").read_text() == res.best.proposal.text
    assert json.loads((out / "launch.json").read_text())["format"] == "CSR"
    md = (out / "report.md").read_text()
    assert "**11.11x**" in md and "## Search" in md and "this run set the best known" in md
    assert len((out / "trace.jsonl").read_text().splitlines()) == 40
    with BestStore(tmp_path / "s.db") as st:
        (b,) = st.best()
        assert b.candidate_id == res.best.proposal.id and b.time_us == 9.0 and b.speedup == pytest.approx(100 / 9)
        assert st.counts()["results"] == 40 and st.counts()["runs"] == 1
        m = st.matrix(b.fingerprint)
        assert m.source_path == str(mtx.resolve()) and m.coords is not None and 900 < len(m.coords[0]) <= 1024
        assert m.features is not None and m.features["nnz"] == b.nnz  # what the cost model learns from

    # a second search starts from what the store knows, and does not replace it with a tie
    ev2 = FakeTimingDouble(lambda t: csr_vector_time(texts.get(normalised(t), "")))
    _, res2 = search_matrix(SearchJob(matrix=str(mtx), search=SearchConfig(budget=3, seed=1),
                                         store=str(tmp_path / "s.db"), out=str(tmp_path / "out2")), evaluator=ev2)
    first = min(res2.entries, key=lambda e: e.order)
    assert first.proposal.provenance is Provenance.KNOWN and first.proposal.id == res.best.proposal.id
    assert res2.known_best is not None and not res2.store_improved
    assert "the best known stays faster" in (tmp_path / "out2" / "report.md").read_text()


def test_no_correct_candidate_is_an_error_with_the_trace_kept(mtx: Path, tmp_path: Path) -> None:
    from sparserl.errors import SparseRLError

    ev = FakeTimingDouble(lambda t: None)  # everything wrong
    with pytest.raises(SparseRLError, match="no correct kernel among the 5 candidates"):
        search_matrix(SearchJob(matrix=str(mtx), search=SearchConfig(budget=5), store=str(tmp_path / "s.db"),
                                out=str(tmp_path / "out")), evaluator=ev)
    assert len((tmp_path / "out" / "trace.jsonl").read_text().splitlines()) == 5
    with BestStore(tmp_path / "s.db") as st:
        assert st.counts()["results"] == 0


def test_a_missing_matrix_file_fails_before_the_store_is_opened(tmp_path: Path) -> None:
    """``search absent.mtx --store NEW`` says the file is missing and leaves no store behind (nor
    migrates an old one first). Kills the check moved after ``open_store``."""
    from sparserl.errors import MatrixError

    with pytest.raises(MatrixError, match="absent.mtx: no such file"):
        search_matrix(SearchJob(matrix=str(tmp_path / "absent.mtx"), search=SearchConfig(budget=1),
                                store=str(tmp_path / "new.sqlite"), out=str(tmp_path / "out")))
    assert not (tmp_path / "new.sqlite").exists() and not (tmp_path / "out").exists()


def test_benchmark_oracle_and_ratio(tmp_path: Path, monkeypatch) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import search_bench
    finally:
        sys.path.pop(0)
    from sparserl.kernels.contract import Op
    from sparserl.search.store import open_store

    A = generate("random", 3000, seed=4, nnz_per_row=8)
    from sparserl.matrices.card import matrix_card

    lib = {normalised(text) for _, text, _ in search_bench.oracle_texts(Op.SPMV, None, matrix_card(A))}
    assert {normalised(v.render()) for v in variants("spmv")} <= lib
    # every oracle text (template seeds, library variants) 50 us, anything else (a mutation) 40 us
    ev = FakeTimingDouble(lambda t: 50.0 if normalised(t) in lib else 40.0)
    args = type("Args", (), {"regime": "cold", "budget": 30, "seconds": None, "seed": 0, "trace_dir": None,
                         "cost_model": "default", "by_matrix": {"rand": "none"}, "seed_share": 0.5, "beam": 3,
                         "retime": 3, "headroom_budget": 0})()
    asked = []  # the cost model each search was given: this matrix's own (--cost-model-by-matrix) over --cost-model
    real_config = search_bench.SearchConfig
    monkeypatch.setattr(search_bench, "SearchConfig", lambda **kw: asked.append(kw["cost_model"]) or real_config(**kw))
    with open_store(tmp_path / "s.db") as st:
        row = search_bench.bench_one(ev, st, A, "rand", Op.SPMV, None, args)
    assert asked == ["none"]
    assert row["oracle_us"] == 50.0 and row["cusparse_us"] == 100.0 and row["oracle_speedup"] == 2.0
    assert row["search_us"] == 40.0 and row["ratio"] == pytest.approx(1.25)
    assert row["search_provenance"] in ("mutation", "switch", "random") and row["search_evaluated"] == 30
    assert row["oracle_candidates"] >= 20 and row["oracle_library_us"] == 50.0
    # the two picks timed again, fresh, 3 times each: the last 6 submissions, alternating
    assert ev.fresh[-6:] == [True] * 6 and not any(ev.fresh[:-6])
    assert [normalised(t) in lib for t in ev.submitted[-6:]] == [True, False, False, True, True, False]
    assert row["retimed_us"] == {"oracle": [50.0] * 3, "search": [40.0] * 3}
    assert row["ratio_retimed"] == pytest.approx(1.25)
    rows = [row | {"set": "families"},
            dict(row, ratio=0.9, ratio_retimed=0.95, set="families", oracle_speedup=2.0, search_speedup=1.8),
            dict(row, ratio=1.0, ratio_retimed=None, set="families")]
    s = search_bench.summarise(rows)["families"]
    assert s["search_wins"] == 1 and s["search_wins_by_2pct"] == 1
    assert s["geomean_search_over_oracle"] == pytest.approx((1.25 * 0.9) ** (1 / 3))
    assert s["retimed"] == 2 and s["search_wins_retimed"] == 1 and s["search_wins_by_2pct_retimed"] == 1
    assert s["geomean_search_over_oracle_retimed"] == pytest.approx((1.25 * 0.95) ** 0.5)


def test_benchmark_headroom_is_a_longer_search_in_a_store_of_its_own(tmp_path: Path) -> None:
    """``--headroom-budget``: a second, longer search from a fresh store (never from the first search's finds),
    its pick retimed beside the others, ``headroom`` the search's time over it; the summary counts it per set.
    Mutations killed: the longer search given the first one's store (it would start from its best), the ratio
    inverted, its pick left out of the second look, rows without it counted."""
    import hashlib

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import search_bench
    finally:
        sys.path.pop(0)
    from sparserl.kernels.contract import Op
    from sparserl.search.store import open_store

    A = generate("random", 3000, seed=4, nnz_per_row=8)

    def time_of(t: str) -> float:  # each text its own time in [30, 50): more candidates find a faster one
        return 30.0 + int(hashlib.sha256(normalised(t).encode()).hexdigest()[:6], 16) % 2000 / 100

    ev = FakeTimingDouble(time_of)
    args = type("Args", (), {"regime": "cold", "budget": 8, "seconds": None, "seed": 0, "trace_dir": None,
                             "cost_model": "none", "by_matrix": {}, "seed_share": 0.5, "beam": 3,
                             "retime": 3, "headroom_budget": 48})()
    with open_store(tmp_path / "s.db") as st:
        row = search_bench.bench_one(ev, st, A, "rand", Op.SPMV, None, args)
        assert st.counts()["runs"] == 1  # the longer search ran in a store of its own
    assert row["long_budget"] == 48 and row["long_us"] < row["search_us"]
    assert row["headroom"] == pytest.approx(row["search_us"] / row["long_us"]) and row["headroom"] > 1
    assert set(row["retimed_us"]) == {"oracle", "search", "long"} and ev.fresh[-9:] == [True] * 9
    assert row["headroom_retimed"] == pytest.approx(row["search_us"] / row["long_us"])  # fixed times: the same
    rows = [row | {"set": "families"}, dict(row, headroom=1.0, headroom_retimed=1.0, set="families"),
            dict(row, headroom=None, headroom_retimed=None, set="families")]
    s = search_bench.summarise(rows)["families"]
    assert s["headroom_compared"] == 2 and s["headroom_compared_retimed"] == 2
    assert s["geomean_headroom_retimed"] == pytest.approx(row["headroom"] ** 0.5)
    assert s["headroom_by_2pct_retimed"] == int(row["headroom"] >= 1.02)
    assert "headroom_compared" not in search_bench.summarise([dict(rows[2])])["families"]
    no_oracle = search_bench.summarise([dict(rows[1], ratio=None, ratio_retimed=None)])["families"]
    assert no_oracle["compared"] == 0 and no_oracle["headroom_compared"] == 1  # the room needs no oracle


def test_benchmark_second_look_never_times_a_kernel_against_itself() -> None:
    """Mutations killed: the oracle's kernel timed against itself when it is the search's and the longer search's
    pick differs (ratio_retimed then noise about 1), the longer search's pick timed against the search's own
    kernel, the oracle required for the headroom's second look."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import search_bench
    finally:
        sys.path.pop(0)
    look = search_bench.second_look
    assert list(look("O k", "S k", "L k")[0].items()) == [("oracle", "O k"), ("search", "S k"), ("long", "L k")]
    assert look("S  k", "S k", "L k") == ({"search": "S k", "long": "L k"}, {"ratio_retimed": 1.0})
    assert look("O k", "S k", "S\nk") == ({"search": "S k", "oracle": "O k"}, {"headroom_retimed": 1.0})
    assert look("S k", "S k", "S k") == ({}, {"ratio_retimed": 1.0, "headroom_retimed": 1.0})
    assert look(None, "S k", "L k") == ({"search": "S k", "long": "L k"}, {})  # no verified oracle
    assert look("O k", "S k", None) == ({"search": "S k", "oracle": "O k"}, {})  # no longer search
    assert look("O k", None, "L k") == ({}, {})  # no search pick: nothing to compare


def test_benchmark_retimes_the_picks_by_their_medians() -> None:
    """The picks' ratio from fresh passes is the ratio of their medians, not of their best (the best of
    several timings is the luckiest, the bias the second look is for), and a failed pass leaves it
    unknown. Mutations killed: min for median, the passes' order never reversed, a failure counted as
    a time."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import search_bench
    finally:
        sys.path.pop(0)
    from sparserl.kernels.contract import Op

    queue = {"ORACLE": [50.0, 50.0, 50.0], "SEARCH": [40.0, 60.0, 60.0]}
    ev = FakeTimingDouble(lambda t: queue[t].pop(0))
    ref = ev.register(generate("random", 100, seed=0))
    times = search_bench.retime(ev, ref, Op.SPMV, None, {"oracle": "ORACLE", "search": "SEARCH"}, 3, "cold")
    assert ev.submitted == ["ORACLE", "SEARCH", "SEARCH", "ORACLE", "ORACLE", "SEARCH"] and all(ev.fresh)
    assert times == {"oracle": [50.0] * 3, "search": [40.0, 60.0, 60.0]}
    assert search_bench.retimed_ratio(times) == pytest.approx(50.0 / 60.0)
    assert search_bench.retimed_ratio({"oracle": [50.0, None], "search": [40.0, 40.0]}) is None


def test_benchmark_models_by_matrix_resolve_against_their_file(tmp_path: Path) -> None:
    """``--cost-model-by-matrix``: paths relative to the JSON's folder; a malformed file or a missing
    model stops the run with one line. Mutations killed: paths taken relative to the working
    directory, a missing model found only mid-run (the search would fall back to no model quietly)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import search_bench
    finally:
        sys.path.pop(0)
    (tmp_path / "fold_0.json.gz").write_bytes(b"x")
    j = tmp_path / "by_matrix.json"
    j.write_text('{"bcsstk29": "fold_0.json.gz"}')
    assert search_bench.load_by_matrix(j) == {"bcsstk29": str((tmp_path / "fold_0.json.gz").resolve())}
    for text, msg in (('{"a": "fold_9.json.gz"}', "no model file at"), ("[1, 2]", "not a JSON object"),
                      ("{", "by_matrix.json")):
        j.write_text(text)
        with pytest.raises(SystemExit, match=msg) as exc:
            search_bench.load_by_matrix(j)
        assert "\n" not in str(exc.value)


def _bench_and_two_real_matrices(tmp_path: Path):
    """benchmarks/search_bench.py as a module, and a folder of two small real-matrix files (aa, bb)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import search_bench
    finally:
        sys.path.pop(0)
    real = tmp_path / "ss"
    real.mkdir()
    for name in ("aa", "bb"):
        save_matrix(generate("random", 200, seed=1), real / f"{name}.mtx")
    return search_bench, real


def test_benchmark_refuses_a_map_that_leaves_a_real_matrix_out(tmp_path: Path, monkeypatch) -> None:
    """With --cost-model-by-matrix, a SuiteSparse matrix the map does not name stops the run before
    any search (it would get the packaged model, fitted on it). Mutation killed: the quiet fallback."""
    search_bench, real = _bench_and_two_real_matrices(tmp_path)
    (tmp_path / "m.json.gz").write_bytes(b"x")
    (tmp_path / "by.json").write_text('{"aa": "m.json.gz"}')
    argv = ["search_bench.py", "--no-families", "--suitesparse", str(real), "--compile-only",
            "--cost-model-by-matrix", str(tmp_path / "by.json"), "--out", str(tmp_path / "o.json")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="names no model for 1 of the matrices \\(bb\\)"):
        search_bench.main()
    assert not (tmp_path / "o.json").exists()


def test_benchmark_goes_on_past_a_matrix_that_cannot_run(tmp_path: Path, monkeypatch) -> None:
    """A matrix that cannot run (here: every one, as if larger than the GPU) is skipped with its reason in
    the JSON, and the run goes on to the next and ends normally. Mutation killed: one matrix's error
    ending the whole benchmark (a bench of eleven 1M-row matrices died on the seventh)."""
    from sparserl.errors import SparseRLError

    search_bench, real = _bench_and_two_real_matrices(tmp_path)
    tried = []

    def too_large(ev, store, A, name, *rest):
        tried.append(name)
        raise SparseRLError(f"{name} is too large for the GPU")

    monkeypatch.setattr(search_bench, "bench_one", too_large)
    out = tmp_path / "o.json"
    monkeypatch.setattr(sys, "argv", ["search_bench.py", "--no-families", "--suitesparse", str(real), "--compile-only",
                                      "--out", str(out)])
    assert search_bench.main() == 0
    assert tried == ["aa", "bb"]
    got = json.loads(out.read_text())
    assert got["skipped"] == {"aa": "aa is too large for the GPU", "bb": "bb is too large for the GPU"}
    assert got["matrices"] == []


def test_a_kernel_found_wrong_is_never_proposed_again_for_its_matrix(tmp_path: Path) -> None:
    """After the store retracts the search's pick as found wrong, the next search on the matrix never submits
    that kernel, even where it would be the fastest (a racy kernel that would pass once more), nor a copy of
    it that differs in whitespace only; another matrix has nothing to avoid. Kills ``avoid`` not passed to the
    search, and the texts it holds compared other than whitespace aside (the store keeps exact texts)."""
    from sparserl.kernels.contract import Op
    from sparserl.request.candidates import normalised as pool_normalised
    from sparserl.request.context import MatrixContext
    from sparserl.search.run import search_array
    from sparserl.search.store import harness_version

    ctx = MatrixContext(generate("banded", 3000, seed=0), "m", Op.SPMV, None)
    with BestStore(tmp_path / "s.db") as st:
        ev = FakeTimingDouble(lambda t: 5.0)
        search_array(ctx, SearchConfig(budget=6), ev, st)
        wrong = ev.submitted[0]
        assert st.retract(ctx.card.fingerprint, "spmv", None, "sm_90", "cold", harness_version(),
                          wrong.replace("\n", "\n  ", 1)) == 0  # a layout of it is remembered, the store's row stays
        ev2 = FakeTimingDouble(lambda t: 1.0 if pool_normalised(t) == pool_normalised(wrong) else 5.0)
        res2 = search_array(ctx, SearchConfig(budget=6), ev2, st)
        assert all(pool_normalised(t) != pool_normalised(wrong) for t in ev2.submitted)
        assert pool_normalised(res2.best.proposal.text) != pool_normalised(wrong)
        other = MatrixContext(generate("random", 3000, seed=1), "other", Op.SPMV, None)
        assert st.found_wrong_texts(other.card.fingerprint, "spmv", None) == []


def test_a_result_the_store_refuses_is_not_counted_as_written(tmp_path: Path) -> None:
    """A kernel another process finds wrong on the matrix while this search times it (retracted between its
    evaluation and its recording) is refused by the store: the search counts it as refused, not as written, and
    its store line says so. Kills the sink counting every result it passes to the store as written (the report's
    "N verified results written" one too high) and the refusal left out of the line."""
    from sparserl.kernels.contract import Op
    from sparserl.request.context import MatrixContext
    from sparserl.search.run import search_array, store_line
    from sparserl.search.store import harness_version, kernel_sha

    ctx = MatrixContext(generate("banded", 3000, seed=0), "m", Op.SPMV, None)
    path = tmp_path / "s.db"
    retracted: list[str] = []

    def time_of(text: str) -> float:
        if not retracted:  # the first candidate: found wrong elsewhere while it is timed here
            with BestStore(path) as other:
                other.retract(ctx.card.fingerprint, "spmv", None, "sm_90", "cold", harness_version(), text)
            retracted.append(text)
        return 5.0

    with BestStore(path) as st:
        res = search_array(ctx, SearchConfig(budget=6), FakeTimingDouble(time_of), st)
        stored = {r.kernel_sha for r in st.results(ctx.card.fingerprint)}
    verified = sum(e.result.ok for e in res.entries)
    assert verified == 6 and res.store_refused == 1 and res.store_writes == 5 == len(stored)
    assert kernel_sha(retracted[0]) not in stored
    line = store_line(res)
    assert line.startswith("5 verified results written (1 refused: their kernel had been found wrong"), line
