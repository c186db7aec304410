"""The RL maths (rl/core.py) at its edges: defaults, dtypes kept, bounds inclusive or not, one or
no valid token, degenerate groups; each value hand-derived or from a slow loop. These tests were
written against the mutants that survived the loop tests (scripts/mutation.py, docs/testing.md);
each docstring names the mutation it kills."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sparserl.rl.core import (  # noqa: E402
    KL_LOSS_CLAMP,
    AdaptiveKL,
    covariance_top_mask,
    explained_variance,
    gae,
    grpo_advantages,
    kl_loss_terms,
    kl_penalty,
    loo_centred,
    masked_mean,
    masked_scale,
    masked_var,
    masked_whiten,
    max_k_advantages,
    max_k_estimate,
    max_k_weights,
    policy_loss,
    token_rewards,
    top_share_mask,
    uniform_groups,
    value_loss,
)

F64 = torch.float64


def test_defaults_are_the_documented_ones() -> None:
    """gae's gamma = lam = 1, the PPO clips 0.2, the KL loss k2, masked_scale without a floor,
    AdaptiveKL's horizon 10 000. Mutations killed: any of these defaults changed."""
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 6, generator=g, dtype=F64), torch.randn(3, 6, generator=g, dtype=F64)
    mask = torch.ones(3, 6, dtype=F64)
    for a, b in zip(gae(r, v, mask), gae(r, v, mask, 1.0, 1.0)):
        assert torch.equal(a, b)
    logp = torch.tensor([[0.0, -1.0, 0.5]], dtype=F64)
    old = torch.tensor([[-1.0, -1.0, 0.0]], dtype=F64)  # ratios e, 1, e^0.5: two past 1.2
    adv = torch.tensor([[1.0, -1.0, 1.0]], dtype=F64)
    m = torch.ones(1, 3, dtype=F64)
    assert torch.equal(policy_loss(logp, old, adv, m).loss, policy_loss(logp, old, adv, m, clip=0.2).loss)
    assert float(policy_loss(logp, old, adv, m).clipfrac) == pytest.approx(2 / 3)
    vals, oldv, ret = (torch.tensor([[x]], dtype=F64) for x in (1.0, 0.0, 2.0))
    assert float(value_loss(vals, oldv, ret, torch.ones(1, 1))[0]) == pytest.approx(0.5 * (0.2 - 2.0) ** 2)
    assert torch.equal(kl_loss_terms(logp, old), 0.5 * (logp - old) ** 2)
    x = torch.tensor([[0.001, -0.002, 0.003]], dtype=F64)
    sd = float(x.std())
    assert masked_scale(x, m)[0].tolist() == pytest.approx((x[0] / math.sqrt(sd ** 2 + 1e-8)).tolist(), rel=1e-12)
    assert AdaptiveKL(1.0, target=1.0).update(2.0, 100) == pytest.approx(1.0 + 0.2 * 100 / 10_000, rel=1e-15)


def test_adaptive_kl_steps_are_exact() -> None:
    """value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon, by hand.
    Mutations killed: either clip bound moved, n / horizon inverted or multiplied."""
    up = AdaptiveKL(0.5, target=2.0, horizon=1000)
    assert up.update(6.0, 50) == pytest.approx(0.5 * (1 + 0.2 * 50 / 1000), rel=1e-15)  # kl/target - 1 = 2
    down = AdaptiveKL(0.5, target=2.0, horizon=1000)
    assert down.update(0.2, 50) == pytest.approx(0.5 * (1 - 0.2 * 50 / 1000), rel=1e-15)  # -0.9, clipped
    mid = AdaptiveKL(0.5, target=2.0, horizon=1000)
    assert mid.update(2.2, 50) == pytest.approx(0.5 * (1 + 0.1 * 50 / 1000), rel=1e-12)  # inside the band


def test_dtypes_follow_the_inputs() -> None:
    """float32 scores give float32 advantages (the internals run in float64); masks come back in the
    mask's dtype; a float64 critic gets a float64 clip fraction. Mutations killed: a final
    ``.to(scores.dtype)`` or ``.to(mask.dtype)`` dropped, the zero clip fraction made float32."""
    s = torch.tensor([1.0, 0.0, 2.0, 5.0])
    assert grpo_advantages(s, 2).dtype == torch.float32 and loo_centred(s, 2).dtype == torch.float32
    mask = torch.ones(2, 4, dtype=F64)
    scores = torch.arange(8, dtype=F64).reshape(2, 4)
    assert top_share_mask(scores, mask, 0.5).dtype == F64
    assert covariance_top_mask(scores, scores, mask, 0.5).dtype == F64
    v = torch.zeros(2, 4, dtype=F64)
    assert value_loss(v, v, v, mask, clip=None)[1].dtype == F64


def test_value_loss_uses_the_fixed_denominator_when_clipped() -> None:
    """sum of the larger squared error over the mask / denom, here 0.5 * (4 + 4) / 10.
    Mutation killed: ``denom`` dropped on the clipped path (the masked mean, 0.5 * 8 / 2)."""
    v, old, ret = torch.tensor([[0.0, 0.0]], dtype=F64), torch.zeros(1, 2, dtype=F64), torch.full((1, 2), 2.0, dtype=F64)
    loss, _ = value_loss(v, old, ret, torch.ones(1, 2), clip=0.2, denom=10.0)
    assert float(loss) == pytest.approx(0.5 * 8 / 10)


def test_masked_whiten_against_a_slow_loop() -> None:
    """(x - mean) / max(sqrt(var + eps), floor), by hand in float64, on a nearly uniform batch where
    eps and the floor decide: both the unfloored and the floored results to 1e-12.
    Mutations killed: ``var - eps``, the floor built in float32 (0.1 as 0.100000001)."""
    x = torch.tensor([[1.0, 1.0 + 1e-4, 1.0 - 1e-4, 1.0]], dtype=F64)
    mask = torch.ones(1, 4, dtype=F64)
    vals = [float(t) for t in x[0]]
    mean = math.fsum(vals) / 4
    var = math.fsum((t - mean) ** 2 for t in vals) / 3
    for floor in (0.0, 0.1):
        want = [(t - mean) / max(math.sqrt(var + 1e-8), floor) for t in vals]
        assert masked_whiten(x, mask, min_std=floor)[0].tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_grpo_groups_of_two_and_unscaled() -> None:
    """A group of 2 is scaled by its std with n - 1 = 1 (|a - b| / sqrt(2) each side); a group of 4 with
    exactly 2 valid samples likewise, and keeps them; ``scale=False`` only centres.
    Mutations killed: ``group_size > 1`` made ``> 2`` or ``scale and`` made ``or``, the n - 1 clamp
    raised to 2, the ``n >= 2`` keep made ``> 2`` or ``>= 3``."""
    s = torch.tensor([3.0, 1.0], dtype=F64)
    sd = math.sqrt(2.0)  # std of (3, 1) with n - 1 = 1
    assert grpo_advantages(s, 2).tolist() == pytest.approx([1 / (sd + 1e-6), -1 / (sd + 1e-6)], rel=1e-12)
    four = torch.tensor([3.0, 9.0, 1.0, 9.0], dtype=F64)
    valid = torch.tensor([True, False, True, False])
    got = grpo_advantages(four, 4, valid=valid)
    assert got.tolist() == pytest.approx([1 / (sd + 1e-6), 0.0, -1 / (sd + 1e-6), 0.0], rel=1e-12)
    assert grpo_advantages(torch.tensor([3.0, 1.0, 0.0, 4.0], dtype=F64), 4, scale=False).tolist() == \
        pytest.approx([1.0, -1.0, -2.0, 2.0])


def test_grpo_groups_of_one_carry_no_advantage() -> None:
    """group_size 1 (one sample per matrix): each sample is its own group's mean, so its advantage is
    exactly 0, scaled or not, valid or not: a lone sample has no one to be better than.
    Mutation killed: the group mean's count clamped to at least 2 (``n.clamp(min=2)``), which gave a
    lone sample half its score as advantage."""
    s = torch.tensor([3.0, -1.5, 0.25], dtype=F64)
    for scale in (True, False):
        assert grpo_advantages(s, 1, scale=scale).tolist() == [0.0, 0.0, 0.0]
        assert grpo_advantages(s, 1, scale=scale, valid=torch.tensor([True, False, True])).tolist() == [0.0] * 3


def test_loo_with_single_sample_groups_and_invalid_samples() -> None:
    """group_size 1: the raw score, 0 for an invalid sample (not inf, not the score).
    Mutations killed: the valid mask ignored, or divided by instead of multiplied."""
    s = torch.tensor([2.0, -1.0, 4.0])
    got = loo_centred(s, 1, torch.tensor([True, False, True]))
    assert got.tolist() == [2.0, 0.0, 4.0]


def test_kl_loss_terms_exact_and_clamped_both_ways() -> None:
    """k2 = 0.5 (logp - ref)^2; k3 = e^-d - 1 + d with d clamped to +-3 on both sides, d = logp - ref
    with a nonzero reference. Mutations killed: ``logp + ref``, the upper clamp dropped, the default
    kind garbled, the error message lost."""
    logp = torch.tensor([-1.0, 4.0, -6.0], dtype=F64)
    ref = torch.tensor([-2.0, -1.0, -1.0], dtype=F64)  # d = 1, 5, -5
    assert kl_loss_terms(logp, ref).tolist() == pytest.approx([0.5, 12.5, 12.5])
    c = KL_LOSS_CLAMP
    want = [math.exp(-1) - 1 + 1, math.exp(-c) - 1 + c, math.exp(c) - 1 - c]
    assert kl_loss_terms(logp, ref, "k3").tolist() == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError) as e:
        kl_loss_terms(logp, ref, "k1")
    assert str(e.value) == "unknown KL loss 'k1' (k2, k3)"


def test_max_k_estimate_per_group() -> None:
    """Rewards of shape (groups, n): one estimate per group, along the last dim (k = 1: the mean).
    Mutation killed: the sum taken over every dim."""
    r = torch.tensor([[1.0, 3.0], [0.0, 10.0]], dtype=F64)
    assert max_k_estimate(r, 1).tolist() == pytest.approx([2.0, 5.0])
    assert max_k_estimate(r, 2).tolist() == pytest.approx([3.0, 10.0])


def test_token_rewards_leave_an_empty_row_alone() -> None:
    """A completion with no response token (an infrastructure failure) gets no score anywhere.
    Mutations killed: ``mask.sum(1) > 0`` made ``>= 0`` or taken over all dims."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    r = token_rewards(torch.tensor([5.0, 7.0]), torch.zeros(2, 3), mask, 0.1)
    assert r.tolist() == [[0.0, 5.0, 0.0], [0.0, 0.0, 0.0]]


def test_uniform_groups_at_the_tolerance_and_with_invalid_members() -> None:
    """Equal valid members are uniform whatever an invalid member holds; a spread of exactly ``tol``
    is uniform, a bit more is not. Mutations killed: the invalid fill +inf for the max, ``<=`` made
    ``<``."""
    s = torch.tensor([2.0, 2.0, 100.0, 0.0, 0.5, 0.0])
    valid = torch.tensor([True, True, False, True, True, True])
    assert uniform_groups(s, 3, valid, tol=0.5).tolist() == [True, True]
    assert uniform_groups(s, 3, valid, tol=0.49).tolist() == [True, False]


def test_share_bounds_and_messages() -> None:
    """top_share_mask: share in (0, 1], 1 is the mask itself; covariance_top_mask the same bounds,
    at least one token, exactly one when only one is masked, none when none is.
    Mutations killed: a bound made inclusive or exclusive, ``max(1, ...)`` made 2, the mask value 2,
    ``n == 0`` made ``n == 1``, the messages lost."""
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0]])
    scores = torch.tensor([[0.1, 0.5, 0.2, 0.9, 0.3]])
    assert torch.equal(top_share_mask(scores, mask, 1.0), mask)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError) as e:
            top_share_mask(scores, mask, bad)
        assert str(e.value) == f"share must be in (0, 1], got {bad}"
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5, -3.0]])
    one = covariance_top_mask(scores, adv, mask, 0.01)  # round(0.05) = 0: still one token
    assert one.sum() == 1 and one.max() == 1
    assert torch.equal(covariance_top_mask(scores, adv, mask, 1.0), mask)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError) as e:
            covariance_top_mask(scores, adv, mask, bad)
        assert str(e.value) == f"share must be in (0, 1], got {bad}"
    single = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
    assert covariance_top_mask(scores, adv, single, 0.2).tolist() == single.tolist()
    assert float(covariance_top_mask(scores, adv, torch.zeros(1, 5), 0.2).abs().sum()) == 0.0


def test_masked_scale_floor_is_exact_in_float64() -> None:
    """A nearly uniform float64 batch scaled by the floor 0.1 itself, not 0.1 rounded to float32.
    Mutation killed: the floor tensor built without the input's dtype."""
    x = torch.tensor([[0.01, -0.01, 0.02]], dtype=F64)
    assert masked_scale(x, torch.ones(1, 3), min_std=0.1)[0].tolist() == pytest.approx([0.1, -0.1, 0.2], rel=1e-14)


def test_masked_mean_along_a_dim_against_a_slow_loop() -> None:
    """``masked_mean(x, mask, dim=1)``: each row's mean over its masked entries, by a slow loop; a row
    with one entry is that entry, an empty row 0 (not nan).
    Mutations killed: the ``dim is None`` test inverted, the row sums taken over everything
    (``sum(None)``), ``x / mask``, the division made a product, the count clamped to 2 or not at all."""
    x = torch.tensor([[1.0, 2.0, 4.0, 8.0], [3.0, -5.0, 7.0, 0.5], [9.0, 9.0, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    want = []
    for row, m in zip(x.tolist(), mask.tolist()):
        kept = [v for v, keep in zip(row, m) if keep]
        want.append(math.fsum(kept) / len(kept) if kept else 0.0)
    assert masked_mean(x, mask, dim=1).tolist() == want == [13.0 / 3.0, -5.0, 0.0]
    assert float(masked_mean(x, mask)) == pytest.approx((1 + 4 + 8 - 5) / 4, rel=1e-15)


def test_masked_var_of_two_entries_divides_by_one() -> None:
    """The unbiased variance of two masked entries a, b is (a - b)^2 / 2 (n - 1 = 1); padding is ignored.
    Mutation killed: ``(n - 1).clamp(min=2)`` (which halves it)."""
    x = torch.tensor([[3.0, 99.0, 1.0]], dtype=F64)
    assert float(masked_var(x, torch.tensor([[1.0, 0.0, 1.0]], dtype=F64))) == 2.0


def test_explained_variance_by_hand() -> None:
    """1 - Var(R - V) / Var(R) with Var(R) = 0.5 (below 1, so a wrong clamp shows) and, for constant
    returns (Var(R) = 0), the 1e-8 floor in the denominator.
    Mutations killed: the ratio made a product, the floor 1e-8 raised (to 1.00000001)."""
    mask = torch.ones(1, 2, dtype=F64)
    R = torch.tensor([[1.0, 2.0]], dtype=F64)  # Var = 0.5
    V = torch.tensor([[1.5, 1.5]], dtype=F64)  # R - V = (-0.5, 0.5): Var = 0.5
    assert float(explained_variance(V, R, mask)) == 0.0
    V2 = torch.tensor([[1.0, 1.5]], dtype=F64)  # R - V = (0, 0.5): Var = 0.125
    assert float(explained_variance(V2, R, mask)) == 1.0 - 0.125 / 0.5
    flat = torch.tensor([[2.0, 2.0]], dtype=F64)
    assert float(explained_variance(V2, flat, mask)) == pytest.approx(1.0 - 0.125 / 1e-8, rel=1e-12)


def test_kl_penalty_default_abs_and_message() -> None:
    """k1 (log p - log q) is the default; ``abs`` is |log p - log q|; an unknown kind names the known ones.
    Mutations killed: the default or the ``abs`` name changed, the message lost."""
    logp = torch.tensor([[-1.0, -0.25, -2.0]], dtype=F64)
    ref = torch.tensor([[-0.5, -1.0, -2.0]], dtype=F64)
    assert kl_penalty(logp, ref).tolist() == [[-0.5, 0.75, 0.0]]
    assert kl_penalty(logp, ref, "abs").tolist() == [[0.5, 0.75, 0.0]]
    with pytest.raises(ValueError) as e:
        kl_penalty(logp, ref, "k9")
    assert str(e.value) == "unknown KL estimator 'k9' (k1, k2, k3, abs)"


def test_group_helpers_say_what_is_wrong() -> None:
    """Scores that do not split into groups, and a max@k with k = 0 or k > n, are refused with what was given.
    Mutations killed: any of the three messages lost."""
    with pytest.raises(ValueError) as e:
        loo_centred(torch.zeros(5), 2)
    assert str(e.value) == "5 scores do not split into groups of 2"
    with pytest.raises(ValueError) as e:
        max_k_advantages(torch.zeros(4), 2, 0)
    assert str(e.value) == "k must be >= 1, got 0"
    with pytest.raises(ValueError) as e:
        max_k_weights(torch.zeros(1, 3), 4)
    assert str(e.value) == "need 1 <= k <= n, got k=4, n=3"


def test_group_maths_runs_in_float64_for_float32_scores() -> None:
    """float32 scores are worked in float64 and only the result is rounded back: with a reward of 2^24
    beside small ones, a float32 sum loses the small ones (the others' mean of the 1.0 sample would be
    8388607.5, not 2^23). max@k weights and advantages come back in float32, equal to the float64
    results rounded; max@k advantages of groups of one are 0, in the scores' dtype.
    Mutations killed: ``_groups`` without ``.to(torch.float64)``, a final ``.to(dtype)`` dropped (full
    or ragged groups, weights), ``zeros_like(None)`` for groups of one."""
    s = torch.tensor([2.0 ** 24, 1.0, 0.0])
    assert loo_centred(s, 3).tolist() == [2.0 ** 24, 1.0 - 2.0 ** 23, -(2.0 ** 23)]
    r = torch.tensor([[2.0 ** 24, 1.0, 3.0, 0.5]])
    w = max_k_weights(r, 2)
    assert w.dtype == torch.float32 and torch.equal(w, max_k_weights(r.double(), 2).float())
    adv = max_k_advantages(torch.tensor([2.0 ** 24, 1.0, 3.0, 0.5]), 4, 2)
    assert adv.dtype == torch.float32
    assert torch.equal(adv, max_k_advantages(torch.tensor([2.0 ** 24, 1.0, 3.0, 0.5], dtype=F64), 4, 2).float())
    one = max_k_advantages(torch.tensor([1.0, 5.0]), 1, 1)
    assert one.dtype == torch.float32 and one.tolist() == [0.0, 0.0]
    ragged = max_k_advantages(torch.tensor([3.0, 1.0, 2.0, 0.0]), 4, 2, torch.tensor([True, True, False, True]))
    assert ragged.dtype == torch.float32 and ragged[2] == 0.0
