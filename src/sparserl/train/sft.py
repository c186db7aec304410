"""Stage 2: supervised fine-tuning on (matrix, correct kernel) pairs.

The loss is next-token cross-entropy on the completion only, with the matrix encoding as
input (:class:`sparserl.model.policy.Policy`). Every ``eval_every`` steps it samples one
completion per validation row at ``eval_temperature`` and runs each through the harness:
compile rate and correctness (pass@1) on matrices the model was not trained on (compile
only without a GPU). Checkpoints (policy + optimizer + step + RNG) every ``save_every``
steps; ``resume`` continues from the last one. Metrics go to ``metrics.jsonl`` and
TensorBoard.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from sparserl.data.rows import SFTRow
from sparserl.data.targets import taught_rows
from sparserl.devices import NO_GPU_NOTE, pick_device
from sparserl.encoding import EncodingConfig
from sparserl.eval.metrics import geomean
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.model.budget import longest_completion
from sparserl.model.hf_parts import text_config
from sparserl.model.build import build_policy
from sparserl.model.policy import LoraSpec, Policy, PolicyConfig
from sparserl.progress import progress
from sparserl.runtime import dist
from sparserl.runtime.metrics import MetricLogger, NullLogger
from sparserl.runtime.optim import cosine_lr, load_train_state, save_train_state
from sparserl.train.config import SFTConfig
from sparserl.train.dataset import SFTDataset, load_splits
from sparserl.train.microbatch import split_by_tokens

log = logging.getLogger(__name__)

__all__ = ["SFTConfig", "evaluate_policy", "policy_config", "sft"]


def policy_config(cfg: SFTConfig) -> PolicyConfig:
    """The policy a new model is wrapped in (a checkpoint keeps its own)."""
    return PolicyConfig(encoding=EncodingConfig(max_nnz=cfg.max_nnz, seed=cfg.seed), text_prompt=cfg.text_prompt,
                        card=cfg.card if cfg.card is not None else True,
                        lora=LoraSpec(r=cfg.lora_r, alpha=2 * cfg.lora_r) if cfg.lora else None,
                        gradient_checkpointing=cfg.gradient_checkpointing)


def evaluate_policy(policy: Policy, data: SFTDataset, cfg: SFTConfig, evaluator) -> dict:
    """Sample one completion per row of ``data`` and check each with the harness; rates in [0, 1]."""
    if not data.rows:
        return {}
    samples = [data.sample(r) for r in data.rows]
    texts: list[str] = []
    for i in range(0, len(samples), 32):
        texts += policy.generate(samples[i:i + 32], max_new_tokens=cfg.max_new_tokens,
                                 temperature=cfg.eval_temperature, seed=cfg.seed + i)
    items = []
    for r, s, t in zip(data.rows, samples, texts):
        name, A = data.matrix(r)
        items.append((t, evaluator.register(A, name), s.op, s.k))
    res = evaluator.evaluate_many(items)
    n = len(res)
    kinds: dict[str, int] = {}
    for r in res:
        kinds[r.error_kind.value] = kinds.get(r.error_kind.value, 0) + 1
    out = {"eval/compile_rate": sum(r.compiled for r in res) / n, "eval/samples": n}
    if not all(r.error_kind is ErrorKind.NO_GPU for r in res if r.compiled):
        out["eval/pass_at_1"] = sum(r.correct for r in res) / n
        speedups = [r.speedup for r in res if r.correct and r.speedup]
        if speedups:
            out["eval/speedup_geomean"] = geomean(speedups)
    out["eval/kinds"] = kinds
    return out


def _train_step(run: _Run, batch: list[SFTRow], lr: float) -> tuple[float, float]:
    """One optimizer step on ``batch``; returns (loss, gradient norm before clipping)."""
    cfg, device = run.cfg, run.device
    samples = [run.train.sample(r) for r in batch]
    codes = [r.code for r in batch]
    for g in run.opt.param_groups:
        g["lr"] = lr
    run.opt.zero_grad(set_to_none=True)
    lengths = run.policy.sequence_lengths(samples, codes)
    targets = sum(n for _, n in lengths)  # the step's loss: the mean over all of its completion tokens
    total = torch.zeros((), device=device)
    groups = split_by_tokens([t for t, _ in lengths], cfg.max_batch_tokens)
    for n, idx in enumerate(groups):
        # DDP: gradients are reduced once, at the last micro-batch (ranks may split their rows differently)
        quiet = run.model.no_sync() if n < len(groups) - 1 and hasattr(run.model, "no_sync") else nullcontext()
        with quiet:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda"):
                part = run.model([samples[i] for i in idx], [codes[i] for i in idx], reduction="sum") / targets
            part.backward()  # each micro-batch's activations freed before the next
        total += part.detach().float()  # read once, after the step: no host wait between micro-batches
    gnorm = torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
    run.opt.step()
    return total.item(), float(gnorm)


def _validate(run: _Run) -> dict:
    """The validation at the run's step (logged, and said while it runs); returns its metrics and
    verdict kinds."""
    step, cfg, ev = run.step, run.cfg, run.evaluator
    log.info("step %d: sampling %d validation kernels and checking them with the harness%s", step, len(run.val),
             " (compile-only)" if cfg.compile_only or not ev.has_gpu else "")
    ev_metrics = evaluate_policy(run.policy, run.val, cfg, ev)
    kinds = ev_metrics.pop("eval/kinds", {})
    run.logger.log(step, ev_metrics)
    log.info("step %d: %s", step, {k: round(v, 3) if isinstance(v, float) else v
                                   for k, v in ev_metrics.items()} | {"kinds": kinds})
    return ev_metrics | {"eval/kinds": kinds}


@dataclass
class _Run:
    """What one SFT run holds between steps."""

    cfg: SFTConfig
    info: dist.DistInfo
    device: torch.device
    policy: Policy
    params: list[torch.Tensor]
    opt: torch.optim.Optimizer
    rng: np.random.Generator
    model: torch.nn.Module
    """The loss module, DDP-wrapped when distributed."""
    train: SFTDataset
    val: SFTDataset
    """The validation rows checked at each validation (at most ``cfg.eval_samples``)."""
    evaluator: Evaluator
    own_evaluator: bool
    logger: MetricLogger | NullLogger
    val_rows: int
    """Validation rows in the data (``val`` holds the ones checked)."""
    step: int = 0

    @property
    def checkpoint(self) -> Path:
        return Path(self.cfg.out) / "checkpoint"

    def snapshot(self, step: int) -> Path:
        """Where the policy after ``step`` is kept (:attr:`SFTConfig.snapshots`)."""
        return Path(self.cfg.out) / f"checkpoint-step{step}"

    def save(self) -> None:
        """Checkpoint the policy and the training state (rank 0; every rank checks the replicas agree)."""
        dist.check_in_sync(self.params, self.info)
        if self.info.is_main:
            self.policy.save(self.checkpoint)
            save_train_state(Path(self.cfg.out) / "state.pt", self.opt, self.step, self.rng, asdict(self.cfg))


def _setup(cfg: SFTConfig, evaluator) -> _Run:
    """Devices, policy (resumed if asked), optimizer, data, harness and logger."""
    out = Path(cfg.out)
    info, dist_device = dist.init(cfg.device)  # torchrun: one process per GPU (runtime/dist.py)
    device = dist_device or pick_device(cfg.device)
    train_rows, val_rows = load_splits(cfg.data, cfg.seed)
    train_rows = taught_rows(train_rows)  # each kernel as the policy is taught to write it: no comments
    ckpt, state_path = out / "checkpoint", out / "state.pt"
    resuming = cfg.resume and state_path.exists() and (ckpt / "policy.json").exists()
    policy = Policy.load(ckpt, device=str(device)) if resuming else build_policy(
        cfg.model, policy_config(cfg), device, seed=cfg.seed, card=cfg.card)
    policy.to(device)
    positions = getattr(text_config(policy.lm), "max_position_embeddings", None)
    taught, past = longest_completion(policy.tokenizer, [r.code for r in train_rows], positions)
    if past:
        log.warning("%d distinct training completion(s) are longer than the model's %s positions: trained on, "
                    "but no sampling budget is made that long", past, positions)
    if taught > policy.taught_tokens:  # the decoder's default budget must let a sample finish what it learns
        log.info("the longest training completion is %d tokens: sampling budgets at least that", taught)
        policy.taught_tokens = taught
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed if not info.rank else [cfg.seed, info.rank])  # each rank its own batches
    step = 0
    if resuming:
        step = load_train_state(state_path, opt, rng, device)["step"]
        if info.rank:
            rng = np.random.default_rng([cfg.seed, info.rank, step])
        log.info("resumed SFT at step %d", step)
    model = dist.wrap(_LossModule(policy), info, device)  # DDP: gradients averaged over ranks
    ev = evaluator or Evaluator(HarnessConfig(
        compile_only=cfg.compile_only or not info.is_main, regimes=("cold",),  # rank 0 evaluates
        devices=dist.harness_devices(info, device)))
    if info.is_main and not cfg.compile_only and not ev.has_gpu:
        log.warning(NO_GPU_NOTE)
    out.mkdir(parents=True, exist_ok=True)  # after the data and the model loaded: a bad one leaves no empty folder
    logger = MetricLogger(out, resumed_at=step if resuming else None) if info.is_main else NullLogger()
    logger.log(step, {"data/train_rows": len(train_rows), "data/val_rows": len(val_rows),
                      "model/trainable_params": sum(p.numel() for p in params)})
    val_pick = np.random.default_rng(cfg.seed).permutation(len(val_rows))[: cfg.eval_samples]
    train, val = SFTDataset(train_rows, policy.config), SFTDataset([val_rows[i] for i in val_pick], policy.config)
    seconds = train.warm() + val.warm()  # in threads now, rather than one by one while the GPU waits
    log.info("the inputs and cards of %d training and %d validation matrices made in %.1f s",
             len(train.matrices_made()), len(val.matrices_made()), seconds)
    return _Run(cfg, info, device, policy, params, opt, rng, model, train, val, ev, evaluator is None, logger,
                len(val_rows), step)


def _loop(run: _Run) -> dict:
    """Steps until ``cfg.steps``: log, validate, save; returns the last step's metrics."""
    cfg, info, rows = run.cfg, run.info, run.train.rows
    last: dict = {}
    t_train, seen = 0.0, 0
    run.policy.train()
    with progress(info.is_main) as bar:
        task = bar.add_task("sft", total=cfg.steps, completed=run.step)
        while run.step < cfg.steps:
            batch = [rows[i] for i in run.rng.integers(0, len(rows), size=cfg.batch_size)]
            lr = cosine_lr(run.step, cfg.steps, cfg.lr, cfg.warmup_steps)
            ts = time.perf_counter()
            loss_v, gnorm = _train_step(run, batch, lr)
            t_train += time.perf_counter() - ts
            seen += len(batch)
            run.step += 1
            last = {"losses/sft": loss_v, "charts/lr": lr, "charts/grad_norm": gnorm,
                    "charts/samples_per_s": seen / t_train}
            if run.step % 10 == 0 or run.step == cfg.steps:
                last = dist.gather_metrics(last, info, summed=("charts/samples_per_s",))  # all ranks
                run.logger.log(run.step, last)
            bar.update(task, advance=1, description=f"sft loss {loss_v:.3f}")
            if (run.step % cfg.eval_every == 0 or run.step == cfg.steps) and len(run.val) and info.is_main:
                last.update(_validate(run))
            if run.step in cfg.snapshots and info.is_main:  # before the checkpoint: a resume never skips it
                run.policy.save(run.snapshot(run.step))
                log.info("step %d: the policy kept as %s", run.step, run.snapshot(run.step))
            if run.step % cfg.save_every == 0 or run.step == cfg.steps:
                run.save()
    return last


def sft(cfg: SFTConfig, evaluator=None) -> dict:
    """Run stage 2; returns the final metrics."""
    run = _setup(cfg, evaluator)
    try:
        last = _loop(run)
    finally:
        run.logger.close()
        if run.own_evaluator:
            run.evaluator.close()
    info = run.info
    run.model = None  # the DDP wrapper goes before leaving the process group (dist.shutdown)
    dist.shutdown(info)
    result = {"steps": run.step, "checkpoint": str(run.checkpoint), "train_rows": len(run.train),
              "val_rows": run.val_rows, "world_size": info.world, **last}
    if info.is_main:
        (Path(cfg.out) / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


class _LossModule(torch.nn.Module):
    """The policy's SFT loss as ``forward`` (what DistributedDataParallel wraps)."""

    def __init__(self, policy: Policy):
        super().__init__()
        self.policy = policy

    def forward(self, samples, completions: list[str], reduction: str = "mean") -> torch.Tensor:
        return self.policy.loss(samples, completions, reduction)
