"""Refinement turns in RL: the policy sees its previous kernel and what the harness measured for it
(its time against cuSPARSE, or its error) and writes another, as ``sparserl search``'s policy
refinements do (:func:`sparserl.search.policy.refinement_prompt`, the same prompt).

With ``turns = T`` each RL step samples the ordinary prompts (turn 1), then for every completion
of turn t one completion of turn t + 1 shown that completion and its outcome. Each turn's samples
are scored on their own; a completion's score becomes its discounted return
``G_t = r_t + discount * G_{t+1}`` (its own reward plus what its refinements achieved), and the
turns enter one update as one batch, each (matrix, turn) its own group for the baselines. A
refinement that failed for a reason of the machine has no reward: it is left out of its parent's
return (:func:`discounted_returns`), as it is left out of the update.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from sparserl.harness.extract import Extracted, extract
from sparserl.model.policy import Sample
from sparserl.rl.rollout import MatrixItem, RolloutBatch, collect
from sparserl.search.policy import MAX_PREVIOUS_CHARS

log = logging.getLogger(__name__)



def refinement_samples(rep: list[MatrixItem], batch: RolloutBatch) -> list[Sample]:
    """The next turn's prompts: each completion of ``batch`` (cleaned by the harness's extractor)
    with its measured outcome, on the same matrix input and card. Pure."""
    from sparserl.search.policy import refinement_prompt

    out = []
    for it, s, text, r in zip(rep, batch.samples, batch.texts, batch.results):
        ex = extract(text, it.op)
        previous = (ex.text if isinstance(ex, Extracted) else text)[:MAX_PREVIOUS_CHARS]
        prompt = refinement_prompt(it.op, it.k, (int(it.A.shape[0]), int(it.A.shape[1])), int(it.A.nnz),
                                   s.card, previous, r)
        out.append(dataclasses.replace(s, prompt=prompt))
    return out


def discounted_returns(rewards: list[torch.Tensor], discount: float, valid: list[torch.Tensor] | None = None,
                       group_size: int | None = None) -> list[torch.Tensor]:
    """``G_t = r_t + discount * G_{t+1}`` per completion, for per-turn rewards (each (B,), the
    completions of turn t + 1 aligned with their parents in turn t). Pure.

    ``valid`` (per turn, (B,) bool; None: all valid): a completion whose evaluation failed for a
    reason of the machine has no reward, so its return is unknown and is left out of its parent's:
    in its place the parent takes the mean return of the valid completions of the same group
    (``group_size`` consecutive completions: one matrix's samples in that turn), so that the
    missing refinement moves no group-relative advantage; a group with no valid completion adds
    nothing (the same for every parent of the group). The returns of invalid completions
    themselves are that stand-in (the update masks them out)."""
    out = [r.clone() for r in rewards]
    if valid is None:
        for t in range(len(out) - 2, -1, -1):
            out[t] = out[t] + discount * out[t + 1]
        return out
    if group_size is None or group_size < 1:
        raise ValueError("discounted_returns with valid masks needs group_size >= 1")
    for t in range(len(out) - 1, -1, -1):
        if t + 1 < len(out):
            out[t] = out[t] + discount * out[t + 1]
        out[t] = _valid_or_group_mean(out[t], valid[t], group_size)
    return out


def _valid_or_group_mean(g: torch.Tensor, valid: torch.Tensor, group_size: int) -> torch.Tensor:
    """``g`` with each invalid entry replaced by the mean of its group's valid entries (0 when the
    group has none). (B,) with B a multiple of ``group_size``."""
    gv, vv = g.view(-1, group_size), valid.view(-1, group_size).to(g.dtype)
    mean = (gv * vv).sum(1, keepdim=True) / vv.sum(1, keepdim=True).clamp(min=1.0)
    return torch.where(vv.bool(), gv, mean.expand_as(gv)).reshape(g.shape)


def _pad(x: torch.Tensor | None, T: int, value: float) -> torch.Tensor | None:
    if x is None or x.shape[1] == T:
        return x
    return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch of several (rows in order; responses right-padded to the longest)."""
    T = max(b.response.shape[1] for b in batches)

    def cat(name: str, value: float = 0.0):
        xs = [getattr(b, name) for b in batches]
        return None if any(x is None for x in xs) else torch.cat([_pad(x, T, value) for x in xs])

    timings: dict[str, float] = {}
    for b in batches:
        for key, v in b.timings.items():
            timings[key] = timings.get(key, 0.0) + v
    for key in timings:  # seconds add up; shares are averaged over the batches
        if not key.startswith("time/"):
            timings[key] /= sum(key in b.timings for b in batches)
    new_bests = frozenset().union(*(b.new_bests for b in batches))
    if "reward/new_best_known" in timings:  # an entry raised in two turns is one new best-known kernel
        timings["reward/new_best_known"] = float(len(new_bests))
    return RolloutBatch(
        samples=[s for b in batches for s in b.samples], texts=[t for b in batches for t in b.texts],
        response=cat("response", pad_id), mask=cat("mask"), old_logp=cat("old_logp"), ref_logp=cat("ref_logp"),
        values=cat("values"), scores=torch.cat([b.scores for b in batches]),
        results=[r for b in batches for r in b.results], timings=timings, entropy=cat("entropy"),
        sample_logp=cat("sample_logp"),
        valid=torch.cat([b.valid_mask for b in batches]), new_bests=new_bests)


def collect_turns(policy, ref_logp_fn, value_fn, evaluator, items: list[MatrixItem], samples_per_item: int,
                  max_new_tokens: int | None, temperature: float, reward_cfg, seed: int, turns: int, discount: float,
                  best_known=None, compile_only: bool = False) -> RolloutBatch:
    """``turns`` turns of :func:`collect` (turn t + 1 refining each completion of turn t), scored by
    discounted returns and merged into one batch; per-turn figures in its timings dict (no correct
    rate when ``compile_only``: nothing was run)."""
    rep = [it for it in items for _ in range(samples_per_item)]
    batches = [collect(policy, ref_logp_fn, value_fn, evaluator, items, samples_per_item, max_new_tokens,
                       temperature, reward_cfg, seed, best_known=best_known)]
    for t in range(1, turns):
        batches.append(collect(policy, ref_logp_fn, value_fn, evaluator, items, samples_per_item, max_new_tokens,
                               temperature, reward_cfg, seed + 7919 * t, best_known=best_known,
                               samples=refinement_samples(rep, batches[-1])))
    figures = {}
    for t, b in enumerate(batches, start=1):
        valid = b.valid_mask
        n = max(int(valid.sum()), 1)
        figures[f"turns/reward_mean_{t}"] = float(b.scores[valid].sum()) / n
        if not compile_only:
            figures[f"turns/correct_rate_{t}"] = sum(r.correct for r, v in zip(b.results, valid.tolist()) if v) / n
    returns = discounted_returns([b.scores for b in batches], discount, [b.valid_mask for b in batches],
                                 samples_per_item)
    for b, g in zip(batches, returns):
        b.scores = g * b.valid_mask.to(g.dtype)
    merged = concat_batches(batches, policy.tokenizer.pad_token_id)
    merged.timings |= figures
    return merged
