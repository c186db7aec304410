"""The learner's side of PPO/GRPO: the critic, the reference, advantages and the clipped update.

* :class:`ValueHead` / :class:`ActorCritic`: the critic is a linear value on the policy's last
  hidden states, *detached*: the value loss trains the head only, never the policy (a badly
  fitted critic cannot drag the policy's gradient).
* :class:`Reference`: log-probs under the policy the run started from (its starting adapters
  swapped in with LoRA, else a frozen copy).
* :func:`build_optimizer`: one AdamW, two groups (policy at ``lr``, critic at ``vf_lr``), each with
  its own gradient-norm clip, and a linear warm-up (:func:`set_lr`).
* :func:`advantages`: rollout batch -> per-token advantages (and returns for the critic).
* :func:`update`: epochs x minibatches of the clipped surrogate on the selected tokens plus a KL
  loss to the reference on every token, losses over fixed token counts, stopped early when the
  policy has moved ``target_kl`` from the one that sampled.

The learner scores tokens exactly as the sampler drew them: at the sampling temperature, in the
sampler's precision (no autocast unless ``bf16``), with dropout off (:func:`rollout.train_mode`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from sparserl.errors import SparseRLError
from sparserl.model.policy import Policy
from sparserl.rl import core
from sparserl.rl.config import RLConfig
from sparserl.rl.rollout import RolloutBatch, logprobs_and_entropy, token_logprobs, train_mode
from sparserl.runtime.dist import mean_over_ranks


class ValueHead(torch.nn.Module):
    """The critic: a linear value on the policy's last hidden states (shared backbone), read detached."""

    def __init__(self, hidden: int):
        super().__init__()
        self.v = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.v.weight)
        torch.nn.init.zeros_(self.v.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.v(h.detach().float()).squeeze(-1)


class ActorCritic(torch.nn.Module):
    """Policy and value head as one module, so one DistributedDataParallel wrapper averages
    the gradients of both. ``forward`` -> (logits (B, T, V), values (B, T) or None)."""

    def __init__(self, policy: Policy, value_head: ValueHead | None):
        super().__init__()
        self.policy, self.value_head = policy, value_head

    def forward(self, samples, ids: torch.Tensor, mask: torch.Tensor):
        logits, hidden = self.policy.response_forward(samples, ids, mask, hidden=self.value_head is not None)
        return logits, (self.value_head(hidden) if self.value_head is not None else None)


def adapter_weights(policy: Policy) -> dict[str, torch.Tensor]:
    """The LoRA adapters' weights of ``policy``, by parameter name (copies)."""
    return {n: p.detach().clone() for n, p in policy.lm.named_parameters() if "lora_" in n}


class Reference:
    """Log-probs under the reference policy (the policy the run started from): the starting
    adapters swapped in (LoRA) or a frozen copy.

    With LoRA the run may start from adapters SFT trained, so turning them off would give the
    pre-SFT base, not the starting policy: the starting adapters' weights are kept (a LoRA-sized
    copy) and put in place, bit for bit, for each reference pass, the live ones back after it.
    At a resume the live policy has moved on, so the starting point comes back separately:
    ``frozen`` is the starting policy reloaded (full fine-tuning), ``encoder_state`` the
    starting matrix encoder and ``adapter_state`` the starting adapters (LoRA)."""

    def __init__(self, policy: Policy, frozen: Policy | None = None, encoder_state: dict | None = None,
                 adapter_state: dict | None = None):
        self.policy = policy
        self.lora = policy.config.lora is not None
        source = frozen if frozen is not None else policy
        self.encoder = copy.deepcopy(source.encoder).requires_grad_(False)
        if encoder_state is not None:
            self.encoder.load_state_dict(encoder_state)
        self.copy = None if self.lora else (frozen if frozen is not None else copy.deepcopy(policy))
        if self.copy is not None:
            self.copy.requires_grad_(False).eval()
        self.adapters = None
        self._live: dict[str, torch.nn.Parameter] = {}  # the adapters' parameters, swapped for each pass
        if self.lora:
            self._live = {n: p for n, p in policy.lm.named_parameters() if "lora_" in n}
            given = adapter_state if adapter_state is not None else adapter_weights(policy)
            if set(given) != set(self._live):
                raise ValueError("the saved starting adapters do not match the policy's adapters")
            self.adapters = {n: t.to(self._live[n].device, self._live[n].dtype) for n, t in given.items()}

    @torch.no_grad()
    def __call__(self, samples, ids, mask, temperature: float = 1.0) -> torch.Tensor:
        """(B, T) log-probs of ``ids`` under softmax(reference logits / temperature)."""
        if self.copy is not None:
            logits, _ = self.copy.response_forward(samples, ids, mask)
            return token_logprobs(logits, ids, temperature=temperature)
        encoder = self.policy.encoder
        kept = {n: p.detach().clone() for n, p in self._live.items()}
        self.policy.encoder = self.encoder
        try:
            for n, p in self._live.items():
                p.copy_(self.adapters[n])
            with train_mode(self.policy, False):
                logits, _ = self.policy.response_forward(samples, ids, mask)
        finally:
            self.policy.encoder = encoder
            for n, p in self._live.items():
                p.copy_(kept[n])
        return token_logprobs(logits, ids, temperature=temperature)


def autocast(cfg: RLConfig, device: torch.device):
    """The learner's precision: bf16 autocast only when asked for and on a GPU (see RLConfig.bf16)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda")


# -- optimizer ---------------------------------------------------------------------------------


@dataclass
class Optim:
    """AdamW with a policy group (index 0) and, with a critic, a value group (index 1)."""

    opt: torch.optim.Optimizer
    policy_params: list[torch.nn.Parameter]
    value_params: list[torch.nn.Parameter]

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self.policy_params + self.value_params


def build_optimizer(policy: Policy, value_head: ValueHead | None, cfg: RLConfig) -> Optim:
    """One AdamW, the policy's trainable parameters at ``cfg.lr`` and the critic's at ``cfg.vf_lr``."""
    pp = [p for p in policy.parameters() if p.requires_grad]
    vp = list(value_head.parameters()) if value_head is not None else []
    groups = [{"params": pp, "lr": cfg.lr, "base_lr": cfg.lr}]
    if vp:
        groups.append({"params": vp, "lr": cfg.vf_lr, "base_lr": cfg.vf_lr})
    return Optim(torch.optim.AdamW(groups, weight_decay=0.0), pp, vp)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up: (step + 1) / warmup_steps for the first ``warmup_steps`` steps (0-based), then 1."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (step + 1) / warmup_steps)


def set_lr(optim: Optim, cfg: RLConfig, step: int) -> float:
    """Set every group's lr for RL step ``step`` (0-based); returns the policy's."""
    f = warmup_factor(step, cfg.warmup_steps)
    for g in optim.opt.param_groups:
        g["lr"] = g["base_lr"] * f
    return optim.opt.param_groups[0]["lr"]


# -- advantages --------------------------------------------------------------------------------


def group_scores(cfg: RLConfig, batch: RolloutBatch) -> torch.Tensor:
    """(B,) each completion's score relative to its group (its matrix's samples), or the raw score
    (PPO with score_baseline 'none'); infrastructure failures get 0."""
    G, valid = cfg.samples_per_matrix, batch.valid_mask
    if cfg.algo == "grpo" and cfg.grpo_baseline == "mean_std":
        return core.grpo_advantages(batch.scores, G, valid=valid, min_std=cfg.adv_std_floor)
    if cfg.algo == "ppo" and cfg.score_baseline == "none":
        return batch.scores * valid.to(batch.scores.dtype)
    return core.max_k_advantages(batch.scores, G, cfg.best_of_k, valid)  # k = 1: leave-one-out


def advantages(cfg: RLConfig, batch: RolloutBatch, kl_coef: float | None = None):
    """(advantages (B, T), returns (B, T) or None without a critic), zero outside ``batch.mask``.

    With a critic: token rewards (the group-relative score on the last token, minus ``kl_coef``
    times the per-token KL penalty when it is > 0; default ``cfg.kl_coef``) through GAE. Without:
    the group-relative score on every token.

    ``whiten_advantages``: divided by the batch's token std (at least ``adv_std_floor``); re-centred
    on the batch's token mean only for PPO's textbook score (``score_baseline`` 'none'). After a
    group baseline, re-centring on a token-weighted mean would flip the sign of small advantages
    (:func:`core.masked_scale`); GRPO's 'mean_std' is normalised per group already."""
    kl_coef = cfg.kl_coef if kl_coef is None else kl_coef
    scores = group_scores(cfg, batch)
    mask = batch.mask
    if not cfg.uses_critic:
        adv = scores[:, None].to(mask.dtype) * mask
        returns = None
    else:
        kl = core.kl_penalty(batch.old_logp, batch.ref_logp, cfg.kl_estimator)
        rewards = core.token_rewards(scores, kl, mask, kl_coef)
        adv, returns = core.gae(rewards, batch.values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages and not (cfg.algo == "grpo" and cfg.grpo_baseline == "mean_std"):
        if has_group_baseline(cfg):  # centred per group already: scale only, never flip a sign
            adv = core.masked_scale(adv, mask, min_std=cfg.adv_std_floor)
        else:  # the textbook score: the batch mean is the baseline
            adv = core.masked_whiten(adv, mask, min_std=cfg.adv_std_floor)
    return adv, returns


def has_group_baseline(cfg: RLConfig) -> bool:
    """Whether :func:`group_scores` subtracts a per-group baseline (all but PPO's score_baseline 'none')."""
    return not (cfg.algo == "ppo" and cfg.score_baseline == "none")


# -- the update --------------------------------------------------------------------------------


@dataclass
class Plan:
    """What every minibatch of one update shares."""

    pg_mask: torch.Tensor
    """(B, T) tokens with the policy-gradient loss."""
    pg_denom: float
    """Fixed count the policy-gradient token sum is divided by: the batch's pg tokens scaled to a minibatch."""
    all_denom: float
    """Fixed count for the KL loss, entropy bonus and KL-Cov terms: all response tokens, scaled likewise."""
    kl_loss_coef: float
    vf_clip: float | None
    """Absolute value clip for this batch (cfg.vf_clip times the returns' std), or None."""

    @classmethod
    def of(cls, cfg: RLConfig, batch: RolloutBatch, returns: torch.Tensor | None, kl_loss_coef: float) -> Plan:
        pg_mask = pg_token_mask(cfg, batch)
        scale = min(cfg.minibatch, batch.mask.shape[0]) / batch.mask.shape[0]
        vf_clip = None
        if cfg.vf_clip is not None and returns is not None:
            vf_clip = cfg.vf_clip * max(float(core.masked_var(returns, batch.mask).sqrt()), 1e-3)
        return cls(pg_mask, max(float(pg_mask.sum()) * scale, 1.0), max(float(batch.mask.sum()) * scale, 1.0),
                   kl_loss_coef, vf_clip)


def pg_token_mask(cfg: RLConfig, batch: RolloutBatch) -> torch.Tensor:
    """(B, T) the tokens that get the policy-gradient loss (all, or each sequence's highest-entropy share)."""
    if cfg.pg_token_share >= 1.0:
        return batch.mask
    if batch.entropy is None:
        raise SparseRLError("pg_token_share < 1 needs the rollout's entropies (rollout.annotate computes them)")
    return core.top_share_mask(batch.entropy, batch.mask, cfg.pg_token_share)


def minibatch_loss(cfg: RLConfig, model, batch: RolloutBatch, idx: torch.Tensor, adv: torch.Tensor,
                   returns: torch.Tensor | None, plan: Plan, device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(policy-side loss, value loss or 0, stats) on the completions ``idx`` of ``batch``."""
    ids, mask = batch.response[idx], batch.mask[idx]
    samples = [batch.samples[int(i)] for i in idx]
    with autocast(cfg, device):
        logits, values = model(samples, ids, mask)
    logp, ent = logprobs_and_entropy(logits, ids, temperature=cfg.temperature, entropy_grad=cfg.entropy_coef > 0)
    old = batch.old_logp[idx]
    pl = core.policy_loss(logp, old, adv[idx], plan.pg_mask[idx], cfg.clip, denom=plan.pg_denom)
    kl = core.masked_sum_over(core.kl_loss_terms(logp, batch.ref_logp[idx], cfg.kl_loss), mask, plan.all_denom)
    loss = pl.loss + plan.kl_loss_coef * kl
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * core.masked_sum_over(ent, mask, plan.all_denom)
    if cfg.kl_cov_share > 0:
        sel = core.covariance_top_mask(logp, adv[idx], mask, cfg.kl_cov_share)
        loss = loss + cfg.kl_cov_coef * core.masked_sum_over((logp - old).abs(), sel, plan.all_denom)
    stats = {"losses/policy_loss": pl.loss.item(), "losses/clipfrac": pl.clipfrac.item(),
             "losses/kl_loss": kl.item(), "losses/entropy": core.masked_mean(ent.detach(), mask).item(),
             "losses/approx_kl": core.masked_mean(0.5 * (logp.detach() - old) ** 2, mask).item()}
    vloss = torch.zeros((), device=logp.device)
    if values is not None and returns is not None:
        vloss, vclip = core.value_loss(values, batch.values[idx], returns[idx], mask, plan.vf_clip)
        stats |= {"losses/value_loss": vloss.item(), "losses/value_clipfrac": vclip.item()}
    return loss, vloss, stats


def _step(optim: Optim, cfg: RLConfig, loss: torch.Tensor, vloss: torch.Tensor) -> dict:
    """Backward, one norm clip per head, step; returns the gradient norms before clipping."""
    optim.opt.zero_grad(set_to_none=True)
    (loss + vloss).backward()  # disjoint parameters: the critic reads detached hidden states
    out = {"charts/grad_norm": float(torch.nn.utils.clip_grad_norm_(optim.policy_params, cfg.grad_clip))}
    if optim.value_params:
        out["charts/value_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(optim.value_params, cfg.vf_grad_clip))
    optim.opt.step()
    return out


def update(cfg: RLConfig, model: torch.nn.Module, optim: Optim, batch: RolloutBatch, adv: torch.Tensor,
           returns: torch.Tensor | None, kl_loss_coef: float, rng: np.random.Generator, device) -> dict:
    """Epochs x minibatches of clipped updates on one rollout batch; ``model`` is the ActorCritic
    (data-parallel: its DDP wrapper). Stops early (before applying the minibatch) once the
    approximate KL to the rollout policy exceeds ``cfg.target_kl``. Returns mean statistics."""
    stats: dict[str, list[float]] = {}
    plan = Plan.of(cfg, batch, returns, kl_loss_coef)
    with train_mode(model):
        applied, stopped = _epochs(cfg, model, optim, batch, adv, returns, plan, rng, device, stats)
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    out |= {"charts/update_minibatches": float(applied), "charts/early_stop": float(stopped),
            "charts/pg_token_share": float(plan.pg_mask.sum()) / max(float(batch.mask.sum()), 1.0)}
    return out


def _epochs(cfg: RLConfig, model, optim: Optim, batch: RolloutBatch, adv, returns, plan: Plan, rng, device,
            stats: dict) -> tuple[int, bool]:
    """The loop of :func:`update`; appends to ``stats``, returns (minibatches applied, stopped early)."""
    B = batch.response.shape[0]
    applied = 0
    for _ in range(cfg.epochs):
        order = torch.as_tensor(rng.permutation(B), device=batch.response.device)
        for start in range(0, B, cfg.minibatch):
            idx = order[start: start + cfg.minibatch]
            loss, vloss, st = minibatch_loss(cfg, model, batch, idx, adv, returns, plan, device)
            for k, v in st.items():
                stats.setdefault(k, []).append(v)
            if cfg.target_kl is not None and mean_over_ranks(st["losses/approx_kl"], device) > cfg.target_kl:
                return applied, True  # every rank decides on the same mean: DDP's collectives stay paired
            for k, v in _step(optim, cfg, loss, vloss).items():
                stats.setdefault(k, []).append(v)
            applied += 1
    return applied, False
