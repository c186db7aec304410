"""PPO and GRPO maths as small pure tensor functions.

Conventions: ``B`` completions of at most ``T`` response tokens, right-padded; ``mask``
(B, T) is 1 on real response tokens. ``logp`` are log-probabilities of the sampled
tokens. Nothing here touches a model, so every function is tested against a slow loop.
"""

from __future__ import annotations

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


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (mean kept when ``shift_mean`` is False); 0 outside the mask."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


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
                clip: float = 0.2) -> LossStats:
    """PPO's clipped surrogate, token-mean over the mask.

    loss = mean(max(-A r, -A clip(r, 1-eps, 1+eps))), r = exp(logp - old_logp).
    approx_kl = mean(0.5 (logp - old_logp)^2); clipfrac = share of tokens where clipping bit.
    """
    ratio = torch.exp(logp - old_logp)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(l1, l2), mask)
    clipfrac = masked_mean((l2 > l1).to(logp.dtype), mask)
    approx_kl = masked_mean(0.5 * (logp - old_logp) ** 2, mask)
    return LossStats(loss, clipfrac.detach(), approx_kl.detach())


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * mean(max((v - R)^2, (clip(v, v_old ± eps) - R)^2)); returns (loss, clipfrac)."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    l1 = (values - returns) ** 2
    l2 = (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(l1, l2), mask)
    return loss, masked_mean((l2 > l1).to(values.dtype), mask).detach()


def entropy_from_logp(logp: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (B, T) of the categorical distributions given by log-probabilities (B, T, V)."""
    return -(logp.exp() * logp).sum(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (B, T) of the categorical distributions given by logits (B, T, V)."""
    return entropy_from_logp(torch.log_softmax(logits.float(), dim=-1))


def top_share_mask(scores: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """(B, T) mask of the ``share`` of masked tokens with the highest ``scores`` (B, T), for
    example the sampling entropy: 1 on exactly ``max(1, round(share * n))`` of the ``n`` masked
    tokens (ties broken by position), 0 elsewhere; ``share >= 1`` returns ``mask``.

    "Forking" tokens (Wang et al. 2025, "Beyond the 80/20 rule"): RL that updates only the
    highest-entropy tokens keeps the near-deterministic rest of a completion intact. In a kernel
    these are the format, strategy and parameter choices; the code that follows a choice is
    nearly determined by it."""
    if share >= 1.0:
        return mask.clone()
    if not 0.0 < share:
        raise ValueError(f"share must be in (0, 1], got {share}")
    m = mask > 0
    n = int(m.sum())
    if n == 0:
        return torch.zeros_like(mask)
    keep = max(1, int(round(share * n)))
    flat = torch.where(m, scores.float(), torch.tensor(float("-inf"), device=scores.device)).reshape(-1)
    out = torch.zeros(flat.shape, dtype=mask.dtype, device=mask.device)
    out[torch.topk(flat, keep).indices] = 1  # exactly keep tokens, even among ties
    return out.view(mask.shape)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over the masked tokens (1 = perfect critic, <= 0 = useless)."""
    var_r = masked_var(returns, mask)
    return 1.0 - masked_var(returns - values, mask) / var_r.clamp(min=1e-8)


def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Group-normalised advantages (B,) for B = n_groups * group_size consecutive samples:
    (score - group mean) / (group std + eps), or only centred when ``scale`` is False."""
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    g = scores.view(-1, group_size).to(torch.float64)
    centred = g - g.mean(1, keepdim=True)
    if scale:
        centred = centred / (g.std(1, unbiased=True, keepdim=True) + eps) if group_size > 1 else centred
    return centred.reshape(-1).to(scores.dtype)


def loo_centred(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Scores (B,) minus the mean of the *other* samples of their group (leave-one-out, RLOO),
    for B = n_groups * group_size consecutive samples; unchanged when ``group_size`` is 1.

    Rewards differ far more between matrices (a banded matrix earns more than a power-law
    one whatever the kernel) than between the samples of one matrix; centring per matrix
    keeps only the part that depends on what the policy wrote."""
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    if group_size == 1:
        return scores.clone()
    g = scores.view(-1, group_size).to(torch.float64)
    others = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(-1).to(scores.dtype)


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
