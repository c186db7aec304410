"""``sparserl demo``: the whole pipeline, small, in one command.

Stages, each writing under ``out``: a generated matrix set with SFT data (``data/``),
pre-training of the embedded default model (``pretrain/``), SFT (``sft/``), a short PPO
(``ppo/``), evaluation on the held-out matrices (``eval/``), and ``generate`` for one
matrix the model never saw (``generate/``). On a GPU every reward and verdict comes from the
harness; ``compile_only`` runs the same stages on a CPU with compile-only rewards, and
``tiny`` shrinks the model and the data so that takes a minute or two (what CI runs).

The demo always ends with a kernel: the model's when one is usable, else the library's
(the fastest verified variant on a GPU; on a CPU the rule-based selector's choice, compiled
but unverified), labelled as such. Its summary says where the kernel came from, whether it
was verified (and the command that verifies it on a GPU), and whether the RL stage changed
the policy at all.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from sparserl import interrupts
from sparserl.checks import require
from sparserl.data.corpus import CorpusConfig
from sparserl.data.sft_build import SFTDataConfig, build_sft_data
from sparserl.errors import MatrixError, SparseRLError
from sparserl.eval.compare import EvalConfig, evaluate
from sparserl.generate import GenerateConfig, generate_kernel
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.matrices import generate, load_matrix, save_matrix
from sparserl.model.config import TinyModelConfig
from sparserl.rl.config import RLConfig
from sparserl.train.config import PretrainConfig, SFTConfig

log = logging.getLogger(__name__)


STAGES = ("data", "pretrain", "sft", "ppo", "evaluate", "generate")


@dataclass(frozen=True)
class DemoConfig:
    """One demo run."""

    out: str = "runs/demo"
    """Output folder (one sub-folder per stage, stages.json, demo.json)."""
    tiny: bool = False
    """Tiny model and data (minutes on a CPU); the default sizes target one H200 in under 20 minutes."""
    compile_only: bool = False
    """No GPU: compile-only rewards and checks (nothing is verified or timed)."""
    real_matrix: str | None = None
    """Matrix for the final generate step (default: a generated 3D 27-point stencil, not in the data)."""
    seed: int = 0
    """Seed of every stage."""
    resume: bool = False
    """Skip the stages an earlier run of the same ``out`` finished (recorded in ``stages.json``)
    and continue the interrupted one from its last checkpoint."""

    def __post_init__(self) -> None:
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
        if self.real_matrix is not None:  # read now: a file that does not load fails before the stages, not after
            try:
                load_matrix(self.real_matrix)
            except MatrixError as exc:
                raise SparseRLError(f"--real-matrix: {exc}") from None


def _identity(cfg: DemoConfig) -> dict:
    """The settings that decide what the stages produce (a resume must not mix two of them)."""
    return {"tiny": cfg.tiny, "compile_only": cfg.compile_only, "real_matrix": cfg.real_matrix, "seed": cfg.seed}


def _stage(name: str, fn, report: dict, done: dict, record: Path, identity: dict):
    """Run one stage (or reuse its recorded result when resuming) and record it in ``record``."""
    if name in done:
        report[name] = done[name]
        log.info("== %s: done by an earlier run (%.1f s), skipped ==", name, done[name]["seconds"])
        return done[name]
    interrupts.check()  # a Ctrl-C that a stage swallowed stops the run here
    t = time.perf_counter()
    log.info("== %s ==", name)
    res = fn()
    report[name] = {"seconds": round(time.perf_counter() - t, 1), **(res or {})}
    done[name] = report[name]
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": identity, "stages": done}, indent=1, default=str))
    tmp.replace(record)
    log.info("== %s done in %.1f s ==", name, report[name]["seconds"])
    return report[name]


def _real_matrix(cfg: DemoConfig, out: Path) -> str:
    if cfg.real_matrix:
        return cfg.real_matrix
    p = out / "real_like.mtx"
    save_matrix(generate("stencil3d_27", 3000 if cfg.tiny else 30000, seed=cfg.seed + 5), p)
    return str(p)


def _stages(cfg: DemoConfig, out: Path, ev, resume) -> dict:
    """name -> a function that runs that stage (sizes: tiny or the H200 default)."""
    from sparserl.rl.trainer import train_rl  # torch
    from sparserl.train.pretrain import pretrain  # torch
    from sparserl.train.sft import sft  # torch

    tiny, co, seed = cfg.tiny, cfg.compile_only, cfg.seed
    t = lambda small, full: small if tiny else full  # noqa: E731
    shape = (TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=32) if tiny else TinyModelConfig())
    data = SFTDataConfig(out=str(out / "data"), matrices_per_family=t(3, 16), min_rows=t(300, 5_000),
                         max_rows=t(2_000, 100_000), compile_only=co, targets_per_matrix=t(2, 6),
                         variants_per_matrix=t(None, 20), val_fraction=t(0.34, 0.25), test_fraction=t(0.34, 0.25),
                         seed=seed)
    keep = ("matrices", "rows", "compiled" if co else "correct", "evaluations")
    return {
        "data": lambda: {"summary": {k: v for k, v in build_sft_data(data, evaluator=ev).items() if k in keep}},
        "pretrain": lambda: pretrain(PretrainConfig(
            out=str(out / "pretrain"), vocab_size=t(1024, 8192), shape=shape, seq_len=t(128, 512),
            batch_size=t(8, 64), steps=t(30, 1000), lr=t(3e-3, 1e-3), warmup_steps=t(5, 100), eval_every=t(30, 500),
            save_every=t(30, 500), heldout_tokens=t(5_000, 200_000),
            corpus=CorpusConfig(max_bytes=t(1 << 20, 64 << 20), library_repeats=t(5, 20)),
            resume=resume("pretrain"), seed=seed)),
        "sft": lambda: sft(SFTConfig(
            data=str(out / "data"), model=str(out / "pretrain" / "model"), out=str(out / "sft"), steps=t(20, 500),
            batch_size=t(4, 16), lr=t(3e-3, 3e-4), warmup_steps=t(2, 30), max_nnz=t(32, 128), eval_every=t(20, 500),
            eval_samples=t(4, 32), max_new_tokens=t(64, None), save_every=t(20, 200), compile_only=co,
            resume=resume("sft"), seed=seed), evaluator=ev),
        "ppo": lambda: train_rl(RLConfig(
            algo="ppo", model=str(out / "sft" / "checkpoint"), matrices=str(out / "data"), out=str(out / "ppo"),
            steps=t(2, 16), matrices_per_step=t(2, 8), samples_per_matrix=t(2, 8), minibatch=t(2, 16),
            epochs=t(1, 2), max_new_tokens=t(64, None), lr=t(1e-4, 2e-5), eval_every=t(2, 4), save_every=t(2, 4),
            compile_only=co, resume=resume("ppo"), seed=seed), evaluator=ev),
        "evaluate": lambda: {"summary": evaluate(EvalConfig(
            matrices=str(out / "data"), split="test", out=str(out / "eval"), samples=t(2, 4),
            max_new_tokens=t(64, None), gen_batch=64, compile_only=co,
            checkpoints=(f"sft={out / 'sft' / 'checkpoint'}", f"ppo={out / 'ppo' / 'checkpoint'}")),
            evaluator=ev)["summary"]},
        "generate": lambda: _generate(cfg, out, ev),
    }


def _generate(cfg: DemoConfig, out: Path, ev) -> dict:
    """The main job on a matrix the model never saw; always returns a kernel (the library's if need be)."""
    rep = generate_kernel(GenerateConfig(
        matrix=_real_matrix(cfg, out), model=str(out / "ppo" / "checkpoint"), samples=4 if cfg.tiny else 16,
        max_new_tokens=64 if cfg.tiny else None, out=str(out / "generate"), compile_only=cfg.compile_only,
        seed=cfg.seed), evaluator=ev)
    return {"verdict": rep.verdict, "source": rep.source, "verified": rep.verified, "notes": rep.notes,
            "out": rep.out, "kernel": str(Path(rep.out) / "kernel.cu"), "format": rep.best.format}


RUN_FILES = (*STAGES, "eval", "stages.json", "demo.json", "real_like.mtx")
"""What a demo run writes in its folder (``evaluate`` writes ``eval/``): what a fresh run clears."""


def _start(cfg: DemoConfig, out: Path) -> dict:
    """The stages an earlier run finished (``--resume``; settings must match); a fresh run (``--force``)
    clears every file an earlier run left, so no stage of it sits beside the new run's."""
    record = out / "stages.json"
    if cfg.resume:
        if not record.exists():
            return {}
        saved = json.loads(record.read_text())
        if saved.get("config") != _identity(cfg):
            raise SparseRLError(f"{out} holds a demo run with other settings ({saved.get('config')}); "
                                "run without --resume, or give another --out")
        return saved["stages"]
    for name in RUN_FILES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    return {}


def run_demo(cfg: DemoConfig) -> dict:
    """Run every stage; returns where each artefact is, with timings and a plain summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    done = _start(cfg, out)
    first_todo = next((n for n in STAGES if n not in done), None)

    def resume(name: str) -> bool:
        """Only the interrupted stage continues from its checkpoint; a later one starts afresh."""
        return cfg.resume and name == first_todo

    report: dict = {"config": cfg.__dict__}
    with Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold",))) as ev:
        if not cfg.compile_only and not ev.has_gpu:
            raise SparseRLError("no GPU visible: run 'sparserl demo --compile-only --tiny' on a CPU")
        for name, fn in _stages(cfg, out, ev, resume).items():
            _stage(name, fn, report, done, out / "stages.json", _identity(cfg))
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["stage_seconds"] = round(sum(report[n]["seconds"] for n in STAGES), 1)
    report["artefacts"] = {"data": str(out / "data"), "pretrained model": str(out / "pretrain" / "model"),
                           "sft checkpoint": str(out / "sft" / "checkpoint"),
                           "ppo checkpoint": str(out / "ppo" / "checkpoint"),
                           "evaluation": str(out / "eval" / "eval.md"), "kernel": report["generate"]["kernel"]}
    report["rl_change"] = policy_change(out / "sft" / "checkpoint", out / "ppo" / "checkpoint", out / "ppo")
    report["summary"] = summary_lines(report)
    (out / "demo.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def policy_change(before: Path, after: Path, rl_out: Path) -> dict:
    """Whether the RL stage changed the policy: its checkpoint's weights against the SFT
    checkpoint's (every ``.safetensors`` file, tensor by tensor), and the gradient norms it logged."""
    from safetensors.numpy import load_file

    files = sorted(p.relative_to(before) for p in before.rglob("*.safetensors"))
    changed, total, largest = 0, 0, 0.0
    for rel in files:
        if not (after / rel).exists():
            return {"comparable": False, "why": f"{after / rel} is missing"}
        a, b = load_file(str(before / rel)), load_file(str(after / rel))
        if a.keys() != b.keys():
            return {"comparable": False, "why": f"{rel} holds other tensors after RL"}
        for key in a:
            total += 1
            diff = float(abs(a[key].astype("float64") - b[key].astype("float64")).max()) if a[key].size else 0.0
            changed += diff > 0
            largest = max(largest, diff)
    norms, rewards, no_signal, skipped = [], [], [], 0
    metrics = rl_out / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        rec = json.loads(line)
        skipped += bool(rec.get("charts/update_skipped"))
        if "charts/grad_norm" in rec:
            norms.append(rec["charts/grad_norm"])
            rewards.append(rec.get("reward/mean"))
            no_signal.append(bool(rec.get("charts/no_signal")))
    return {"comparable": bool(files), "tensors": total, "tensors_changed": changed, "largest_change": largest,
            "grad_norms": norms, "reward_means": rewards, "no_signal_steps": sum(no_signal), "skipped_steps": skipped}


def summary_lines(report: dict) -> list[str]:
    """What the user should know at the end: the kernel and where it came from, whether it was
    verified, what the evaluation measured, and whether RL changed anything."""
    g = report["generate"]
    lines = [f"kernel: {g['kernel']} ({g['format']}), {g['source']}", f"verdict: {g['verdict']}"]
    lines += [f"note: {n}" for n in g.get("notes", [])]
    ev = report["evaluate"]["summary"]
    compile_only = report["config"]["compile_only"]
    for name in ("sft", "ppo"):
        m = ev.get(name, {})
        if compile_only:
            lines.append(f"evaluation, {name} model: {100 * (m.get('compile_rate') or 0):.1f}% of samples compiled "
                         "(compile-only: nothing verified or timed)")
        else:
            lines.append(f"evaluation, {name} model: {100 * (m.get('correct_rate') or 0):.1f}% correct, "
                         f"geomean speedup {m.get('geomean_speedup') or 1.0:.2f}x (best of samples)")
    lines.append(_rl_line(report["rl_change"]))
    return lines


def _rl_line(ch: dict) -> str:
    if not ch.get("comparable"):
        return f"RL stage: could not compare the policy before and after ({ch.get('why', 'no weights found')})"
    if ch["tensors_changed"]:
        line = (f"RL stage: changed the policy ({ch['tensors_changed']} of {ch['tensors']} weight tensors moved, "
                f"largest change {ch['largest_change']:.2g})")
        steps = len(ch.get("grad_norms", []))
        if steps and ch.get("no_signal_steps", 0) == steps:  # it moved, but not toward any reward
            line += (f", but in none of its {steps} steps did the rewards differ (every sample scored alike), "
                     "so nothing it learned came from the rewards: only the KL and entropy terms moved it")
        return line
    why = ""
    if ch.get("skipped_steps") and not ch["grad_norms"]:
        why = (f": all {ch['skipped_steps']} of its steps were skipped, since every sample scored alike (no reward "
               "differences to learn from)")
    elif ch["grad_norms"] and not any(ch["grad_norms"]):
        means = ", ".join(f"{r:.2f}" for r in ch["reward_means"] if r is not None)
        why = (f": the gradient was zero in all {len(ch['grad_norms'])} steps (mean reward per step: {means}); "
               "PPO had no reward differences to learn from")
    return f"RL stage: did NOT change the policy (its weights equal the SFT checkpoint's){why}"
