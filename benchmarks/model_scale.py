"""Memory and throughput of the policy at a given shape, with random weights (no download).

Builds the policy around a randomly initialised model of the embedded default's shape or
Qwen3-8B's shape (``--shape 8b``; bf16, LoRA on a frozen base, gradient checkpointing), then
measures: SFT steps (peak GPU memory, step time, tokens/s), batched generation with the
KV cache (tokens/s at ``--gen-batch``, per decode engine: CUDA graph vs ``generate()``), and one PPO step (reference + value head forward,
two epochs of updates on ``--batch`` of the generated completions; peak memory and time). Prints a table and writes JSON.

    python benchmarks/model_scale.py --shape default --out results/scale_default.json
    python benchmarks/model_scale.py --shape 8b --lora --out results/scale_8b.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from sparserl.encoding import EncodingConfig
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.model.config import QWEN3_8B_SHAPE, TinyModelConfig, hf_config
from sparserl.model.policy import LoraSpec, Policy, PolicyConfig, make_sample
from sparserl.model.tokenizer import train_tokenizer


def memory_bound_tokens_per_s(lm, batch: int, prompt: int, steps: int, engine: str, bytes_per_s: float) -> float:
    """Tokens/s if each decode step only had to read the weights once and the keys and values it
    attends over once, at ``bytes_per_s``: the bound a step at this batch cannot beat.

    Keys and values read per step and layer: batch x key heads x head size x 2 x element size
    x positions, where positions is what the engine attends over, averaged over the steps: the
    bucketed engine the prompt plus the tokens so far rounded up to its bucket, the others the
    whole allocated cache (prompt + requested tokens)."""
    from sparserl.model.bucketed import BUCKET
    from sparserl.model.hf_parts import text_config

    cfg = text_config(lm)
    p = next(lm.parameters())
    weights = sum(q.numel() for q in lm.parameters()) * p.element_size()
    kv = cfg.num_key_value_heads * cfg.head_dim * 2 * p.element_size() * cfg.num_hidden_layers * batch
    if engine == "bucketed":
        positions = sum(-(-(prompt + t) // BUCKET) * BUCKET for t in range(1, steps + 1)) / max(steps, 1)
    else:
        positions = prompt + steps
    return batch * bytes_per_s / (weights + kv * positions)


KERNEL_KINDS = (("attention", ("attention", "flash", "fmha", "sdpa")),
                ("matmul", ("gemm", "gemv", "sm90_xmma", "cutlass", "nvjet", "matmul", "splitkreduce")),
                ("memcpy/memset", ("memcpy", "memset")),
                ("softmax (attention or sampler)", ("softmax",)),
                ("sampling", ("multinomial", "sort", "topk", "cumsum", "exponential", "argmax", "philox", "uniform")),
                ("reduction/norm", ("reduce", "norm", "rsqrt", "mean")))


def kernel_kind(name: str) -> str:
    """A coarse kind for a CUDA kernel's name (what a decode step spends its device time on)."""
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "elementwise/other")


def profile_decode(run) -> str:
    """Run ``run`` under torch.profiler; the device time per kind of kernel, then the top 40 kernels."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    from torch.autograd import DeviceType

    events = prof.key_averages()
    dev = [(e.key, getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0), e.count)
           for e in events if e.device_type == DeviceType.CUDA  # kernels, not the operators that launched them,
           and not getattr(e, "is_user_annotation", False)]  # nor record_function ranges drawn on the GPU timeline
    dev = [d for d in dev if d[1] > 0]
    total = sum(t for _, t, _ in dev) or 1.0
    by_kind: dict[str, float] = {}
    for name, t, _ in dev:
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + t
    lines = [f"device time {total / 1e3:.1f} ms in {sum(c for _, _, c in dev)} kernels and copies (CUDA graph "
             "replays included where the profiler sees their kernels)"]
    lines += [f"  {kind:30} {t / 1e3:9.1f} ms {t / total:6.1%}" for kind, t in sorted(by_kind.items(), key=lambda x: -x[1])]
    lines += ["", f"{'self device ms':>14} {'share':>6} {'calls':>7}  kernel"]
    lines += [f"{t / 1e3:14.2f} {t / total:6.1%} {c:7d}  {name[:120]}" for name, t, c in sorted(dev, key=lambda x: -x[1])[:40]]
    if not dev:
        lines = ["no device time recorded (a CPU run, or the profiler saw no kernels)",
                 "", events.table(sort_by="self_cpu_time_total", row_limit=25)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["tiny-test", "default", "8b"], default="default")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bf16 weights (default for 8b)")
    ap.add_argument("--batch", type=int, default=8, help="SFT batch")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("model_scale.json"))
    ap.add_argument("--decode", default="bucketed,graph,hf",
                    help="decode engines to time, comma-separated (bucketed, graph, static, hf); the first one's "
                         "completions feed the PPO step")
    ap.add_argument("--hbm-tb-s", type=float, default=4.8,
                    help="memory bandwidth (TB/s) for the memory-bound limit printed beside each engine "
                         "(4.8: the H200's HBM3e peak)")
    ap.add_argument("--repeat", type=int, default=1, help="time each engine this many times, keep the fastest "
                                                          "(the first run of an engine includes its graph captures)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="after timing, decode once more with the first engine under torch.profiler and write its "
                         "kernels' device time (top 40, and the share by kind) to this text file")
    ap.add_argument("--cudnn-attention", action="store_true",
                    help="leave torch's cuDNN attention on (the project turns it off; this measures why)")
    args = ap.parse_args()
    from sparserl.data.corpus import library_texts

    tok = train_tokenizer(library_texts(), vocab_size=2048)
    if args.shape == "8b":
        shape = dict(QWEN3_8B_SHAPE)
        vocab = shape.pop("vocab_size")
        hf = hf_config(vocab, TinyModelConfig(**shape), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    elif args.shape == "tiny-test":
        hf = hf_config(len(tok), TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=2, num_key_value_heads=1, head_dim=32),
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    else:
        hf = hf_config(len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    bf16 = args.bf16 or args.shape == "8b"
    cfg = PolicyConfig(encoding=EncodingConfig(max_nnz=128), lora=LoraSpec() if args.lora else None,
                       gradient_checkpointing=args.shape == "8b", dtype="bfloat16" if bf16 else "float32")
    dev = torch.device(args.device)
    if dev.type == "cuda":
        from sparserl.devices import cuda_defaults

        cuda_defaults()
        torch.backends.cuda.enable_cudnn_sdp(args.cudnn_attention)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    policy = Policy.from_config(hf, tok, cfg, device=args.device)
    build_s = time.perf_counter() - t0
    print(f"built {args.shape} policy in {build_s:.1f} s", flush=True)
    params = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    A = generate("stencil2d", 100_000, seed=0)
    sample = make_sample(A, cfg, Op.SPMV)
    target = variants("spmv", "CSR")[3].render()
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-4)
    ntok = len(policy.completion_ids(target)) * args.batch
    step_s = []
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = policy.loss([sample] * args.batch, [target] * args.batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t)
    train_peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None
    print(f"SFT steps: {sorted(step_s)} s, peak {train_peak} GiB", flush=True)
    gen = {}
    ids = None
    prompt = int(policy._batch(policy._prefix([sample]))[0].shape[1])  # prompt positions (the same for every row)
    for engine in args.decode.split(","):
        runs = []
        for _ in range(max(1, args.repeat)):
            t = time.perf_counter()
            out = policy.generate_ids([sample] * args.gen_batch, max_new_tokens=args.gen_tokens, temperature=1.0,
                                      seed=0, engine=engine)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - t)
        gen_s = min(runs)
        gen_tokens = int((out != tok.pad_token_id).sum())  # generated tokens, padding after EOS excluded
        limit = memory_bound_tokens_per_s(policy.base_model, args.gen_batch, prompt, int(out.shape[1]),
                                          engine, args.hbm_tb_s * 1e12)
        gen[engine] = {"tokens": gen_tokens, "seconds": gen_s, "seconds_each_run": runs,
                       "tokens_per_s": gen_tokens / gen_s, "steps": int(out.shape[1]),
                       "ms_per_step": 1e3 * gen_s / out.shape[1], "prompt_tokens": prompt,
                       "memory_bound_tokens_per_s": limit}
        print(f"generation ({engine}): {gen_tokens} tokens in {gen_s:.2f} s at batch {args.gen_batch} "
              f"({gen[engine]['ms_per_step']:.2f} ms per decode step, {gen_tokens / gen_s:,.0f} tokens/s; "
              f"memory-bound limit {limit:,.0f} tokens/s)", flush=True)
        ids = out if ids is None else ids
    if args.profile is not None:
        engine = args.decode.split(",")[0]
        text = profile_decode(lambda: policy.generate_ids([sample] * args.gen_batch, max_new_tokens=args.gen_tokens,
                                                          temperature=1.0, seed=0, engine=engine))
        args.profile.parent.mkdir(parents=True, exist_ok=True)
        args.profile.write_text(f"# {engine} decode, batch {args.gen_batch}, {args.gen_tokens} tokens, "
                                f"{args.shape} shape\n\n{text}")
        print(text.split("\n\n")[0], flush=True)
    # one PPO step (policy + value head + reference forward, 2 epochs) on this rollout, through the
    # trainer's own functions (rollout.annotate, update.advantages / update), so it cannot drift from them
    import numpy as np

    from sparserl.rl.config import RLConfig
    from sparserl.rl.rollout import RolloutBatch, annotate, response_mask
    from sparserl.rl.update import ActorCritic, Reference, ValueHead, advantages, build_optimizer, update

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ids = ids[: args.batch]
    rmask = response_mask(ids, tok.eos_token_id, tok.pad_token_id).to(ids.device)
    rs = [sample] * ids.shape[0]
    rl_cfg = RLConfig(algo="ppo", critic=True, minibatch=max(1, ids.shape[0] // 2), epochs=2, device=args.device,
                      target_kl=None,
                      matrices_per_step=1, samples_per_matrix=int(ids.shape[0]))  # one matrix, one group
    vh = ValueHead(policy.base_model.config.hidden_size).to(dev)
    ref = Reference(policy)
    t = time.perf_counter()
    ann = annotate(policy, ref, vh, rs, ids, rmask, rl_cfg.temperature)
    scores = torch.randn(ids.shape[0], device=dev)
    batch = RolloutBatch(rs, [""] * ids.shape[0], ids, rmask, ann.old_logp, ann.ref_logp, ann.values, scores, [],
                         entropy=ann.entropy)
    adv, rets = advantages(rl_cfg, batch)
    update(rl_cfg, ActorCritic(policy, vh), build_optimizer(policy, vh, rl_cfg), batch, adv, rets,
           rl_cfg.kl_loss_coef, np.random.default_rng(0), dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ppo_s = time.perf_counter() - t
    ppo_peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None
    res = {
        "ppo_step_s": ppo_s, "ppo_peak_gib": ppo_peak, "ppo_batch": int(ids.shape[0]),
        "ppo_response_tokens": int(ids.shape[1]),
        "shape": args.shape, "lora": args.lora, "cudnn_attention": args.cudnn_attention, "bf16": bf16, "device": str(dev),
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
        "params": params, "trainable_params": trainable, "build_s": build_s,
        "sft_batch": args.batch, "sft_step_s": sorted(step_s)[len(step_s) // 2],
        "sft_tokens_per_s": ntok / sorted(step_s)[len(step_s) // 2], "sft_peak_gib": train_peak,
        "gen_batch": args.gen_batch, "gen_tokens_requested": args.gen_tokens, "generation": gen,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
    }
    print(json.dumps(res, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
