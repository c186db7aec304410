"""Stage 1: pre-train a causal LM on the CUDA corpus (the paper's domain pre-training).

With no ``--model`` it trains a BPE tokenizer and a model of the chosen preset
(:mod:`sparserl.model.config`: the 29M default, or the ~210M base) from scratch; with
``--model PATH`` it continues pre-training any local Hugging Face causal LM with its own
tokenizer. Held-out perplexity is measured on files the model never saw.

The corpus is either the one found on this machine (:mod:`sparserl.data.corpus`: the toolkit's
headers and the kernel library) or, with ``--corpus DIR``, a corpus built from the package index
(``sparserl corpus build``) or its tokenised pack (``sparserl corpus pack``); then held-out
perplexity is reported per held-out package, the headline (``eval/heldout_ppl``) over the packages
held out whole and the other packages' held-out shares apart (``eval/heldout_share_ppl``).
``--minutes`` ends training after that much wall time (the learning rate decays over the budget),
with a checkpoint and a last evaluation.
Throughput is reported as tokens/s and MFU (:mod:`sparserl.train.throughput`).

Output folder: ``model/`` (HF ``save_pretrained`` of model and tokenizer, loadable by
``AutoModelForCausalLM``), ``state.pt`` (optimizer, step, RNG: ``--resume`` continues from
it), ``metrics.jsonl`` (and TensorBoard events when tensorboard is installed), ``result.json``;
with ``--corpus`` also ``tokens/`` (the pack's streams, decompressed once) and, for a built
corpus, ``pack/`` (its tokenisation).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sparserl.data.corpus import CorpusConfig, build_corpus
from sparserl.devices import pick_device
from sparserl.errors import SparseRLError
from sparserl.model.config import hf_config
from sparserl.model.tokenizer import encode_plain, load_tokenizer, save_tokenizer, train_tokenizer
from sparserl.progress import progress
from sparserl.runtime.metrics import MetricLogger
from sparserl.runtime.optim import cosine_lr, load_train_state, save_train_state
from sparserl.train.config import PretrainConfig
from sparserl.train.throughput import matmul_params, mfu, peak_tflops

log = logging.getLogger(__name__)


def token_stream(texts: list[str], tokenizer, eos_id: int) -> np.ndarray:
    """All texts tokenized as plain text (a special token's string in a file is its characters) and joined with
    EOS, as one int32 array."""
    ids = encode_plain(tokenizer, texts)
    out = np.fromiter((t for seq in ids for t in (*seq, eos_id)), dtype=np.int32)
    return out


def batches(stream: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator):
    """Endless random windows of ``seq_len + 1`` tokens."""
    if stream.size <= seq_len + 1:
        raise SparseRLError(f"corpus has only {stream.size} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    while True:
        starts = rng.integers(0, stream.size - seq_len - 1, size=batch_size)
        yield torch.from_numpy(np.stack([stream[s: s + seq_len + 1] for s in starts]).astype(np.int64))


def heldout_perplexity(model, stream: np.ndarray, seq_len: int, max_tokens: int, device, bf16: bool,
                       batch_size: int = 8) -> float:
    """exp(mean next-token loss) over consecutive held-out windows."""
    total, count = heldout_loss(model, stream, seq_len, max_tokens, device, bf16, batch_size)
    return math.exp(total / count)


@torch.no_grad()
def heldout_loss(model, stream: np.ndarray, seq_len: int, max_tokens: int, device, bf16: bool,
                 batch_size: int = 8) -> tuple[float, int]:
    """(summed next-token loss in nats, tokens scored) over consecutive held-out windows of
    ``seq_len`` (one shorter window when the stream is shorter than one)."""
    model.eval()
    if stream.size < 2:
        raise SparseRLError("held-out set is shorter than two tokens")
    seq_len = min(seq_len, stream.size - 1)
    n = min(stream.size - 1, max_tokens) // seq_len
    windows = torch.from_numpy(stream[: n * seq_len + 1].astype(np.int64))
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        idx = torch.arange(i, min(i + batch_size, n))
        x = torch.stack([windows[j * seq_len: (j + 1) * seq_len + 1] for j in idx]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
            logits = model(input_ids=x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                 reduction="sum")
        total += float(loss)
        count += x[:, 1:].numel()
    model.train()
    return total, count


def _build(cfg: PretrainConfig, texts: list[str]):
    from transformers import AutoModelForCausalLM

    if cfg.model:
        tok = load_tokenizer(cfg.model)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
        return tok, model
    t0 = time.perf_counter()
    tok = train_tokenizer(texts, cfg.vocab_size)
    log.info("trained a %d-token BPE tokenizer in %.1f s", len(tok), time.perf_counter() - t0)
    return tok, _new_model(cfg, tok)


def untrained_model(folder: Path, cfg: PretrainConfig | None = None) -> Path:
    """The model pre-training starts from (a tokenizer trained on the corpus, random weights), saved to
    ``folder`` (kept as it is when it holds a model already); what the paper's SFT entry point trains
    when no pre-trained model is given. ``cfg``: the corpus, vocabulary, shape and seed (default: a
    4 MiB corpus and the default model)."""
    if (Path(folder) / "config.json").exists():
        return Path(folder)
    cfg = cfg or PretrainConfig(corpus=CorpusConfig(max_bytes=4 << 20))
    tok, model = _build(cfg, build_corpus(cfg.corpus).train)
    model.save_pretrained(folder)
    save_tokenizer(tok, folder)
    return Path(folder)


def _new_model(cfg: PretrainConfig, tok):
    """A model of ``cfg``'s shape with random weights (SDPA attention: flash kernels on a GPU)."""
    from transformers import AutoModelForCausalLM

    hf = hf_config(len(tok), cfg.model_shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
    torch.manual_seed(cfg.seed)
    return AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa")


def _train_step(model, opt, x: torch.Tensor, lr: float, cfg: PretrainConfig, device: torch.device
                ) -> tuple[float, float]:
    """One next-token step on the windows ``x`` (B, seq_len + 1); returns (loss, gradient norm)."""
    for g in opt.param_groups:
        g["lr"] = lr
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda"):
        logits = model(input_ids=x[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return loss.item(), float(gnorm)


class TimeEstimate:
    """Says, once the first steps are timed, how long the whole run will take (default
    settings on a CPU take hours, which a user should know in the first minute): after
    ``after_steps`` steps past the ``warmup`` ones, or as soon as ``after_s`` seconds of
    training have gone by."""

    def __init__(self, cfg: PretrainConfig, device: torch.device, first_step: int, warmup: int = 1,
                 after_s: float = 10.0, after_steps: int = 10):
        self.cfg, self.device, self.first = cfg, device, first_step
        self.warmup, self.after_s, self.after_steps = warmup, after_s, after_steps
        self.t_warm: float | None = None
        self.said = False

    def step(self, step: int, t_train: float) -> str | None:
        """Called after each step with the training time so far; returns (and logs) the estimate once."""
        done = step - self.first
        if done == self.warmup:  # the first steps carry one-time costs (allocation, kernel selection)
            self.t_warm = t_train
        if self.said or done < 1 or step >= self.cfg.steps:
            return None
        if self.t_warm is not None and done > self.warmup:
            timed, n = t_train - self.t_warm, done - self.warmup
        else:  # slow steps (a CPU): the first ones already tell, warm-up costs and all (an overestimate)
            timed, n = t_train, done
        if n < self.after_steps and timed < self.after_s:
            return None
        self.said = True
        left = (self.cfg.steps - step) * timed / n
        c = self.cfg
        msg = (f"{n * c.batch_size * c.seq_len / timed:.0f} tokens/s on {self.device.type}: the {c.steps} steps take "
               f"about {_hours(left + t_train)} in all (about {_hours(left)} left)")
        if self.device.type == "cpu" and left > 1800:
            msg += ("; on a CPU, smaller settings finish in minutes: --steps 200 --batch-size 8 --seq-len 256 "
                    "(see the README)")
        log.info("%s", msg)
        return msg


def _hours(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def _open_corpus(cfg: PretrainConfig, out: Path, resuming: bool = False):
    """The pack of ``cfg.corpus_dir``: opened as it is, or made from a built corpus into ``out/pack`` (with
    ``cfg.model`` tokenised by that model's tokenizer). A pack already there is used when it was made from this
    corpus, as it is now, with these settings; else it is made again, or, for a run resumed, refused. A pack of a
    corpus built under other rules (:data:`~sparserl.corpus.manifest.CORPUS_VERSION`) is refused."""
    from sparserl.corpus.manifest import CORPUS_VERSION, MANIFEST
    from sparserl.corpus.pack import PackConfig, is_pack, open_pack, pack, pack_differs, pack_info

    folder = Path(cfg.corpus_dir)
    if is_pack(folder):
        info = pack_info(folder)  # read before the streams are decompressed: an old pack is refused at once
        version = info.get("corpus_version", 1) if info is not None else CORPUS_VERSION  # unreadable: open_pack says
        if version != CORPUS_VERSION:
            raise SparseRLError(f"--corpus {folder} was packed from a corpus built under corpus rules {version}, not "
                                f"{CORPUS_VERSION} (its held-out split may hold near-copies of training files): build "
                                "the corpus again and pack it")
        return open_pack(folder, scratch=out / "tokens")
    if not (folder / MANIFEST).exists():
        raise SparseRLError(f"--corpus {folder}: neither a built corpus (manifest.jsonl) nor a pack (pack.json): "
                            "build one with 'sparserl corpus build --out DIR'")
    want = PackConfig(corpus=str(folder), out=str(out / "pack"), vocab_size=cfg.vocab_size, max_mib=0, seed=cfg.seed,
                      tokenizer=cfg.model)
    why = pack_differs(out / "pack", want)
    if why is not None:
        if is_pack(out / "pack"):
            if resuming:
                raise SparseRLError(f"{out / 'pack'} was packed {why}: resume with the corpus and settings the run "
                                    "began with, or start again with --force")
            log.info("%s was packed %s: packing again", out / "pack", why)
        pack(want)
    return open_pack(out / "pack", scratch=out / "tokens")


def _same_vocab(a, b) -> bool:
    return a.get_vocab() == b.get_vocab()


def _data(cfg: PretrainConfig, out: Path, resuming: bool):
    """(tokenizer, model, train stream, held-out streams by name, what the corpus is) for this run."""
    from transformers import AutoModelForCausalLM

    if resuming:
        tok = load_tokenizer(out / "model")
        model = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32, attn_implementation="sdpa")
    if cfg.corpus_dir:
        pk = _open_corpus(cfg, out, resuming)
        if not resuming:
            tok = load_tokenizer(cfg.model) if cfg.model else load_tokenizer(pk.tokenizer_dir)
            if cfg.model and not _same_vocab(tok, load_tokenizer(pk.tokenizer_dir)):
                raise SparseRLError(f"--model {cfg.model} has its own tokenizer, not the pack's: give the built "
                                    "corpus folder instead of its pack, so it is tokenised with the model's")
            model = (AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32, attn_implementation="sdpa")
                     if cfg.model else _new_model(cfg, tok))
        whole = [p for p in pk.info.get("heldout_whole", ()) if p in pk.heldout]
        if not whole:
            raise SparseRLError(f"--corpus {cfg.corpus_dir}: no package is held out whole, so no perplexity on code "
                                "the model never saw: build the corpus with held-out packages (--heldout NAME)")
        held = dict(sorted(pk.heldout.items(), key=lambda kv: (kv[0] not in whole, kv[0])))  # whole ones first
        return tok, model, pk.train, held, {"corpus": str(pk.folder), "heldout_whole_packages": whole}
    corpus = build_corpus(cfg.corpus)
    if not resuming:
        tok, model = _build(cfg, corpus.train)
    t0 = time.perf_counter()
    train_ids = token_stream(corpus.train, tok, tok.eos_token_id)
    held_ids = token_stream(corpus.heldout, tok, tok.eos_token_id)
    log.info("tokenized %d train and %d held-out tokens in %.1f s", train_ids.size, held_ids.size,
             time.perf_counter() - t0)
    return tok, model, train_ids, {"heldout": held_ids}, {"corpus": "toolkit headers and kernel library"}


def _evaluate(model, held: dict[str, np.ndarray], cfg: PretrainConfig, device,
              whole: list[str] | None = None) -> dict[str, float]:
    """Held-out perplexity per stream, and pooled: ``eval/heldout_ppl`` (and ``eval/heldout_ppl/<package>``) over
    the packages held out whole (``whole``; None: every stream is), ``eval/heldout_share_ppl`` (and
    ``eval/heldout_share_ppl/<package>``) over the other packages' held-out shares, code of packages the model
    trains on."""
    out: dict[str, float] = {}
    pooled = {"eval/heldout_ppl": [0.0, 0], "eval/heldout_share_ppl": [0.0, 0]}
    for name, stream in held.items():
        if stream.size < 2:
            continue
        nats, n = heldout_loss(model, stream, cfg.seq_len, cfg.heldout_tokens, device, cfg.bf16)
        key = "eval/heldout_ppl" if whole is None or name in whole else "eval/heldout_share_ppl"
        pooled[key][0] += nats
        pooled[key][1] += n
        if len(held) > 1 or name != "heldout":
            out[f"{key}/{name}"] = math.exp(nats / n)
    for key, (nats, n) in pooled.items():
        if n:
            out[key] = math.exp(nats / n)
    return out


def _budget_lr(step: int, frac: float, cfg: PretrainConfig, floor: float = 0.1) -> float:
    """Warm-up over ``warmup_steps``, then cosine decay to ``floor`` over the run's progress ``frac``
    (the larger of steps done and budget spent)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def expected_steps(steps: int, step: int, steps_done: int, seconds_spent: float, seconds_left: float | None) -> int:
    """The step a run will end at, for its progress line: ``steps``, or sooner when a time budget
    (``seconds_left`` of it remaining) runs out first at the rate so far (``steps_done`` in
    ``seconds_spent`` since this process began). A run bounded by ``--minutes`` then shows its
    share done and the minutes left, not a share of a step count it will never reach."""
    if seconds_left is None or steps_done <= 0 or seconds_spent <= 0:
        return steps
    return max(step, min(steps, step + int(steps_done / seconds_spent * max(seconds_left, 0.0))))


def pretrain(cfg: PretrainConfig) -> dict:
    """Run stage 1; returns the final metrics (tokens/s, MFU, held-out perplexity, paths)."""
    run = _setup(cfg)
    try:
        stopped = _loop(run)
    except KeyboardInterrupt:  # the steps done are kept: --resume goes on from here
        if run.step > run.first_step and run.step % cfg.save_every:
            log.warning("interrupted at step %d: saving the model and the training state (--resume continues "
                        "from step %d)", run.step, run.step)
            run.save()
        raise
    if run.step % cfg.eval_every and run.step != cfg.steps:  # stopped by the budget between evaluations
        run.evaluate()
    if run.step % cfg.save_every and run.step != cfg.steps:
        run.save()
    run.logger.close()
    result = _result(run, stopped)
    (run.out / "result.json").write_text(json.dumps(result, indent=1))
    return result


@dataclass
class _Run:
    """What one pre-training run holds between steps."""

    cfg: PretrainConfig
    out: Path
    device: torch.device
    tok: Any
    model: torch.nn.Module
    train_model: torch.nn.Module
    """The model the steps run (compiled on a GPU when asked)."""
    opt: torch.optim.Optimizer
    rng: np.random.Generator
    logger: MetricLogger
    train_ids: np.ndarray
    held: dict[str, np.ndarray]
    corpus_info: dict
    params: int
    n_flop: int
    """Matmul parameters (what MFU counts)."""
    peak: float | None
    """The device's peak TFLOP/s (None: unknown, no MFU)."""
    step: int
    elapsed0: float
    """Wall seconds spent before a resume."""
    t_start: float
    """``perf_counter`` at the start, less ``elapsed0``."""
    first_step: int
    tokens_done: int = 0
    t_train: float = 0.0
    warm: tuple[float, int] | None = None
    """(train seconds, tokens) once the first steps' one-time costs are paid."""
    last: dict = field(default_factory=dict)
    """The latest metrics (training and held-out)."""

    @property
    def state_path(self) -> Path:
        return self.out / "state.pt"

    def rate(self) -> float:
        """Tokens/s of the steady state: past the first 3 steps (compilation, allocation), when there are more."""
        if self.warm is not None and self.tokens_done > self.warm[1]:
            return (self.tokens_done - self.warm[1]) / (self.t_train - self.warm[0])
        return self.tokens_done / max(self.t_train, 1e-9)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def save(self) -> None:
        self.model.save_pretrained(self.out / "model")
        save_tokenizer(self.tok, self.out / "model")
        save_train_state(self.state_path, self.opt, self.step, self.rng, asdict(self.cfg), elapsed_s=self.elapsed())

    def evaluate(self) -> None:
        log.info("step %d: held-out perplexity on %d stream(s), at most %d tokens each", self.step, len(self.held),
                 self.cfg.heldout_tokens)
        ev = _evaluate(self.model, self.held, self.cfg, self.device, self.corpus_info.get("heldout_whole_packages"))
        self.last.update(ev)
        self.logger.log(self.step, ev)


def _setup(cfg: PretrainConfig) -> _Run:
    """Device, data and model (resumed if asked), optimizer and logger."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(cfg.device)
    state_path = out / "state.pt"
    resuming = cfg.resume and state_path.exists() and (out / "model").exists()
    if cfg.resume and not resuming:
        log.warning("--resume: nothing to resume in %s (no state.pt and model/ there): starting from step 0", out)
    tok, model, train_ids, held, corpus_info = _data(cfg, out, resuming)
    model.to(device)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95),
                            fused=device.type == "cuda")
    rng = np.random.default_rng(cfg.seed)
    step, elapsed0 = 0, 0.0
    if resuming:
        st = load_train_state(state_path, opt, rng, device)
        step, elapsed0 = st["step"], float(st.get("elapsed_s", 0.0))
        log.info("resumed from step %d", step)
    logger = MetricLogger(out, resumed_at=step if resuming else None)
    model.train()
    train_model = torch.compile(model) if cfg.compile and device.type == "cuda" else model
    if cfg.compile and device.type != "cuda":
        log.warning("--compile compiles on a CUDA device only: on %s the model runs eagerly", device.type)
    params = sum(p.numel() for p in model.parameters())
    n_flop = matmul_params(model)
    peak = cfg.peak_tflops or (peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None)
    logger.log(step, {"model/params": params, "data/train_tokens": int(train_ids.size),
                      "data/heldout_tokens": int(sum(h.size for h in held.values()))})
    return _Run(cfg, out, device, tok, model, train_model, opt, rng, logger, train_ids, held, corpus_info, params,
                n_flop, peak, step, elapsed0, time.perf_counter() - elapsed0, first_step=step)


def _loop(run: _Run) -> str:
    """Steps until ``cfg.steps`` or the time budget: log, estimate, evaluate, save; returns what
    stopped it ('steps' or 'minutes')."""
    cfg = run.cfg
    data = batches(run.train_ids, cfg.batch_size, cfg.seq_len, run.rng)
    budget_s = cfg.minutes * 60 if cfg.minutes else None
    estimate = TimeEstimate(cfg, run.device, first_step=run.step)
    stopped = "steps"
    step0, spent0 = run.step, run.elapsed()
    with progress() as bar:
        task = bar.add_task("pretrain", total=cfg.steps, completed=run.step)
        while run.step < cfg.steps:
            if budget_s is not None and run.elapsed() >= budget_s:
                stopped = "minutes"
                break
            x = next(data).to(run.device, non_blocking=True)
            lr = (cosine_lr(run.step, cfg.steps, cfg.lr, cfg.warmup_steps) if budget_s is None
                  else _budget_lr(run.step, max(run.step / cfg.steps, run.elapsed() / budget_s), cfg))
            loss_v = _step(run, x, lr)
            total = expected_steps(cfg.steps, run.step, run.step - step0, run.elapsed() - spent0,
                                   None if budget_s is None else budget_s - run.elapsed())
            bar.update(task, advance=1, total=total, description=f"pretrain loss {loss_v:.3f}")
            if budget_s is None:
                estimate.step(run.step, run.t_train)
            if run.step % cfg.eval_every == 0 or run.step == cfg.steps:
                run.evaluate()
            if run.step % cfg.save_every == 0 or run.step == cfg.steps:
                run.save()
    return stopped


def _step(run: _Run, x: torch.Tensor, lr: float) -> float:
    """One training step on ``x`` and its metrics (logged every 10 steps); returns its loss."""
    cfg = run.cfg
    ts = time.perf_counter()
    loss_v, gnorm = _train_step(run.train_model, run.opt, x, lr, cfg, run.device)
    run.t_train += time.perf_counter() - ts
    run.tokens_done += x[:, :-1].numel()
    run.step += 1
    if run.warm is None and run.step - run.first_step == 3:
        run.warm = (run.t_train, run.tokens_done)
    tps = run.rate()
    run.last.update({"losses/train": loss_v, "charts/lr": lr, "charts/grad_norm": gnorm,
                     "charts/tokens_per_s": tps})
    if (u := mfu(run.n_flop, tps, run.peak)) is not None:
        run.last["charts/mfu"] = u
    if run.step % 10 == 0 or run.step == cfg.steps:
        run.logger.log(run.step, {k: v for k, v in run.last.items() if not k.startswith("eval/")})
    return loss_v


def _result(run: _Run, stopped: str) -> dict:
    """The final metrics (what result.json holds)."""
    cfg, device, last = run.cfg, run.device, run.last
    return {"steps": run.step, "params": run.params, "flop_params": run.n_flop, "preset": cfg.preset,
            "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "tokens_trained": run.tokens_done,
            "tokens_per_s": run.rate(), "train_seconds": run.t_train,
            "wall_seconds": run.elapsed() - run.elapsed0, "stopped": stopped, "minutes": cfg.minutes,
            "mfu": mfu(run.n_flop, run.rate(), run.peak), "peak_tflops": run.peak,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            "heldout_ppl_by_package": {k.split("/", 2)[2]: v for k, v in last.items()
                                       if k.startswith("eval/heldout_ppl/")},
            "heldout_share_ppl_by_package": {k.split("/", 2)[2]: v for k, v in last.items()
                                             if k.startswith("eval/heldout_share_ppl/")},
            "train_tokens": int(run.train_ids.size), **run.corpus_info, "model_dir": str(run.out / "model"), **last}
