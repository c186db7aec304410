"""Which correct library variants become SFT targets (pure; no GPU)."""

import numpy as np
import pytest

from sparserl.data.sft_build import SFTDataConfig, pick_targets
from sparserl.errors import SparseRLError

TIMES = [10.0, 30.0, 10.5, 12.0, 10.9, 50.0]  # near 10.0 within 1.10: indices 0, 2, 4


def rng():
    return np.random.default_rng(0)


def test_fastest_is_in_time_order():
    assert pick_targets(TIMES, 6, "fastest", 3, rng()) == [0, 2, 4]
    assert pick_targets(TIMES, 6, "fastest", 10, rng()) == [0, 2, 4, 3, 1, 5]


def test_near_fastest_draws_only_within_the_ratio_and_fills_n():
    for seed in range(20):
        picks = pick_targets(TIMES, 6, "near_fastest", 6, np.random.default_rng(seed), ratio=1.10)
        assert len(picks) == 6
        assert set(picks) == {0, 2, 4}  # every candidate appears; nothing slower ever does
        assert picks[:3] == picks[3:]  # filled by repeating one shuffled order
    assert pick_targets(TIMES, 6, "near_fastest", 4, rng(), ratio=1.25) and \
        set(pick_targets(TIMES, 6, "near_fastest", 8, rng(), ratio=1.25)) == {0, 2, 3, 4}
    # one clear winner: every row is it
    assert pick_targets([1.0, 5.0, 9.0], 3, "near_fastest", 4, rng()) == [0, 0, 0, 0]


def test_near_fastest_shuffles_between_ties():
    firsts = {pick_targets(TIMES, 6, "near_fastest", 1, np.random.default_rng(s))[0] for s in range(30)}
    assert firsts == {0, 2, 4}


def test_correct_and_no_times_draw_distinct_variants():
    for target in ("correct", "fastest", "near_fastest"):
        picks = pick_targets(None, 5, target, 3, rng())  # compile-only: no times, random distinct
        assert len(picks) == 3 and len(set(picks)) == 3 and all(0 <= i < 5 for i in picks)
    picks = pick_targets(TIMES, 6, "correct", 6, rng())
    assert sorted(picks) == list(range(6))


def test_edge_cases_and_bad_input():
    assert pick_targets([], 0, "near_fastest", 3, rng()) == []
    assert pick_targets(TIMES, 6, "near_fastest", 0, rng()) == []
    with pytest.raises(SparseRLError, match="times for"):
        pick_targets([1.0], 2, "fastest", 1, rng())
    with pytest.raises(SparseRLError, match="target must be"):
        pick_targets(TIMES, 6, "slowest", 1, rng())
    with pytest.raises(SparseRLError, match="--near-fastest-ratio"):
        SFTDataConfig(near_fastest_ratio=0.9)
    with pytest.raises(SparseRLError, match="target must be"):
        SFTDataConfig(target="slowest")
