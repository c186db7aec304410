"""PPO/GRPO maths against slow reference loops, across seeds and ragged masks."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sparserl.rl.core import (  # noqa: E402
    AdaptiveKL,
    entropy_from_logits,
    explained_variance,
    gae,
    grpo_advantages,
    kl_penalty,
    loo_centred,
    masked_mean,
    masked_whiten,
    policy_loss,
    token_rewards,
    top_share_mask,
    value_loss,
)


def ragged(seed: int, B: int = 5, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    return g, mask, lengths


def slow_gae(rewards, values, lengths, gamma, lam):
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    ret = torch.zeros_like(rewards)
    for b in range(B):
        L = int(lengths[b])
        running = 0.0
        for t in reversed(range(L)):
            nv = float(values[b, t + 1]) if t + 1 < L else 0.0
            delta = float(rewards[b, t]) + gamma * nv - float(values[b, t])
            running = delta + gamma * lam * running
            adv[b, t] = running
            ret[b, t] = running + float(values[b, t])
    return adv, ret


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.99, 1.0), (0.9, 0.0)])
def test_gae_matches_loop(seed: int, gamma: float, lam: float) -> None:
    g, mask, lengths = ragged(seed)
    rewards = torch.randn(mask.shape, generator=g, dtype=torch.float64) * mask
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = slow_gae(rewards, values, lengths, gamma, lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


@pytest.mark.parametrize("seed", range(5))
def test_token_rewards_put_score_on_last_token(seed: int) -> None:
    g, mask, lengths = ragged(seed)
    kl = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    scores = torch.randn(mask.shape[0], generator=g, dtype=torch.float64)
    r = token_rewards(scores, kl, mask, kl_coef=0.1)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            want = 0.0 if t >= lengths[b] else -0.1 * float(kl[b, t]) + (float(scores[b]) if t == lengths[b] - 1 else 0.0)
            assert math.isclose(float(r[b, t]), want, abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_policy_loss_matches_loop(seed: int) -> None:
    g, mask, _ = ragged(seed)
    logp = torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3 - 1
    old = logp + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    st = policy_loss(logp, old, adv, mask, clip=0.2)
    tot, n, clipped, kl = 0.0, 0, 0, 0.0
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                r = math.exp(float(logp[b, t] - old[b, t]))
                a = float(adv[b, t])
                l1, l2 = -a * r, -a * min(max(r, 0.8), 1.2)
                tot += max(l1, l2)
                clipped += l2 > l1
                kl += 0.5 * float(logp[b, t] - old[b, t]) ** 2
                n += 1
    assert math.isclose(float(st.loss), tot / n, rel_tol=1e-9)
    assert math.isclose(float(st.clipfrac), clipped / n, rel_tol=1e-9)
    assert math.isclose(float(st.approx_kl), kl / n, rel_tol=1e-9)


def test_policy_loss_gradient_direction() -> None:
    """Positive advantage: the gradient raises the sampled token's log-probability (within the clip)."""
    logp = torch.zeros(1, 3, requires_grad=True)
    st = policy_loss(logp, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 0.0]]), torch.ones(1, 3))
    st.loss.backward()
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1] and logp.grad[0, 2] == 0


@pytest.mark.parametrize("seed", range(5))
def test_value_loss_matches_loop(seed: int) -> None:
    g, mask, _ = ragged(seed)
    v = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    vo = v + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.5
    R = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    loss, frac = value_loss(v, vo, R, mask, clip=0.2)
    tot, n, cl = 0.0, 0, 0
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                c = float(vo[b, t]) + min(max(float(v[b, t] - vo[b, t]), -0.2), 0.2)
                l1, l2 = (float(v[b, t] - R[b, t])) ** 2, (c - float(R[b, t])) ** 2
                tot += max(l1, l2)
                cl += l2 > l1
                n += 1
    assert math.isclose(float(loss), 0.5 * tot / n, rel_tol=1e-9) and math.isclose(float(frac), cl / n, rel_tol=1e-9)


def test_kl_estimators() -> None:
    p = torch.tensor([-1.0, -2.0, -0.5])
    q = torch.tensor([-1.5, -2.0, -0.1])
    d = p - q
    torch.testing.assert_close(kl_penalty(p, q, "k1"), d)
    torch.testing.assert_close(kl_penalty(p, q, "k2"), 0.5 * d * d)
    torch.testing.assert_close(kl_penalty(p, q, "k3"), torch.exp(-d) - 1 + d)
    assert torch.all(kl_penalty(p, q, "k3") >= 0) and float(kl_penalty(p, p, "k3").abs().max()) == 0
    # k1 and k3 are unbiased estimators of KL(p || q) under samples from p
    g = torch.Generator().manual_seed(0)
    P = torch.tensor([0.5, 0.3, 0.2])
    Q = torch.tensor([0.2, 0.3, 0.5])
    x = torch.multinomial(P, 200_000, replacement=True, generator=g)
    true = float((P * (P / Q).log()).sum())
    for kind in ("k1", "k3"):
        est = float(kl_penalty(P.log()[x], Q.log()[x], kind).mean())
        assert abs(est - true) < 0.01, (kind, est, true)
    with pytest.raises(ValueError):
        kl_penalty(p, q, "k9")


@pytest.mark.parametrize("seed", range(4))
def test_masked_whiten_and_mean(seed: int) -> None:
    g, mask, _ = ragged(seed)
    x = torch.randn(mask.shape, generator=g, dtype=torch.float64) * 3 + 2
    vals = x[mask.bool()]
    assert math.isclose(float(masked_mean(x, mask)), float(vals.mean()), rel_tol=1e-12)
    w = masked_whiten(x, mask)
    wv = w[mask.bool()]
    assert abs(float(wv.mean())) < 1e-9 and abs(float(wv.std()) - 1) < 1e-6
    assert float(w[~mask.bool()].abs().sum()) == 0


def test_entropy_and_explained_variance() -> None:
    logits = torch.zeros(2, 3, 4)
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(4)))
    peaked = torch.tensor([[[100.0, 0.0, 0.0]]])
    assert float(entropy_from_logits(peaked)) < 1e-6
    mask = torch.ones(2, 5)
    R = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    assert math.isclose(float(explained_variance(R, R, mask)), 1.0)
    assert float(explained_variance(torch.zeros_like(R) + R.mean(), R, mask)) < 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_grpo_advantages_match_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(12, generator=g, dtype=torch.float64)
    adv = grpo_advantages(s, 4)
    for i in range(3):
        grp = [float(v) for v in s[4 * i: 4 * i + 4]]
        mu = sum(grp) / 4
        sd = math.sqrt(sum((v - mu) ** 2 for v in grp) / 3)
        for j in range(4):
            assert math.isclose(float(adv[4 * i + j]), (grp[j] - mu) / (sd + 1e-6), rel_tol=1e-9)
    same = grpo_advantages(torch.ones(8), 4)
    assert float(same.abs().max()) == 0, "identical rewards in a group give no signal"
    with pytest.raises(ValueError):
        grpo_advantages(torch.ones(7), 4)


@pytest.mark.parametrize("seed", range(3))
def test_loo_centred_matches_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(12, generator=g, dtype=torch.float64)
    c = loo_centred(s, 3)
    for i in range(12):
        grp = [float(v) for v in s[3 * (i // 3): 3 * (i // 3) + 3]]
        others = (sum(grp) - float(s[i])) / 2
        assert math.isclose(float(c[i]), float(s[i]) - others, rel_tol=1e-12, abs_tol=1e-12)
    offset = loo_centred(torch.tensor([5.0, 5.0, -7.0, -7.0]), 2)
    assert float(offset.abs().max()) == 0, "a per-matrix offset alone carries no signal"
    assert torch.equal(loo_centred(s, 1), s)
    with pytest.raises(ValueError):
        loo_centred(torch.ones(7), 2)


def test_adaptive_kl() -> None:
    c = AdaptiveKL(0.1, target=6.0, horizon=1000)
    assert c.update(12.0, 100) > 0.1  # KL too high: penalise more
    c2 = AdaptiveKL(0.1, target=6.0, horizon=1000)
    assert c2.update(1.0, 100) < 0.1
    fixed = AdaptiveKL(0.05, target=None)
    assert fixed.update(100.0, 1000) == 0.05


def test_gae_lambda_one_credits_the_first_token() -> None:
    """Why lam defaults to 1.0: one score on the last of 600 tokens and an untrained critic
    (values 0). With lam = 1 the first token (where the format is chosen) gets the whole score;
    with 0.95 it gets almost nothing and only the last tokens are pushed."""
    T = 600
    rewards = torch.zeros(1, T)
    rewards[0, -1] = 1.0
    values, mask = torch.zeros(1, T), torch.ones(1, T)
    adv1, _ = gae(rewards, values, mask, 1.0, 1.0)
    adv095, _ = gae(rewards, values, mask, 1.0, 0.95)
    assert torch.allclose(adv1, torch.ones(1, T))
    assert adv095[0, 0] < 1e-10 and adv095[0, -1] == 1.0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("share", [0.05, 0.3, 0.999])
def test_top_share_mask_matches_sort(seed: int, share: float) -> None:
    g, mask, _ = ragged(seed, B=6, T=11)
    scores = torch.rand(mask.shape, generator=g, dtype=torch.float64) - 10 * (1 - mask)  # padding scores low...
    scores = scores + 100 * (1 - mask) * (seed % 2)  # ...or high: neither may be picked
    got = top_share_mask(scores, mask, share)
    vals = sorted((float(scores[b, t]) for b in range(6) for t in range(11) if mask[b, t]), reverse=True)
    keep = max(1, round(share * len(vals)))
    want = torch.tensor([[1.0 if mask[b, t] and float(scores[b, t]) >= vals[keep - 1] else 0.0 for t in range(11)]
                         for b in range(6)], dtype=mask.dtype)
    assert torch.equal(got, want)  # random scores have no ties
    assert int(got.sum()) == keep
    assert torch.equal(top_share_mask(scores, mask, 1.0), mask)
    with pytest.raises(ValueError):
        top_share_mask(scores, mask, 0.0)


def test_top_share_mask_keeps_the_forking_tokens() -> None:
    """A completion whose only uncertain token is the choice: a 5% share keeps just that token."""
    mask = torch.ones(2, 40)
    entropy = torch.full((2, 40), 1e-4)
    entropy[:, 2] = 1.2  # 'FORMAT: <choice>'
    got = top_share_mask(entropy, mask, 0.025)
    assert got[:, 2].tolist() == [1.0, 1.0] and int(got.sum()) == 2
    assert int(top_share_mask(entropy, torch.zeros(2, 40), 0.5).sum()) == 0
    # ties at the cut-off: still exactly the share (5% of 80 = 4: the two choices and two others)
    got = top_share_mask(entropy, mask, 0.05)
    assert int(got.sum()) == 4 and got[:, 2].tolist() == [1.0, 1.0]
    half = torch.ones(2, 40)
    half[1, 20:] = 0  # padding is never picked, even with the highest score
    padded = entropy.clone()
    padded[1, 20:] = 99.0
    got = top_share_mask(padded, half, 0.1)
    assert int(got.sum()) == 6 and float((got * (1 - half)).sum()) == 0
