"""RL's relative_best reward against the best-known store: scored against the best before the
batch, new bests written back, nothing unverified ever written, and the rollout wiring."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
from sparserl.kernels.contract import Op
from sparserl.matrices import generate
from sparserl.rewards import RewardConfig, reward
from sparserl.rl.best_known import BestKnown
from sparserl.search.store import open_store

REL = RewardConfig(name="relative_best", r_eff=1.0, r_pen=0.5, clip=3.0)
CUSPARSE_US = 40.0


def timed(t_us: float | None, kind: ErrorKind = ErrorKind.NONE, regime: str = "cold") -> EvalResult:
    """A result as the harness gives it: correct ones timed in ``regime`` beside cuSPARSE."""
    ok = kind is ErrorKind.NONE and t_us is not None
    kt = (lambda t: {regime: KernelTiming(regime, t, t, t, 0.0)})
    return EvalResult(op="spmv", k=None, matrix="m", error_kind=kind, compiled=kind.compiled,
                      correct=kind is ErrorKind.NONE, format="CSR", timings=kt(t_us) if ok else {},
                      baseline=kt(CUSPARSE_US) if ok else {}, regime=regime,
                      speedup=CUSPARSE_US / t_us if ok else None, arch="sm_90", gpu="H200")


class Item:
    def __init__(self, name: str, A, op: Op = Op.SPMV, k: int | None = None):
        self.name, self.A, self.op, self.k = name, A, op, k


@pytest.fixture()
def bk(tmp_path: Path):
    pytest.importorskip("torch")  # the store's sampled coordinates come from the encoding module
    store = open_store(tmp_path / "best.sqlite")
    b = BestKnown(store, model="policy")
    yield b
    b.close()
    store.close()


def score(bk: BestKnown, items, texts, results) -> list[float]:
    before = bk.bests(items, results)
    out = [reward(r, REL, b) for r, b in zip(results, before)]
    bk.record(items, texts, results, before)
    return out


def test_scores_against_the_best_before_the_batch_and_writes_new_bests(bk: BestKnown) -> None:
    item = Item("banded", generate("banded", 3000, seed=0))
    # nothing known: the speed term is against cuSPARSE (clipped_log's), and the sample starts the entry
    (r0,) = score(bk, [item], ["K20"], [timed(20.0)])
    assert r0 == pytest.approx(math.log2(CUSPARSE_US / 20.0))
    (row,) = bk.store.best(op="spmv")
    assert row.time_us == 20.0 and row.text == "K20" and row.provenance == "policy-sample" and row.model == "policy"
    # a batch: matching the best earns 0, slower is negative, faster positive; both faster ones are
    # scored against 20 us (the best before the batch), and the fastest becomes the best
    rs = score(bk, [item] * 4, ["K20b", "K40", "K10", "K16"], [timed(20.0), timed(40.0), timed(10.0), timed(16.0)])
    assert rs[0] == pytest.approx(0.0) and rs[1] == pytest.approx(-1.0)
    assert rs[2] == pytest.approx(1.0) and rs[3] == pytest.approx(math.log2(20 / 16))
    (row,) = bk.store.best(op="spmv")
    assert row.time_us == 10.0 and row.text == "K10"
    assert {r.time_us for r in bk.store.results()} == {20.0, 10.0, 16.0}, "only samples that beat the old best"
    # the next batch must beat 10 us
    (r,) = score(bk, [item], ["K16again"], [timed(16.0)])
    assert r == pytest.approx(math.log2(10 / 16)) and r < 0


def test_unverified_samples_are_never_written_and_keep_the_ladder(bk: BestKnown) -> None:
    item = Item("random", generate("random", 2000, seed=1, nnz_per_row=6))
    score(bk, [item], ["good"], [timed(30.0)])
    bad = [timed(1.0, ErrorKind.INCORRECT), timed(None, ErrorKind.COMPILE), timed(None, ErrorKind.INTERNAL),
           timed(None, ErrorKind.NO_GPU)]
    rs = score(bk, [item] * 4, ["wrong", "broken", "internal", "untimed"], bad)
    assert rs[0] == -3.5 and rs[1] == -4.0  # the ladder below every correct kernel, however fast it claimed
    assert [bk.store.kernel_text(r.kernel_sha) for r in bk.store.results()] == ["good"]


def test_the_key_keeps_matrices_ops_regimes_and_architectures_apart(bk: BestKnown) -> None:
    a, b = Item("a", generate("banded", 3000, seed=0)), Item("b", generate("stencil2d", 3025, seed=0))
    score(bk, [a], ["Ka"], [timed(5.0)])
    assert bk.bests([b], [timed(50.0)]) == [None], "another structure"
    assert bk.bests([a], [timed(50.0, regime="warm")]) == [None], "another regime"
    other_gpu = EvalResult(**{**timed(50.0).__dict__, "arch": "sm_100"})
    assert bk.bests([a], [other_gpu]) == [None], "another architecture"
    same_pattern = Item("a2", generate("banded", 3000, seed=0) * 3.0)  # new values, same structure
    assert bk.bests([same_pattern], [timed(50.0)]) == [5.0]


def test_collect_scores_with_the_store_and_logs_new_bests(bk: BestKnown, tiny_tokenizer, tiny_hf_config) -> None:
    from sparserl.rl.rollout import MatrixItem, collect, matrix_entry
    from sparserl.rl.update import Reference
    from tests.rl.tiny import tiny_policy

    from tests.rl.tiny import ScriptedEvaluator

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    A = generate("banded", 200, seed=0)
    inp, card = matrix_entry(A, policy)
    item = MatrixItem("m", A, "m", inp, Op.SPMV, None, card)
    bk.store.close()
    bk.store = open_store(bk.store.path)
    score(bk, [item], ["seeded"], [timed(20.0)])  # the store knows 20 us for this matrix
    ev = ScriptedEvaluator([timed(30.0), timed(10.0), timed(60.0)])
    batch = collect(policy, Reference(policy), None, ev, [item], 3, 8, 1.0, REL, seed=0, best_known=bk)
    assert batch.scores.tolist() == pytest.approx([math.log2(20 / 30), math.log2(20 / 10), math.log2(20 / 60)])
    assert batch.timings["reward/new_best_known"] == 1.0 and batch.timings["reward/best_known_share"] == 1.0
    (row,) = bk.store.best(op="spmv")
    assert row.time_us == 10.0


def test_the_trainer_opens_the_store_only_for_relative_best(tmp_path: Path) -> None:
    from sparserl.rl.trainer import RLConfig, _best_known

    path = tmp_path / "s.sqlite"
    assert _best_known(RLConfig(reward=RewardConfig(name="clipped_log"), store=str(path))) is None
    assert _best_known(RLConfig(reward=REL, store=str(path), compile_only=True)) is None  # nothing is timed
    assert not path.exists()
    b = _best_known(RLConfig(reward=REL, store=str(path)))
    try:
        assert isinstance(b, BestKnown) and path.exists() and b.regime == "cold"
    finally:
        b.store.close()


def test_new_best_known_counts_each_raised_entry_once(bk: BestKnown) -> None:
    """Kills the mutation that counted every sample faster than the pre-batch best: four samples
    that each beat the one before (each became the store's best as it was written) raise one
    entry's bar; two matrices raised are two; a slower-than-cuSPARSE first kernel raises nothing."""
    a, b = Item("a", generate("banded", 3000, seed=0)), Item("b", generate("stencil2d", 3025, seed=0))
    score(bk, [a, b], ["Ka", "Kb"], [timed(20.0), timed(20.0)])
    batch = [timed(16.0), timed(14.0), timed(12.0), timed(10.0)]
    before = bk.bests([a] * 4, batch)
    assert len(bk.record([a] * 4, ["K16", "K14", "K12", "K10"], batch, before)) == 1
    (row,) = bk.store.best(fingerprint=bk.card(a).fingerprint)
    assert row.time_us == 10.0
    both = [timed(9.0), timed(8.0), timed(19.0)]
    raised = bk.record([a, a, b], ["K9", "K8", "Kb19"], both, bk.bests([a, a, b], both))
    assert raised == {bk.key(a, both[0]), bk.key(b, both[2])}
    c = Item("c", generate("random", 2000, seed=3, nnz_per_row=6))
    slow = [timed(2 * CUSPARSE_US)]
    assert bk.record([c], ["slow"], slow, bk.bests([c], slow)) == set(), "beat nothing: cuSPARSE was the bar"
    assert bk.store.best(fingerprint=bk.card(c).fingerprint), "the entry is started all the same"
    fast = [timed(CUSPARSE_US / 4)]
    d = Item("d", generate("random", 2000, seed=4, nnz_per_row=6))
    assert len(bk.record([d], ["fast"], fast, bk.bests([d], fast))) == 1


def test_turns_count_an_entry_raised_twice_once(bk: BestKnown, tiny_tokenizer, tiny_hf_config) -> None:
    from sparserl.rl.rollout import MatrixItem, matrix_entry
    from sparserl.rl.turns import collect_turns
    from sparserl.rl.update import Reference
    from tests.rl.tiny import ScriptedEvaluator, tiny_policy

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    A = generate("banded", 200, seed=0)
    inp, card = matrix_entry(A, policy)
    item = MatrixItem("m", A, "m", inp, Op.SPMV, None, card)
    score(bk, [item], ["seeded"], [timed(20.0)])
    ev = ScriptedEvaluator([timed(15.0), timed(30.0), timed(10.0), timed(30.0)])  # each turn beats the bar
    batch = collect_turns(policy, Reference(policy), None, ev, [item], 2, 8, 1.0, REL, seed=0, turns=2,
                          discount=0.5, best_known=bk)
    assert batch.timings["reward/new_best_known"] == 1.0
    # each turn is scored against the bar before it: 20 us, then the first turn's 15 us (kills a turn that
    # scores without the store, against cuSPARSE's 40 us)
    t1, t2 = [math.log2(20 / 15), math.log2(20 / 30)], [math.log2(15 / 10), math.log2(15 / 30)]
    assert batch.scores.tolist() == pytest.approx([t1[0] + 0.5 * t2[0], t1[1] + 0.5 * t2[1], *t2])


def test_the_bar_is_read_and_written_under_the_whole_key(bk: BestKnown, caplog) -> None:
    """SpMM at k = 32 keeps its own entry apart from k = 64 and from SpMV, a newer harness version starts
    afresh, and a result without an architecture is filed and found under 'unknown' (kills a store query
    or write that leaves out the op, k or the harness version, or spells 'unknown' another way); the new
    best is logged with the store it went to."""
    import logging

    A = generate("banded", 3000, seed=0)
    spmm32, spmm64, spmv = Item("a", A, Op.SPMM, 32), Item("a", A, Op.SPMM, 64), Item("a", A)
    with caplog.at_level(logging.INFO, logger="sparserl.rl.best_known"):
        score(bk, [spmm32], ["K32"], [timed(5.0)])
    assert f"RL found 1 new best-known kernels (written to {bk.store.path})" in caplog.text
    assert bk.bests([spmm32, spmm64, spmv], [timed(50.0)] * 3) == [5.0, None, None]
    newer = EvalResult(**{**timed(50.0).__dict__, "harness_version": "newer"})
    assert bk.bests([spmm32], [newer]) == [None]
    no_arch = EvalResult(**{**timed(7.0).__dict__, "arch": None})
    score(bk, [spmv], ["Kv"], [no_arch])
    assert bk.bests([spmv], [EvalResult(**{**timed(9.0).__dict__, "arch": None})]) == [7.0]
    assert bk.key(spmv, no_arch)[3] == "unknown" and bk.key(spmv, no_arch)[5] == str(no_arch.harness_version)
    (row,) = bk.store.best(fingerprint=bk.card(spmv).fingerprint, op="spmv")
    assert row.arch == "unknown"
    assert bk.store.matrix(bk.card(spmv).fingerprint).coords is not None  # the matrix filed with its nonzeros


def test_untimed_or_wrong_results_neither_read_nor_write_the_bar(bk: BestKnown) -> None:
    """A correct result with no timing (compile-only, or a regime not timed) has no bar, even in a batch
    beside a timed one of the same matrix (kills ``and`` for ``or`` in best_us, and a batch memo that
    shares the timed result's answer with it); a wrong result that carries times is never written (kills
    a time read from an unverified result); a tie with the best is no new best, and a first kernel exactly
    as fast as cuSPARSE raises nothing."""
    item = Item("banded", generate("banded", 3000, seed=0))
    score(bk, [item], ["K20"], [timed(20.0)])
    untimed = EvalResult(**{**timed(5.0).__dict__, "timings": {}})
    assert bk.bests([item, item], [untimed, timed(30.0)]) == [None, 20.0]
    assert bk.bests([item, item], [timed(30.0), untimed]) == [20.0, None]
    wrong_timed = EvalResult(**{**timed(1.0).__dict__, "error_kind": ErrorKind.INCORRECT, "correct": False})
    assert not wrong_timed.ok
    assert bk.record([item], ["cheat"], [wrong_timed], [20.0]) == set()
    tie = [timed(20.0)]
    assert bk.record([item], ["K20-again"], tie, bk.bests([item], tie)) == set()
    assert {r.time_us for r in bk.store.results()} == {20.0} and len(bk.store.results()) == 1
    fresh = Item("fresh", generate("random", 2000, seed=5, nnz_per_row=6))
    level = [timed(CUSPARSE_US)]
    assert bk.record([fresh], ["level"], level, bk.bests([fresh], level)) == set()


def test_one_run_per_matrix_and_it_is_finished_at_close(bk: BestKnown) -> None:
    """Every new best of one matrix goes into one store run, closed as finished (kills a run started per
    write, and a status other than 'finished')."""
    item = Item("banded", generate("banded", 3000, seed=0))
    score(bk, [item], ["K20"], [timed(20.0)])
    score(bk, [item], ["K10"], [timed(10.0)])
    assert bk.store.counts()["runs"] == 1
    bk.close()
    [(status, config)] = [(r["status"], r["config_json"]) for r in bk.store._rows("runs", "SELECT * FROM runs")]
    assert status == "finished" and f'"rl": "{bk.run_id}"' in config


def test_the_bar_is_never_above_cusparse(bk: BestKnown) -> None:
    """A first correct kernel four times slower than cuSPARSE (stopped early as slow, say) starts the entry;
    a later one twice slower than cuSPARSE, though faster than it, earns what clipped_log gives it and raises
    nothing, and is written all the same (faster than the store's own best). Kills: the store's best read as the
    bar uncapped (+1.0 for a kernel slower than cuSPARSE, and a new best-known counted), the capped bar used to
    decide what is written (the store kept at 160 us)."""
    a = Item("a", generate("banded", 3000, seed=0))
    score(bk, [a], ["K160"], [timed(4 * CUSPARSE_US)])
    later = [timed(2 * CUSPARSE_US)]
    before = bk.bests([a], later)
    assert before == [CUSPARSE_US] and reward(later[0], REL, before[0]) == pytest.approx(-1.0)
    assert bk.record([a], ["K80"], later, before) == set()
    (row,) = bk.store.best(fingerprint=bk.card(a).fingerprint)
    assert row.time_us == 2 * CUSPARSE_US, "the store still improves on its own best, though nothing was raised"


def test_a_best_from_another_gpu_is_scaled_by_cusparse(bk: BestKnown) -> None:
    """Another GPU of the same architecture (an H200's best for an H100's sample) carries its speedup over
    cuSPARSE, not its time: a best at 4x cuSPARSE on the H200 is a bar at 4x the H100's own cuSPARSE time, also
    in a batch where an H200 sample comes first. Kills: the other GPU's time taken as it is (a 2x kernel on the
    slower card scored against the faster card's 10 us), the bar cached per entry across a batch's GPUs."""
    a = Item("a", generate("banded", 3000, seed=0))
    score(bk, [a], ["K10"], [timed(10.0)])  # on the "H200", cuSPARSE at 40 us: speedup 4
    h100_base = 60.0
    kt = KernelTiming("cold", 30.0, 30.0, 30.0, 0.0)
    slower_card = EvalResult(**{**timed(30.0).__dict__, "gpu": "H100", "timings": {"cold": kt},
                                "baseline": {"cold": KernelTiming("cold", h100_base, h100_base, h100_base, 0.0)},
                                "speedup": h100_base / 30.0})
    assert bk.bests([a], [slower_card]) == [pytest.approx(h100_base / 4)]
    assert bk.bests([a], [timed(30.0)]) == [10.0], "the same GPU: the time itself"
    assert bk.bests([a, a], [timed(30.0), slower_card]) == [10.0, pytest.approx(h100_base / 4)], "one batch"
