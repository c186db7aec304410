"""Metrics against brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import pytest

from sparserl.eval.metrics import fast_p, geomean, mean_pass_at_k, pass_at_k, speedup_at_1


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
    assert speedup_at_1([[2.0], [0.5]]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        speedup_at_1([[2.0], []])
