"""PPO and GRPO on the kernel-writing policy, with rewards from the harness.

One loop, read top to bottom: collect a rollout batch (sample, score through the
harness, annotate with old/reference log-probs and values), turn scores into advantages
(PPO: token-level rewards with a per-token KL penalty and GAE on a value head; GRPO:
group-normalised scores, KL to the reference in the loss, no critic), then a few epochs
of clipped updates over minibatches.

Memory: with LoRA the reference is the same backbone with the adapters switched off and
the critic is a value head on the policy's hidden states, so one frozen backbone serves
actor, reference and critic; without LoRA (the small default model) the reference is a
frozen copy. Checkpoints every ``save_every`` steps; ``resume`` continues after a kill.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from sparserl.errors import SparseRLError
from sparserl.model.policy import Policy
from sparserl.rewards import RewardConfig
from sparserl.rl import core
from sparserl.rl.curve import plot_learning_curve
from sparserl.rl.rollout import (
    MatrixPool,
    RolloutBatch,
    collect,
    logprobs_and_entropy,
    matrix_items,
    token_logprobs,
)
from sparserl.devices import pick_device
from sparserl.train.common import (
    MetricLogger,
    NullLogger,
    load_train_state,
    progress,
    save_train_state,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RLConfig:
    """PPO / GRPO on the policy; one field per knob, a docstring under each."""

    algo: str = "ppo"
    """'ppo' (critic, GAE, token-level KL penalty) or 'grpo' (group-normalised, no critic)."""
    model: str = "runs/sft/checkpoint"
    """Policy checkpoint (from sparserl sft) or a HF model folder."""
    matrices: str = "runs/data"
    """SFT data folder (its train split's matrices) or a folder of .mtx/.mtx.gz/.npz files."""
    val_matrices: str | None = None
    """Held-out matrices for the learning curve (default: the data folder's val split)."""
    out: str = "runs/ppo"
    max_nnz: int = 128
    """Coordinate tokens per matrix when ``model`` is a plain HF folder (a checkpoint keeps its own)."""
    steps: int = 200
    """RL steps (one rollout batch and its updates each)."""
    matrices_per_step: int = 8
    samples_per_matrix: int = 4
    """Completions per matrix per step (GRPO's group size)."""
    ops: tuple[str, ...] = ("spmv",)
    k: int = 32
    """SpMM columns (when 'spmm' is in ops)."""
    max_new_tokens: int = 1536
    temperature: float = 1.0
    lr: float = 1e-5
    epochs: int = 2
    """Passes over each rollout batch."""
    minibatch: int = 8
    clip: float = 0.2
    vf_coef: float = 0.5
    vf_clip: float = 0.2
    gamma: float = 1.0
    lam: float = 1.0
    """GAE's lambda. 1.0: the score on the last token reaches the first tokens, where the format
    and parameters are chosen, undiminished (less the critic's value). With 0.95 and ~670-token
    kernels an untrained critic left the choice tokens 0.95^600 ~ 1e-13 of it, and all of PPO's
    push landed on the last tokens of the code (the 2026-11-30 H200 runs garbled kernel endings)."""
    kl_coef: float = 0.05
    kl_target: float | None = None
    """Adaptive KL target (None: fixed kl_coef)."""
    kl_estimator: str = "k1"
    """Per-token KL estimator in the reward (PPO) or loss (GRPO uses k3)."""
    whiten_advantages: bool = True
    score_baseline: str = "group"
    """PPO: 'group' subtracts from each score the mean score of the other samples of the same
    matrix (leave-one-out) before GAE, so an untrained critic does not turn "this matrix is
    hard" into "this kernel is bad"; 'none' is the textbook score. GRPO always centres per group."""
    pg_token_share: float = 0.05
    """Share of each batch's response tokens that get the policy-gradient loss: those where the
    sampling policy's entropy was highest ("forking" tokens, Wang et al. 2025); 1.0 is the
    textbook loss on every token. Below 1 the format/strategy/parameter choices carry the update
    and the near-deterministic code after them is left alone (the KL penalty and the critic
    still see every token). On the H200 (2026-11-30, default tiny model, lr 2e-5, 16 steps)
    0.05 kept held-out correctness (93.8% -> 94.9% PPO, 99.4% GRPO) while an earlier all-token
    run lost a fifth of its compiles to garbled code; not a controlled ablation (lambda differed)."""
    grad_clip: float = 1.0
    reward: RewardConfig = field(default_factory=RewardConfig)
    regime: str = "cold"
    """Harness timing regime the reward uses."""
    eval_every: int = 20
    eval_samples_per_matrix: int = 1
    save_every: int = 20
    resume: bool = False
    compile_only: bool = False
    """No GPU: rewards from compile + static checks only (CPU smoke runs)."""
    device: str = "auto"
    bf16: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.algo not in ("ppo", "grpo"):
            raise SparseRLError(f"algo must be ppo or grpo, got {self.algo!r}")
        if self.algo == "grpo" and self.samples_per_matrix < 2:
            raise SparseRLError("GRPO needs samples_per_matrix >= 2 (the group)")
        if min(self.steps, self.matrices_per_step, self.samples_per_matrix, self.epochs, self.minibatch) < 1:
            raise SparseRLError("steps, matrices_per_step, samples_per_matrix, epochs and minibatch must be >= 1")
        if not 0 < self.pg_token_share <= 1:
            raise SparseRLError(f"pg_token_share must be in (0, 1], got {self.pg_token_share}")
        if self.lr <= 0 or not 0 < self.clip < 1:
            raise SparseRLError("need lr > 0 and 0 < clip < 1")
        if self.score_baseline not in ("group", "none"):
            raise SparseRLError(f"score_baseline must be group or none, got {self.score_baseline!r}")
        if self.eval_every < 1 or self.save_every < 1:
            raise SparseRLError("eval_every and save_every must be >= 1")


def load_config_file(path: str | Path, **overrides) -> RLConfig:
    """RLConfig from a TOML or YAML file (keys = field names), then ``overrides``."""
    p = Path(path)
    if not p.exists():
        raise SparseRLError(f"{p}: no such config file")
    if p.suffix == ".toml":
        import tomllib

        raw = tomllib.loads(p.read_text())
    elif p.suffix in (".yaml", ".yml"):
        import yaml

        raw = yaml.safe_load(p.read_text()) or {}
    else:
        raise SparseRLError(f"{p}: config files are .toml or .yaml")
    known = {f.name for f in fields(RLConfig)}
    bad = set(raw) - known
    if bad:
        raise SparseRLError(f"{p}: unknown settings {sorted(bad)}")
    if "reward" in raw:
        raw["reward"] = RewardConfig(**raw["reward"])
    if "ops" in raw:
        raw["ops"] = tuple(raw["ops"])
    return RLConfig(**(raw | overrides))


class ValueHead(torch.nn.Module):
    """The critic: a linear value on the policy's last hidden states (shared backbone)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.v = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.v.weight)
        torch.nn.init.zeros_(self.v.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.v(h.float()).squeeze(-1)


class ActorCritic(torch.nn.Module):
    """Policy and value head as one module, so one DistributedDataParallel wrapper averages
    the gradients of both. ``forward`` -> (logits (B, T, V), values (B, T) or None)."""

    def __init__(self, policy: Policy, value_head: ValueHead | None):
        super().__init__()
        self.policy, self.value_head = policy, value_head

    def forward(self, samples, ids: torch.Tensor, mask: torch.Tensor):
        logits, hidden = self.policy.response_forward(samples, ids, mask, hidden=self.value_head is not None)
        return logits, (self.value_head(hidden) if self.value_head is not None else None)


def _matrix_paths(source: str, split: str) -> list[str]:
    p = Path(source)
    if (p / f"{split}.jsonl").exists():
        from sparserl.data.sft_build import read_jsonl

        text = (p / f"{split}.jsonl").read_text()
        return sorted({r["matrix"] for r in read_jsonl(p / f"{split}.jsonl")}) if text.strip() else []
    if p.is_dir():
        return sorted(str(f) for f in p.iterdir() if f.name.endswith((".mtx", ".mtx.gz", ".npz")))
    raise SparseRLError(f"{source}: neither an SFT data folder nor a folder of matrices")


class Reference:
    """Log-probs under the reference policy (the policy the run started from): adapters off
    (LoRA) or a frozen copy.

    At a resume the live policy has moved on, so the starting point comes back separately:
    ``frozen`` is the starting policy reloaded (full fine-tuning), ``encoder_state`` the
    starting matrix encoder (LoRA; the backbone with adapters off has not changed)."""

    def __init__(self, policy: Policy, frozen: Policy | None = None, encoder_state: dict | None = None):
        self.policy = policy
        self.lora = policy.config.lora is not None
        source = frozen if frozen is not None else policy
        self.encoder = copy.deepcopy(source.encoder).requires_grad_(False)
        if encoder_state is not None:
            self.encoder.load_state_dict(encoder_state)
        self.copy = None if self.lora else (frozen if frozen is not None else copy.deepcopy(policy))
        if self.copy is not None:
            self.copy.requires_grad_(False).eval()

    @torch.no_grad()
    def __call__(self, samples, ids, mask) -> torch.Tensor:
        if self.copy is not None:
            logits, _ = self.copy.response_forward(samples, ids, mask)
            return token_logprobs(logits, ids)
        live = self.policy.encoder
        self.policy.encoder = self.encoder
        try:
            with self.policy.lm.disable_adapter():
                logits, _ = self.policy.response_forward(samples, ids, mask)
        finally:
            self.policy.encoder = live
        return token_logprobs(logits, ids)


def _advantages(cfg: RLConfig, batch: RolloutBatch, kl_coef: float):
    if cfg.algo == "grpo":
        adv = core.grpo_advantages(batch.scores, cfg.samples_per_matrix)[:, None] * batch.mask
        return adv, None
    kl = core.kl_penalty(batch.old_logp, batch.ref_logp, cfg.kl_estimator)
    scores = core.loo_centred(batch.scores, cfg.samples_per_matrix) if cfg.score_baseline == "group" else batch.scores
    rewards = core.token_rewards(scores, kl, batch.mask, kl_coef)
    adv, returns = core.gae(rewards, batch.values, batch.mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = core.masked_whiten(adv, batch.mask)
    return adv, returns


def _update(cfg: RLConfig, policy: Policy, value_head, opt, params, batch: RolloutBatch, adv, returns,
            kl_coef: float, rng: np.random.Generator, device, model: torch.nn.Module | None = None) -> dict:
    """Epochs x minibatches of clipped PPO/GRPO updates on one rollout batch. ``model`` is the
    ActorCritic to call (data-parallel: its DDP wrapper); by default policy + value head."""
    model = model if model is not None else ActorCritic(policy, value_head)
    stats: dict[str, list[float]] = {}
    B = batch.response.shape[0]
    pg_mask = batch.mask
    if cfg.pg_token_share < 1.0:
        if batch.entropy is None:
            raise SparseRLError("pg_token_share < 1 needs the rollout's entropies")
        pg_mask = core.top_share_mask(batch.entropy, batch.mask, cfg.pg_token_share)
    for _ in range(cfg.epochs):
        order = torch.as_tensor(rng.permutation(B), device=batch.response.device)
        for start in range(0, B, cfg.minibatch):
            idx = order[start: start + cfg.minibatch]
            ids, mask = batch.response[idx], batch.mask[idx]
            samples = [batch.samples[int(i)] for i in idx]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda"):
                logits, values = model(samples, ids, mask)
            logp, ent_tokens = logprobs_and_entropy(logits, ids)  # one chunked log-softmax for both
            pl = core.policy_loss(logp, batch.old_logp[idx], adv[idx], pg_mask[idx], cfg.clip)
            loss = pl.loss
            ent = core.masked_mean(ent_tokens, mask)
            if values is not None:
                vl, vclip = core.value_loss(values, batch.values[idx], returns[idx], mask, cfg.vf_clip)
                loss = loss + cfg.vf_coef * vl
                stats.setdefault("losses/value_loss", []).append(vl.item())
                stats.setdefault("losses/value_clipfrac", []).append(vclip.item())
            else:  # GRPO: KL to the reference in the loss
                kl = core.masked_mean(core.kl_penalty(logp, batch.ref_logp[idx], "k3"), mask)
                loss = loss + kl_coef * kl
                stats.setdefault("losses/kl_loss", []).append(kl.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            stats.setdefault("losses/policy_loss", []).append(pl.loss.item())
            stats.setdefault("losses/clipfrac", []).append(pl.clipfrac.item())
            stats.setdefault("losses/approx_kl", []).append(pl.approx_kl.item())
            stats.setdefault("losses/entropy", []).append(ent.item())
            stats.setdefault("charts/grad_norm", []).append(float(gn))
    return {k: float(np.mean(v)) for k, v in stats.items()}


def _batch_metrics(batch: RolloutBatch, cfg: RLConfig) -> dict:
    res = batch.results
    n = len(res)
    out = {"reward/mean": float(batch.scores.mean()), "reward/compile_rate": sum(r.compiled for r in res) / n,
           "reward/correct_rate": sum(r.correct for r in res) / n,
           "charts/response_tokens": float(batch.mask.sum(1).mean())}
    sp = [r.speedup for r in res if r.correct and r.speedup]
    if sp:
        out["reward/speedup_geomean"] = float(np.exp(np.mean(np.log(sp))))
    kl = core.masked_mean(batch.old_logp - batch.ref_logp, batch.mask)
    out["charts/kl_to_ref"] = float(kl)
    if batch.values is not None:
        out["charts/values_mean"] = float(core.masked_mean(batch.values, batch.mask))
    return out


def evaluate_heldout(policy: Policy, evaluator, items, cfg: RLConfig, seed: int) -> dict:
    """One sampled completion per held-out matrix: compile rate, correctness, speedup geomean."""
    if not items:
        return {}
    samples = [it.sample() for it in items for _ in range(cfg.eval_samples_per_matrix)]
    reps = [it for it in items for _ in range(cfg.eval_samples_per_matrix)]
    texts = []
    for i in range(0, len(samples), 32):
        texts += policy.generate(samples[i:i + 32], max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                 seed=seed + i)
    res = evaluator.evaluate_many([(t, it.ref, it.op, it.k) for t, it in zip(texts, reps)])
    n = len(res)
    out = {"heldout/compile_rate": sum(r.compiled for r in res) / n, "heldout/correct_rate": sum(r.correct for r in res) / n}
    sp = [r.speedup for r in res if r.correct and r.speedup]
    if sp:
        out["heldout/speedup_geomean_correct"] = float(np.exp(np.mean(np.log(sp))))
    return out


def train_rl(cfg: RLConfig, evaluator=None) -> dict:
    """Run PPO or GRPO; returns the final metrics."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.train import dist
    from sparserl.train.sft import SFTConfig, build_policy

    info, dist_device = dist.init(cfg.device)  # torchrun: one process per GPU (train/dist.py)
    device = dist_device or pick_device(cfg.device)
    own_eval = evaluator is None
    ev = evaluator or Evaluator(HarnessConfig(
        compile_only=cfg.compile_only, regimes=(cfg.regime,), reward_regime=cfg.regime,
        devices=dist.harness_devices(info, device)))
    if not cfg.compile_only and not ev.has_gpu:
        raise SparseRLError("RL needs the harness on a GPU for correctness and speed rewards; "
                            "pass --compile-only for a CPU smoke run (compile rewards only)")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt, state_path = out / "checkpoint", out / "state.pt"
    resuming = cfg.resume and state_path.exists() and (ckpt / "policy.json").exists()

    def starting_policy() -> Policy:
        return build_policy(SFTConfig(model=cfg.model, max_nnz=cfg.max_nnz, seed=cfg.seed), device).to(device)

    policy = Policy.load(ckpt, device=str(device)).to(device) if resuming else starting_policy()
    value_head = ValueHead(policy.base_model.config.hidden_size).to(device) if cfg.algo == "ppo" else None
    params = [p for p in policy.parameters() if p.requires_grad] + (list(value_head.parameters()) if value_head else [])
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    kl_ctl = core.AdaptiveKL(cfg.kl_coef, cfg.kl_target)
    rng = np.random.default_rng(cfg.seed)
    step = 0
    st: dict = {}
    if resuming:
        st = load_train_state(state_path, opt, rng, device)
        if info.rank:  # rank 0's saved stream; the other ranks draw their own
            rng = np.random.default_rng([cfg.seed, info.rank, st["step"]])
        if value_head is not None and st.get("value_head"):
            value_head.load_state_dict(st["value_head"])
        step, kl_ctl.value = st["step"], st["kl_coef"]
        log.info("resumed %s at step %d", cfg.algo, step)
    model = dist.wrap(ActorCritic(policy, value_head), info, device)  # DDP: gradients averaged over ranks
    # the reference after the wrap, which made every rank's replica rank 0's
    if not resuming:
        reference = Reference(policy)
    else:
        if st.get("ref_encoder") is None:
            log.warning("%s has no reference encoder (older run): the KL reference uses the restored one",
                        state_path)
        frozen = None
        if policy.config.lora is None:  # the KL keeps pointing at the starting policy, reloaded from cfg.model
            frozen = starting_policy()
        reference = Reference(policy, frozen=frozen, encoder_state=st.get("ref_encoder"))
    if not cfg.compile_only:
        _ = ev.pool  # start the GPU worker now, so its lease exists before the first rollout
    train_paths = _matrix_paths(cfg.matrices, "train")
    val_paths = _matrix_paths(cfg.val_matrices, "val") if cfg.val_matrices else (
        _matrix_paths(cfg.matrices, "val") if (Path(cfg.matrices) / "val.jsonl").exists() else [])
    pool = MatrixPool(matrix_items(train_paths, ev, policy, cfg.ops, cfg.k), seed=cfg.seed + step + 7919 * info.rank)
    val_items = matrix_items(val_paths, ev, policy, cfg.ops, cfg.k) if info.is_main else []
    logger = MetricLogger(out, resumed_at=step if resuming else None) if info.is_main else NullLogger()

    def save() -> None:
        dist.check_in_sync(params, info)
        if not info.is_main:
            return
        policy.save(ckpt)
        save_train_state(state_path, opt, step, rng, asdict(cfg), kl_coef=kl_ctl.value,
                         value_head=value_head.state_dict() if value_head else None,
                         ref_encoder=reference.encoder.state_dict())

    last: dict = {}
    samples_done, t_start = 0, time.perf_counter()
    try:
        if step == 0 and val_items:  # the starting point of the learning curve
            logger.log(0, evaluate_heldout(policy, ev, val_items, cfg, seed=cfg.seed))
        with progress(info.is_main) as bar:
            task = bar.add_task(cfg.algo, total=cfg.steps, completed=step)
            while step < cfg.steps:
                items = pool.next(cfg.matrices_per_step)
                policy.eval()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda"):
                    batch = collect(policy, reference, value_head, ev, items, cfg.samples_per_matrix,
                                    cfg.max_new_tokens, cfg.temperature, cfg.reward,
                                    seed=cfg.seed * 100_003 + step + 1_000_003 * info.rank)
                policy.train()
                t_up = time.perf_counter()
                adv, returns = _advantages(cfg, batch, kl_ctl.value)
                upd = _update(cfg, policy, value_head, opt, params, batch, adv, returns, kl_ctl.value, rng, device,
                              model=model)
                t_update = time.perf_counter() - t_up
                metrics = _batch_metrics(batch, cfg) | upd | batch.timings | {"time/update": t_update}
                if returns is not None:
                    metrics["losses/explained_variance"] = float(core.explained_variance(batch.values, returns,
                                                                                         batch.mask))
                step += 1
                samples_done += len(batch.texts)
                metrics["charts/samples_per_s"] = samples_done / (time.perf_counter() - t_start)
                metrics = dist.gather_metrics(metrics, info, summed=("charts/samples_per_s",))  # all ranks
                metrics["charts/kl_coef"] = kl_ctl.update(metrics["charts/kl_to_ref"], len(batch.texts) * info.world)
                if (step % cfg.eval_every == 0 or step == cfg.steps) and info.is_main:
                    metrics |= evaluate_heldout(policy, ev, val_items, cfg, seed=cfg.seed + step)
                logger.log(step, metrics)
                last = metrics
                if step % cfg.save_every == 0 or step == cfg.steps:
                    save()
                bar.update(task, advance=1, description=f"{cfg.algo} reward {metrics['reward/mean']:.3f}")
    finally:
        logger.close()
        if own_eval:
            ev.close()
    del model  # before leaving the process group (dist.shutdown)
    dist.shutdown(info)
    result = {"algo": cfg.algo, "steps": step, "checkpoint": str(ckpt), "rank": info.rank, "world_size": info.world,
              **last}
    if info.is_main:
        result["learning_curve"] = plot_learning_curve(out / "metrics.jsonl", out / "learning_curve.png")
        (out / "result.json").write_text(json.dumps(result, indent=1))
    return result
