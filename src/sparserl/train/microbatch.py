"""Micro-batches under a token budget: one optimizer step's rows split so that no forward pass holds
more padded tokens than the budget (activations grow with rows x longest row; a refinement row with
a parent kernel in its prompt is several thousand tokens).

The split is a pure function of the rows' lengths; the caller sums each micro-batch's loss over the
whole step's target tokens, so the gradient is the one of the full batch.
"""

from __future__ import annotations


def split_by_tokens(lengths: list[int], budget: int | None) -> list[list[int]]:
    """Indices of the rows in groups whose padded size (rows x the group's longest) is at most
    ``budget``; rows taken shortest first, so a group pads little. A row longer than the budget is a
    group of its own. ``budget`` None: one group, in the given order."""
    if budget is None:
        return [list(range(len(lengths)))] if lengths else []
    if budget < 1:
        raise ValueError(f"the token budget must be >= 1, got {budget}")
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        wide = max(longest, lengths[i])
        if cur and wide * (len(cur) + 1) > budget:
            groups.append(cur)
            cur, wide = [], lengths[i]
        cur.append(i)
        longest = wide
    if cur:
        groups.append(cur)
    return groups
