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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from sparserl.data.sft_build import read_jsonl
from sparserl.encoding import EncodingConfig, MatrixInput
from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.model.policy import LoraSpec, Policy, PolicyConfig, Sample, make_sample
from sparserl.devices import pick_device
from sparserl.train.common import (
    MetricLogger,
    NullLogger,
    cosine_lr,
    load_train_state,
    progress,
    save_train_state,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTConfig:
    """Stage-2 supervised fine-tuning."""

    data: str = "runs/data"
    """A folder with train.jsonl (and val.jsonl), or one .jsonl file (then 10% is held out for val)."""
    model: str = "runs/pretrain/model"
    """A local HF causal LM folder, or a policy checkpoint (folder with policy.json)."""
    out: str = "runs/sft"
    """Output folder (checkpoint/, state.pt, metrics.jsonl, result.json)."""
    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 8
    """(matrix, kernel) pairs per step."""
    lr: float = 3e-4
    """Peak learning rate (AdamW), after linear warm-up, cosine decay to 10%."""
    warmup_steps: int = 50
    """Steps of linear warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    lora: bool = False
    """LoRA adapters on a frozen base (True for large models), else full fine-tuning."""
    lora_r: int = 16
    """LoRA rank (alpha = 2 r)."""
    max_nnz: int = 128
    """Coordinate tokens per matrix."""
    text_prompt: bool = True
    """Name the shape and nonzero count in the prompt text (besides the matrix soft tokens)."""
    card: bool | None = None
    """Carry the matrix card in the prompt. None: a new model gets it, a policy checkpoint keeps its
    own setting; True/False: set it (a checkpoint trained otherwise is re-trained to the new prompt)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more time)."""
    eval_every: int = 250
    """Steps between validations (and one at the end)."""
    eval_samples: int = 32
    """Validation rows sampled and checked by the harness at each evaluation."""
    eval_temperature: float = 1.0
    """Sampling temperature of the validation (> 0)."""
    max_new_tokens: int = 1536
    """Longest validation completion, in tokens."""
    save_every: int = 250
    """Steps between checkpoints (and one at the end)."""
    resume: bool = False
    """Continue from ``out/state.pt`` when it is there."""
    device: str = "auto"
    """'auto' (cuda when available), 'cpu' or 'cuda[:N]'."""
    bf16: bool = True
    """bf16 autocast on CUDA."""
    compile_only: bool = False
    """Evaluate by compiling only (no GPU)."""
    seed: int = 0
    """Seed of the batches, the encoding's sampling, a new encoder's weights and the validation draw."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise SparseRLError("need steps >= 1, batch_size >= 1 and lr > 0")
        if self.max_new_tokens < 1:
            raise SparseRLError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.eval_temperature > 0:
            raise SparseRLError(f"eval_temperature must be > 0 (1.0 samples the policy as it is), "
                                f"got {self.eval_temperature}")


_MATRIX_CACHE: dict[str, sp.csr_array] = {}


def matrix_of(row: dict) -> tuple[str, sp.csr_array]:
    """(name, matrix) of a data row: its matrix file when it exists, else the stored
    coordinates (the paper's rows/cols fields, whole matrices in its cut-down data) with
    unit values."""
    from sparserl.matrices import canonicalize, load_matrix

    path = row.get("matrix")
    if path and Path(path).exists():
        A = _MATRIX_CACHE.get(path)
        if A is None:
            A = _MATRIX_CACHE[path] = load_matrix(path)
        return Path(path).name.split(".")[0], A
    m, n = (int(v) for v in row["shape"])
    r, c = np.asarray(row["rows"], np.int64), np.asarray(row["cols"], np.int64)
    if r.size == 0 or r.size != c.size or r.min() < 0 or c.min() < 0 or r.max() >= m or c.max() >= n:
        raise SparseRLError(f"data row has rows/cols that do not fit its shape {m} x {n}")
    A = canonicalize(sp.coo_array((np.ones(r.size, np.float32), (r, c)), shape=(m, n)).tocsr())
    import hashlib

    digest = hashlib.sha1(r.tobytes() + c.tobytes()).hexdigest()[:12]
    return f"coords_{m}x{n}_{digest}", A


_INPUT_CACHE: dict[tuple, MatrixInput] = {}
_CARD_CACHE: dict[tuple, str] = {}


def card_of(row: dict, name: str, A) -> str:
    """The card's prompt text for a data row: of its matrix file when it exists, else of the card
    facts it carries (``card``: a best-known export), else of its coordinates when they are all of
    its nonzeros. Raises SparseRLError otherwise (the card of sampled coordinates would be wrong)."""
    from sparserl.matrices.card import MatrixCard, prompt_card

    path = row.get("matrix")
    if path and Path(path).exists():
        return prompt_card(A)
    if isinstance(row.get("card"), dict):
        return MatrixCard.from_dict(row["card"]).prompt()
    if int(row.get("nnz", A.nnz)) == A.nnz:
        return prompt_card(A)
    raise SparseRLError(f"data row of {name}: its matrix file is missing and its rows/cols hold {A.nnz} of "
                        f"{row['nnz']} nonzeros, so its matrix card cannot be made (train with --no-card, or "
                        "keep the data's matrix files)")


def sample_of(row: dict, config: PolicyConfig | EncodingConfig) -> Sample:
    """The policy input for one data row, as :func:`~sparserl.model.policy.make_sample` builds it
    (the sampled encoding input and the card, :func:`card_of`, are cached per matrix). An
    ``EncodingConfig`` alone: a sample without the card."""
    if isinstance(config, EncodingConfig):
        config = PolicyConfig(encoding=config, card=False)
    name, A = matrix_of(row)
    mkey = (row.get("matrix") or name, tuple(row["shape"]))
    inp = _INPUT_CACHE.get(mkey + (config.encoding,))
    if inp is None:
        inp = _INPUT_CACHE[mkey + (config.encoding,)] = MatrixInput.from_matrix(A, config.encoding)
    card = None
    if config.card:
        card = _CARD_CACHE.get(mkey)
        if card is None:
            card = _CARD_CACHE[mkey] = card_of(row, name, A)
    op = Op(row.get("op", "spmv"))
    return make_sample(A, config, op, row.get("k"), inp=inp, nnz=int(row.get("nnz", A.nnz)), card=card)


def load_rows(data: str, seed: int) -> tuple[list[dict], list[dict]]:
    p = Path(data)
    if p.is_dir():
        train = read_jsonl(p / "train.jsonl")
        v = p / "val.jsonl"
        val = read_jsonl(v) if v.exists() and v.read_text().strip() else []
        return train, val
    rows = read_jsonl(p)
    if len(rows) < 2:
        return rows, []
    idx = np.random.default_rng(seed).permutation(len(rows))
    n_val = max(1, len(rows) // 10)
    return [rows[i] for i in idx[n_val:]], [rows[i] for i in idx[:n_val]]


def build_policy(cfg: SFTConfig, device: torch.device) -> Policy:
    """The policy to fine-tune: a checkpoint, a HF model folder, or (no model there) the default from
    scratch. Seeded by ``cfg.seed`` (the matrix encoder's initial weights), so runs that differ in one
    setting (the card ablation) start from the same weights."""
    import dataclasses

    torch.manual_seed(cfg.seed)

    pcfg = PolicyConfig(encoding=EncodingConfig(max_nnz=cfg.max_nnz, seed=cfg.seed), text_prompt=cfg.text_prompt,
                        card=cfg.card if cfg.card is not None else True,
                        lora=LoraSpec(r=cfg.lora_r, alpha=2 * cfg.lora_r) if cfg.lora else None,
                        gradient_checkpointing=cfg.gradient_checkpointing)
    policy = Policy.open(cfg.model, pcfg, device=str(device))
    if cfg.card is not None and policy.config.card != cfg.card:
        log.warning("%s was trained %s the matrix card in its prompt; fine-tuning it %s (card=%s)", cfg.model,
                    "with" if policy.config.card else "without", "with" if cfg.card else "without", cfg.card)
        policy.config = dataclasses.replace(policy.config, card=cfg.card)
    return policy


def evaluate_policy(policy: Policy, rows: list[dict], cfg: SFTConfig, evaluator) -> dict:
    """Sample one completion per row and check each with the harness; rates in [0, 1]."""
    from sparserl.harness.result import ErrorKind

    if not rows:
        return {}
    samples = [sample_of(r, policy.config) for r in rows]
    texts: list[str] = []
    for i in range(0, len(samples), 32):
        texts += policy.generate(samples[i:i + 32], max_new_tokens=cfg.max_new_tokens,
                                 temperature=cfg.eval_temperature, seed=cfg.seed + i)
    items = []
    for r, s, t in zip(rows, samples, texts):
        name, A = matrix_of(r)
        items.append((t, evaluator.register(A, name), s.op, s.k))
    res = evaluator.evaluate_many(items)
    n = len(res)
    compiled = sum(r.compiled for r in res)
    correct = sum(r.correct for r in res)
    kinds: dict[str, int] = {}
    for r in res:
        kinds[r.error_kind.value] = kinds.get(r.error_kind.value, 0) + 1
    out = {"eval/compile_rate": compiled / n, "eval/samples": n}
    if not all(r.error_kind is ErrorKind.NO_GPU for r in res if r.compiled):
        out["eval/pass_at_1"] = correct / n
        sp_ = [r.speedup for r in res if r.correct and r.speedup]
        if sp_:
            out["eval/speedup_geomean"] = float(np.exp(np.mean(np.log(sp_))))
    out["eval/kinds"] = kinds
    return out


def _train_step(model, opt, params, policy: Policy, batch: list[dict], lr: float, cfg: SFTConfig,
                device: torch.device) -> tuple[float, float]:
    """One optimizer step on ``batch``; returns (loss, gradient norm before clipping)."""
    samples = [sample_of(r, policy.config) for r in batch]
    for g in opt.param_groups:
        g["lr"] = lr
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda"):
        loss = model(samples, [r["code"] for r in batch])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    opt.step()
    return loss.item(), float(gnorm)


def _validate(step: int, policy: Policy, rows: list[dict], cfg: SFTConfig, ev, logger) -> dict:
    """The validation at ``step`` (logged, and said while it runs); returns its metrics and verdict kinds."""
    log.info("step %d: sampling %d validation kernels and checking them with the harness%s", step, len(rows),
             " (compile-only)" if cfg.compile_only or not ev.has_gpu else "")
    ev_metrics = evaluate_policy(policy, rows, cfg, ev)
    kinds = ev_metrics.pop("eval/kinds", {})
    logger.log(step, ev_metrics)
    log.info("step %d: %s", step, {k: round(v, 3) if isinstance(v, float) else v
                                   for k, v in ev_metrics.items()} | {"kinds": kinds})
    return ev_metrics | {"eval/kinds": kinds}


def sft(cfg: SFTConfig, evaluator=None) -> dict:
    """Run stage 2; returns the final metrics."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.train import dist

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    info, dist_device = dist.init(cfg.device)  # torchrun: one process per GPU (train/dist.py)
    device = dist_device or pick_device(cfg.device)
    train_rows, val_rows = load_rows(cfg.data, cfg.seed)
    ckpt, state_path = out / "checkpoint", out / "state.pt"
    resuming = cfg.resume and state_path.exists() and (ckpt / "policy.json").exists()
    policy = Policy.load(ckpt, device=str(device)) if resuming else build_policy(cfg, device)
    policy.to(device)
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
    own_eval = evaluator is None
    ev = evaluator or Evaluator(HarnessConfig(
        compile_only=cfg.compile_only or not info.is_main, regimes=("cold",),  # rank 0 evaluates
        devices=dist.harness_devices(info, device)))
    if info.is_main and not cfg.compile_only and not ev.has_gpu:
        from sparserl.devices import NO_GPU_NOTE

        log.warning(NO_GPU_NOTE)
    logger = MetricLogger(out, resumed_at=step if resuming else None) if info.is_main else NullLogger()
    logger.log(step, {"data/train_rows": len(train_rows), "data/val_rows": len(val_rows),
                      "model/trainable_params": sum(p.numel() for p in params)})
    val_subset = [val_rows[i] for i in np.random.default_rng(cfg.seed).permutation(len(val_rows))[: cfg.eval_samples]]

    def save() -> None:
        dist.check_in_sync(params, info)
        if not info.is_main:
            return
        policy.save(ckpt)
        save_train_state(state_path, opt, step, rng, asdict(cfg))

    last: dict = {}
    t_train, seen = 0.0, 0
    policy.train()
    try:
        with progress(info.is_main) as bar:
            task = bar.add_task("sft", total=cfg.steps, completed=step)
            while step < cfg.steps:
                batch = [train_rows[i] for i in rng.integers(0, len(train_rows), size=cfg.batch_size)]
                lr = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_steps)
                ts = time.perf_counter()
                loss_v, gnorm = _train_step(model, opt, params, policy, batch, lr, cfg, device)
                t_train += time.perf_counter() - ts
                seen += len(batch)
                step += 1
                last = {"losses/sft": loss_v, "charts/lr": lr, "charts/grad_norm": gnorm,
                        "charts/samples_per_s": seen / t_train}
                if step % 10 == 0 or step == cfg.steps:
                    last = dist.gather_metrics(last, info, summed=("charts/samples_per_s",))  # all ranks
                    logger.log(step, last)
                bar.update(task, advance=1, description=f"sft loss {loss_v:.3f}")
                if (step % cfg.eval_every == 0 or step == cfg.steps) and val_subset and info.is_main:
                    last.update(_validate(step, policy, val_subset, cfg, ev, logger))
                if step % cfg.save_every == 0 or step == cfg.steps:
                    save()
    finally:
        logger.close()
        if own_eval:
            ev.close()
    del model  # before leaving the process group (dist.shutdown)
    dist.shutdown(info)
    result = {"steps": step, "checkpoint": str(ckpt), "train_rows": len(train_rows), "val_rows": len(val_rows),
              "world_size": info.world, **last}
    if info.is_main:
        (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


class _LossModule(torch.nn.Module):
    """The policy's SFT loss as ``forward`` (what DistributedDataParallel wraps)."""

    def __init__(self, policy: Policy):
        super().__init__()
        self.policy = policy

    def forward(self, samples, completions: list[str]) -> torch.Tensor:
        return self.policy.loss(samples, completions)
