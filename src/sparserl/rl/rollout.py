"""Rollouts: completions sampled from the policy, scored by the harness.

``collect`` samples completions for a batch of matrices, submits every completion to the
harness right away (compiling and timing run in the harness's threads and GPU workers)
and, while they run, computes the policy's and the reference's log-probabilities and the
critic's values for the same tokens (:func:`annotate`, at the sampling temperature). Scores
come from the named reward function; samples whose evaluation failed for a reason of the
machine are marked invalid and masked out instead of scored.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch

from sparserl.encoding import MatrixInput
from sparserl.errors import SparseRLError
from sparserl.harness.result import EvalResult
from sparserl.kernels.contract import Op
from sparserl.model.policy import Policy, Sample, make_sample
from sparserl.rewards import RewardConfig, infrastructure_failure, reward
from sparserl.rl.core import entropy_from_logp

if TYPE_CHECKING:
    from sparserl.harness.evaluator import MatrixRef

log = logging.getLogger(__name__)


@dataclass
class MatrixItem:
    """A training matrix: its data, its harness registration and its encoder input."""

    name: str
    A: sp.csr_array
    ref: MatrixRef
    inp: MatrixInput
    op: Op
    k: int | None
    card: str | None = None
    """The matrix card's prompt text (None: the policy's prompt has no card)."""

    def sample(self) -> Sample:
        return Sample(self.inp, self.op, self.k, int(self.A.nnz), card=self.card)


def matrix_entry(A, policy: Policy) -> tuple[MatrixInput, str | None]:
    """A matrix's encoder input and card, computed once and shared by its items (ops)."""
    s = make_sample(A, policy.config, Op.SPMV)
    return s.matrix, s.card


class MatrixPool:
    """Matrices cycled over by RL (seeded order, reshuffled every pass)."""

    def __init__(self, items: list[MatrixItem], seed: int = 0):
        if not items:
            raise SparseRLError("no training matrices for RL")
        self.items = items
        self.rng = np.random.default_rng(seed)
        self.order: list[int] = []

    def next(self, n: int) -> list[MatrixItem]:
        out = []
        while len(out) < n:
            if not self.order:
                self.order = list(self.rng.permutation(len(self.items)))
            out.append(self.items[self.order.pop()])
        return out


def matrix_items(paths: list[str], evaluator, policy: Policy, ops: tuple[str, ...], k: int) -> list[MatrixItem]:
    from sparserl.matrices import load_matrix

    items = []
    for p in paths:
        A = load_matrix(p)
        name = Path(p).name.split(".")[0]
        ref = evaluator.register(A, name)
        inp, card = matrix_entry(A, policy)
        for o in ops:
            op = Op(o)
            items.append(MatrixItem(name, A, ref, inp, op, k if op is Op.SPMM else None, card))
    return items


@dataclass
class RolloutBatch:
    """B completions with everything PPO/GRPO need (tensors on the policy's device).

    Samples whose evaluation failed for a reason of the machine (``valid`` False, see
    :func:`sparserl.rewards.infrastructure_failure`) have an all-zero ``mask`` row and a 0 score:
    they take no part in the update, and the group baselines leave them out."""

    samples: list[Sample]
    texts: list[str]
    response: torch.Tensor  # (B, T) token ids, right-padded
    mask: torch.Tensor  # (B, T) 1 on real response tokens (EOS included) of valid samples
    old_logp: torch.Tensor  # (B, T) the learner's log-probs at rollout time (at the sampling temperature)
    ref_logp: torch.Tensor  # (B, T)
    values: torch.Tensor | None  # (B, T) or None (no critic)
    scores: torch.Tensor  # (B,) reward of each completion (a 0 placeholder where not valid: read with valid_mask)
    results: list[EvalResult]
    timings: dict[str, float] = field(default_factory=dict)
    entropy: torch.Tensor | None = None  # (B, T) the old policy's entropy at each response token
    sample_logp: torch.Tensor | None = None  # (B, T) the sampler's own log-probs of the same tokens
    valid: torch.Tensor | None = None  # (B,) bool: False for infrastructure failures (None: all valid)
    new_bests: frozenset = frozenset()
    """The best-known store entries whose bar this batch raised (``BestKnown.record``; counted once
    each in ``reward/new_best_known``, also when batches merge)."""

    @property
    def valid_mask(self) -> torch.Tensor:
        """(B,) bool, True for the samples that count."""
        if self.valid is None:
            return torch.ones(self.scores.shape[0], dtype=torch.bool, device=self.scores.device)
        return self.valid


def response_mask(ids: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row (all non-pad tokens when there is none)."""
    is_eos = ids == eos_id
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
    mask = ~after
    if pad_id != eos_id:
        mask &= ids != pad_id
    return mask.to(torch.float32)


def _log_softmax_rows(logits: torch.Tensor, rows: int, temperature: float = 1.0):
    """(row slice, float32 log-softmax of those rows' logits / temperature) for ``rows`` sequences
    at a time: a float32 copy of the whole (B, T, V) logits would be tens of GB with a 150k-token
    vocabulary."""
    for i in range(0, logits.shape[0], rows):
        chunk = logits[i:i + rows].float()
        yield slice(i, i + rows), torch.log_softmax(chunk / temperature if temperature != 1.0 else chunk, dim=-1)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, rows: int = 4, temperature: float = 1.0) -> torch.Tensor:
    """log p(ids) under softmax(logits / temperature): (B, T, V), (B, T) -> (B, T), in float32."""
    return torch.cat([logp.gather(-1, ids[sl, :, None]).squeeze(-1)
                      for sl, logp in _log_softmax_rows(logits, rows, temperature)])


def logprobs_and_entropy(logits: torch.Tensor, ids: torch.Tensor, rows: int = 4, temperature: float = 1.0,
                         entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(ids), entropy), both (B, T) in float32, of softmax(logits / temperature), from one
    log-softmax per ``rows`` sequences.

    Gradients flow through the log-probabilities; the entropy is a measurement computed without
    autograd (no per-chunk (rows, T, V) intermediate kept for a backward pass) unless
    ``entropy_grad`` (an entropy bonus in the loss)."""
    lp, ent = [], []
    for sl, logp in _log_softmax_rows(logits, rows, temperature):
        lp.append(logp.gather(-1, ids[sl, :, None]).squeeze(-1))
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent.append(entropy_from_logp(logp))
    return torch.cat(lp), torch.cat(ent)


@contextlib.contextmanager
def train_mode(module: torch.nn.Module, training: bool = True):
    """``module`` in training mode (gradient checkpointing needs it) or eval mode, with every
    dropout layer in eval mode either way: LoRA dropout and any model dropout are off, as they
    are when sampling, so that the learner's log-probs are the sampler's. Restores the previous
    modes on exit."""
    before = {m: m.training for m in module.modules()}
    module.train(training)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.eval()
    try:
        yield module
    finally:
        for m, t in before.items():
            m.training = t


@dataclass
class Annotation:
    """What the learner needs besides the tokens, computed once at rollout time, all (B, T)."""

    old_logp: torch.Tensor
    entropy: torch.Tensor
    ref_logp: torch.Tensor
    values: torch.Tensor | None


@torch.no_grad()
def annotate(policy: Policy, ref_logp_fn, value_fn, samples: list[Sample], ids: torch.Tensor, mask: torch.Tensor,
             temperature: float) -> Annotation:
    """The policy's log-probs and entropies, the reference's log-probs (``ref_logp_fn(samples, ids,
    mask)``) and the critic's values (``value_fn(hidden)``, or None) for sampled ``ids`` (B, T),
    all at the sampling temperature and zero outside ``mask``. Run it under the same autocast
    setting as the update, so that the update's first ratio is exactly 1."""
    with train_mode(policy, False):
        logits, hidden = policy.response_forward(samples, ids, mask, hidden=value_fn is not None)
    old_logp, entropy = logprobs_and_entropy(logits, ids, temperature=temperature)
    del logits
    values = value_fn(hidden) * mask if value_fn is not None else None
    ref_logp = ref_logp_fn(samples, ids, mask, temperature=temperature) * mask
    return Annotation(old_logp * mask, entropy * mask, ref_logp, values)


def _valid(results: list[EvalResult]) -> list[bool]:
    """False for the results that failed for a reason of the machine; logged."""
    valid = [not infrastructure_failure(r) for r in results]
    if not all(valid):
        kinds = sorted({r.error_kind.value for r, v in zip(results, valid) if not v})
        log.warning("%d of %d samples failed for reasons of the machine (%s): left out of the update and the "
                    "baselines", valid.count(False), len(valid), ", ".join(kinds))
    return valid


def collect(policy: Policy, ref_logp_fn, value_fn, evaluator, items: list[MatrixItem], samples_per_item: int,
            max_new_tokens: int | None, temperature: float, reward_cfg: RewardConfig, seed: int,
            best_known=None, samples: list[Sample] | None = None) -> RolloutBatch:
    """Sample, score and annotate one batch (``len(items) * samples_per_item`` completions).

    ``samples``: the prompts to sample from, one per completion in that order (each item's
    ``samples_per_item`` in a row; a refinement turn's, :mod:`sparserl.rl.turns`), instead of
    each item's ordinary prompt.

    ``best_known`` (:class:`~sparserl.rl.best_known.BestKnown`, for the relative_best reward):
    samples are scored against the store's best time before the batch, and the correct ones that
    beat it are written back."""
    t0 = time.perf_counter()
    rep = [it for it in items for _ in range(samples_per_item)]
    if samples is None:
        samples = [it.sample() for it in rep]
    elif len(samples) != len(rep):
        raise SparseRLError(f"{len(samples)} prompts for {len(rep)} completions")
    ids, sample_logp = policy.generate_ids(samples, max_new_tokens=max_new_tokens, temperature=temperature,
                                           seed=seed, return_logp=True)
    tok = policy.tokenizer
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    t_gen = time.perf_counter() - t0
    hits = getattr(evaluator, "memo_hits", 0)
    futures = [evaluator.submit(t, it.ref, it.op, it.k) for t, it in zip(texts, rep)]  # harness runs meanwhile
    hits = getattr(evaluator, "memo_hits", 0) - hits
    t1 = time.perf_counter()
    mask = response_mask(ids, tok.eos_token_id, tok.pad_token_id).to(ids.device)
    with evaluator.gpu_lease(ids.device):  # compile and verify overlap these passes; timing waits for the GPU
        ann = annotate(policy, ref_logp_fn, value_fn, samples, ids, mask, temperature)
        if ids.device.type == "cuda":  # the lease goes back only once this GPU work has finished
            torch.cuda.synchronize(ids.device)
    t_fwd = time.perf_counter() - t1
    t2 = time.perf_counter()
    results = [f.result() for f in futures]
    t_wait = time.perf_counter() - t2
    valid = torch.tensor(_valid(results), dtype=torch.bool, device=ids.device)
    before = best_known.bests(rep, results) if best_known is not None else [None] * len(results)
    scores = torch.tensor([reward(r, reward_cfg, b) if v else 0.0 for r, v, b in zip(results, valid.tolist(), before)],
                          dtype=torch.float32, device=ids.device)
    extra, new_bests = {}, frozenset()
    if best_known is not None:
        extra["reward/best_known_share"] = sum(b is not None for b in before) / len(before) if before else 0.0
        new_bests = frozenset(best_known.record(rep, texts, results, before))
        extra["reward/new_best_known"] = float(len(new_bests))
    keep = valid[:, None].to(mask.dtype)
    eval_s = [r.eval_seconds for r in results]
    return RolloutBatch(samples, texts, ids, mask * keep, ann.old_logp * keep, ann.ref_logp * keep,
                        ann.values * keep if ann.values is not None else None, scores, results,
                        {"time/generate": t_gen, "time/forward": t_fwd, "time/harness_wait": t_wait,
                         "time/harness_eval_mean": float(np.mean(eval_s)) if eval_s else 0.0,
                         "charts/harness_memo_share": hits / len(texts) if texts else 0.0} | extra,
                        ann.entropy * keep, sample_logp.to(mask.dtype) * mask * keep, valid, new_bests)
