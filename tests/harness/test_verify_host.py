"""The verification rules (harness/verify.py) and the timed-run checks (harness/buffers.py) on the
host: the real Verifier, IOBuffers and CheckedIO with ``xp=numpy``, judging host kernels.

A :class:`HostKernel` stands in for a compiled CUDA kernel (it is what is judged, not what judges):
``run(x, y)`` writes y from the matrix arrays it was bound to, as a launch would. Each cheat below is
a kernel a policy could write; the expected verdict and the input that catches it are written out
by hand. The docstrings name the mutation of the judge each test kills."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.harness.buffers import GUARD, NAN_BITS, CheckedIO, IOBuffers, host_refresh
from sparserl.harness.reference import Fp64Reference
from sparserl.harness.resident import revalued
from sparserl.harness.result import ErrorKind
from sparserl.harness.verify import NON_NEGATIVE, STALE_Y, Target, Verifier, VerifyConfig, make_inputs
from tests.harness.adversarial.tolerance import long_row_matrix

M, N = 120, 90


class HostKernel:
    """A host stand-in for a compiled SpMV/SpMM kernel bound to one version of the matrix: ``arrays``
    (row_ptr, col_idx, val) are the "device" arrays it reads; ``body(self, x, y)`` computes y
    (default: the honest fp32 product). ``calls`` counts launches."""

    def __init__(self, A: sp.csr_array, body: Callable | None = None):
        self.arrays = {"row_ptr": A.indptr.copy(), "col_idx": A.indices.copy(), "val": A.data.copy()}
        self.shape = A.shape
        self.body = body or HostKernel.honest
        self.calls = 0
        self.pointers: list[tuple[int, int]] = []

    def product(self, x, val=None) -> np.ndarray:
        a = self.arrays
        A = sp.csr_array((a["val"] if val is None else val, a["col_idx"], a["row_ptr"]), shape=self.shape)
        return (A @ x).astype(np.float32)

    def honest(self, x, y) -> None:
        y[...] = self.product(x)

    def run(self, x, y) -> None:
        self.pointers.append((x.ctypes.data, y.ctypes.data))
        self.body(self, x, y)
        self.calls += 1


def matrix(seed: int = 0) -> sp.csr_array:
    A = sp.random_array((M, N), density=0.08, format="csr", random_state=seed, dtype=np.float32)
    A.data[:] = np.random.default_rng(seed).standard_normal(A.nnz).astype(np.float32)
    return A


def target(A: sp.csr_array, kernel: HostKernel) -> Target:
    """The kernel with its fp64 reference and a tamper check that restores the arrays (as the worker's)."""
    pristine = {k: v.copy() for k, v in kernel.arrays.items()}

    def modified() -> list[str]:
        bad = [k for k, v in kernel.arrays.items() if not np.array_equal(v, pristine[k])]
        for k in bad:
            kernel.arrays[k][...] = pristine[k]
        return bad

    return Target(kernel, Fp64Reference(A), modified)


def verify(body=None, alt_body=None, k=None, cfg=VerifyConfig(), atomics=False, phases=None):
    """Verify a kernel (``body``) on the matrix and, unless cfg says not, on its fresh-valued twin."""
    A = matrix()
    A_alt = revalued(A, seed=5)
    main, alt = HostKernel(A, body), HostKernel(A_alt, alt_body or body)
    v = Verifier(M, N, k, cfg, xp=np)
    out = v.run(target(A, main), target(A_alt, alt), atomics, phases.append if phases is not None else lambda p: None)
    return out, main, alt


# -- the inputs --------------------------------------------------------------------------------


def test_the_inputs_are_the_documented_set() -> None:
    """Random normal and uniform inputs, then large signed magnitudes (|x| in [1e3, 1e4], both signs),
    all zeros, alternating +1/-1, and a non-negative one (|normal|); the same for the same seed,
    different for another seed.

    Mutations killed: an adversarial input dropped or made harmless (e.g. large values all positive);
    the non-negative input dropped or given negative entries."""
    got = make_inputs((1000,), VerifyConfig())
    assert [n for n, _ in got] == ["normal0", "uniform1", "normal2", "large_signed", "zeros", "alternating",
                                   NON_NEGATIVE]
    d = dict(got)
    assert all(x.dtype == np.float32 and x.shape == (1000,) for x in d.values())
    assert np.abs(d["uniform1"]).max() <= 1 and d["uniform1"].min() < -0.9 and d["uniform1"].max() > 0.9
    assert 0.5 < np.std(d["normal0"]) < 1.5
    big = np.abs(d["large_signed"])
    assert big.min() >= 1e3 and big.max() <= 1e4 and 300 < (d["large_signed"] < 0).sum() < 700
    assert np.unique(big).size > 900  # magnitudes drawn per entry, not one for all
    assert not d["zeros"].any() and d["alternating"].tolist() == [1.0, -1.0] * 500
    assert d[NON_NEGATIVE].min() >= 0 and 0.5 < np.std(d[NON_NEGATIVE]) < 1.5 and np.unique(d[NON_NEGATIVE]).size > 900
    again = make_inputs((1000,), VerifyConfig())
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, again))
    other = dict(make_inputs((1000,), VerifyConfig(seed=1)))
    assert not np.array_equal(other["normal0"], d["normal0"])
    assert [n for n, _ in make_inputs((4, 3), VerifyConfig(random_inputs=1, adversarial=False))] == ["normal0",
                                                                                                  NON_NEGATIVE]
    assert make_inputs((4, 3), VerifyConfig())[5][1].tolist() == [[1.0] * 3, [-1.0] * 3] * 2  # SpMM: by rows
    for bad in ({"random_inputs": 0}, {"revalued_inputs": -1}):
        with pytest.raises(ValueError) as e:
            VerifyConfig(**bad)
        assert str(e.value) == "need random_inputs >= 1 and revalued_inputs >= 0"


# -- verdicts ------------------------------------------------------------------------------------


def test_an_honest_kernel_passes_with_every_launch_on_fresh_buffers() -> None:
    """Seven inputs, the first run again, three inputs on the fresh-valued twin: 11 launches, each on x and
    y buffers no earlier launch used, each between a "verify" and a "check" phase.

    Mutations killed: one IOBuffers reused for every launch (a kernel could cache by pointer), the
    rerun of the first input dropped, the twin's launches dropped, the phases swapped or skipped."""
    phases: list[str] = []
    out, main, alt = verify(phases=phases)
    assert out.kind is ErrorKind.NONE and out.message == "" and 0 < out.max_scaled_error < 1
    assert (main.calls, alt.calls) == (8, 3)
    ptrs = main.pointers + alt.pointers
    assert len({p for p, _ in ptrs}) == 11 and len({q for _, q in ptrs}) == 11
    assert phases == ["verify", "check"] * 11


def test_the_profile_names_each_verification_step_and_counts_the_launches() -> None:
    """Under a job's profile the sequential verifier's time lands in the steps harness/profile.py
    documents (fresh buffers and inputs, launches, tamper checks, fp64 comparisons, the rerun's
    determinism check) and the 11 launches are counted.

    Mutations killed: any step or count name changed or made None (harness/profile.py's table
    documents them; harness_speed.py reports the time per step name)."""
    from sparserl.harness import profile

    profile.begin()
    try:
        out, _, _ = verify()
    finally:
        prof = profile.end()
    assert out.kind is ErrorKind.NONE
    assert set(prof["seconds"]) - {"other"} == {"verify_inputs", "verify_launch", "verify_tamper", "verify_compare",
                                                 "verify_determinism"}
    assert prof["counts"] == {"verify_launches": 11}


def unwritten_last_row(self, x, y) -> None:
    y[:-1] = self.product(x)[:-1]


def writes_past_y(self, x, y) -> None:
    self.honest(x, y)
    y.base[GUARD + y.size] = 0.0


def writes_before_y(self, x, y) -> None:
    self.honest(x, y)
    y.base[GUARD - 1] = 0.0


def writes_before_x(self, x, y) -> None:
    self.honest(x, y)
    x.base[GUARD - 1] = 0.0


def scribbles_on_x(self, x, y) -> None:
    self.honest(x, y)
    x[0] = 7.0


def scribbles_on_val(self, x, y) -> None:
    self.honest(x, y)
    self.arrays["val"][3] += 1.0


def first_answer_forever(self, x, y) -> None:
    if self.calls == 0:
        self.cached = self.product(x)
    y[...] = self.cached


def clamps_x(self, x, y) -> None:  # e.g. a lookup table or half-precision x
    y[...] = self.product(np.clip(x, -100, 100))


def bias(self, x, y) -> None:  # a constant left in every row: only an all-zero input shows it
    y[...] = self.product(x) + np.float32(1e-20)


def wrong_on_its_eighth_launch(self, x, y) -> None:  # the rerun of the first input
    y[...] = self.product(x) * (2.0 if self.calls == 7 else 1.0)


def skips_rows_holding_a_number(self, x, y) -> None:  # right on a poisoned y, stale on a user's
    np.copyto(y, self.product(x), where=np.isnan(y))


def adds_to_a_number_in_y(self, x, y) -> None:  # "zeroes" only the poison, then accumulates
    y[...] = np.where(np.isnan(y), np.float32(0), y) + self.product(x)


def scribbles_on_two_arrays(self, x, y) -> None:
    self.honest(x, y)
    self.arrays["col_idx"][0] = 0
    self.arrays["col_idx"][1] = 0
    self.arrays["val"][3] += 1.0


@pytest.mark.parametrize("body, kind, says, worst", [
    (unwritten_last_row, ErrorKind.INCORRECT, "input 'normal0': 1 rows out of tolerance (1 entries never written or "
     f"not finite), first bad row {M - 1}, max error infx the tolerance", "inf"),
    (writes_past_y, ErrorKind.INCORRECT, "input 'normal0': wrote past the end of y", "inf"),
    (writes_before_y, ErrorKind.INCORRECT, "input 'normal0': wrote before the start of y", "inf"),
    (writes_before_x, ErrorKind.INPUT_MODIFIED, "input 'normal0': wrote before the start of x", "inf"),
    (scribbles_on_x, ErrorKind.INPUT_MODIFIED, "input 'normal0': the kernel wrote to x", "none yet"),
    (scribbles_on_val, ErrorKind.INPUT_MODIFIED, "input 'normal0': the kernel wrote to the matrix arrays val",
     "none yet"),
    (scribbles_on_two_arrays, ErrorKind.INPUT_MODIFIED,
     "input 'normal0': the kernel wrote to the matrix arrays col_idx, val", "none yet"),
    (first_answer_forever, ErrorKind.INCORRECT, "input 'uniform1': ", "over"),
    (clamps_x, ErrorKind.INCORRECT, "input 'large_signed': ", "over"),
    (bias, ErrorKind.INCORRECT, "input 'zeros': ", "over"),
    (wrong_on_its_eighth_launch, ErrorKind.INCORRECT, f"{STALE_Y}input 'normal0': ", "over"),
    (skips_rows_holding_a_number, ErrorKind.INCORRECT, f"{STALE_Y}input 'normal0': ", "over"),
    (adds_to_a_number_in_y, ErrorKind.INCORRECT, f"{STALE_Y}input 'normal0': ", "over"),
])
def test_cheats_get_their_verdict_on_the_input_that_shows_them(body, kind, says: str, worst: str) -> None:
    """Each kernel fails with its kind, on the input named (the earlier inputs pass it), with the
    message in full where it is fixed (no hint about values: that is the twin's), and the worst
    scaled error the outcome reports: inf for a write outside the buffers, 0 when it failed
    before any output was compared, above 1 for wrong values.

    Mutations killed: the NaN poison of y skipped (unwritten_last_row passes), guard_problem not
    called or a guard left unchecked, the x comparison or the tamper check dropped, a guard write
    into x classed as incorrect, the large-signed, zeros or rerun input dropped, the arrays' names
    joined without their separator, the outcome's error dropped or taken from the wrong branch, the
    re-run's y left NaN (the two kernels that read y pass: a user's y holds the last call's output)."""
    out, _, _ = verify(body)
    assert out.kind is kind and out.message.startswith(says), out.message
    assert "read every value from val" not in out.message
    if says.endswith(("tolerance", " of y", " of x", " to x", "val")):
        assert out.message == says
    if worst == "inf":
        assert out.max_scaled_error == float("inf")
    elif worst == "none yet":
        assert out.max_scaled_error == 0.0
    else:
        assert 1.0 < out.max_scaled_error < float("inf")


def test_a_tampered_matrix_is_restored_for_the_next_job() -> None:
    A = matrix()
    kern = HostKernel(A, scribbles_on_val)
    t = target(A, kern)
    out = Verifier(M, N, None, VerifyConfig(), xp=np).run(t, None, False)
    assert out.kind is ErrorKind.INPUT_MODIFIED and np.array_equal(kern.arrays["val"], A.data)


def test_values_baked_into_the_code_fail_on_the_fresh_valued_twin() -> None:
    """A kernel that carries the matrix's values in its code (here: it reads A's values whatever
    ``val`` holds) is right on A and wrong on the same pattern with fresh values; without
    revalued inputs nothing catches it.

    Mutations killed: the twin not run, or run against A's reference instead of its own."""
    A = matrix()
    baked = lambda self, x, y: y.__setitem__(..., self.product(x, val=A.data))  # noqa: E731
    out, _, alt = verify(baked)
    assert out.kind is ErrorKind.INCORRECT and alt.calls == 1
    assert out.message.startswith("with the same pattern and fresh values, input 'normal0'")
    assert out.message.endswith("(the kernel must read every value from val)")
    out, _, alt = verify(baked, cfg=VerifyConfig(revalued_inputs=0))
    assert out.kind is ErrorKind.NONE and alt.calls == 0


def test_the_fresh_values_have_one_sign_to_a_row() -> None:
    """``revalued``: ``A``'s pattern, no zero value, magnitudes spread, every row's values of one
    sign and both signs among the rows, another seed other values.

    Mutations killed: a sign drawn per entry (the tolerance then loose again on every timed run);
    all rows given one sign (a kernel could then hard-code it); zeros among the values."""
    A = sp.random_array((2000, 300), density=0.05, format="csr", random_state=3, dtype=np.float32)
    B = revalued(A, 11)
    assert np.array_equal(B.indptr, A.indptr) and np.array_equal(B.indices, A.indices) and B.dtype == np.float32
    assert (B.data != 0).all() and np.unique(np.abs(B.data)).size > 0.9 * B.nnz
    lo = np.minimum.reduceat(np.sign(B.data), A.indptr[:-1][np.diff(A.indptr) > 0])
    hi = np.maximum.reduceat(np.sign(B.data), A.indptr[:-1][np.diff(A.indptr) > 0])
    assert np.array_equal(lo, hi) and 0.4 < (lo < 0).mean() < 0.6
    assert not np.array_equal(revalued(A, 12).data, B.data)


def leaves_out_the_tail(self, x, y) -> None:
    """A kernel that skips the last 1% of every row longer than 100 000 entries (the adversarial
    suite's ``leaves_out_the_tail_of_long_rows``, on the host)."""
    a = self.arrays
    val = a["val"].copy()
    for i in range(self.shape[0]):
        lo, hi = int(a["row_ptr"][i]), int(a["row_ptr"][i + 1])
        if hi - lo > 100_000:
            val[hi - (hi - lo) // 100:hi] = 0
    y[...] = self.product(x, val=val)


def test_a_kernel_that_leaves_out_the_tail_of_a_long_row_fails() -> None:
    """Leaving out the last 1% of a row of 10^6 entries: with terms of random sign the error grows
    like the square root of the terms left out, about a third of the bound there, so every signed input
    passes it (shown here on a twin whose signs are drawn per entry, and on every input on ``A``); on
    ``A_alt`` (one sign to a row) with the non-negative input nothing cancels, it is 1% of the row's sum
    against a bound of 4.9e-4, and it fails, as does every timed run (x non-negative).

    Mutations killed: the non-negative input not run on the twin; the twin's signs drawn per entry;
    timed x drawn with both signs."""
    A = long_row_matrix(rows=8, per_row=3)
    n = A.shape[1]
    A_alt = revalued(A, seed=5)
    main, alt = HostKernel(A, leaves_out_the_tail), HostKernel(A_alt, leaves_out_the_tail)
    out = Verifier(8, n, None, VerifyConfig(), xp=np).run(target(A, main), target(A_alt, alt), False)
    assert out.kind is ErrorKind.INCORRECT and main.calls == 8 and alt.calls == 3
    assert out.message.startswith(f"with the same pattern and fresh values, input '{NON_NEGATIVE}': ")
    assert out.message.endswith("(every row's terms have one sign here, so none cancel: the kernel must add every term, "
                                "and one fp32 accumulator drifts on a row of 1.5 million entries or more)")
    per_entry = A_alt.copy()
    per_entry.data = np.abs(per_entry.data) * np.where(np.random.default_rng(1).random(A.nnz) < 0.5, -1, 1).astype(np.float32)
    mixed = HostKernel(per_entry, leaves_out_the_tail)
    assert Verifier(8, n, None, VerifyConfig(), xp=np).run(target(A, HostKernel(A, leaves_out_the_tail)),
                                                           target(per_entry, mixed), False).kind is ErrorKind.NONE
    checked = CheckedIO(IOBuffers(8, n, xp=np), Fp64Reference(A_alt))
    msg = timed_samples(checked, HostKernel(A_alt, leaves_out_the_tail), "cold", samples=1)
    assert msg is not None and msg.startswith("timed run (cold, sample 1): output differs from the reference")
    honest = CheckedIO(IOBuffers(8, n, xp=np), Fp64Reference(A_alt))
    assert timed_samples(honest, HostKernel(A_alt), "cold", samples=2) is None


def mean_of_x_when_timed(self, x, y) -> None:
    """The adversarial ``mean_of_x_on_long_rows_when_timed`` on the host: on a timed run's x (on the 2^-23
    grid in [0, 1)) rows longer than 100 000 entries are answered with 0.5 x the sum of their values."""
    a = self.arrays
    y[...] = self.product(x)
    if looks_timed(x):
        for i in range(self.shape[0]):
            lo, hi = int(a["row_ptr"][i]), int(a["row_ptr"][i + 1])
            if hi - lo > 100_000:
                y[i] = np.float32(0.5 * a["val"][lo:hi].astype(np.float64).sum())


def test_a_statistical_answer_on_a_long_row_fails_when_timed() -> None:
    """The mean of x times the sum of the values is off by about 7e-4 of the row's sum on a row of 10^6
    entries: within the bound uncapped (1.9e-3 there), over it capped (4.9e-4). It fails a cold timed run
    within 20 (the chance of passing one is about a half); honest, the same 20 pass. Uncapped, most runs
    pass it (all 20 did when tried), so the cap's own mutation is killed by the formula's test
    (tests/harness/test_reference.py::test_rtol_is_the_documented_formula)."""
    A = long_row_matrix(rows=8, per_row=3)
    A_alt = revalued(A, seed=5)
    checked = CheckedIO(IOBuffers(8, A.shape[1], xp=np), Fp64Reference(A_alt))
    msg = timed_samples(checked, HostKernel(A_alt, mean_of_x_when_timed), "cold", samples=20)
    assert msg is not None and msg.startswith("timed run (cold, sample ") and "output differs" in msg
    honest = CheckedIO(IOBuffers(8, A.shape[1], xp=np), Fp64Reference(A_alt))
    assert timed_samples(honest, HostKernel(A_alt), "cold", samples=20) is None


def test_a_kernel_without_atomics_must_repeat_itself_bit_for_bit() -> None:
    """The first launch rounds one way, later ones 2 ulps higher (another summation order would do
    the same): both within the tolerance, not bitwise equal. Without atomics in its compiled code
    that is a nondeterministic kernel; with atomics (whose rounding order may differ) the rerun need
    only pass the tolerance.

    Mutations killed: the bitwise comparison of the rerun dropped, or applied to kernels with atomics."""
    def order_changes(self, x, y) -> None:
        y[...] = self.product(x) * np.float32(1 + 2 ** -22 if self.calls else 1)

    out, _, _ = verify(order_changes)
    assert out.kind is ErrorKind.NONDETERMINISTIC and 0.0 < out.max_scaled_error <= 1.0
    assert out.message == "two runs on the same input differ and the compiled code uses no atomics"
    out, _, _ = verify(order_changes, atomics=True)
    assert out.kind is ErrorKind.NONE


def test_spmm_is_verified_per_column() -> None:
    """k = 4: the honest product passes; one that skips the last column (left NaN) fails."""
    assert verify(k=4)[0].kind is ErrorKind.NONE

    def three_columns(self, x, y) -> None:
        y[:, :3] = self.product(x)[:, :3]

    out, _, _ = verify(three_columns, k=4)
    assert out.kind is ErrorKind.INCORRECT and f"{M} entries never written" in out.message


# -- the buffers ---------------------------------------------------------------------------------


def splitmix_x(seed: int, offset: int, i: int) -> float:
    """x[i] of a timed run, one value at a time in Python integers (the CUDA kernel's arithmetic)."""
    M64 = (1 << 64) - 1
    s = ((seed + offset) * 0x9E3779B97F4A7C15) & M64
    z = (s + i * 0xD1B54A32D192ED03) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 41) / 8388608.0


def test_host_refresh_is_the_cuda_generator() -> None:
    """Values from a Python-integer splitmix64, element by element: on the 2^-23 grid in [0, 1)
    (non-negative: timed runs use ``A_alt``, one sign to a row, so no timed row cancels), spread over
    it, and another offset (repetition) gives other values."""
    seed = 0x7FFF_FFFF_FFFF_FFF1
    got = host_refresh(seed, 3, 500)
    assert got.tolist() == [splitmix_x(seed, 3, i) for i in range(500)]
    assert got.min() >= 0 and got.max() < 1 and np.all(got * 2 ** 23 == np.floor(got * 2 ** 23))
    assert got.min() < 0.01 and got.max() > 0.99
    assert not np.array_equal(got, host_refresh(seed, 4, 500))
    assert got.dtype == np.float32  # what the kernel's x is, so loading it changes no value


def test_the_host_refresh_fills_spmm_buffers_and_poisons_only_when_asked() -> None:
    """SpMM's x is n x k: the host path writes the generator's n*k values in row-major order (as the CUDA
    kernel writes the flat buffer) and poisons y; with ``poison=False`` (the kept repetition's x
    regenerated) y keeps its output. Kills: the flat view of x lost (x reshaped other than -1), y
    poisoned when not asked or not poisoned when asked."""
    io = IOBuffers(M, N, k=3, xp=np)
    seed = np.array([0x1234_5678], dtype=np.uint64)
    io.refresh(seed, 2)
    assert io.x.shape == (N, 3) and io.x.reshape(-1).tolist() == host_refresh(0x1234_5678, 2, N * 3).tolist()
    assert np.isnan(io.y).all() and io.guard_problem() is None
    io.y[...] = 7.0
    io.refresh(seed, 5, poison=False)
    assert (io.y == 7.0).all() and io.x.reshape(-1).tolist() == host_refresh(0x1234_5678, 5, N * 3).tolist()


def test_checked_io_seed_and_what_a_check_leaves() -> None:
    """The seed is one uint64 (the CUDA kernel reads it as ``const unsigned long long*``), a new one per
    sample; a check leaves the last output in y (it regenerates the kept repetition's x without poisoning);
    without a reference no repetition is kept, so marking every one copies nothing. Kills: the seed's dtype
    or size changed, the check's regeneration poisoning y, a repetition kept for an unchecked baseline."""
    A = matrix()
    checked = CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A))
    assert checked.seed.dtype == np.uint64 and checked.seed.shape == (1,)
    seeds = set()
    for _ in range(4):
        checked.new_seed()
        seeds.add(int(checked.seed[0]))
    assert len(seeds) == 4
    checked.choose_snapshot(3)
    for rep in range(3):
        checked.prepare(rep)
        HostKernel(A).run(checked.io.x, checked.io.y)
        checked.mark(rep)
    last = checked.io.y.copy()
    assert checked.check("warm", 2) is None and checked.checked == 2
    assert np.array_equal(checked.io.y, last)
    baseline = CheckedIO(IOBuffers(M, N, xp=np))
    baseline.choose_snapshot(3)
    assert baseline.snapshot_rep is None
    for rep in range(3):
        baseline.prepare(rep)
        baseline.mark(rep)
    assert baseline.check("warm", 2) is None


def test_buffers_start_poisoned_between_guards() -> None:
    """y and every guard hold the one NaN bit pattern; a different NaN written into a guard is found.

    Mutation killed: guards compared as floats (any NaN equals "still NaN") instead of bits."""
    io = IOBuffers(5, 7, xp=np)
    assert (io.yfull.view(np.uint32) == NAN_BITS).all() and (io.xfull.view(np.uint32) == NAN_BITS).all()
    assert io.guard_problem() is None and io.x.shape == (7,) and io.y.shape == (5,)
    io.yfull.view(np.uint32)[GUARD + 5 + 10] = 0x7FC00001  # another NaN, past the end of y
    assert io.guard_problem() == "wrote past the end of y"
    io2 = IOBuffers(5, 7, 3, xp=np)
    assert io2.x.shape == (7, 3) and io2.y.shape == (5, 3)
    io2.xfull[GUARD + 21] = 1.0
    assert io2.guard_problem() == "wrote past the end of x"


# -- timed runs are checked runs ---------------------------------------------------------------


def timed_samples(checked: CheckedIO, kernel: HostKernel, regime: str, samples: int = 4, reps: int = 5,
                  snapshot: int | None = None) -> str | None:
    """Drive CheckedIO the way timing.time_run does on the GPU (prepare, run, mark per repetition;
    check after each sample), with the repetition kept aside set by the test (None: chosen at random)."""
    io = checked.io
    if regime == "cold":  # as time_run's cold regime: no repetition chosen, CheckedIO's own start state
        reps = 1
    else:
        checked.choose_snapshot(reps)
        if snapshot is not None:
            checked.snapshot_rep = snapshot
    for s in range(samples):
        checked.new_seed()
        for rep in range(reps):
            checked.prepare(rep)
            kernel.run(io.x, io.y)
            checked.mark(rep)
        if (msg := checked.check(f"{regime}, sample {s + 1}", reps - 1)) is not None:
            return msg
    return None


def looks_timed(x) -> bool:
    head = np.asarray(x, np.float32).reshape(-1)[:8]
    on_grid = head * 2 ** 23 == np.floor(head * 2 ** 23)
    return bool(head.size == 8 and np.all((head != 0) & (head >= -1) & (head < 1) & on_grid))


@pytest.mark.parametrize("regime", ["cold", "warm"])
def test_timed_runs_of_an_honest_kernel_pass_and_are_all_checked(regime: str) -> None:
    """Cold: every sample's output is checked (4); warm: the last repetition and the kept one (8).
    A kernel that skips rows whose y already holds a number computes every time (y is poisoned
    before every run) and passes the timed runs too: verification's re-run, on a y holding another
    input's output, is what refuses it (``skips_rows_holding_a_number``).

    Mutations killed: the poison skipped in prepare (skips_written leaves the previous x's answer),
    the snapshot's x not regenerated for its own repetition."""
    A = matrix()
    for body in (None, lambda self, x, y: np.copyto(y, self.product(x), where=np.isnan(y))):
        checked = CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A))
        assert timed_samples(checked, HostKernel(A, body), regime) is None
        assert checked.checked == (4 if regime == "cold" else 8)


@pytest.mark.parametrize("regime", ["cold", "warm"])
def test_a_kernel_that_skips_work_when_timed_is_rejected(regime: str) -> None:
    """It recognises the timed runs' inputs (on the 2^-23 grid in [0, 1), which no verification
    input is) and leaves y alone: the output check finds the poison.

    Mutation killed: the timed output not compared with the reference."""
    A = matrix()
    assert not any(looks_timed(x) for _, x in make_inputs((N,), VerifyConfig()))
    lazy = HostKernel(A, lambda self, x, y: None if looks_timed(x) else self.honest(x, y))
    msg = timed_samples(CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A)), lazy, regime)
    assert msg is not None and msg.startswith(f"timed run ({regime}, sample 1): output differs from the reference")
    assert "never written" in msg


def test_a_kernel_that_writes_a_guard_when_timed_is_rejected() -> None:
    A = matrix()
    sly = HostKernel(A, lambda self, x, y: (self.honest(x, y), looks_timed(x) and y.base.__setitem__(GUARD + M, 0)))
    msg = timed_samples(CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A)), sly, "cold")
    assert msg == "timed run (cold, sample 1) wrote past the end of y"


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("regime", ["cold", "warm"])
def test_a_kernel_that_zeroes_x_when_timed_is_judged_on_the_x_it_was_given(regime: str, k: int | None) -> None:
    """It recognises a timed run's input, zeroes x past its first 8 values (which it reads to
    recognise the next one) and answers for the zeroed x: right for what it left in the buffer,
    a fraction of the work on a real matrix. The check writes x again from the run's seed and
    compares with the reference for it, so the answer is wrong. An honest kernel still passes
    after the check's rewrite of x, and a kernel that scribbles on x but answers for the x it was
    given passes too (it gains nothing: x is written again before every run). SpMV and SpMM (k = 3:
    x is n x k, written again whole).

    Mutation killed: the check comparing with the x left in the buffer (no rewrite from the
    seed): cold passed the cheat; warm caught it through the kept repetition, but rejected the
    scribbler's right answer."""
    A = matrix()
    assert not any(looks_timed(x) for _, x in make_inputs((N,), VerifyConfig()))

    def zero_x(self, x, y) -> None:
        if looks_timed(x):
            x.reshape(-1)[8:] = 0.0
        self.honest(x, y)

    def scribble(self, x, y) -> None:
        self.honest(x, y)
        x.reshape(-1)[8:] = 0.0

    msg = timed_samples(CheckedIO(IOBuffers(M, N, k, xp=np), Fp64Reference(A)), HostKernel(A, zero_x), regime)
    assert msg is not None and msg.startswith(f"timed run ({regime}, sample 1"), msg
    assert "output differs from the reference" in msg
    for body in (None, scribble):
        checked = CheckedIO(IOBuffers(M, N, k, xp=np), Fp64Reference(A))
        assert timed_samples(checked, HostKernel(A, body), regime) is None


def test_the_kept_repetition_catches_work_skipped_inside_a_warm_sample() -> None:
    """A kernel that computes only on every 5th launch (it guesses the last repetition of each warm
    sample of 5) and repeats its previous answer otherwise: the last repetition's output is right,
    the kept repetition's is not.

    Mutations killed: ``mark`` not copying the chosen repetition's output, the kept output not
    checked, or checked against the last repetition's x."""
    A = matrix()

    def every_fifth(self, x, y) -> None:
        if self.calls % 5 == 4 or not hasattr(self, "last"):
            self.last = self.product(x)
        y[...] = self.last

    checked = CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A))
    msg = timed_samples(checked, HostKernel(A, every_fifth), "warm", reps=5, snapshot=1)
    assert msg is not None and msg.startswith("timed run (warm, sample 1, repetition 2): output differs")
    honest = CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A))
    assert timed_samples(honest, HostKernel(A), "warm", reps=5, snapshot=1) is None


def test_cusparse_runs_are_prepared_but_not_checked() -> None:
    """Without a reference (the trusted baseline) runs are prepared like the candidate's (fresh x,
    poisoned y) and nothing is compared."""
    io = IOBuffers(M, N, xp=np)
    checked = CheckedIO(io)
    checked.new_seed()
    checked.prepare(0)
    assert np.isnan(io.y).all() and io.x.tolist() == host_refresh(int(checked.seed[0]), 0, N).tolist()
    assert checked.check("cold", 0) is None and checked.checked == 0 and checked.snapshot is None


@pytest.mark.gpu
def test_the_host_refresh_is_what_the_gpu_writes() -> None:
    """The CUDA refresh kernel and :func:`host_refresh` give the same x, bit for bit, for two
    offsets, and the same poison in y (so the host path tests the inputs the GPU times with)."""
    import cupy as cp

    io = IOBuffers(300, 1000, xp=cp)
    seed = cp.asarray([0x1234_5678_9ABC_DEF1], dtype=cp.uint64)
    for offset in (0, 7):
        io.refresh(seed, offset)
        cp.cuda.runtime.deviceSynchronize()
        assert np.array_equal(cp.asnumpy(io.x), host_refresh(0x1234_5678_9ABC_DEF1, offset, 1000))
        assert bool((io.y.view(cp.uint32) == NAN_BITS).all()) and io.guard_problem() is None


def test_the_stale_y_run_is_among_the_first_runs_and_unpredictable() -> None:
    """The cold run before which y keeps the previous run's output is one of runs 2 to 5 (0-based 1-4: every
    timed evaluation makes them, the early stop included), each of them drawn, never the first (no earlier
    output); none with one run. Kills: a fixed choice (one value only), the first run chosen, a run past the
    early stop's five (a slow kernel would never meet it)."""
    from sparserl.harness.buffers import STALE_WITHIN, stale_y_run

    seen = {stale_y_run(41) for _ in range(400)}
    assert seen == set(range(1, STALE_WITHIN)) and STALE_WITHIN == 5
    assert {stale_y_run(2) for _ in range(20)} == {1} and stale_y_run(1) is None
    assert {stale_y_run(3) for _ in range(100)} == {1, 2}


def test_a_kernel_that_rewrites_the_seed_is_judged_on_the_x_it_was_given() -> None:
    """The timed run's seed is device memory a kernel could reach (it lies beside the buffers): a kernel that writes
    a seed of its own there and y for that seed's x (an answer it could have kept from an earlier launch) is
    compared with the reference for the x it was given, since the check writes the seed again from the host's copy
    before it writes x again (cold runs here; a warm sample's check and its kept repetition's go the same way).
    Kills: x written again from the device's seed as the kernel left it (the rule before, which passed the cheat).
    A kernel that writes the seed's own value back stays correct."""
    A_alt = revalued(matrix(), seed=5)
    chosen = 12345
    checked = CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A_alt))

    def rewrites_the_seed(self, x, y):
        checked.seed[0] = chosen
        y[...] = self.product(host_refresh(chosen, 0, N))

    msg = timed_samples(checked, HostKernel(A_alt, rewrites_the_seed), "cold", samples=2)
    assert msg is not None and "output differs from the reference" in msg
    checked = CheckedIO(IOBuffers(M, N, xp=np), Fp64Reference(A_alt))

    def writes_it_back(self, x, y):
        checked.seed[0] = checked.seed_value
        y[...] = self.product(x)

    assert timed_samples(checked, HostKernel(A_alt, writes_it_back), "cold", samples=2) is None
