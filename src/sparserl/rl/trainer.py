"""PPO and GRPO on the kernel-writing policy, with rewards from the harness.

One loop, read top to bottom (:func:`train_rl`): set the run up (:func:`setup`), then per step
(:func:`rl_step`) collect a rollout batch (sample, score through the harness, annotate with
old/reference log-probs and values), turn scores into advantages and run a few epochs of
clipped updates over minibatches (:mod:`sparserl.rl.update`), log, evaluate held out, save.

Memory: with LoRA the reference is the same backbone with the starting adapters swapped in (a
LoRA-sized copy of them) and the critic is a value head on the policy's hidden states, so one frozen backbone serves
actor, reference and critic; without LoRA (the small default model) the reference is a
frozen copy. Checkpoints every ``save_every`` steps; ``resume`` continues after a kill.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from sparserl.data.rows import read_rows
from sparserl.devices import pick_device
from sparserl.encoding import EncodingConfig
from sparserl.errors import SparseRLError
from sparserl.eval.metrics import geomean
from sparserl.eval.library_match import LibraryMatch, library_match
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.kernels.contract import Op
from sparserl.matrices import generate
from sparserl.matrices.generators import family_names
from sparserl.model.build import build_policy
from sparserl.model.policy import Policy, PolicyConfig, uses_card
from sparserl.progress import progress
from sparserl.request.context import MatrixContext
from sparserl.rl import core
from sparserl.rl.best_known import BestKnown
from sparserl.rl.config import RLConfig, load_config_file
from sparserl.rl.curve import plot_learning_curve
from sparserl.rl.rollout import MatrixItem, MatrixPool, RolloutBatch, collect, matrix_items
from sparserl.rl.turns import collect_turns
from sparserl.rl.update import (
    ActorCritic,
    Optim,
    Reference,
    ValueHead,
    adapter_weights,
    advantages,
    autocast,
    build_optimizer,
    set_lr,
    update,
)
from sparserl.runtime import dist
from sparserl.runtime.metrics import MetricLogger, NullLogger
from sparserl.runtime.optim import load_train_state, save_train_state
from sparserl.search.store import open_store

log = logging.getLogger(__name__)

__all__ = ["RLConfig", "load_config_file", "train_rl", "evaluate_heldout", "batch_metrics"]


def _matrix_paths(source: str, split: str) -> list[str]:
    p = Path(source)
    if (p / f"{split}.jsonl").exists():
        return sorted({r.matrix for r in read_rows(p / f"{split}.jsonl") if r.matrix})
    if p.is_dir():
        return sorted(str(f) for f in p.iterdir() if f.name.endswith((".mtx", ".mtx.gz", ".npz")))
    raise SparseRLError(f"{source}: neither an SFT data folder nor a folder of matrices")


def matrix_item(ctx: MatrixContext, evaluator, policy: Policy) -> MatrixItem:
    """A request's matrix as an RL pool's item (registered with the harness, with the policy's input)."""
    card = ctx.prompt_card if uses_card(policy.config) else None
    return MatrixItem(ctx.name, ctx.A, ctx.ref(evaluator), ctx.encoder_input(policy.config.encoding), ctx.op, ctx.k,
                      card)


def large_items(cfg: RLConfig, evaluator, policy: Policy) -> list[MatrixItem]:
    """``large_per_family`` generated matrices of ``large_rows`` rows per family (seeded), for the pool."""
    per = cfg.large_per_family if cfg.large_per_family is not None else (0 if cfg.compile_only else 1)
    items = []
    for f_i, fam in enumerate(family_names()):
        for j in range(per):
            ctx = MatrixContext(generate(fam, cfg.large_rows, seed=cfg.seed + 1000 * f_i + j),
                                f"{fam}_large{j}_{cfg.large_rows}", Op.SPMV)
            items += [matrix_item(ctx.with_op(o, cfg.k), evaluator, policy) for o in cfg.ops]
    if items:
        log.info("RL pool: %d large matrices (%d rows) added", len(items), cfg.large_rows)
    return items


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
    out = {"heldout/compile_rate": sum(r.compiled for r in res) / n}
    if not cfg.compile_only:  # compile-only: nothing was run, so there is no correctness to report
        out["heldout/correct_rate"] = sum(r.correct for r in res) / n
    sp = [r.speedup for r in res if r.correct and r.speedup]
    if sp:
        out["heldout/speedup_geomean_correct"] = geomean(sp)
    return out


def batch_metrics(batch: RolloutBatch, cfg: RLConfig) -> dict:
    """Reward, sampler/learner agreement, signal and KL figures of one rollout batch."""
    valid = batch.valid_mask
    res = [r for r, v in zip(batch.results, valid.tolist()) if v] or batch.results
    n = max(len(res), 1)
    out = {"reward/mean": float(batch.scores[valid].mean()) if bool(valid.any()) else 0.0,
           "reward/compile_rate": sum(r.compiled for r in res) / n,
           "reward/infra_failure_share": 1.0 - float(valid.float().mean()),
           "charts/response_tokens": float(batch.mask.sum(1)[valid].mean()) if bool(valid.any()) else 0.0}
    if not cfg.compile_only:  # compile-only: nothing was run, so there is no correctness to report
        out["reward/correct_rate"] = sum(r.correct for r in res) / n
    sp = [r.speedup for r in res if r.correct and r.speedup]
    if sp:
        out["reward/speedup_geomean"] = geomean(sp)
    uniform = core.uniform_groups(batch.scores, cfg.samples_per_matrix, valid)
    out["reward/uniform_group_share"] = float(uniform.float().mean())
    out["charts/no_signal"] = float(bool(uniform.all()))
    out["charts/kl_to_ref"] = float(core.masked_mean(batch.old_logp - batch.ref_logp, batch.mask))
    if batch.sample_logp is not None:  # how far the learner's log-probs are from the sampler's
        gap = (batch.sample_logp - batch.old_logp).abs() * batch.mask
        out["rollout/logp_gap"] = float(core.masked_mean(gap, batch.mask))
        out["rollout/logp_gap_max"] = float(gap.max()) if gap.numel() else 0.0
    if batch.values is not None:
        out["charts/values_mean"] = float(core.masked_mean(batch.values, batch.mask))
    kinds = Counter(library_match(t, r.op) for t, r in zip(batch.texts, batch.results))  # against the library
    for c in LibraryMatch:
        out[f"samples/{c.value}_share"] = kinds[c] / max(len(batch.texts), 1)
    return out


@dataclass
class Run:
    """Everything one RL run holds between steps."""

    cfg: RLConfig
    info: dist.DistInfo
    device: torch.device
    evaluator: Evaluator
    own_evaluator: bool
    policy: Policy
    value_head: ValueHead | None
    optim: Optim
    model: torch.nn.Module  # ActorCritic, DDP-wrapped when distributed
    reference: Reference
    kl_ctl: core.AdaptiveKL
    rng: np.random.Generator
    pool: MatrixPool | None = None
    val_items: list = field(default_factory=list)
    logger: MetricLogger | NullLogger | None = None
    step: int = 0
    resumed: bool = False
    samples_done: int = 0
    t_start: float = field(default_factory=time.perf_counter)
    best_known: BestKnown | None = None
    """The best-known kernels the relative_best reward reads (None for the other rewards)."""

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)


def _evaluator(cfg: RLConfig, info, device, evaluator):
    """(evaluator, whether this run owns it); refuses a GPU run without a GPU."""
    ev = evaluator or Evaluator(HarnessConfig(
        compile_only=cfg.compile_only, regimes=(cfg.regime,), reward_regime=cfg.regime,
        devices=dist.harness_devices(info, device)))
    if not cfg.compile_only and not ev.has_gpu:
        raise SparseRLError("RL needs the harness on a GPU for correctness and speed rewards; "
                            "pass --compile-only for a CPU smoke run (compile rewards only)")
    return ev, evaluator is None


def _starting_policy(cfg: RLConfig, device) -> Policy:
    """The policy RL starts from (a HF model folder is wrapped with the card on, as SFT does)."""
    config = PolicyConfig(encoding=EncodingConfig(max_nnz=cfg.max_nnz, seed=cfg.seed))
    return build_policy(cfg.model, config, device, seed=cfg.seed).to(device)


def _restore(run: Run, state_path: Path) -> dict:
    """Optimizer, RNG, step, KL coefficient and critic from ``state_path``; returns the record."""
    cfg = run.cfg
    st = load_train_state(state_path, run.optim.opt, run.rng, run.device)
    if run.info.rank:  # rank 0's saved stream; the other ranks draw their own
        run.rng = np.random.default_rng([cfg.seed, run.info.rank, st["step"]])
    if run.value_head is not None and st.get("value_head"):
        run.value_head.load_state_dict(st["value_head"])
    run.step, run.kl_ctl.value = st["step"], st["kl_coef"]
    log.info("resumed %s at step %d", cfg.algo, run.step)
    return st


def _reference(run: Run, st: dict, state_path: Path) -> Reference:
    """The KL reference: the starting policy (on a resume: reloaded, or its saved encoder with LoRA)."""
    if not run.resumed:
        return Reference(run.policy)
    if st.get("ref_encoder") is None:
        log.warning("%s has no reference encoder (older run): the KL reference uses the restored one", state_path)
    frozen = None
    if run.policy.config.lora is None:  # the KL keeps pointing at the starting policy, reloaded from cfg.model
        frozen = _starting_policy(run.cfg, run.device)
    adapters = st.get("ref_adapters")
    if run.policy.config.lora is not None and adapters is None:  # an older run: the starting adapters reloaded
        log.warning("%s has no reference adapters (older run): they are read from the starting policy", state_path)
        adapters = adapter_weights(_starting_policy(run.cfg, run.device))
    return Reference(run.policy, frozen=frozen, encoder_state=st.get("ref_encoder"), adapter_state=adapters)


def setup(cfg: RLConfig, evaluator=None) -> Run:
    """Devices, harness, policy, critic, optimizer, reference, matrix pools and logger (resumed if asked)."""
    info, dist_device = dist.init(cfg.device)  # torchrun: one process per GPU (runtime/dist.py)
    device = dist_device or pick_device(cfg.device)
    ev, own = _evaluator(cfg, info, device, evaluator)
    out = Path(cfg.out)
    ckpt, state_path = out / "checkpoint", out / "state.pt"
    resuming = cfg.resume and state_path.exists() and (ckpt / "policy.json").exists()
    policy = Policy.load(ckpt, device=str(device)).to(device) if resuming else _starting_policy(cfg, device)
    value_head = ValueHead(policy.base_model.config.hidden_size).to(device) if cfg.uses_critic else None
    kl_ctl = core.AdaptiveKL(cfg.kl_loss_coef, cfg.kl_target)
    run = Run(cfg, info, device, ev, own, policy, value_head, build_optimizer(policy, value_head, cfg), None,
              None, kl_ctl, np.random.default_rng(cfg.seed), resumed=resuming)
    st = _restore(run, state_path) if resuming else {}
    run.model = dist.wrap(ActorCritic(policy, value_head), info, device)  # DDP: gradients averaged over ranks
    run.reference = _reference(run, st, state_path)  # after the wrap, which made every replica rank 0's
    if not cfg.compile_only:
        _ = ev.pool  # start the GPU worker now, so its lease exists before the first rollout
    _pools(run)
    run.best_known = _best_known(cfg)
    out.mkdir(parents=True, exist_ok=True)  # after the model and the matrices loaded: a bad one leaves no empty folder
    run.logger = MetricLogger(out, resumed_at=run.step if resuming else None) if info.is_main else NullLogger()
    return run


def _best_known(cfg: RLConfig):
    """The best-known store the relative_best reward reads and updates (None for other rewards,
    and without a GPU, where nothing is timed)."""
    if cfg.reward.name != "relative_best" or cfg.compile_only:
        return None
    store = open_store(cfg.store)
    log.info("relative_best: rewards against the best known kernels in %s", store.path)
    return BestKnown(store, regime=cfg.regime, model=str(cfg.model))


def _pools(run: Run) -> None:
    """The training pool (the data's train split plus the large matrices) and the held-out items."""
    cfg, ev, policy = run.cfg, run.evaluator, run.policy
    train_paths = _matrix_paths(cfg.matrices, "train")
    val_paths = _matrix_paths(cfg.val_matrices, "val") if cfg.val_matrices else (
        _matrix_paths(cfg.matrices, "val") if (Path(cfg.matrices) / "val.jsonl").exists() else [])
    items = matrix_items(train_paths, ev, policy, cfg.ops, cfg.k) + large_items(cfg, ev, policy)
    run.pool = MatrixPool(items, seed=cfg.seed + run.step + 7919 * run.info.rank)
    run.val_items = matrix_items(val_paths, ev, policy, cfg.ops, cfg.k) if run.info.is_main else []


def save(run: Run) -> None:
    """Checkpoint the policy and the training state (rank 0; every rank checks the replicas agree)."""
    dist.check_in_sync(run.optim.params, run.info)
    if not run.info.is_main:
        return
    run.policy.save(run.out / "checkpoint")
    save_train_state(run.out / "state.pt", run.optim.opt, run.step, run.rng, asdict(run.cfg),
                     kl_coef=run.kl_ctl.value, value_head=run.value_head.state_dict() if run.value_head else None,
                     ref_encoder=run.reference.encoder.state_dict(), ref_adapters=run.reference.adapters)


def _signal_warning(run: Run, metrics: dict) -> None:
    if metrics.get("charts/no_signal"):
        log.warning("step %d: every group's rewards are equal (mean %.3f): no policy gradient this step, only the "
                    "KL and entropy terms move the policy", run.step, metrics["reward/mean"])


def _worth_a_step(cfg: RLConfig, metrics: dict, device) -> bool:
    """False when the update would only turn gradient noise into a step (see
    ``RLConfig.skip_no_signal_kl``), judged on the batch's :func:`batch_metrics` (no signal, KL to
    the reference); the same answer on every rank."""
    if cfg.skip_no_signal_kl is None or cfg.entropy_coef > 0:
        return True
    local = not metrics["charts/no_signal"] or abs(metrics["charts/kl_to_ref"]) > cfg.skip_no_signal_kl
    return dist.mean_over_ranks(float(local), device) > 0


def rl_step(run: Run) -> dict:
    """One RL step: rollout, advantages, update; returns the step's metrics (gathered over ranks)."""
    cfg, device = run.cfg, run.device
    lr = set_lr(run.optim, cfg, run.step)
    items = run.pool.next(cfg.matrices_per_step)
    seed = cfg.seed * 100_003 + run.step + 1_000_003 * run.info.rank
    with autocast(cfg, device):  # the learner's log-probs in the precision the update uses
        if cfg.turns > 1:
            batch = collect_turns(run.policy, run.reference, run.value_head, run.evaluator, items,
                                  cfg.samples_per_matrix, cfg.max_new_tokens, cfg.temperature, cfg.reward, seed,
                                  cfg.turns, cfg.turn_discount, best_known=run.best_known,
                                  compile_only=cfg.compile_only)
        else:
            batch = collect(run.policy, run.reference, run.value_head, run.evaluator, items, cfg.samples_per_matrix,
                            cfg.max_new_tokens, cfg.temperature, cfg.reward, seed=seed, best_known=run.best_known)
    t_up = time.perf_counter()
    adv, returns = advantages(cfg, batch)
    metrics = batch_metrics(batch, cfg)
    if _worth_a_step(cfg, metrics, device):
        upd = update(cfg, run.model, run.optim, batch, adv, returns, run.kl_ctl.value, run.rng, device)
    else:
        upd = {"charts/update_skipped": 1.0, "charts/update_minibatches": 0.0}
        log.info("step %d: no reward signal and the policy is at the reference: optimizer step skipped", run.step + 1)
    metrics |= upd | batch.timings | {"time/update": time.perf_counter() - t_up, "charts/lr": lr}
    if returns is not None:
        metrics["losses/explained_variance"] = float(core.explained_variance(batch.values, returns, batch.mask))
    run.step += 1
    run.samples_done += len(batch.texts)
    metrics["charts/samples_per_s"] = run.samples_done / (time.perf_counter() - run.t_start)
    metrics = dist.gather_metrics(metrics, run.info, summed=("charts/samples_per_s",))  # all ranks
    metrics["charts/kl_coef"] = run.kl_ctl.update(metrics["charts/kl_to_ref"], len(batch.texts) * run.info.world)
    _signal_warning(run, metrics)
    return metrics


def _loop(run: Run) -> dict:
    """Steps until ``cfg.steps``: log, evaluate held out, save; returns the last step's metrics."""
    cfg, last = run.cfg, {}
    if run.step == 0 and run.val_items:  # the starting point of the learning curve
        run.logger.log(0, evaluate_heldout(run.policy, run.evaluator, run.val_items, cfg, seed=cfg.seed))
    with progress(run.info.is_main) as bar:
        task = bar.add_task(cfg.algo, total=cfg.steps, completed=run.step)
        while run.step < cfg.steps:
            metrics = rl_step(run)
            if (run.step % cfg.eval_every == 0 or run.step == cfg.steps) and run.info.is_main:
                metrics |= evaluate_heldout(run.policy, run.evaluator, run.val_items, cfg, seed=cfg.seed + run.step)
            run.logger.log(run.step, metrics)
            last = metrics
            if run.step % cfg.save_every == 0 or run.step == cfg.steps:
                save(run)
            bar.update(task, advance=1, description=f"{cfg.algo} reward {metrics['reward/mean']:.3f}")
    return last


def train_rl(cfg: RLConfig, evaluator=None) -> dict:
    """Run PPO or GRPO; returns the final metrics."""
    run = setup(cfg, evaluator)
    try:
        last = _loop(run)
    finally:
        run.logger.close()
        if run.best_known is not None:
            run.best_known.close()
            run.best_known.store.close()
        if run.own_evaluator:
            run.evaluator.close()
    info = run.info
    run.model = None  # the DDP wrapper goes before leaving the process group (dist.shutdown)
    dist.shutdown(info)
    result = {"algo": cfg.algo, "steps": run.step, "checkpoint": str(run.out / "checkpoint"), "rank": info.rank,
              "world_size": info.world, **last}
    if info.is_main:
        result["learning_curve"] = plot_learning_curve(run.out / "metrics.jsonl", run.out / "learning_curve.png")
        (run.out / "result.json").write_text(json.dumps(result, indent=1))
    return result
