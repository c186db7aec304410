"""Helpers of the RL tests: a tiny random policy, its samples, and rollout batches built the
trainer's way (rollout.annotate), so the tests exercise the code paths a run takes."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future

import torch

from sparserl.matrices import generate
from sparserl.rl.rollout import response_mask


def tiny_policy(tiny_tokenizer, tiny_hf_config, lora: bool = False, dropout: float = 0.05):
    from sparserl.encoding import EncodingConfig
    from sparserl.model.policy import LoraSpec, Policy, PolicyConfig

    enc = EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2)
    pcfg = PolicyConfig(encoding=enc, lora=LoraSpec(r=4, alpha=8, dropout=dropout) if lora else None)
    return Policy.from_config(tiny_hf_config, tiny_tokenizer, pcfg, seed=0)


def tiny_samples(policy, families=("banded",) * 4):
    from sparserl.kernels.contract import Op
    from sparserl.model.policy import make_sample

    mats = {f: generate(f, 200, seed=i) for i, f in enumerate(dict.fromkeys(families))}
    return [make_sample(mats[f], policy.config, Op.SPMV) for f in families]


def rollout(policy, vh, samples, scores, temperature: float = 1.0, max_new_tokens: int = 10, seed: int = 1):
    """A RolloutBatch built the trainer's way (rollout.annotate) for given scores."""
    from sparserl.rl.rollout import RolloutBatch, annotate
    from sparserl.rl.update import Reference

    tok = policy.tokenizer
    ids, sample_logp = policy.generate_ids(samples, max_new_tokens=max_new_tokens, temperature=temperature,
                                           seed=seed, return_logp=True)
    mask = response_mask(ids, tok.eos_token_id, tok.pad_token_id)
    ann = annotate(policy, Reference(policy), vh, samples, ids, mask, temperature)
    return RolloutBatch(samples, [""] * len(samples), ids, mask, ann.old_logp, ann.ref_logp, ann.values, scores, [],
                        entropy=ann.entropy, sample_logp=sample_logp * mask)


def seq_logp(policy, batch):
    from sparserl.rl.rollout import token_logprobs

    with torch.no_grad():
        logits, _ = policy.response_forward(batch.samples, batch.response, batch.mask)
        return (token_logprobs(logits, batch.response) * batch.mask).sum(1)


def run_update(cfg, policy, vh, batch):
    import numpy as np

    from sparserl.rl.update import ActorCritic, advantages, build_optimizer, update

    adv, returns = advantages(cfg, batch)
    stats = update(cfg, ActorCritic(policy, vh), build_optimizer(policy, vh, cfg), batch, adv, returns,
                   cfg.kl_loss_coef, np.random.default_rng(0), torch.device("cpu"))
    return adv, returns, stats


class ScriptedEvaluator:
    """Stands in for the harness in rollout tests: returns the given EvalResults in turn (as
    finished futures) and remembers the texts it was sent."""

    memo_hits = 0

    def __init__(self, results):
        self.results, self.texts = list(results), []

    def submit(self, text, ref, op, k) -> Future:
        self.texts.append(text)
        f: Future = Future()
        f.set_result(self.results.pop(0))
        return f

    @contextlib.contextmanager
    def gpu_lease(self, device):
        yield
