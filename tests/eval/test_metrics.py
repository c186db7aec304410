"""Metrics against brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from sparserl.eval.metrics import fast_p, geomean, kept_speedup, mean_pass_at_k, pass_at_k, speedup_at_1


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            outcomes = [1] * c + [0] * (n - c)
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
            assert math.isclose(pass_at_k(n, c, k), brute, abs_tol=1e-12), (n, c, k)


def test_pass_at_k_edges() -> None:
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0 and pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert mean_pass_at_k([(4, 1), (4, 3)], 1) == pytest.approx(0.5)
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_fast_p_and_geomean() -> None:
    sp = [2.0, 1.1, None, 0.9, 1.6]
    assert fast_p(sp, 1.0) == pytest.approx(3 / 5)
    assert fast_p(sp, 1.5) == pytest.approx(2 / 5)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(geomean([])) and math.isnan(fast_p([], 1.0))
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])


def test_speedup_at_1_is_the_expected_single_sample() -> None:
    # problem 1: samples 4x and 1x (geomean 2); problem 2: 8x and an incorrect sample (counts 1: geomean sqrt 8)
    got = speedup_at_1([[4.0, 1.0], [8.0, None]])
    assert got == pytest.approx(math.sqrt(2 * math.sqrt(8)))
    # drawing one sample uniformly per problem: the mean log over all draws is the same
    draws = [math.log(a) + math.log(b) for a in (4.0, 1.0) for b in (8.0, 1.0)]
    assert math.log(got) == pytest.approx(sum(draws) / len(draws) / 2)
    # a correct sample slower than cuSPARSE is worth what the user keeps: cuSPARSE, 1.0
    assert speedup_at_1([[2.0], [0.5]]) == pytest.approx(math.sqrt(2.0))
    with pytest.raises(ValueError):
        speedup_at_1([[2.0], []])


def test_an_incorrect_sample_never_beats_a_correct_one() -> None:
    """A correct 0.5x sample and an incorrect one: the correct one is worth at least as much.

    Mutation killed: counting a correct sample at its raw speed below 1.0 while an incorrect one
    counts 1.0 (the earlier definition scored [[0.5]] at 0.5 and [[None]] at 1.0)."""
    assert kept_speedup(0.5) == 1.0 and kept_speedup(None) == 1.0 and kept_speedup(3.0) == 3.0
    assert speedup_at_1([[0.5]]) >= speedup_at_1([[None]])
    assert speedup_at_1([[0.5, 4.0]]) >= speedup_at_1([[None, 4.0]])


speeds = st.one_of(st.none(), st.floats(0.01, 100.0))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(speeds, min_size=1, max_size=6), min_size=1, max_size=5), st.data())
def test_speedup_at_1_is_monotone_in_correctness(samples, data) -> None:
    """Turning any incorrect sample into a correct one, at any speed, never lowers speedup@1; and the
    value is the brute-force mean over every way of drawing one sample per problem of the log of
    what the user keeps (max(speedup, 1), or 1 for an incorrect sample), exponentiated."""
    p = data.draw(st.integers(0, len(samples) - 1))
    i = data.draw(st.integers(0, len(samples[p]) - 1))
    s = data.draw(st.floats(0.01, 100.0))
    before = [list(x) for x in samples]
    before[p][i] = None
    after = [list(x) for x in before]
    after[p][i] = s
    assert speedup_at_1(after) >= speedup_at_1(before) * (1 - 1e-12)
    logs = [[math.log(v) if v is not None and v > 1 else 0.0 for v in prob] for prob in samples]
    draws = [math.fsum(c) / len(c) for c in itertools.product(*logs)]
    assert speedup_at_1(samples) == pytest.approx(math.exp(math.fsum(draws) / len(draws)), rel=1e-9)


def test_edges_and_messages() -> None:
    """fast_p counts strictly faster than p; an empty set of problems is nan for the means; every
    refusal says why, in full. Mutations killed: ``s > p`` made ``>=``, the empty case dropped, the
    zero check of geomean made ``< 0`` (log(0) then raised a bare math error), messages lost."""
    assert fast_p([1.2, 1.2000001, None], 1.2) == pytest.approx(1 / 3)
    assert math.isnan(mean_pass_at_k([], 1))
    cases = [(lambda: geomean([2.0, 0.0]), "geometric mean needs positive values"),
             (lambda: pass_at_k(3, 4, 1), "need 0 <= c <= n and k >= 1, got n=3, c=4, k=1"),
             (lambda: pass_at_k(3, 1, 4), "k=4 is larger than the n=3 samples drawn"),
             (lambda: speedup_at_1([[2.0], []]), "a problem with no samples")]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == message
