"""The model-side commands: ``pretrain``, ``data build``, ``sft``, ``ppo``/``grpo``, ``generate``,
``evaluate``, ``rescore`` and ``demo``.

Rules every one of them follows:

* On a machine without a GPU a command that would verify kernels falls back to compile-only and
  prints a ``note:`` line saying so (:func:`sparserl.devices.compile_only_or_fallback`).
* A command that writes a run folder refuses one that holds an earlier run unless ``--force``
  (or ``--resume``, where the stage can continue) is given (:mod:`sparserl.runs`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from typer.core import TyperCommand

from sparserl.errors import SparseRLError
from sparserl.runs import check_output


def _fallback(compile_only: bool) -> bool:
    """compile-only as asked, or forced by a machine without a GPU (with a note)."""
    from sparserl.devices import compile_only_or_fallback

    compile_only, note = compile_only_or_fallback(compile_only)
    if note:
        typer.echo(f"note: {note}", err=True)
    return compile_only


def pretrain_cmd(
    out: Path = typer.Option(Path("runs/pretrain"), help="output folder (model/, state.pt, metrics.jsonl)"),
    model: Path = typer.Option(None, help="continue pre-training this local HF model [default: train the "
                                          "embedded default model and its tokenizer from scratch]"),
    steps: int = typer.Option(2000, help="optimizer steps (on a CPU try 200: see the README)"),
    batch_size: int = typer.Option(32, help="sequences per step"),
    seq_len: int = typer.Option(512, help="tokens per sequence"),
    lr: float = typer.Option(1e-3, help="peak learning rate (warm-up, then cosine decay)"),
    vocab_size: int = typer.Option(8192, help="BPE vocabulary when training the tokenizer from scratch"),
    device: str = typer.Option("auto", help="auto, cpu or cuda[:N]"),
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/state.pt"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
    seed: int = typer.Option(0, help="random seed"),
    corpus: Path = typer.Option(None, help="a built corpus (sparserl corpus build) or its pack (sparserl corpus "
                                           "pack) [default: the toolkit headers and kernel library on this machine]"),
    preset: str = typer.Option("default", help="shape of a model trained from scratch: default (about 29M "
                                               "parameters) or base (about 210M, for a GPU)"),
    minutes: float = typer.Option(None, help="wall-clock budget of the training loop: stop after it with a "
                                             "checkpoint and an evaluation [default: none, --steps decides]"),
    warmup_steps: int = typer.Option(100, help="steps of linear learning-rate warm-up"),
    eval_every: int = typer.Option(500, help="steps between held-out evaluations"),
    heldout_tokens: int = typer.Option(200_000, help="held-out tokens scored per held-out package (at most)"),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the model (CUDA only)"),
    peak_tflops: float = typer.Option(None, help="peak dense bf16 TFLOP/s for MFU [default: from the GPU's name, "
                                                 "H100/H200: 989]"),
) -> None:
    """Stage 1: pre-train on a CUDA corpus: the one built from the package index (--corpus), or the toolkit
    headers and kernel library found on this machine."""
    from sparserl.train.pretrain import PretrainConfig, pretrain

    check_output(out, "pretrain", force, resume)
    cfg = PretrainConfig(out=str(out), model=str(model) if model else None, steps=steps, batch_size=batch_size,
                         seq_len=seq_len, lr=lr, vocab_size=vocab_size, device=device, resume=resume, seed=seed,
                         corpus_dir=str(corpus) if corpus else None, preset=preset, minutes=minutes,
                         warmup_steps=warmup_steps, eval_every=eval_every,
                         heldout_tokens=heldout_tokens, compile=compile, peak_tflops=peak_tflops)
    result = pretrain(cfg)
    typer.echo(json.dumps(result, indent=1))


data_app = typer.Typer(help="SFT data: (matrix, correct kernel) pairs from the reference library.",
                       no_args_is_help=True, rich_markup_mode="rich")


@data_app.command("build")
def data_build_cmd(
    out: Path = typer.Option(Path("runs/data"), help="output folder (matrices/, train/val/test.jsonl, summary.json)"),
    families: str = typer.Option("", help="comma-separated generator families [default: all]"),
    per_family: int = typer.Option(12, help="generated matrices per family"),
    min_rows: int = typer.Option(2000, help="fewest rows of a generated matrix"),
    max_rows: int = typer.Option(200000, help="most rows of a generated matrix"),
    real_dir: Path = typer.Option(None, help="folder of real matrices (.mtx/.mtx.gz/.npz), test split "
                                             "[default: none]"),
    ops: str = typer.Option("spmv", help="spmv, spmm or spmv,spmm"),
    ks: str = typer.Option(None, help="SpMM column counts, comma-separated (with spmm in --ops only) "
                                      "[default: 32]"),
    target: str = typer.Option("correct", help="correct (a random correct variant), fastest (the fastest ones) "
                                                "or near_fastest (random among those within --near-fastest-ratio "
                                                "of the fastest)"),
    targets_per_matrix: int = typer.Option(2, help="rows per train (matrix, op, k)"),
    near_fastest_ratio: float = typer.Option(1.10, help="near_fastest: at most this times the fastest time"),
    variants_per_matrix: int = typer.Option(None, help="evaluate this many random library variants per matrix "
                                                       "[default: all]"),
    val_fraction: float = typer.Option(0.1, help="share of each family's matrices for validation (rounded down)"),
    test_fraction: float = typer.Option(0.1, help="share of each family's matrices for test (rounded down)"),
    compile_only: bool = typer.Option(False, "--compile-only", help="targets are variants that compile (no "
                                                                    "times); the default without a GPU"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier data set in OUT"),
    seed: int = typer.Option(0, help="random seed"),
) -> None:
    """Render library variants for each matrix, check them with the harness, write JSONL splits."""
    from sparserl.data.sft_build import SFTDataConfig, build_sft_data

    op_list = tuple(filter(None, ops.split(",")))
    if ks is not None and "spmm" not in op_list:
        raise SparseRLError("--ks are SpMM column counts: give --ops spmm (or spmv,spmm), or leave --ks out")
    try:
        k_list = tuple(int(k) for k in (ks or "32").split(","))
    except ValueError:
        raise SparseRLError(f"--ks must be comma-separated integers, got {ks!r}") from None
    check_output(out, "data", force)
    compile_only = _fallback(compile_only)
    cfg = SFTDataConfig(out=str(out), families=tuple(filter(None, families.split(","))),
                        matrices_per_family=per_family, min_rows=min_rows, max_rows=max_rows,
                        real_dir=str(real_dir) if real_dir else None, ops=op_list, ks=k_list, target=target,
                        targets_per_matrix=targets_per_matrix, variants_per_matrix=variants_per_matrix,
                        near_fastest_ratio=near_fastest_ratio, val_fraction=val_fraction,
                        test_fraction=test_fraction, compile_only=compile_only, seed=seed)
    summary = build_sft_data(cfg)
    usable = "compiled" if compile_only else "correct"  # compile-only: nothing was verified
    typer.echo(json.dumps({k: summary[k] for k in ("matrices", "rows", "evaluations", usable, "seconds")}, indent=1))


def sft_cmd(
    data: Path = typer.Option(Path("runs/data"), help="data folder (train.jsonl, val.jsonl) or a .jsonl file"),
    model: Path = typer.Option(Path("runs/pretrain/model"), help="HF model folder or policy checkpoint"),
    out: Path = typer.Option(Path("runs/sft"), help="output folder (checkpoint/, metrics.jsonl)"),
    steps: int = typer.Option(1000, help="optimizer steps"),
    batch_size: int = typer.Option(8, help="(matrix, kernel) pairs per step"),
    lr: float = typer.Option(3e-4, help="peak learning rate (warm-up, then cosine decay)"),
    lora: bool = typer.Option(False, "--lora", help="LoRA adapters on a frozen base (for large models)"),
    lora_r: int = typer.Option(16, help="LoRA rank (with --lora)"),
    max_nnz: int = typer.Option(128, help="coordinate tokens per matrix"),
    no_text_prompt: bool = typer.Option(False, "--no-text-prompt",
                                        help="leave shape and nonzeros out of the prompt text (soft tokens only)"),
    card: bool | None = typer.Option(None, "--card/--no-card",
                                     help="put the matrix card (exact structure facts) in the prompt; default: on "
                                          "for a new model, as trained for a policy checkpoint"),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing",
                                                help="recompute activations in the backward pass (less memory)"),
    eval_every: int = typer.Option(250, help="steps between validation checks through the harness"),
    eval_samples: int = typer.Option(32, help="validation rows sampled and checked at each validation"),
    eval_temperature: float = typer.Option(1.0, help="sampling temperature of the validation (> 0)"),
    max_new_tokens: int = typer.Option(1536, help="longest validation completion, in tokens"),
    save_every: int = typer.Option(250, help="steps between checkpoints"),
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/state.pt"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
    device: str = typer.Option("auto", help="auto, cpu or cuda[:N]"),
    compile_only: bool = typer.Option(False, "--compile-only",
                                      help="validate by compiling only; the default without a GPU"),
    seed: int = typer.Option(0, help="random seed"),
) -> None:
    """Stage 2: supervised fine-tuning on (matrix, kernel) pairs; validation through the harness."""
    from sparserl.train.sft import SFTConfig, sft

    check_output(out, "sft", force, resume)
    cfg = SFTConfig(data=str(data), model=str(model), out=str(out), steps=steps, batch_size=batch_size, lr=lr,
                    lora=lora, lora_r=lora_r, max_nnz=max_nnz, text_prompt=not no_text_prompt, card=card,
                    gradient_checkpointing=gradient_checkpointing, eval_every=eval_every, eval_samples=eval_samples,
                    eval_temperature=eval_temperature, max_new_tokens=max_new_tokens, save_every=save_every,
                    resume=resume, device=device,
                    compile_only=_fallback(compile_only), seed=seed)
    typer.echo(json.dumps(sft(cfg), indent=1, default=str))


def rl_config(algo: str, config: Path | None, given: dict):
    """RLConfig from the defaults, then the config file (if any), then the flags given (None = not given)."""
    from sparserl.rl.trainer import RLConfig, load_config_file

    over = {k: v for k, v in given.items() if v is not None} | {"algo": algo}
    if config:  # the file's settings, then the flags given; its out (if any) beats the default
        cfg = load_config_file(config, **over)
        if "out" not in over and cfg.out == RLConfig.out:
            cfg = dataclasses.replace(cfg, out=f"runs/{algo}")
    else:
        cfg = RLConfig(**({"out": f"runs/{algo}"} | over))
    if cfg.temperature <= 0:
        raise SparseRLError(f"temperature must be > 0 (1.0 samples the policy as it is), got {cfg.temperature}")
    return cfg


class RLCommand(TyperCommand):
    """``ppo`` / ``grpo``: their options default to "not given" (the config file decides, then
    RLConfig); the help prints RLConfig's value beside each, read when the help is shown (so
    the command line does not import torch to start)."""

    def format_help(self, ctx, formatter):
        from sparserl.rewards import RewardConfig
        from sparserl.rl.trainer import RLConfig

        defaults = {f.name: f.default for f in dataclasses.fields(RLConfig) if f.default is not dataclasses.MISSING}
        defaults["reward"] = RewardConfig().name
        defaults["out"] = f"runs/{ctx.info_name}"
        for p in self.params:
            if p.name in defaults and p.default is None and "[default:" not in (p.help or ""):
                if not isinstance(defaults[p.name], bool):  # an on/off flag is off unless given
                    p.help = f"{p.help or ''} \\[default: {defaults[p.name]}]".strip()
        return super().format_help(ctx, formatter)


def _rl(algo: str):
    def cmd(
        config: Path = typer.Option(None, help="TOML or YAML file of RLConfig settings (flags below override it) "
                                               "[default: none]"),
        model: Path = typer.Option(None, help="policy checkpoint (sparserl sft) or HF model folder"),
        matrices: Path = typer.Option(None, help="SFT data folder (train split) or a folder of matrices"),
        out: Path = typer.Option(None, help="output folder"),
        steps: int = typer.Option(None, help="RL steps"),
        matrices_per_step: int = typer.Option(None, help="matrices per rollout batch"),
        samples_per_matrix: int = typer.Option(None, help="completions per matrix per step (GRPO group size)"),
        lr: float = typer.Option(None, help="learning rate"),
        kl_loss_coef: float = typer.Option(None, help="weight of the KL-to-reference loss on every response "
                                                      "token"),
        kl_coef: float = typer.Option(None, help="PPO only: KL penalty in the reward"),
        pg_token_share: float = typer.Option(None, help="share of tokens (highest sampling entropy) that get the "
                                                        "policy-gradient loss (1.0 = every token)"),
        reward: str = typer.Option(None, help="clipped_log, relative_best or paper"),
        max_new_tokens: int = typer.Option(None, help="longest completion, in tokens"),
        resume: bool = typer.Option(None, "--resume", help="continue from OUT/state.pt"),
        force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
        compile_only: bool = typer.Option(None, "--compile-only", help="rewards from compiling only (smoke runs); "
                                                                       "the default without a GPU"),
        device: str = typer.Option(None, help="auto, cpu or cuda[:N]"),
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
        check_output(cfg.out, algo, force, cfg.resume)
        if not cfg.compile_only and _fallback(False):
            cfg = dataclasses.replace(cfg, compile_only=True)
        typer.echo(json.dumps(train_rl(cfg), indent=1, default=str))

    cmd.__doc__ = (f"Stage 3: {algo.upper()} with rewards from the harness "
                   + ("(clipped ratio, leave-one-out baseline or a critic, KL-to-reference loss)." if algo == "ppo"
                      else "(group-relative rewards, no critic, KL-to-reference loss)."))
    return cmd


ppo_cmd = _rl("ppo")
grpo_cmd = _rl("grpo")


def generate_cmd(
    matrix: Path = typer.Argument(..., exists=True, dir_okay=False, help=".mtx, .mtx.gz or .npz"),
    op: str = typer.Option("spmv", help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
    model: Path = typer.Option(Path("runs/ppo/checkpoint"), help="policy checkpoint or HF model folder; without "
                                                                 "one, the best library kernel is returned"),
    samples: int = typer.Option(16, help="completions to sample and evaluate"),
    temperature: float = typer.Option(1.0, help="sampling temperature (> 0)"),
    out: Path = typer.Option(None, help="output folder [default: runs/generate/<matrix name>]"),
    no_library_fallback: bool = typer.Option(False, "--no-library-fallback",
                                             help="fail instead of returning a library kernel"),
    compile_only: bool = typer.Option(False, "--compile-only", help="the best compiling kernel, unverified; "
                                                                    "the default without a GPU"),
    device: str = typer.Option("auto", help="auto, cpu or cuda[:N] (for the model)"),
    seed: int = typer.Option(0, help="random seed"),
    search: int = typer.Option(0, help="then search N more candidates (templates, mutations, refinements) "
                                       "and return the best of all (0: no search)"),
    store: str = typer.Option(None, help="best-known store for --search: a file or postgresql:// URL "
                                         "[default: under the harness cache root]"),
) -> None:
    """The main job: sample kernels for a matrix, verify and time them, write the best one and a report."""
    from sparserl.generate import GenerateConfig, generate_kernel

    cfg = GenerateConfig(matrix=str(matrix), op=op, k=k, model=str(model), samples=samples,
                         temperature=temperature, out=str(out) if out else None,
                         library_fallback=not no_library_fallback, device=device, seed=seed,
                         compile_only=compile_only, search=search, store=str(store) if store else None)
    rep = generate_kernel(dataclasses.replace(cfg, compile_only=_fallback(compile_only)))
    typer.echo(f"{rep['verdict']} [{rep['source']}]")
    for line in rep.get("notes", []):
        typer.echo(f"note: {line}")
    typer.echo(f"wrote {rep['out']}/kernel.cu, launch.json, report.md, report.json in {rep['seconds']:.1f} s")


def evaluate_cmd(
    matrices: str = typer.Option("runs/data", help="data folder (uses --split), a folder of matrices, or 'families'"),
    split: str = typer.Option("test", help="split of a data folder: train, val or test"),
    checkpoint: list[str] = typer.Option([], "--checkpoint", "-c", help="NAME=PATH of a policy (repeatable) "
                                                                        "[default: none, baselines only]"),
    baselines: str = typer.Option("cusparse,oracle,selector", help="comma-separated: cusparse, oracle, selector"),
    op: str = typer.Option("spmv", help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM columns (with --op spmm only) [default: 32]"),
    samples: int = typer.Option(8, help="completions per matrix per checkpoint (pass@k uses them)"),
    temperature: float = typer.Option(1.0, help="sampling temperature (> 0)"),
    max_new_tokens: int = typer.Option(1536, help="longest completion, in tokens"),
    family_rows: int = typer.Option(200_000, help="rows of each generated matrix with --matrices families"),
    gen_batch: int = typer.Option(32, help="completions generated together"),
    out: Path = typer.Option(Path("runs/eval"), help="output folder (eval.md, eval.json, plots)"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile rates only; the default without a GPU"),
    no_plots: bool = typer.Option(False, "--no-plots", help="write no plots"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier evaluation in OUT"),
) -> None:
    """Evaluate checkpoints and baselines side by side: pass@k, fast_p, speedup, per family, plots."""
    from sparserl.eval.compare import EvalConfig, evaluate

    check_output(out, "evaluate", force)
    if op == "spmv" and k is not None:
        raise SparseRLError("--k is the column count of X for --op spmm; SpMV multiplies one vector: leave --k out")
    cfg = EvalConfig(matrices=matrices, split=split, checkpoints=tuple(checkpoint),
                     baselines=tuple(filter(None, baselines.split(","))), op=op, k=32 if k is None else k,
                     samples=samples, temperature=temperature, max_new_tokens=max_new_tokens,
                     family_rows=family_rows, gen_batch=gen_batch, out=str(out),
                     plots=not no_plots)
    res = evaluate(dataclasses.replace(cfg, compile_only=_fallback(compile_only)))
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
    tiny: bool = typer.Option(False, "--tiny", help="tiny model and data (minutes on a CPU)"),
    compile_only: bool = typer.Option(False, "--compile-only", help="compile-only rewards and checks; the "
                                                                    "default without a GPU"),
    real_matrix: Path = typer.Option(None, help="matrix for the final generate step [default: a generated "
                                                "3D 27-point stencil]"),
    seed: int = typer.Option(0, help="random seed"),
    resume: bool = typer.Option(False, "--resume", help="skip the stages an earlier run in OUT finished; "
                                                        "continue the interrupted one"),
    force: bool = typer.Option(False, "--force", help="overwrite an earlier run in OUT"),
) -> None:
    """The whole pipeline, small: data, pretrain, SFT, PPO, evaluate, generate (on a CPU: --tiny --compile-only)."""
    from sparserl.demo import DemoConfig, run_demo

    check_output(out, "demo", force, resume)
    compile_only = _fallback(compile_only)
    if compile_only and not tiny:
        typer.echo("note: the default sizes are made for one H200 and take hours on a CPU; add --tiny for minutes",
                   err=True)
    rep = run_demo(DemoConfig(out=str(out), tiny=tiny, compile_only=compile_only,
                              real_matrix=str(real_matrix) if real_matrix else None, seed=seed,
                              resume=resume))
    typer.echo(f"demo finished in {rep['seconds']:.0f} s "
               f"(all stages, across resumed runs: {rep['stage_seconds']:.0f} s)")
    for name, path in rep["artefacts"].items():
        typer.echo(f"  {name:18} {path}")
    for line in rep["summary"]:
        typer.echo(line)
