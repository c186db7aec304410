"""The token-budget split of one SFT step into micro-batches (pure)."""

from __future__ import annotations

import pytest

from sparserl.train.microbatch import split_by_tokens


def _padded(groups, lengths):
    return [len(g) * max(lengths[i] for i in g) for g in groups]


@pytest.mark.parametrize("lengths, budget", [
    ([100, 3000, 250, 6000, 400, 800, 50, 2000], 8192),
    ([512] * 16, 2048),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 10),
    ([7000], 4096),
])
def test_every_row_once_and_each_group_within_the_budget(lengths, budget) -> None:
    """Kills: a row dropped or repeated at a group boundary, the budget compared with the sum of the
    lengths instead of rows x the longest (padding), the new row's length left out of the check."""
    groups = split_by_tokens(lengths, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g, padded in zip(groups, _padded(groups, lengths)):
        assert padded <= budget or len(g) == 1  # only a row longer than the budget goes over, alone


def test_groups_are_as_full_as_the_budget_allows() -> None:
    """Shortest rows first: 16 rows of 512 at 2048 are 4 groups of 4 (not 16 of 1); a row over the
    budget is a group of its own and the rest still share. Kills: a split after every row, a long row
    that drags its neighbours into single groups."""
    assert [len(g) for g in split_by_tokens([512] * 16, 2048)] == [4, 4, 4, 4]
    groups = split_by_tokens([100, 100, 9000, 100], 1000)
    assert groups == [[0, 1, 3], [2]]


def test_no_budget_is_one_group_in_order_and_a_bad_budget_is_refused() -> None:
    assert split_by_tokens([5, 1, 3], None) == [[0, 1, 2]]
    assert split_by_tokens([], 100) == [] and split_by_tokens([], None) == []
    with pytest.raises(ValueError):
        split_by_tokens([1], 0)
