"""``sparserl pretrain``: stage 1 from the command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer


def pretrain_cmd(
    out: Path = typer.Option(Path("runs/pretrain"), help="output folder (model/, state.pt, metrics.jsonl)"),
    model: Path = typer.Option(None, help="continue pre-training this local HF model (default: train the "
                                          "embedded default model and its tokenizer from scratch)"),
    steps: int = typer.Option(2000, help="optimizer steps"),
    batch_size: int = typer.Option(32, help="sequences per step"),
    seq_len: int = typer.Option(512, help="tokens per sequence"),
    lr: float = typer.Option(1e-3, help="peak learning rate (warm-up, then cosine decay)"),
    vocab_size: int = typer.Option(8192, help="BPE vocabulary when training the tokenizer from scratch"),
    device: str = typer.Option("auto", help="auto, cpu or cuda[:N]"),
    resume: bool = typer.Option(False, help="continue from OUT/state.pt"),
    seed: int = typer.Option(0),
) -> None:
    """Stage 1: pre-train on the CUDA corpus found on this machine (toolkit headers + kernel library)."""
    from sparserl.train.pretrain import PretrainConfig, pretrain

    cfg = PretrainConfig(out=str(out), model=str(model) if model else None, steps=steps, batch_size=batch_size,
                         seq_len=seq_len, lr=lr, vocab_size=vocab_size, device=device, resume=resume, seed=seed)
    result = pretrain(cfg)
    typer.echo(json.dumps(result, indent=1))


data_app = typer.Typer(help="SFT data: (matrix, correct kernel) pairs from the reference library.", no_args_is_help=True)


@data_app.command("build")
def data_build_cmd(
    out: Path = typer.Option(Path("runs/data"), help="output folder (matrices/, train/val/test.jsonl, summary.json)"),
    families: str = typer.Option("", help="comma-separated generator families (default: all)"),
    per_family: int = typer.Option(12, help="generated matrices per family"),
    min_rows: int = typer.Option(2000),
    max_rows: int = typer.Option(200000),
    real_dir: Path = typer.Option(None, help="folder of real matrices (.mtx/.mtx.gz/.npz), test split by default"),
    ops: str = typer.Option("spmv", help="spmv, spmm or spmv,spmm"),
    ks: str = typer.Option("32", help="SpMM column counts, comma-separated"),
    target: str = typer.Option("correct", help="correct (a random correct variant), fastest (the fastest ones) "
                                                "or near_fastest (random among those within --near-fastest-ratio "
                                                "of the fastest)"),
    targets_per_matrix: int = typer.Option(2, help="rows per train (matrix, op, k)"),
    near_fastest_ratio: float = typer.Option(1.10, help="near_fastest: at most this times the fastest time"),
    variants_per_matrix: int = typer.Option(None, help="evaluate this many random library variants per matrix "
                                                       "(default: all)"),
    val_fraction: float = typer.Option(0.1, help="share of each family's matrices for validation (rounded down)"),
    test_fraction: float = typer.Option(0.1, help="share of each family's matrices for test (rounded down)"),
    compile_only: bool = typer.Option(False, help="no GPU: targets are variants that compile (no times)"),
    seed: int = typer.Option(0),
) -> None:
    """Render library variants for each matrix, check them with the harness, write JSONL splits."""
    from sparserl.data.sft_build import SFTDataConfig, build_sft_data

    cfg = SFTDataConfig(out=str(out), families=tuple(filter(None, families.split(","))),
                        matrices_per_family=per_family, min_rows=min_rows, max_rows=max_rows,
                        real_dir=str(real_dir) if real_dir else None, ops=tuple(ops.split(",")),
                        ks=tuple(int(k) for k in ks.split(",")), target=target,
                        targets_per_matrix=targets_per_matrix, variants_per_matrix=variants_per_matrix,
                        near_fastest_ratio=near_fastest_ratio, val_fraction=val_fraction, test_fraction=test_fraction, compile_only=compile_only, seed=seed)
    summary = build_sft_data(cfg)
    typer.echo(json.dumps({k: summary[k] for k in ("matrices", "rows", "evaluations", "correct", "seconds")}, indent=1))


def sft_cmd(
    data: Path = typer.Option(Path("runs/data"), help="data folder (train.jsonl, val.jsonl) or a .jsonl file"),
    model: Path = typer.Option(Path("runs/pretrain/model"), help="HF model folder or policy checkpoint"),
    out: Path = typer.Option(Path("runs/sft"), help="output folder (checkpoint/, metrics.jsonl)"),
    steps: int = typer.Option(1000),
    batch_size: int = typer.Option(8),
    lr: float = typer.Option(3e-4),
    lora: bool = typer.Option(False, help="LoRA adapters on a frozen base (for large models)"),
    lora_r: int = typer.Option(16),
    max_nnz: int = typer.Option(128, help="coordinate tokens per matrix"),
    text_prompt: bool = typer.Option(True, help="name shape and nonzeros in the prompt text"),
    gradient_checkpointing: bool = typer.Option(False),
    eval_every: int = typer.Option(250),
    eval_samples: int = typer.Option(32),
    eval_temperature: float = typer.Option(1.0),
    save_every: int = typer.Option(250),
    resume: bool = typer.Option(False),
    device: str = typer.Option("auto"),
    compile_only: bool = typer.Option(False, help="evaluate by compiling only (no GPU)"),
    seed: int = typer.Option(0),
) -> None:
    """Stage 2: supervised fine-tuning on (matrix, kernel) pairs; validation through the harness."""
    from sparserl.train.sft import SFTConfig, sft

    cfg = SFTConfig(data=str(data), model=str(model), out=str(out), steps=steps, batch_size=batch_size, lr=lr,
                    lora=lora, lora_r=lora_r, max_nnz=max_nnz, text_prompt=text_prompt,
                    gradient_checkpointing=gradient_checkpointing, eval_every=eval_every, eval_samples=eval_samples,
                    eval_temperature=eval_temperature, save_every=save_every, resume=resume, device=device,
                    compile_only=compile_only, seed=seed)
    typer.echo(json.dumps(sft(cfg), indent=1, default=str))


def rl_config(algo: str, config: Path | None, given: dict):
    """RLConfig from the defaults, then the config file (if any), then the flags given (None = not given)."""
    from sparserl.rl.trainer import RLConfig, load_config_file

    over = {k: v for k, v in given.items() if v is not None} | {"algo": algo}
    if config:  # the file's settings, then the flags given; its out (if any) beats the default
        cfg = load_config_file(config, **over)
        if "out" not in over and cfg.out == RLConfig.out:
            cfg = dataclasses.replace(cfg, out=f"runs/{algo}")
        return cfg
    return RLConfig(**({"out": f"runs/{algo}"} | over))


def _rl(algo: str):
    def cmd(
        config: Path = typer.Option(None, help="TOML or YAML file of RLConfig settings (flags below override it)"),
        model: Path = typer.Option(None, help="policy checkpoint (sparserl sft) or HF model folder"),
        matrices: Path = typer.Option(None, help="SFT data folder (train split) or a folder of matrices"),
        out: Path = typer.Option(None, help=f"output folder (default runs/{algo})"),
        steps: int = typer.Option(None, help="RL steps"),
        matrices_per_step: int = typer.Option(None),
        samples_per_matrix: int = typer.Option(None, help="completions per matrix per step (GRPO group size)"),
        lr: float = typer.Option(None),
        kl_loss_coef: float = typer.Option(None, help="weight of the KL-to-reference loss on every response token "
                                                      "[default: 0.05]"),
        kl_coef: float = typer.Option(None, help="PPO only: KL penalty in the reward [default: 0]"),
        pg_token_share: float = typer.Option(None, help="share of tokens (highest sampling entropy) that get the "
                                                        "policy-gradient loss [default: 0.05; 1.0 = every token]"),
        reward: str = typer.Option(None, help="clipped_log (default), relative_best or paper"),
        max_new_tokens: int = typer.Option(None),
        resume: bool = typer.Option(None, help="continue from OUT/state.pt [default: no-resume]"),
        compile_only: bool = typer.Option(None, help="no GPU: rewards from compiling only (smoke runs) "
                                                     "[default: no-compile-only]"),
        device: str = typer.Option(None),
    ) -> None:
        from sparserl.rewards import RewardConfig
        from sparserl.rl.trainer import train_rl

        given = {"model": str(model) if model else None, "matrices": str(matrices) if matrices else None,
                 "out": str(out) if out else None, "steps": steps, "matrices_per_step": matrices_per_step,
                 "samples_per_matrix": samples_per_matrix, "lr": lr, "kl_coef": kl_coef, "kl_loss_coef": kl_loss_coef,
                 "pg_token_share": pg_token_share,
                 "max_new_tokens": max_new_tokens, "device": device, "resume": resume, "compile_only": compile_only,
                 "reward": RewardConfig(name=reward) if reward else None}
        cfg = rl_config(algo, config, given)
        typer.echo(json.dumps(train_rl(cfg), indent=1, default=str))

    cmd.__doc__ = (f"Stage 3: {algo.upper()} with rewards from the harness "
                   + ("(critic and GAE, KL-to-reference loss)." if algo == "ppo"
                      else "(group-relative rewards, no critic, KL-to-reference loss)."))
    return cmd


ppo_cmd = _rl("ppo")
grpo_cmd = _rl("grpo")


def generate_cmd(
    matrix: Path = typer.Argument(..., exists=True, dir_okay=False, help=".mtx, .mtx.gz or .npz"),
    op: str = typer.Option("spmv", help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X"),
    model: Path = typer.Option(Path("runs/ppo/checkpoint"), help="policy checkpoint or HF model folder"),
    samples: int = typer.Option(16, help="completions to sample and evaluate"),
    temperature: float = typer.Option(1.0),
    out: Path = typer.Option(None, help="output folder (default runs/generate/<matrix>)"),
    no_library_fallback: bool = typer.Option(False, help="fail instead of returning a library kernel"),
    compile_only: bool = typer.Option(False, help="no GPU: the best compiling sample, unverified"),
    device: str = typer.Option("auto"),
    seed: int = typer.Option(0),
    search: int = typer.Option(0, help="then search N more candidates (templates, mutations, refinements) "
                                       "and return the best of all"),
    store: Path = typer.Option(None, help="best-known store for --search (default: under the harness cache root)"),
) -> None:
    """The main job: sample kernels for a matrix, verify and time them, write the best one and a report."""
    from sparserl.generate import GenerateConfig, generate_kernel

    rep = generate_kernel(GenerateConfig(matrix=str(matrix), op=op, k=k, model=str(model), samples=samples,
                                         temperature=temperature, out=str(out) if out else None,
                                         library_fallback=not no_library_fallback, compile_only=compile_only,
                                         device=device, seed=seed, search=search,
                                         store=str(store) if store else None))
    typer.echo(f"{rep['verdict']} [{rep['source']}]\nwrote {rep['out']}/kernel.cu, launch.json, report.md, "
               f"report.json in {rep['seconds']:.1f} s")


def evaluate_cmd(
    matrices: str = typer.Option("runs/data", help="data folder (uses --split), a folder of matrices, or 'families'"),
    split: str = typer.Option("test"),
    checkpoint: list[str] = typer.Option([], "--checkpoint", "-c", help="NAME=PATH of a policy (repeatable)"),
    baselines: str = typer.Option("cusparse,oracle,selector", help="comma-separated: cusparse, oracle, selector"),
    op: str = typer.Option("spmv"),
    k: int = typer.Option(32, help="SpMM columns"),
    samples: int = typer.Option(8, help="completions per matrix per checkpoint (pass@k uses them)"),
    family_rows: int = typer.Option(200_000, help="rows of each generated matrix with --matrices families"),
    gen_batch: int = typer.Option(32, help="completions generated together"),
    out: Path = typer.Option(Path("runs/eval")),
    compile_only: bool = typer.Option(False, help="no GPU: compile rates only"),
    no_plots: bool = typer.Option(False),
) -> None:
    """Evaluate checkpoints and baselines side by side: pass@k, fast_p, speedup, per family, plots."""
    from sparserl.eval.compare import EvalConfig, evaluate

    res = evaluate(EvalConfig(matrices=matrices, split=split, checkpoints=tuple(checkpoint),
                              baselines=tuple(filter(None, baselines.split(","))), op=op, k=k, samples=samples,
                              family_rows=family_rows, gen_batch=gen_batch, out=str(out),
                              compile_only=compile_only, plots=not no_plots))
    typer.echo((out / "eval.md").read_text())
    typer.echo(f"wrote {out}/eval.json, eval.md" + (", plots" if res.get("plots") else ""))


def rescore_cmd(
    folder: Path = typer.Argument(..., exists=True, file_okay=False, help="a 'sparserl evaluate' output folder"),
) -> None:
    """Recompute an evaluation's summary and eval.md from its eval.json and completions.jsonl (no GPU)."""
    from sparserl.eval.rescore import rescore

    rescore(folder)
    typer.echo((folder / "eval.md").read_text())


def demo_cmd(
    out: Path = typer.Option(Path("runs/demo"), help="output folder"),
    tiny: bool = typer.Option(False, help="tiny model and data (minutes on a CPU)"),
    compile_only: bool = typer.Option(False, help="no GPU: compile-only rewards and checks"),
    real_matrix: Path = typer.Option(None, help="matrix for the final generate step"),
    seed: int = typer.Option(0),
    resume: bool = typer.Option(False, help="skip the stages an earlier run in OUT finished; continue the interrupted one"),
) -> None:
    """The whole pipeline, small: data, pretrain, SFT, PPO, evaluate, generate (GPU; or --compile-only --tiny)."""
    from sparserl.demo import DemoConfig, run_demo

    rep = run_demo(DemoConfig(out=str(out), tiny=tiny, compile_only=compile_only,
                              real_matrix=str(real_matrix) if real_matrix else None, seed=seed,
                              resume=resume))
    typer.echo(f"demo finished in {rep['seconds']:.0f} s (all stages, across resumed runs: {rep['stage_seconds']:.0f} s)")
    for name, path in rep["artefacts"].items():
        typer.echo(f"  {name:18} {path}")
    typer.echo(f"  generate verdict   {rep['generate']['verdict']}")
