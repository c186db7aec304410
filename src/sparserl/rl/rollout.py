"""Rollouts: completions sampled from the policy, scored by the harness.

``collect`` samples completions for a batch of matrices, submits every completion to the
harness right away (compiling and timing run in the harness's threads and GPU workers)
and, while they run, computes the policy's and the reference's log-probabilities and the
critic's values for the same tokens. Scores come from the named reward function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sparserl.encoding import MatrixInput
from sparserl.errors import SparseRLError
from sparserl.harness.result import EvalResult
from sparserl.kernels.contract import Op
from sparserl.model.policy import Policy, Sample
from sparserl.rewards import RewardConfig, reward
from sparserl.rl.core import entropy_from_logp


@dataclass
class MatrixItem:
    """A training matrix: its data, its harness registration and its encoder input."""

    name: str
    A: object
    ref: object  # harness MatrixRef
    inp: MatrixInput
    op: Op
    k: int | None

    def sample(self) -> Sample:
        return Sample(self.inp, self.op, self.k, int(self.A.nnz))


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
        inp = MatrixInput.from_matrix(A, policy.config.encoding)
        for o in ops:
            op = Op(o)
            items.append(MatrixItem(name, A, ref, inp, op, k if op is Op.SPMM else None))
    return items


@dataclass
class RolloutBatch:
    """B completions with everything PPO/GRPO need (tensors on the policy's device)."""

    samples: list[Sample]
    texts: list[str]
    response: torch.Tensor  # (B, T) token ids, right-padded
    mask: torch.Tensor  # (B, T) 1 on real response tokens (EOS included)
    old_logp: torch.Tensor  # (B, T)
    ref_logp: torch.Tensor  # (B, T)
    values: torch.Tensor | None  # (B, T) or None (GRPO)
    scores: torch.Tensor  # (B,) reward of each completion
    results: list[EvalResult]
    timings: dict[str, float] = field(default_factory=dict)
    entropy: torch.Tensor | None = None  # (B, T) the old policy's entropy at each response token


def response_mask(ids: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row (all non-pad tokens when there is none)."""
    is_eos = ids == eos_id
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
    mask = ~after
    if pad_id != eos_id:
        mask &= ids != pad_id
    return mask.to(torch.float32)


def _log_softmax_rows(logits: torch.Tensor, rows: int):
    """(row slice, float32 log-softmax of those rows) for ``rows`` sequences at a time: a float32
    copy of the whole (B, T, V) logits would be tens of GB with a 150k-token vocabulary."""
    for i in range(0, logits.shape[0], rows):
        yield slice(i, i + rows), torch.log_softmax(logits[i:i + rows].float(), dim=-1)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, rows: int = 4) -> torch.Tensor:
    """log p(ids) under logits: (B, T, V), (B, T) -> (B, T), in float32."""
    return torch.cat([logp.gather(-1, ids[sl, :, None]).squeeze(-1) for sl, logp in _log_softmax_rows(logits, rows)])


def logprobs_and_entropy(logits: torch.Tensor, ids: torch.Tensor, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(ids), entropy), both (B, T) in float32, from one log-softmax per ``rows`` sequences.

    Gradients flow through the log-probabilities only: the entropy is a measurement (computed
    without autograd, so no per-chunk (rows, T, V) intermediate is kept for a backward pass)."""
    lp, ent = [], []
    for sl, logp in _log_softmax_rows(logits, rows):
        lp.append(logp.gather(-1, ids[sl, :, None]).squeeze(-1))
        with torch.no_grad():
            ent.append(entropy_from_logp(logp))
    return torch.cat(lp), torch.cat(ent)


def collect(policy: Policy, ref_logp_fn, value_fn, evaluator, items: list[MatrixItem], samples_per_item: int,
            max_new_tokens: int, temperature: float, reward_cfg: RewardConfig, seed: int) -> RolloutBatch:
    """Sample, score and annotate one batch (``len(items) * samples_per_item`` completions)."""
    t0 = time.perf_counter()
    rep = [it for it in items for _ in range(samples_per_item)]
    samples = [it.sample() for it in rep]
    ids = policy.generate_ids(samples, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    tok = policy.tokenizer
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    t_gen = time.perf_counter() - t0
    hits = getattr(evaluator, "memo_hits", 0)
    futures = [evaluator.submit(t, it.ref, it.op, it.k) for t, it in zip(texts, rep)]  # harness runs meanwhile
    hits = getattr(evaluator, "memo_hits", 0) - hits
    t1 = time.perf_counter()
    mask = response_mask(ids, tok.eos_token_id, tok.pad_token_id).to(ids.device)
    with evaluator.gpu_lease(ids.device), torch.no_grad():  # compile and verify overlap these passes; timing waits for the GPU
        logits, hidden = policy.response_forward(samples, ids, mask, hidden=value_fn is not None)
        old_logp, entropy = logprobs_and_entropy(logits, ids)
        old_logp, entropy = old_logp * mask, entropy * mask
        del logits
        values = value_fn(hidden) * mask if value_fn is not None else None
        ref_logp = ref_logp_fn(samples, ids, mask) * mask
        if ids.device.type == "cuda":  # the lease goes back only once this GPU work has finished
            torch.cuda.synchronize(ids.device)
    t_fwd = time.perf_counter() - t1
    t2 = time.perf_counter()
    results = [f.result() for f in futures]
    t_wait = time.perf_counter() - t2
    scores = torch.tensor([reward(r, reward_cfg) for r in results], dtype=torch.float32, device=ids.device)
    eval_s = [r.eval_seconds for r in results]
    return RolloutBatch(samples, texts, ids, mask, old_logp, ref_logp, values, scores, results,
                        {"time/generate": t_gen, "time/forward": t_fwd, "time/harness_wait": t_wait,
                         "time/harness_eval_mean": float(np.mean(eval_s)) if eval_s else 0.0,
                         "charts/harness_memo_share": hits / len(texts) if texts else 0.0}, entropy)
