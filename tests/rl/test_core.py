"""PPO/GRPO maths against slow reference loops, across seeds and ragged masks."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from sparserl.rl.core import (  # noqa: E402
    KL_LOSS_CLAMP,
    AdaptiveKL,
    covariance_top_mask,
    entropy_from_logits,
    explained_variance,
    gae,
    grpo_advantages,
    kl_loss_terms,
    kl_penalty,
    loo_centred,
    masked_mean,
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


def test_equal_scores_of_a_group_are_a_tie_after_rounding() -> None:
    """Three equal scores whose sum rounds (x = 0.1: 3x is not exact) are a tie: each advantage is 0,
    not +-1e-17 that whitening would scale up into a sign. Mutation killed: no snapping of ties."""
    x = 0.1
    assert (3 * x) - x != 2 * x  # the rounding this guards against
    out = loo_centred(torch.tensor([x, x, x, 1.0, 2.0, 3.0], dtype=torch.float64), 3)
    assert out[:3].tolist() == [0.0, 0.0, 0.0]
    assert out[3:].tolist() == pytest.approx([-1.5, 0.0, 1.5], abs=1e-12) and float(out[3]) < 0 < float(out[5])
    for k in (1, 2):  # the best-of-k path (its sorted prefix sums leave -6.7e-16 on three scores of -3.5)
        tie = max_k_advantages(torch.tensor([-3.5, -3.5, -3.5, x, x, x], dtype=torch.float64), 3, k)
        assert tie.tolist() == [0.0] * 6


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
def test_top_share_mask_matches_a_per_sequence_sort(seed: int, share: float) -> None:
    g, mask, lengths = ragged(seed, B=6, T=11)
    mask[2] = 0  # an empty row keeps nothing
    scores = torch.rand(mask.shape, generator=g, dtype=torch.float64) - 10 * (1 - mask)  # padding scores low...
    scores = scores + 100 * (1 - mask) * (seed % 2)  # ...or high: neither may be picked
    got = top_share_mask(scores, mask, share)
    for b in range(6):
        vals = sorted((float(scores[b, t]) for t in range(11) if mask[b, t]), reverse=True)
        keep = max(1, round(share * len(vals))) if vals else 0
        want = [1.0 if mask[b, t] and keep and float(scores[b, t]) >= vals[keep - 1] else 0.0 for t in range(11)]
        assert got[b].tolist() == want, b  # random scores have no ties
        assert int(got[b].sum()) == keep
    assert torch.equal(top_share_mask(scores, mask, 1.0), mask)
    with pytest.raises(ValueError):
        top_share_mask(scores, mask, 0.0)


def test_top_share_mask_selects_within_each_sequence() -> None:
    """A confident completion still gets its share: selection over the whole batch gave every
    token to the most uncertain sequence."""
    mask = torch.ones(2, 40)
    entropy = torch.full((2, 40), 1e-4)
    entropy[0] = 2.0  # sequence 0 is uncertain everywhere
    entropy[1, 2] = 0.5  # sequence 1 has one choice: 'FORMAT: <choice>'
    got = top_share_mask(entropy, mask, 0.025)
    assert int(got[0].sum()) == 1 and got[1].tolist() == [1.0 if t == 2 else 0.0 for t in range(40)]
    assert int(top_share_mask(entropy, torch.zeros(2, 40), 0.5).sum()) == 0
    got = top_share_mask(entropy, mask, 0.1)  # ties: exactly the share, the earliest positions first
    assert got[0].tolist() == [1.0] * 4 + [0.0] * 36 and int(got[1].sum()) == 4 and got[1, 2] == 1
    half = torch.ones(2, 40)
    half[1, 20:] = 0  # padding is never picked, even with the highest score
    padded = entropy.clone()
    padded[1, 20:] = 99.0
    got = top_share_mask(padded, half, 0.1)
    assert int(got[0].sum()) == 4 and int(got[1].sum()) == 2 and float((got * (1 - half)).sum()) == 0


def test_whitening_leaves_a_nearly_uniform_batch_small() -> None:
    """Rewards that differ only by noise (1e-3) are not blown up to unit std with a floor;
    a batch with real differences is whitened as before."""
    mask = torch.ones(4, 6, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    noise = 1.0 + 1e-3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    plain = masked_whiten(noise, mask)
    floored = masked_whiten(noise, mask, min_std=0.1)
    assert abs(float(plain.std()) - 1) < 0.05  # the old behaviour: noise at unit scale
    assert float(floored.abs().max()) < 0.05
    torch.testing.assert_close(floored, (noise - noise.mean()) / 0.1)
    real = torch.randn(4, 6, generator=g, dtype=torch.float64) * 2
    torch.testing.assert_close(masked_whiten(real, mask, min_std=0.1), masked_whiten(real, mask))


def test_kl_loss_gradient_is_bounded() -> None:
    """k2's gradient is the log-ratio itself; clamped k3's stays below e^clamp - 1 however far the
    policy has moved, where unclamped k3 (the old GRPO loss) grows like e^|log-ratio|."""
    d = torch.linspace(-30, 30, 601, dtype=torch.float64)
    ref = torch.zeros_like(d)
    for kind, bound in (("k2", lambda x: x.abs() + 1e-12), ("k3", lambda x: torch.full_like(x, math.expm1(KL_LOSS_CLAMP) + 1e-9))):
        logp = d.clone().requires_grad_()
        kl_loss_terms(logp, ref, kind).sum().backward()
        assert torch.all(logp.grad.abs() <= bound(d)), kind
        assert torch.all(torch.isfinite(logp.grad))
        assert torch.all(kl_loss_terms(d, ref, kind) >= 0) and float(kl_loss_terms(ref, ref, kind).abs().max()) == 0
    raw = d.clone().requires_grad_()
    kl_penalty(raw, ref, "k3").sum().backward()
    assert float(raw.grad.abs().max()) > 1e12  # what the clamp prevents
    small = torch.tensor([0.1, -0.2], dtype=torch.float64)  # inside the clamp k3 is k3
    torch.testing.assert_close(kl_loss_terms(small, torch.zeros(2, dtype=torch.float64), "k3"),
                               kl_penalty(small, torch.zeros(2, dtype=torch.float64), "k3"))
    with pytest.raises(ValueError):
        kl_loss_terms(d, ref, "k1")


@pytest.mark.parametrize("seed", range(3))
def test_fixed_denominator_losses(seed: int) -> None:
    """With a fixed denominator the loss is the token sum over it, whatever the minibatch's own count."""
    g, mask, _ = ragged(seed)
    logp = torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3 - 1
    old = logp + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    mean = policy_loss(logp, old, adv, mask).loss
    summed = policy_loss(logp, old, adv, mask, denom=100.0).loss
    assert math.isclose(float(summed), float(mean) * float(mask.sum()) / 100.0, rel_tol=1e-9)
    v, R = torch.randn(mask.shape, generator=g, dtype=torch.float64), torch.randn(mask.shape, generator=g, dtype=torch.float64)
    lv, _ = value_loss(v, v.clone(), R, mask, clip=None, denom=50.0)
    assert math.isclose(float(lv), 0.5 * float((((v - R) ** 2) * mask).sum()) / 50.0, rel_tol=1e-9)


def slow_group_mean_std(s, valid, G, min_std):
    out = []
    for i in range(len(s) // G):
        grp = [(float(s[i * G + j]), bool(valid[i * G + j])) for j in range(G)]
        vals = [x for x, ok in grp if ok]
        if len(vals) < 2:
            out += [0.0] * G
            continue
        mu = sum(vals) / len(vals)
        sd = max(math.sqrt(sum((x - mu) ** 2 for x in vals) / (len(vals) - 1)), min_std)
        out += [(x - mu) / (sd + 1e-6) if ok else 0.0 for x, ok in grp]
    return out


def slow_loo(s, valid, G):
    out = []
    for i in range(len(s)):
        grp = range(G * (i // G), G * (i // G) + G)
        others = [float(s[j]) for j in grp if j != i and valid[j]]
        out.append(float(s[i]) - sum(others) / len(others) if valid[i] and others else 0.0)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_group_baselines_leave_out_invalid_samples(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(12, generator=g, dtype=torch.float64)
    valid = torch.rand(12, generator=g) > 0.3
    valid[8:11] = False  # a group with one valid sample
    for min_std in (0.0, 0.5):
        got = grpo_advantages(s, 4, valid=valid, min_std=min_std)
        assert got.tolist() == pytest.approx(slow_group_mean_std(s, valid, 4, min_std), rel=1e-9, abs=1e-12)
    assert loo_centred(s, 3, valid).tolist() == pytest.approx(slow_loo(s, valid, 3), rel=1e-9, abs=1e-12)
    # an invalid sample's score (a placeholder) changes nothing
    s2 = s.clone()
    s2[~valid] = 1e6
    assert torch.equal(grpo_advantages(s2, 4, valid=valid), grpo_advantages(s, 4, valid=valid))
    assert torch.equal(loo_centred(s2, 3, valid), loo_centred(s, 3, valid))
    assert torch.equal(max_k_advantages(s2, 4, 2, valid), max_k_advantages(s, 4, 2, valid))


def test_grpo_std_floor() -> None:
    """A group whose rewards differ by timing noise keeps small advantages under a floor."""
    s = torch.tensor([1.0, 1.001, 0.999, 1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    plain, floored = grpo_advantages(s, 4), grpo_advantages(s, 4, min_std=0.1)
    assert float(plain[:4].abs().max()) > 0.5 and float(floored[:4].abs().max()) < 0.02
    torch.testing.assert_close(floored[4:], plain[4:])


def brute_max_k(r, k):
    """Mean over all k-subsets of their best reward, and each sample's w_i (sum over its subsets / C(n,k))."""
    from itertools import combinations

    n = len(r)
    subsets = list(combinations(range(n), k))
    est = sum(max(r[j] for j in S) for S in subsets) / len(subsets)
    w = [sum(max(r[j] for j in S) for S in subsets if i in S) / len(subsets) for i in range(n)]
    return est, w


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n,k", [(4, 1), (4, 2), (5, 3), (6, 6), (7, 4)])
def test_max_k_weights_match_the_subset_enumeration(seed: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(n, generator=g, dtype=torch.float64)
    if seed == 0:
        r[1] = r[0]  # ties
    est, w = brute_max_k(r.tolist(), k)
    assert max_k_weights(r, k).tolist() == pytest.approx(w, rel=1e-9, abs=1e-12)
    assert float(max_k_estimate(r, k)) == pytest.approx(est, rel=1e-9)


def slow_max_k_advantages(s, valid, G, k):
    out = []
    for grp in range(len(s) // G):
        ids = [grp * G + j for j in range(G) if valid[grp * G + j]]
        n = len(ids)
        if n < 2:
            out += [0.0] * G
            continue
        r = [float(s[i]) for i in ids]
        kk = min(k, n)
        _, w = brute_max_k(r, kk)
        adv = {}
        for pos, i in enumerate(ids):
            others = r[:pos] + r[pos + 1:]
            base, _ = brute_max_k(others, min(kk, n - 1))
            adv[i] = (n / kk) * (w[pos] - kk / n * base)
        out += [adv.get(grp * G + j, 0.0) for j in range(G)]
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_max_k_advantages_match_loop(seed: int, k: int) -> None:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(16, generator=g, dtype=torch.float64)
    valid = torch.rand(16, generator=g) > 0.25
    got = max_k_advantages(s, 4, k, valid)
    assert got.tolist() == pytest.approx(slow_max_k_advantages(s, valid, 4, k), rel=1e-9, abs=1e-12)


def test_max_k_at_one_is_rloo_and_credits_the_best_at_larger_k() -> None:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(12, generator=g, dtype=torch.float64)
    torch.testing.assert_close(max_k_advantages(s, 4, 1), loo_centred(s, 4))
    grp = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    a1, a4 = max_k_advantages(grp, 4, 1), max_k_advantages(grp, 4, 4)
    assert a1[2] > 0 and a4[2] <= 0 < a4[3]  # at k = n only the best sample is credited


def test_max_k_gradient_is_unbiased() -> None:
    """On a 3-armed bandit with softmax policy, the mean of sum_i a_i grad log p(x_i) over many
    groups matches the exact gradient of max@k (computed by enumeration)."""
    from itertools import product

    theta = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    R = torch.tensor([1.0, 0.0, 2.5], dtype=torch.float64)
    n, k = 4, 2

    def exact(th):
        p = torch.softmax(th, 0)
        return sum(p[a] * p[b] * torch.maximum(R[a], R[b]) for a, b in product(range(3), repeat=2))

    (grad_exact,) = torch.autograd.grad(exact(theta), theta)
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(theta.detach(), 0)
    draws = torch.multinomial(p.expand(40_000, 3), n, replacement=True, generator=g)  # (groups, n)
    adv = max_k_advantages(R[draws].reshape(-1), n, k).reshape(-1, n)
    score = torch.eye(3, dtype=torch.float64)[draws] - p  # grad log softmax of each draw, (groups, n, 3)
    est = (adv[..., None] * score).sum(1).mean(0) * k / n  # a_i = (n/k)(w_i - b_i): undo the scale
    assert torch.allclose(est, grad_exact, atol=0.01), (est, grad_exact)


def test_uniform_groups() -> None:
    s = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 5.0, 3.0])
    valid = torch.tensor([True, True, True, True, True, True, False, True])
    assert uniform_groups(s, 2).tolist() == [True, False, True, False]
    assert uniform_groups(s, 2, valid).tolist() == [True, False, True, True]  # one valid sample
    assert uniform_groups(s, 4).tolist() == [False, False]


@pytest.mark.parametrize("seed", range(3))
def test_covariance_top_mask_matches_loop(seed: int) -> None:
    g, mask, _ = ragged(seed, B=4, T=7)
    logp = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    adv = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    got = covariance_top_mask(logp, adv, mask, 0.2)
    cells = [(b, t) for b in range(4) for t in range(7) if mask[b, t]]
    mlp = sum(float(logp[c]) for c in cells) / len(cells)
    ma = sum(float(adv[c]) for c in cells) / len(cells)
    cov = sorted(cells, key=lambda c: -(float(logp[c]) - mlp) * (float(adv[c]) - ma))
    keep = set(cov[:max(1, round(0.2 * len(cells)))])
    assert {(b, t) for b in range(4) for t in range(7) if got[b, t]} == keep
