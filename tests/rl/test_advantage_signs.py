"""Advantages after the leave-one-out baseline keep the sign of the baseline's verdict: a completion
that scored above the other samples of its matrix is pushed up on every one of its tokens, whatever
the lengths and scores of the rest of the batch. Checked against a slow loop version of the
baseline and of the scaling, across random batches (hypothesis)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sparserl.rl.config import RLConfig  # noqa: E402
from sparserl.rl.rollout import RolloutBatch  # noqa: E402
from sparserl.rl.update import advantages  # noqa: E402

FLOOR = 0.1


def slow_loo(scores: list[float], valid: list[bool], group: int) -> list[float]:
    """Each valid sample's score minus the mean of the other valid samples of its group (0 when it
    is invalid or has no valid other), one sample at a time."""
    out = []
    for i, s in enumerate(scores):
        g0 = i - i % group
        others = [scores[j] for j in range(g0, g0 + group) if j != i and valid[j]]
        # exact arithmetic: the mean of equal scores is the score itself, so the verdict's sign is exact too
        out.append(float(Fraction(s) - sum(map(Fraction, others)) / len(others)) if valid[i] and others else 0.0)
    return out


def slow_scale(per_token: list[list[float]], floor: float) -> float:
    """max(sqrt(unbiased variance + 1e-8), floor) over all tokens, one token at a time."""
    flat = [v for row in per_token for v in row]
    mean = math.fsum(flat) / max(len(flat), 1)
    var = math.fsum((v - mean) ** 2 for v in flat) / max(len(flat) - 1, 1)
    return max(math.sqrt(var + 1e-8), floor)


def make_batch(scores: list[float], lengths: list[int], valid: list[bool]) -> RolloutBatch:
    B, T = len(scores), max(max(lengths), 1)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b, n in enumerate(lengths):
        if valid[b]:
            mask[b, :n] = 1
    z = torch.zeros(B, T, dtype=torch.float64)
    return RolloutBatch([None] * B, [""] * B, torch.zeros(B, T, dtype=torch.long), mask, z, z, None,
                        torch.tensor(scores, dtype=torch.float64), [], valid=torch.tensor(valid))


@st.composite
def batches(draw):
    group = draw(st.integers(2, 4))
    n = group * draw(st.integers(1, 4))
    scores = draw(st.lists(st.sampled_from([-4.0, -3.5, -1.0, -0.25, 0.0, 0.1, 0.5, 1.0, 2.0, 3.0]),
                           min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    valid = draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(any))
    return group, scores, lengths, valid


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
@settings(max_examples=60, deadline=None)
@given(case=batches())
def test_whitened_advantages_keep_the_leave_one_out_sign(algo: str, case) -> None:
    """Every token's advantage equals its completion's leave-one-out score over the batch's token
    std (never below the floor): same sign, same order within a group.

    Mutation killed: re-centring on the token-weighted batch mean after the baseline
    (``core.masked_whiten`` in ``update.advantages``, the earlier code) flips the small advantages
    of one group when long completions of another carry large ones (e.g. 40 tokens at +3 against
    1 token at +0.1 and 1 at -0.1)."""
    group, scores, lengths, valid = case
    cfg = RLConfig(algo=algo, samples_per_matrix=group, grpo_baseline="loo", whiten_advantages=True,
                   adv_std_floor=FLOOR)
    adv, _ = advantages(cfg, make_batch(scores, lengths, valid))
    loo = slow_loo(scores, valid, group)
    tokens = [[loo[b]] * lengths[b] for b in range(len(scores)) if valid[b]]
    scale = slow_scale(tokens, FLOOR)
    for b, n in enumerate(lengths):
        row = adv[b].tolist()
        if not valid[b]:
            assert all(v == 0.0 for v in row)
            continue
        for v in row[:n]:
            assert (v > 0) == (loo[b] > 0) and (v < 0) == (loo[b] < 0), (b, v, loo[b])
            assert v == pytest.approx(loo[b] / scale, rel=1e-9, abs=1e-12)
        assert all(v == 0.0 for v in row[n:])


def test_a_known_sign_flip_of_the_old_whitening_is_gone() -> None:
    """The hand-made case behind the property: group 1 (+0.1 vs -0.1 after the baseline) has short
    completions, group 2 (+3 vs -3) a long winner. The token-weighted mean is +2.8, so re-centring
    made group 1's winner negative; scaling alone keeps it positive.

    Mutation killed: ``core.masked_whiten`` in place of ``core.masked_scale`` in ``update.advantages``."""
    scores = [0.1, -0.1, 3.0, -3.0]  # loo: +0.2, -0.2, +6, -6
    lengths = [1, 1, 40, 1]
    cfg = RLConfig(algo="ppo", samples_per_matrix=2, whiten_advantages=True, adv_std_floor=FLOOR)
    adv, _ = advantages(cfg, make_batch(scores, lengths, [True] * 4))
    assert float(adv[0, 0]) > 0 > float(adv[1, 0])
    assert float(adv[2, :40].min()) > 0 > float(adv[3, 0])


def test_the_textbook_score_is_still_centred_on_the_batch() -> None:
    """PPO with score_baseline 'none' has no group baseline: whitening keeps centring it (the batch
    mean is its only baseline), so advantages over the masked tokens have mean 0.

    Mutation killed: scaling without centring on this path too (all-negative rewards, as a batch of
    failed compiles gives, would push every completion down)."""
    scores = [-3.5, -4.0, -3.5, -2.0]
    cfg = RLConfig(algo="ppo", score_baseline="none", critic=True, samples_per_matrix=2, whiten_advantages=True)
    batch = make_batch(scores, [3, 5, 2, 4], [True] * 4)
    batch = RolloutBatch(batch.samples, batch.texts, batch.response, batch.mask, batch.old_logp, batch.ref_logp,
                         torch.zeros_like(batch.mask), batch.scores, [], valid=batch.valid)
    adv, _ = advantages(cfg, batch)
    m = batch.mask.bool()
    assert abs(float(adv[m].mean())) < 1e-9 and float(adv[m].max()) > 0


def _scored(scores: list[float]):
    from types import SimpleNamespace

    return SimpleNamespace(scores=torch.tensor(scores), valid_mask=torch.ones(len(scores), dtype=torch.bool))


def test_grpo_normalises_each_matrix_s_group_on_its_own() -> None:
    """GRPO's 'mean_std' (the default config's baseline) through ``group_scores``: an easy matrix's [3, 2] and a
    hard one's [-2, -3] give the same advantages, so "this matrix is hard" never reads as "this kernel is bad".
    Mutation killed: one whitening over the whole batch instead of per group (a review found it survived)."""
    from sparserl.rl.update import group_scores

    a = group_scores(RLConfig(algo="grpo", samples_per_matrix=2, device="cpu"), _scored([3.0, 2.0, -2.0, -3.0]))
    assert a[0] > 0 > a[1] and a[2] > 0 > a[3]
    assert torch.allclose(a[:2], a[2:])


def test_grpo_keeps_its_std_floor_for_a_group_that_differs_by_jitter() -> None:
    """Two samples 0.01 apart in log2 speed (timing jitter) stay under 0.1 in advantage: the group's std is
    floored at ``adv_std_floor`` (0.1). Mutation killed: the floor not passed to ``core.grpo_advantages``
    (the jitter then becomes advantages of +-0.7)."""
    from sparserl.rl.update import group_scores

    cfg = RLConfig(algo="grpo", samples_per_matrix=2, device="cpu")
    assert cfg.adv_std_floor == FLOOR
    a = group_scores(cfg, _scored([1.0, 1.01, 0.0, 0.0]))
    assert float(a.abs().max()) < 0.1 and float(a[1]) > 0
