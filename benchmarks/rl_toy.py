"""RL settings on a CPU in minutes: the kernel-choice problem with a table instead of a GPU.

K kernels (real rendered library variants, cut to their first ``--chars`` characters so a tiny
model learns them) and M generated matrices; a fixed table gives each (matrix, kernel) pair a
speedup, with a different best kernel for each matrix. A completion that is not exactly one of
the K kernels scores as a compile error. The tiny policy is first fine-tuned to write every
kernel for every matrix (SFT on correct targets, as ``sparserl data build`` does), then trained
with the project's own RL code (``collect``, ``advantages``, ``update``) on rewards from the
table through the default reward function. Per step it reports the share of intact kernels
(exactly one of the K), the share of oracle picks (the best kernel for its matrix) and the mean
reward; one run per ``--algos`` entry from the same SFT model, side by side, and a JSON file.

It answers questions about the algorithm, not the GPU: does an update damage the code tokens
after the choice, does the choice move toward the fast kernel, and how fast.

    python benchmarks/rl_toy.py --algos ppo,grpo --steps 30 --out rl_toy.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch

from sparserl.encoding import EncodingConfig, MatrixInput
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.model.config import TinyModelConfig, hf_config
from sparserl.model.policy import Policy, PolicyConfig
from sparserl.model.tokenizer import train_tokenizer
from sparserl.rewards import RewardConfig
from sparserl.rl.config import RLConfig
from sparserl.rl.rollout import MatrixItem, collect
from sparserl.rl.trainer import batch_metrics
from sparserl.rl.update import ActorCritic, Reference, ValueHead, advantages, build_optimizer, set_lr, update

FAMILIES = ("diagonal", "banded", "random", "powerlaw")


class TableEvaluator:
    """Stands in for the harness: a completion's result is looked up in the speedup table."""

    def __init__(self, kernels: list[str], table: np.ndarray, names: list[str]):
        self.kernels, self.table, self.names = kernels, table, names
        self.memo_hits = 0

    def submit(self, text: str, ref: str, op: Op, k: int | None) -> Future:
        f: Future = Future()
        text = text.strip()
        if text not in self.kernels:
            f.set_result(EvalResult.failure(op.value, k, ref, ErrorKind.COMPILE, "not one of the kernels"))
        else:
            s = float(self.table[self.names.index(ref), self.kernels.index(text)])
            f.set_result(EvalResult(op=op.value, k=k, matrix=ref, error_kind=ErrorKind.NONE, compiled=True,
                                    correct=True, speedup=s))
        return f

    @contextlib.contextmanager
    def gpu_lease(self, device):
        yield


def sft(policy: Policy, items: list[MatrixItem], kernels: list[str], steps: int, lr: float) -> float:
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    pairs = [(it.sample(), k) for it in items for k in kernels]
    rng = np.random.default_rng(0)
    policy.train()
    for _ in range(steps):
        batch = [pairs[i] for i in rng.choice(len(pairs), 16)]
        loss = policy.loss([b[0] for b in batch], [b[1] for b in batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def rl_config(spec: str, n_items: int, args) -> RLConfig:
    """The RLConfig of one run: ALGO or ALGO@SHARE, with the flags; ``--no-guards`` restores the
    settings of the lr 5e-5 collapse (no KL loss, KL only in PPO's reward, no warm-up, no KL stop)."""
    algo, _, share = spec.partition("@")
    guards = dict(kl_loss_coef=args.kl_loss_coef, target_kl=args.target_kl, warmup_steps=args.warmup,
                  kl_coef=args.kl_coef if algo == "ppo" else 0.0)
    if args.no_guards:
        guards = dict(kl_loss_coef=0.0, target_kl=None, warmup_steps=0, kl_coef=0.05 if algo == "ppo" else 0.0,
                      critic=True)
    return RLConfig(algo=algo, matrices_per_step=n_items, samples_per_matrix=args.group, minibatch=16,
                    lr=args.lr, epochs=2, device="cpu", lam=args.lam, score_baseline=args.baseline,
                    whiten_advantages=not args.no_whiten, pg_token_share=float(share) if share else args.pg_share,
                    large_per_family=0, **({"critic": args.critic} | guards))


def run(spec: str, policy: Policy, items, ev: TableEvaluator, args) -> list[dict]:
    best = [ev.kernels[int(np.argmax(ev.table[i]))] for i in range(len(items))]
    cfg = rl_config(spec, len(items), args)
    vh = ValueHead(policy.base_model.config.hidden_size) if cfg.uses_critic else None
    ref = Reference(policy)
    model, optim = ActorCritic(policy, vh), build_optimizer(policy, vh, cfg)
    rng = np.random.default_rng(1)
    rows = []
    for step in range(args.steps + 1):
        batch = collect(policy, ref, vh, ev, items, args.group, args.max_new_tokens, cfg.temperature, RewardConfig(),
                        seed=1000 + step)
        texts = [t.strip() for t in batch.texts]
        mats = [i for i in range(len(items)) for _ in range(args.group)]
        m = batch_metrics(batch, cfg)
        row = {"step": step, "intact": float(np.mean([t in ev.kernels for t in texts])),
               "oracle": float(np.mean([t == best[i] for t, i in zip(texts, mats)])),
               "reward": float(batch.scores.mean()), "kl_to_ref": m["charts/kl_to_ref"],
               "logp_gap": m["rollout/logp_gap"]}
        rows.append(row)
        if step == args.steps:
            print(f"{spec} step {step:3d}: intact {row['intact']:.2f} oracle {row['oracle']:.2f} "
                  f"reward {row['reward']:+.2f} kl_to_ref {row['kl_to_ref']:.3f}", flush=True)
            break
        set_lr(optim, cfg, step)
        adv, returns = advantages(cfg, batch)
        upd = update(cfg, model, optim, batch, adv, returns, cfg.kl_loss_coef, rng, torch.device("cpu"))
        row |= {"update_minibatches": upd["charts/update_minibatches"], "approx_kl": upd["losses/approx_kl"]}
        print(f"{spec} step {step:3d}: intact {row['intact']:.2f} oracle {row['oracle']:.2f} "
              f"reward {row['reward']:+.2f} kl_to_ref {row['kl_to_ref']:.3f} "
              f"minibatches {row['update_minibatches']:.0f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algos", default="ppo,grpo",
                    help="comma-separated runs: ppo, grpo, or ALGO@SHARE (that run's --pg-share)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--group", type=int, default=8, help="samples per matrix per step")
    ap.add_argument("--kernels", type=int, default=4)
    ap.add_argument("--chars", type=int, default=300, help="characters kept of each kernel")
    ap.add_argument("--sft-steps", type=int, default=500)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--lr", type=float, default=2e-4, help="RL learning rate (the demo's RL/SFT ratio is 1/15)")
    ap.add_argument("--kl-loss-coef", type=float, default=RLConfig.kl_loss_coef,
                    help="weight of the KL loss to the reference on every response token")
    ap.add_argument("--kl-coef", type=float, default=RLConfig.kl_coef, help="PPO: KL penalty in the reward")
    ap.add_argument("--target-kl", type=lambda v: None if v == "none" else float(v), default=RLConfig.target_kl,
                    help="stop a step's update epochs past this approximate KL ('none': never)")
    ap.add_argument("--warmup", type=int, default=RLConfig.warmup_steps, help="RL steps of linear lr warm-up")
    ap.add_argument("--no-guards", action="store_true",
                    help="the settings of the lr 5e-5 collapse: no KL loss (PPO: KL in the reward only, and a "
                         "critic), no warm-up, no KL early stop (the update's other fixes stay)")
    ap.add_argument("--lam", type=float, default=RLConfig.lam)
    ap.add_argument("--baseline", default="group", help="PPO score baseline: group or none")
    ap.add_argument("--no-whiten", action="store_true", help="PPO: leave the advantages unwhitened")
    ap.add_argument("--critic", action="store_true", help="PPO: a value head and GAE (default: leave-one-out, RLOO)")
    ap.add_argument("--pg-share", type=float, default=RLConfig.pg_token_share,
                    help="share of tokens (highest sampling entropy) that get the policy-gradient loss")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="tokens a completion may take (default: the longest kernel's, its end token and 8 more)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-cache", type=Path, default=None,
                    help="file of the SFT policy's weights: loaded when it exists, else written after SFT "
                         "(same --kernels/--chars/--seed/--sft-steps only)")
    ap.add_argument("--out", type=Path, default=Path("rl_toy.json"))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cut = sorted({v.render()[: args.chars].strip() for v in variants("spmv") if v.format in ("CSR", "ELL", "DIA", "COO")})
    if len(cut) < args.kernels:  # variants can coincide in their first characters
        sys.exit(f"only {len(cut)} distinct kernels in the first {args.chars} characters; lower --kernels")
    kernels = [cut[i] for i in np.random.default_rng(args.seed).choice(len(cut), args.kernels, replace=False)]
    tok = train_tokenizer(kernels * 20, vocab_size=400)
    longest = max(len(tok(k)["input_ids"]) for k in kernels)
    if args.max_new_tokens is None:
        args.max_new_tokens = longest + 1 + 8
    elif args.max_new_tokens <= longest:  # a kernel that can never be finished is never intact: the table lies
        sys.exit(f"error: --max-new-tokens {args.max_new_tokens} cannot finish a kernel of {longest} tokens "
                 f"and its end token")
    shape = TinyModelConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32, max_position_embeddings=1024)
    hf = hf_config(len(tok), shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    enc = EncodingConfig(max_nnz=32, d_pe=16, summary_tokens=4)
    # no matrix card: the toy keeps the prompt its earlier results were measured with
    policy = Policy.from_config(hf, tok, PolicyConfig(encoding=enc, card=False), seed=args.seed)
    mats = [generate(f, 2000, seed=i) for i, f in enumerate(FAMILIES)]
    items = [MatrixItem(f, A, f, MatrixInput.from_matrix(A, enc), Op.SPMV, None) for f, A in zip(FAMILIES, mats)]
    rng = np.random.default_rng(args.seed + 1)
    table = rng.uniform(0.8, 1.6, size=(len(items), len(kernels)))
    for i in range(len(items)):
        table[i, i % len(kernels)] = 2.5  # a different best kernel per matrix
    ev = TableEvaluator(kernels, table, [it.name for it in items])
    t0 = time.perf_counter()
    if args.sft_cache and args.sft_cache.exists():  # the same SFT start for runs launched separately
        policy.load_state_dict(torch.load(args.sft_cache))
        print(f"SFT: loaded {args.sft_cache}", flush=True)
    else:
        loss = sft(policy, items, kernels, args.sft_steps, args.sft_lr)
        print(f"SFT: {args.sft_steps} steps, last loss {loss:.4f}, {time.perf_counter() - t0:.0f} s", flush=True)
        if args.sft_cache:
            torch.save(policy.state_dict(), args.sft_cache)
    out = {"config": {k: str(v) for k, v in vars(args).items()}, "kernel_tokens": [len(tok(k)["input_ids"]) for k in kernels],
           "table": table.tolist(), "runs": {}}
    for algo in args.algos.split(","):
        t0 = time.perf_counter()
        out["runs"][algo] = run(algo, copy.deepcopy(policy), items, ev, args)
        print(f"{algo}: {time.perf_counter() - t0:.0f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for algo, rows in out["runs"].items():
        first, last = rows[0], rows[-1]
        print(f"{algo}: intact {first['intact']:.2f} -> {last['intact']:.2f}, oracle {first['oracle']:.2f} -> "
              f"{last['oracle']:.2f}, reward {first['reward']:+.2f} -> {last['reward']:+.2f}, "
              f"max kl_to_ref {max(r['kl_to_ref'] for r in rows):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
