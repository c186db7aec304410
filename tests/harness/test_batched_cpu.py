"""The batched path's host side on the CPU: the verdict replayed from a board row in the sequential
path's order, the board's decoding, the balanced comparison's row plan, the profile, the evaluator's
memo of slow verdicts and the best-known note."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.harness import gpucheck, profile
from sparserl.harness.batched import BatchedVerifier, GpuTarget
from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
from sparserl.harness.speed import VerifyLimit
from sparserl.harness.verify import VerifyConfig
from sparserl.matrices import generate

ARRAYS = ("row_ptr", "col_idx", "val")


def row(**set_) -> np.ndarray:
    r = np.zeros(gpucheck.FIELDS, np.uint64)
    r[gpucheck.FIRST] = np.iinfo(np.uint64).max
    for name, value in set_.items():
        r[getattr(gpucheck, name.upper())] = value
    return r


def verifier() -> BatchedVerifier:
    inputs = [(n, None) for n in ("normal0", "uniform1", "normal2", "large_signed", "zeros", "alternating",
                                  "non_negative")]
    return BatchedVerifier(SimpleNamespace(m=10, n=10, k=None, cfg=VerifyConfig(), inputs=inputs))


def target() -> GpuTarget:
    dev = SimpleNamespace(arrays={n: None for n in ARRAYS})
    return GpuTarget(bound=SimpleNamespace(dev=dev), check=None, pristine={}, sms=1)


def judge(r: np.ndarray, idx: int = 1, where: str = "", atomics: bool = False, hint: str = ""):
    return verifier()._judge(idx, (target(), "uniform1", None, where, hint), r, 0.25, atomics)


def test_verdict_replay_follows_the_sequential_order() -> None:
    """x written, then the matrix, then the guards, then the comparison, then determinism: each row's
    first problem in that order is the verdict, with the sequential path's message. Kills a replay
    that checks the comparison before the tamper checks (a kernel writing x and y wrong would be
    'incorrect' instead of 'input_modified')."""
    worst_bits = np.float64(7.5).view(np.uint64)
    everything = row(x_changed=3, bad=4, worst=worst_bits, first=2, nonfinite=1)
    everything[gpucheck.ARRAYS + 2] = 5
    everything[gpucheck.GUARDS + 1] = 1
    out, _ = judge(everything)
    assert out.kind is ErrorKind.INPUT_MODIFIED and out.message == "input 'uniform1': the kernel wrote to x"
    everything[gpucheck.X_CHANGED] = 0
    out, _ = judge(everything)
    assert out.kind is ErrorKind.INPUT_MODIFIED and out.message.endswith("the kernel wrote to the matrix arrays val")
    everything[gpucheck.ARRAYS + 2] = 0
    out, _ = judge(everything)
    assert out.kind is ErrorKind.INCORRECT and out.message.endswith("wrote past the end of y")
    assert out.max_scaled_error == float("inf")
    everything[gpucheck.GUARDS + 1] = 0
    everything[gpucheck.GUARDS + 3] = 2
    out, _ = judge(everything)
    assert out.kind is ErrorKind.INPUT_MODIFIED and out.message.endswith("wrote past the end of x")
    everything[gpucheck.GUARDS + 3] = 0
    out, worst = judge(everything, where="with the same pattern and fresh values, ",
                       hint=" (the kernel must read every value from val)")
    assert out.kind is ErrorKind.INCORRECT and worst == 7.5
    assert out.message == ("with the same pattern and fresh values, input 'uniform1': 4 rows out of tolerance "
                           "(1 entries never written or not finite), first bad row 2, max error 7.5x the tolerance "
                           "(the kernel must read every value from val)")


def test_determinism_is_judged_on_the_rerun_only_and_not_with_atomics() -> None:
    ok = row(rerun=3, worst=np.float64(0.5).view(np.uint64))
    assert judge(ok, idx=2)[0] is None  # not the re-run: the counter is not read
    out, worst = judge(ok, idx=7)  # the re-run of the first input comes after the seven inputs
    assert out.kind is ErrorKind.NONDETERMINISTIC and worst == 0.5
    assert judge(ok, idx=7, atomics=True)[0] is None
    assert judge(ok, idx=6)[0] is None  # the last input, not the re-run
    clean = row(worst=np.float64(0.9).view(np.uint64))
    assert judge(clean, idx=7) == (None, 0.9)


def test_board_row_decoding() -> None:
    r = row(bad=2, nonfinite=0, worst=np.float64(3.25).view(np.uint64), first=17)
    c = gpucheck.comparison(r)
    assert not c.ok and c.bad_rows == 2 and c.max_scaled_error == 3.25 and c.first_bad_row == 17
    assert gpucheck.comparison(row()).ok and gpucheck.comparison(row()).first_bad_row is None
    r = row()
    r[gpucheck.GUARDS + 0] = 1
    r[gpucheck.GUARDS + 2] = 1
    assert gpucheck.guard_problem(r) == "wrote before the start of y"  # y's guards are looked at first
    assert gpucheck.guard_problem(row()) is None


@pytest.mark.parametrize("family, rows", [("powerlaw", 3000), ("skewed", 4000), ("dense_lines", 2000),
                                          ("diagonal", 500), ("empty_rows", 800)])
def test_row_plan_covers_every_entry_once_and_sums_like_fp64(family: str, rows: int) -> None:
    """Every entry of a short row is summed by its row's lanes, every entry of a long row by exactly
    one chunk; the plan's sums (as the GPU adds them) match SciPy's fp64 product. Kills an off-by-one
    in a chunk's end, a long row also summed by the short path, a wrong long-row threshold."""
    A = generate(family, rows, seed=2)
    plan = gpucheck.RowPlan.of(A.indptr)
    lengths = np.diff(A.indptr)
    assert plan.lanes in (1, 2, 4, 8, 16, 32) and plan.long_len == 32 * plan.lanes
    assert np.array_equal(plan.long_rows, np.flatnonzero(lengths > plan.long_len))
    covered = np.zeros(A.nnz, np.int64)
    for s, e in zip(plan.chunk_start, plan.chunk_end):
        assert 0 < e - s <= gpucheck.CHUNK
        covered[s:e] += 1
    for i, r in enumerate(plan.long_rows):
        spans = [(plan.chunk_start[c], plan.chunk_end[c]) for c in range(plan.chunk_ptr[i], plan.chunk_ptr[i + 1])]
        assert spans[0][0] == A.indptr[r] and spans[-1][1] == A.indptr[r + 1]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    short = np.ones(A.shape[0], bool)
    short[plan.long_rows] = False
    for r in np.flatnonzero(short):
        covered[A.indptr[r]:A.indptr[r + 1]] += 1
    assert np.all(covered == 1)
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(np.float32)
    if A.nnz <= 60_000:
        ref, mag = plan.sums(A.indptr, A.indices, A.data, x)
        A64 = sp.csr_array((A.data.astype(np.float64), A.indices, A.indptr), shape=A.shape)
        want, want_mag = A64 @ x.astype(np.float64), abs(A64) @ np.abs(x.astype(np.float64))
        assert np.allclose(ref, want, rtol=1e-12, atol=1e-12) and np.allclose(mag, want_mag, rtol=1e-12)


def test_row_plan_sends_a_dense_row_to_chunks() -> None:
    A = generate("dense_lines", 4000, seed=1)
    plan = gpucheck.RowPlan.of(A.indptr)
    assert plan.long_rows.size >= 1 and plan.chunk_start.size > plan.long_rows.size


def test_profile_steps_record_their_own_time() -> None:
    """Nested steps are not counted twice: the steps add up to the wall time. Kills a profiler that
    adds a child's time to its parent too."""
    import time

    prof = profile.begin()
    with profile.step("outer"):
        time.sleep(0.02)
        with profile.step("inner"):
            time.sleep(0.03)
        profile.count("syncs", 2)
    out = profile.end()
    assert out["counts"] == {"syncs": 2}
    assert 0.015 < out["seconds"]["outer"] < 0.045 and 0.025 < out["seconds"]["inner"] < 0.06
    assert abs(sum(out["seconds"].values()) - (time.perf_counter() - prof.t0)) < 0.01
    with profile.step("nobody"):  # no job being profiled: a no-op
        pass
    assert profile.end() == {"seconds": {}, "counts": {}}


def _done(result: EvalResult) -> Future:
    f: Future = Future()
    f.set_result(result)
    return f


def test_a_remembered_slow_verdict_holds_only_while_still_slow(tmp_path) -> None:
    """The memo answers with a slow verdict only when the best time known now would stop the kernel
    too; a faster best makes it slower still (kept), a slower one gets it evaluated again."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path))) as ev:
        t, base = KernelTiming("cold", 700.0, 690.0, 710.0, 0.03, 5), KernelTiming("cold", 100.0, 99, 101, 0.02)
        slow = EvalResult(op="spmv", k=None, matrix="m", error_kind=ErrorKind.SLOW, compiled=True, correct=True,
                          timings={"cold": t}, baseline={"cold": base}, speedup=100 / 700)
        assert ev._still_valid(_done(slow), 50.0)  # 700 > 3 x 50
        assert ev._still_valid(_done(slow), None)  # 700 > 3 x cuSPARSE's 100
        assert ev._still_valid(_done(slow), 400.0)  # cuSPARSE (100 us) is the faster reference: 700 > 300
        good = EvalResult(op="spmv", k=None, matrix="m", error_kind=ErrorKind.NONE, compiled=True, correct=True)
        assert ev._still_valid(_done(good), 1.0)
        slower_base = KernelTiming("cold", 300.0, 299, 301, 0.02)
        slow2 = EvalResult(op="spmv", k=None, matrix="m", error_kind=ErrorKind.SLOW, compiled=True, correct=True,
                           timings={"cold": t}, baseline={"cold": slower_base}, speedup=300 / 700)
        assert not ev._still_valid(_done(slow2), None)  # 700 < 3 x 300: not slow against this best


def test_note_best_keeps_the_best_in_the_reward_regime(tmp_path) -> None:
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path))) as ev:
        m = ev.register(generate("random", 200, seed=0, nnz_per_row=4), "r")
        assert ev.best_known(m, "spmv", None) is None
        ev.note_best(m, "spmv", None, 50.0)
        ev.note_best(m, "spmv", None, 80.0)
        ev.note_best(m, "spmv", None, 10.0, regime="warm")  # not the reward regime: ignored
        ev.note_best(m, "spmm", 8, 5.0)
        assert ev.best_known(m, "spmv", None) == 50.0 and ev.best_known(m, "spmm", 8) == 5.0


def test_check_kernels_compile_with_nvrtc() -> None:
    """The board's kernels build with NVRTC for Hopper, as CuPy builds them in a worker (no GPU
    needed); a syntax or type error would otherwise surface only in a worker's start-up."""
    from sparserl.harness.nvrtc import load_nvrtc

    nvrtc = load_nvrtc()
    if nvrtc is None:
        pytest.skip("NVRTC not found")
    out = nvrtc.compile(gpucheck._SRC, ["--gpu-architecture=sm_90"], 120)
    assert out.status == "ok", out.log[-2000:]
    assert "word_sums" in gpucheck.KERNELS
    for name in gpucheck.KERNELS:
        assert f".entry {name}(" in out.ptx, name


def _sums_by_hand(words: list[int]) -> tuple[int, int]:
    """The two fingerprint sums with Python integers, reduced mod 2^64 at the end."""
    plain = sum(words)
    mixed = sum(w * (2 * i + 1) for i, w in enumerate(words))
    return plain % 2 ** 64, mixed % 2 ** 64


def test_fingerprint_sums_by_hand_and_what_they_catch() -> None:
    """The host mirror of the word_sums kernel (the GPU test holds the kernel to it): per array the sum
    of its 32-bit words and the sum of word_i * (2 i + 1), wrapping; a float64 array is its two words
    per value. One changed word changes both sums (the first word too: its weight is 1, not 0); two words
    exchanged change the second. Kills a fingerprint that is the plain sum alone (blind to exchanged
    words), a weight of i instead of 2 i + 1 (blind in the second sum to the first word), a float64
    array read as one word per value."""
    big = np.array([0xFFFFFFFF, 0x80000000, 7, 0xFFFFFFFF] * 1000, dtype=np.uint32)  # sums wrap past 2^64
    halves = np.array([1.5, -2.0e300], dtype=np.float64)
    got = gpucheck.word_sums_host([big, halves, np.zeros(0, np.float32)])
    assert got[:2] == _sums_by_hand([int(w) for w in big])
    assert got[2:4] == _sums_by_hand([int(w) for w in halves.view(np.uint32)])
    assert got[4:] == (0, 0)
    vals = np.arange(1, 2001, dtype=np.int32)
    base = gpucheck.word_sums_host([vals])
    one = vals.copy()
    one.view(np.uint32)[1234] ^= np.uint32(1 << 31)  # a sign bit flipped
    changed = gpucheck.word_sums_host([one])
    assert changed[0] != base[0] and changed[1] != base[1]
    first = vals.copy()
    first[0] += 5
    changed = gpucheck.word_sums_host([first])
    assert changed[0] != base[0] and changed[1] != base[1]
    swapped = vals.copy()
    swapped[[10, 900]] = swapped[[900, 10]]
    s = gpucheck.word_sums_host([swapped])
    assert s[0] == base[0] and s[1] != base[1]


def _library_conversions(op: str = "spmv") -> set[tuple[str, tuple]]:
    from sparserl.kernels.contract import Op, split_completion
    from sparserl.kernels.library import variants

    out = set()
    for v in variants(Op(op)):
        header, _ = split_completion(v.render(), Op(op))
        out.add((header.format, tuple(sorted(header.params.items()))))
    return out


@pytest.mark.parametrize("family, rows", [("banded", 3000), ("powerlaw", 4000), ("empty_rows", 3000),
                                          ("rectangular", 2000), ("block", 2048)])
def test_one_conversion_of_the_pattern_gives_both_versions_bit_for_bit(family: str, rows: int) -> None:
    """The premise of TwinConversions, on the real converters for every format and parameter set of the
    library: converting the pattern with each nonzero's position as its value names, in every value slot,
    the nonzero it holds (every nonzero exactly once, padding 0), and gathering a matrix's values
    through it gives exactly (bit for bit, explicit zeros and signed zeros too) what converting that
    matrix gives; index arrays are the pattern's. Kills a converter that reorders by value, drops
    explicit zeros, or pads with something other than +0 (the GPU kernels do what these host lines do:
    tests/harness/test_batched_gpu.py)."""
    from sparserl.errors import FormatError
    from sparserl.formats import convert
    from sparserl.harness.preconvert import convert_pattern
    from sparserl.harness.resident import revalued

    A = generate(family, rows, seed=5)
    A.data[::7] = 0.0  # explicit zeros are stored nonzeros like any other
    A.data[3::11] = -0.0
    twin = revalued(A, 9)
    for fmt, params in sorted(_library_conversions()):
        try:
            fd = convert_pattern(A, fmt, dict(params))
        except FormatError:
            with pytest.raises(FormatError):
                convert(A, fmt, dict(params))
            continue
        wheres = {n: a.view(np.int32) for n, a in fd.arrays.items() if a.dtype == np.float32}
        named = np.concatenate([w[w != 0] for w in wheres.values()])
        assert np.array_equal(np.sort(named), np.arange(1, A.nnz + 1)), (fmt, params)
        for M in (A, twin):
            want = convert(M, fmt, dict(params))
            assert want.sizes == fd.sizes and want.params == fd.params, (fmt, params)
            for name, arr in want.arrays.items():
                got = fd.arrays[name]
                if name in wheres:
                    w = wheres[name]
                    got = np.where(w > 0, M.data.view(np.uint32)[np.maximum(w, 1) - 1], 0).view(np.float32)
                assert np.array_equal(got.view(np.uint32), arr.view(np.uint32)), (family, fmt, params, name)


class _Clock:
    """A perf_counter that moves only when a fake launch runs."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class _HostBoard:
    """gpucheck.Board on the host: the same rows, reset, read."""

    def __init__(self, rows: int) -> None:
        self.host = np.zeros((rows, gpucheck.FIELDS), dtype=np.uint64)
        self.host[:, gpucheck.FIRST] = np.iinfo(np.uint64).max

    def row(self, i: int, field: int = 0):
        return self.host[i, field:]

    def enqueue_reset(self, i: int) -> None:
        pass

    def read(self) -> np.ndarray:
        return self.host.copy()


def _verify_on_host(monkeypatch, launch_s: list[float], wrong: set[int], limit):
    """BatchedVerifier.run with the GPU work replaced by host doubles: launch ``i`` takes
    ``launch_s[i]`` seconds on the verifier's clock, and its comparison counts a bad row when ``i`` is in
    ``wrong`` (every other check clean). Returns (outcome, launches run, phases announced, limits
    asked, profile counts)."""
    from sparserl.harness import batched

    clock = _Clock()
    monkeypatch.setattr(batched, "time", clock)
    monkeypatch.setattr(batched, "_sync", lambda stream=None: None)
    monkeypatch.setattr(batched, "IOBuffers", lambda m, n, k: SimpleNamespace(
        load_x=lambda x: None, x=np.zeros(n, np.float32), y=np.zeros(m, np.float32)))
    monkeypatch.setattr(gpucheck, "Board", _HostBoard)
    monkeypatch.setattr(gpucheck, "enqueue_diff", lambda *a, **kw: None)
    monkeypatch.setattr(gpucheck, "enqueue_guards", lambda *a, **kw: None)
    launched: list[int] = []

    def run(x, y) -> None:
        clock.now += launch_s[len(launched)]
        launched.append(len(launched))

    def compare(x, y, out) -> None:
        if launched[-1] in wrong:
            out[gpucheck.BAD] = 1
            out[gpucheck.FIRST] = 0

    dev = SimpleNamespace(arrays={n: None for n in ARRAYS})
    targets = [GpuTarget(bound=SimpleNamespace(dev=dev, run=run), check=SimpleNamespace(enqueue=compare),
                         pristine={n: None for n in ARRAYS}, sms=1) for _ in range(2)]
    phases, asked = [], []

    def limit_of(n: int):
        asked.append(n)
        return limit

    profile.begin()
    out = verifier().run(targets[0], targets[1], False, lambda *a: phases.append(a), limit=VerifyLimit(limit_of))
    return out, len(launched), phases, asked, profile.end()["counts"]


def test_a_slow_first_launch_stops_verification_with_a_timeout(monkeypatch) -> None:
    """First launch 0.4 s, 10 launches left, limit 2 s (0.4 x 10 = 4 > 1.25 x 2): ``timeout`` after that
    launch, the others never enqueued nor announced, the limit asked for the 10, the profile counting
    it. Kills a prediction that still runs the remaining batch, that asks the limit for the wrong
    number of launches, or that reads the time of the whole verification instead of the first launch."""
    out, launched, phases, asked, counts = _verify_on_host(monkeypatch, [0.4] * 11, set(), 2.0)
    assert out.kind is ErrorKind.TIMEOUT and launched == 1 and asked == [10]
    assert out.message == ("the first launch took 0.40 s: the 10 remaining launches would run past the verify "
                           "limit of 2 s")
    assert phases == [("verify", 1), ("check",)]
    assert counts["verify_predicted_timeouts"] == 1 and counts["verify_launches"] == 1


def test_no_prediction_without_a_limit_a_fast_first_launch_or_a_right_answer(monkeypatch) -> None:
    """The same slow kernel with no limit (scaling off) runs every launch and passes, as before; a
    first launch under the prediction's share runs every launch; a slow first launch that is wrong is
    ``incorrect``, never ``timeout``. Kills a None limit read as 0, a prediction made before the first
    launch is judged (a kernel slow and wrong would be reported slow to fail, not wrong)."""
    out, launched, phases, _, counts = _verify_on_host(monkeypatch, [0.4] * 11, set(), None)
    assert out.kind is ErrorKind.NONE and launched == 11 and ("verify", 10) in phases
    assert "verify_predicted_timeouts" not in counts
    out, launched, *_ = _verify_on_host(monkeypatch, [0.24] + [5.0] * 10, set(), 2.0)  # 0.24 x 10 = 2.4 <= 2.5
    assert out.kind is ErrorKind.NONE and launched == 11
    out, launched, *_ = _verify_on_host(monkeypatch, [0.4] * 11, {0}, 2.0)
    assert out.kind is ErrorKind.INCORRECT and launched == 1 and out.message.startswith("input 'normal0'")


def test_the_slow_first_launch_kernels_pass_the_parent_checks_and_compile(tmp_path) -> None:
    """The GPU test's spinning kernels get through extraction, the source and compiled-code checks and
    nvcc here, so the GPU run cannot fail before it runs them."""
    from sparserl.harness.compile import find_nvcc
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from tests.harness.adversarial.early import SLOW_FIRST_LAUNCH, SLOW_FIRST_LAUNCH_WRONG

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path))) as ev:
        mat = ev.register(generate("random", 500, seed=0, nnz_per_row=8), "random500")
        for text in (SLOW_FIRST_LAUNCH, SLOW_FIRST_LAUNCH_WRONG):
            res = ev.evaluate(text, mat, "spmv")
            assert res.error_kind is ErrorKind.NO_GPU and res.compiled, res.message


def test_both_paths_verify_the_same_launches_with_the_same_labels() -> None:
    """The batched verifier's launches are the sequential one's (one function makes both lists): every
    input, the first again on a y that held the second (random) input's output, the first two and the
    non-negative one on the fresh-valued twin; only the re-run's y is filled from another launch. Kills: the
    re-run's y left NaN (no source), or filled from a launch of another target; the non-negative input not run
    on the twin (or with the values hint)."""
    from sparserl.harness.verify import STALE_Y, stale_source, verification_runs

    inputs = verifier().base.inputs
    runs = verification_runs(inputs, "A", "A_alt", VerifyConfig())
    assert [(t, n) for t, n, *_ in runs] == [("A", n) for n, _ in inputs] + [("A", "normal0"), ("A_alt", "normal0"),
                                                                            ("A_alt", "uniform1"),
                                                                            ("A_alt", "non_negative")]
    assert [stale_source(i, len(inputs)) for i in range(len(runs))] == [None] * 7 + [1] + [None] * 3
    assert runs[7][3] == STALE_Y and "write all of y" in runs[7][4]
    assert "add every term" in runs[10][4] and "one fp32 accumulator" in runs[10][4] and "read every value" in runs[9][4]
    assert [n for _, n, *_ in verification_runs(inputs, "A", "A_alt", VerifyConfig(revalued_inputs=0))][-1] == "normal0"
    one = verification_runs(inputs[:1], "A", None, VerifyConfig())
    assert len(one) == 2 and stale_source(1, 1) is None and one[1][3] == "", "one input: nothing else to fill y from"
