"""PPO and GRPO maths as small pure tensor functions.

Conventions: ``B`` completions of at most ``T`` response tokens, right-padded; ``mask``
(B, T) is 1 on real response tokens. ``logp`` are log-probabilities of the sampled
tokens. Nothing here touches a model, so every function is tested against a slow loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1 (all dims, or along ``dim``)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of the masked entries of ``x``."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    return ((x - mean) ** 2 * mask).sum() / (n - 1).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, min_std: float = 0.0) -> torch.Tensor:
    """(x - mean) / max(std, min_std) over the masked entries; 0 outside the mask. x, mask: (B, T).

    ``min_std``: a batch whose entries differ by less than this is not blown up to unit std
    (a nearly uniform batch is mostly noise: timing jitter, KL terms, float error). Advantages that
    already carry a baseline are scaled without re-centring instead (:func:`masked_scale`)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) / torch.maximum(torch.sqrt(var + eps), torch.tensor(min_std, dtype=x.dtype, device=x.device))
    return out * mask.to(x.dtype)


def masked_scale(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, min_std: float = 0.0) -> torch.Tensor:
    """x / max(std, min_std) over the masked entries, *not* re-centred: every entry keeps its sign;
    0 outside the mask. x, mask: (B, T).

    For advantages that already have their baseline (leave-one-out, max@k): :func:`masked_whiten`
    would subtract the token-weighted batch mean, and where long completions of one group carry
    large advantages that mean moves every small advantage of another group across zero."""
    var = masked_var(x, mask)
    std = torch.maximum(torch.sqrt(var + eps), torch.tensor(min_std, dtype=x.dtype, device=x.device))
    return x / std * mask.to(x.dtype)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, (B, T).

    k1: log p - log q (unbiased, can be negative); k2: 0.5 (log p - log q)^2;
    k3: (q/p - 1) - log(q/p) (unbiased, non-negative; Schulman's low-variance estimator);
    abs: |log p - log q|.
    """
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.expm1(-d) + d
    if kind == "abs":
        return d.abs()
    raise ValueError(f"unknown KL estimator {kind!r} (k1, k2, k3, abs)")


KL_LOSS_CLAMP = 3.0
"""|log p - log q| past which the ``k3`` KL loss stops growing (its gradient stays <= e^3 - 1 ~ 19)."""


def kl_loss_terms(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k2") -> torch.Tensor:
    """Per-token KL terms (B, T) to use as a loss (differentiated through ``logp``).

    k2: 0.5 (log p - log q)^2, gradient (log p - log q): linear in the log-ratio (the default).
    k3: (q/p - 1) - log(q/p) with the log-ratio clamped to ±KL_LOSS_CLAMP. Unclamped, k3's
    gradient 1 - q/p grows like e^|log-ratio| where the policy has left the reference (a token
    the policy made unlikely), which is where a loss must stay bounded.
    """
    d = logp - ref_logp
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        d = d.clamp(-KL_LOSS_CLAMP, KL_LOSS_CLAMP)
        return torch.expm1(-d) + d
    raise ValueError(f"unknown KL loss {kind!r} (k2, k3)")


def masked_sum_over(x: torch.Tensor, mask: torch.Tensor, denom: float | None) -> torch.Tensor:
    """sum(x * mask) / denom, or the masked mean when ``denom`` is None. x, mask: (B, T).

    A fixed ``denom`` (the batch's token count scaled to a minibatch) gives every token the same
    weight in every minibatch; a minibatch's own count would weight the tokens of a minibatch
    with few selected tokens more."""
    if denom is None:
        return masked_mean(x, mask)
    return (x * mask.to(x.dtype)).sum() / denom


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Per-token rewards (B, T): ``-kl_coef * kl`` on every response token plus the sequence
    score (B,) on its last real token (the token-level MDP with reward at the end)."""
    r = -kl_coef * kl * mask.to(kl.dtype)
    last = (mask.long().cumsum(1).argmax(1))  # index of the last 1 in each row
    has = mask.sum(1) > 0
    r[torch.arange(r.shape[0], device=r.device)[has], last[has]] += scores[has].to(r.dtype)
    return r


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens.

    rewards, values, mask: (B, T). Returns (advantages, returns), both (B, T), zero outside
    the mask. The value after a sequence's last real token is 0 (the episode ends).
    """
    B, T = rewards.shape
    m = mask.to(values.dtype)
    adv = torch.zeros_like(values)
    last = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        last = last * m[:, t]  # padding contributes nothing and resets nothing after the end
        adv[:, t] = last
        next_value = values[:, t] * m[:, t]
    returns = (adv + values) * m
    return adv * m, returns


@dataclass(frozen=True)
class LossStats:
    loss: torch.Tensor
    clipfrac: torch.Tensor
    approx_kl: torch.Tensor


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip: float = 0.2, denom: float | None = None) -> LossStats:
    """PPO's clipped surrogate over the mask; all inputs (B, T).

    loss = sum(max(-A r, -A clip(r, 1-eps, 1+eps))) / denom, r = exp(logp - old_logp), the
    token mean when ``denom`` is None. approx_kl = mean(0.5 (logp - old_logp)^2); clipfrac =
    share of tokens where clipping bit (both over the mask).
    """
    ratio = torch.exp(logp - old_logp)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_sum_over(torch.maximum(l1, l2), mask, denom)
    clipfrac = masked_mean((l2 > l1).to(logp.dtype), mask)
    approx_kl = masked_mean(0.5 * (logp - old_logp) ** 2, mask)
    return LossStats(loss, clipfrac.detach(), approx_kl.detach())


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, denom: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * sum(max((v - R)^2, (clip(v, v_old ± eps) - R)^2)) / denom (the
    token mean when ``denom`` is None; no clipping when ``clip`` is None); all inputs (B, T).
    Returns (loss, clipfrac)."""
    l1 = (values - returns) ** 2
    if clip is None:
        return 0.5 * masked_sum_over(l1, mask, denom), torch.zeros((), dtype=values.dtype, device=values.device)
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    l2 = (clipped - returns) ** 2
    loss = 0.5 * masked_sum_over(torch.maximum(l1, l2), mask, denom)
    return loss, masked_mean((l2 > l1).to(values.dtype), mask).detach()


def entropy_from_logp(logp: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (B, T) of the categorical distributions given by log-probabilities (B, T, V)."""
    return -(logp.exp() * logp).sum(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (B, T) of the categorical distributions given by logits (B, T, V)."""
    return entropy_from_logp(torch.log_softmax(logits.float(), dim=-1))


def top_share_mask(scores: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """(B, T) mask of the ``share`` of each sequence's masked tokens with the highest ``scores``
    (B, T), for example the sampling entropy: in row b, 1 on exactly ``max(1, round(share * n_b))``
    of its ``n_b`` masked tokens (ties broken by position), 0 elsewhere and in empty rows;
    ``share >= 1`` returns ``mask``.

    "Forking" tokens (Wang et al. 2025, "Beyond the 80/20 rule"): RL that updates only the
    highest-entropy tokens is meant to keep the near-deterministic rest of a completion intact. In a
    kernel these are the format, strategy and parameter choices. On the project's RL toy it did the
    opposite (benchmarks/results/2026-12-04/pg-token-share): a garbled sample's wrong tokens are rarely
    its highest-entropy ones, so a 5% share left them uncorrected, and every token (``share`` 1) is
    the default. Chosen within each sequence, so that every completion gets its share, not only the
    most uncertain ones of the batch."""
    if share >= 1.0:
        return mask.clone()
    if not 0.0 < share:
        raise ValueError(f"share must be in (0, 1], got {share}")
    m = mask > 0
    n = m.sum(1)  # (B,)
    keep = torch.where(n > 0, torch.clamp(torch.round(share * n.double()).long(), min=1), torch.zeros_like(n))
    masked = torch.where(m, scores.double(), torch.tensor(float("-inf"), dtype=torch.float64, device=scores.device))
    # stable descending order: equal scores keep their positions' order
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return ((rank < keep[:, None]) & m).to(mask.dtype)


def covariance_top_mask(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """(B, T) mask of the ``share`` of the batch's masked tokens with the largest centred covariance
    (logp - mean logp) * (A - mean A) (means over the masked tokens); at least one token when any
    is masked. KL-Cov (Cui et al. 2025, "The entropy mechanism of RL for reasoning LMs"): the
    entropy of a policy falls through the few tokens where a likely token also has a high advantage;
    penalising the drift of those tokens alone keeps the entropy, leaving the others free."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    m = mask > 0
    n = int(m.sum())
    if n == 0:
        return torch.zeros_like(mask)
    lp, a = logp.detach().double(), advantages.detach().double()
    cov = (lp - lp[m].mean()) * (a - a[m].mean())
    flat = torch.where(m, cov, torch.tensor(float("-inf"), dtype=cov.dtype, device=cov.device)).reshape(-1)
    out = torch.zeros(flat.shape, dtype=mask.dtype, device=mask.device)
    out[torch.topk(flat, max(1, round(share * n))).indices] = 1
    return out.view(mask.shape)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over the masked tokens (1 = perfect critic, <= 0 = useless)."""
    var_r = masked_var(returns, mask)
    return 1.0 - masked_var(returns - values, mask) / var_r.clamp(min=1e-8)


def _groups(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None):
    """(scores, valid) reshaped to (G, group_size), in float64; checks the split."""
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    g = scores.reshape(-1, group_size).to(torch.float64)
    v = (torch.ones_like(g, dtype=torch.bool) if valid is None else valid.reshape(-1, group_size).bool())
    return g, v


def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True,
                    valid: torch.Tensor | None = None, min_std: float = 0.0) -> torch.Tensor:
    """Group-normalised advantages (B,) for B = n_groups * group_size consecutive samples:
    (score - group mean) / (max(group std, min_std) + eps), or only centred when ``scale`` is False.

    ``valid`` (B,) bool: samples to leave out (infrastructure failures): they get 0 and do not
    enter their group's mean or std. A group with fewer than 2 valid samples gets 0."""
    g, v = _groups(scores, group_size, valid)
    vf = v.to(g.dtype)
    n = vf.sum(1, keepdim=True)
    mean = (g * vf).sum(1, keepdim=True) / n.clamp(min=1)
    centred = (g - mean) * vf
    if scale and group_size > 1:
        std = torch.sqrt((centred ** 2).sum(1, keepdim=True) / (n - 1).clamp(min=1))
        centred = centred / (std.clamp(min=min_std) + eps)
    out = torch.where(n >= 2, centred, torch.zeros_like(centred)) if group_size > 1 else centred
    return out.reshape(-1).to(scores.dtype)


def loo_centred(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Scores (B,) minus the mean of the *other* valid samples of their group (leave-one-out,
    RLOO), for B = n_groups * group_size consecutive samples; unchanged when ``group_size`` is 1.

    Rewards differ far more between matrices (a banded matrix earns more than a power-law
    one whatever the kernel) than between the samples of one matrix; centring per matrix
    keeps only the part that depends on what the policy wrote. ``valid`` (B,) bool: samples to
    leave out get 0 and are nobody's baseline; a sample with no valid other gets 0."""
    if group_size == 1:
        return scores.clone() if valid is None else scores * valid.to(scores.dtype)
    g, v = _groups(scores, group_size, valid)
    vf = v.to(g.dtype)
    n_others = vf.sum(1, keepdim=True) - vf
    others = ((g * vf).sum(1, keepdim=True) - g * vf) / n_others.clamp(min=1)
    out = torch.where(v & (n_others > 0), g - others, torch.zeros_like(g))
    return _ties_to_zero(out, g * vf).reshape(-1).to(scores.dtype)


def _ties_to_zero(adv: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Advantages (G, n) within rounding of 0 set to 0: the group's sums round (three equal scores
    can leave +-1e-15), and a whitened or clipped update would read that residue as a sign."""
    tiny = 4 * scores.shape[-1] * torch.finfo(scores.dtype).eps * scores.abs().amax(-1, keepdim=True)
    return torch.where(adv.abs() <= tiny.to(adv.dtype), torch.zeros_like(adv), adv)


def max_k_weights(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """For rewards (..., n) and k <= n: w_i = (1/C(n,k)) * sum over the k-subsets S that contain i
    of max_{j in S} r_j, along the last dim, so that sum_i w_i grad log p(x_i) is an unbiased
    estimate of the gradient of max@k = E[max of k samples] (Walder & Karkhanis 2025, "Pass@K
    policy optimization").

    With the rewards sorted ascending (rank i = 1..n), w_i = [C(i-1, k-1) r_i + sum_{j>i}
    C(j-2, k-2) r_j] / C(n, k): the subsets where i is the best, and those where a better j is."""
    n = rewards.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    r, order = torch.sort(rewards.to(torch.float64), dim=-1)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=r.device)
    own = _binom(i - 1, k - 1) * r  # subsets where rank i is the best
    tail = _suffix_after(_binom(i - 2, k - 2) * r)  # tail[i] = sum_{j > i} C(j-2, k-2) r_j
    w = (own + tail) / math.comb(n, k)
    return torch.empty_like(w).scatter_(-1, order, w).to(rewards.dtype)


def _binom(n: torch.Tensor, k: int) -> torch.Tensor:
    """C(n, k) elementwise for integer-valued float64 ``n`` (0 where n < k, or k < 0)."""
    if k < 0:
        return torch.zeros_like(n)
    out = torch.ones_like(n)
    for j in range(k):
        out = out * (n - j) / (j + 1)
    return torch.where(n >= k, out, torch.zeros_like(n))


def _suffix_after(x: torch.Tensor) -> torch.Tensor:
    """out[..., i] = sum_{j > i} x[..., j]."""
    return torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1]) - x


def max_k_estimate(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased estimate of max@k = E[max of k samples] from n >= k rewards (..., n): the mean over
    all k-subsets of their best reward, which is sum_i w_i / k (every subset is counted once per
    member)."""
    return max_k_weights(rewards, k).sum(-1) / k


def _loo_max_k(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """out[..., i] = max_k_estimate of the rewards (..., n) without sample i, k <= n - 1.

    Sorted ascending, removing rank i leaves ranks j < i in place and moves ranks j > i down by
    one: out_i = [sum_{j<i} C(j-1, k-1) r_j + sum_{j>i} C(j-2, k-1) r_j] / C(n-1, k)."""
    n = rewards.shape[-1]
    r, order = torch.sort(rewards.to(torch.float64), dim=-1)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=r.device)
    below = _binom(i - 1, k - 1) * r
    before = torch.cumsum(below, -1) - below  # sum over j < i
    after = _suffix_after(_binom(i - 2, k - 1) * r)  # sum over j > i
    out = (before + after) / math.comb(n - 1, k)
    return torch.empty_like(out).scatter_(-1, order, out)


def _max_k_rows(r: torch.Tensor, k: int) -> torch.Tensor:
    """max@k advantages for full groups r (G, n), n >= 2 (see :func:`max_k_advantages`)."""
    n = r.shape[-1]
    kk = min(k, n)
    w = max_k_weights(r, kk)
    base = _loo_max_k(r, min(kk, n - 1))
    return _ties_to_zero((n / kk) * (w - (kk / n) * base), r)


def max_k_advantages(scores: torch.Tensor, group_size: int, k: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages (B,) for the best-of-k objective max@k, per group of ``group_size`` consecutive
    samples: a_i = (n / k) * (w_i - b_i), with w the :func:`max_k_weights` of the group's n valid
    samples (k capped at n) and the leave-one-out baseline b_i = (k / n) * max@k' of the *other*
    samples (k' = min(k, n - 1)), which does not depend on sample i: the gradient stays unbiased.

    k = 1 is exactly :func:`loo_centred`. Larger k moves the credit to the group's best samples: a
    sample below the others' best earns little even when it beats their mean, so the policy is
    pushed to widen what it tries rather than to sharpen its mean (the best of k, not the mean,
    is what ``generate`` hands a user). Invalid samples and groups with one valid sample get 0."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    g, v = _groups(scores, group_size, valid)
    if group_size < 2:
        return torch.zeros_like(scores)
    if bool(v.all()):
        return _max_k_rows(g, k).reshape(-1).to(scores.dtype)
    out = torch.zeros_like(g)
    for row in range(g.shape[0]):  # ragged groups: one at a time
        idx = torch.nonzero(v[row]).squeeze(1)
        if idx.numel() >= 2:
            out[row, idx] = _max_k_rows(g[row, idx][None], k)[0]
    return out.reshape(-1).to(scores.dtype)


def uniform_groups(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None,
                   tol: float = 1e-9) -> torch.Tensor:
    """(G,) bool: groups whose valid samples all scored the same (within ``tol``), or have fewer
    than two valid samples. Such a group gives a group-relative update no signal."""
    g, v = _groups(scores, group_size, valid)
    hi = torch.where(v, g, torch.full_like(g, -math.inf)).amax(1)
    lo = torch.where(v, g, torch.full_like(g, math.inf)).amin(1)
    return (v.sum(1) < 2) | (hi - lo <= tol)


class AdaptiveKL:
    """Adaptive KL coefficient (Ziegler et al. 2019): steer the observed KL toward ``target``."""

    def __init__(self, init: float, target: float | None, horizon: int = 10_000):
        self.value, self.target, self.horizon = init, target, horizon

    def update(self, current_kl: float, n_samples: int) -> float:
        if self.target is None:  # fixed coefficient
            return self.value
        err = max(-0.2, min(0.2, current_kl / self.target - 1.0))
        self.value *= 1.0 + err * n_samples / self.horizon
        return self.value
