"""``sparserl demo``: the whole pipeline, small, in one command.

Stages, each writing under ``out``: a generated matrix set with SFT data (``data/``),
pre-training of the embedded default model (``pretrain/``), SFT (``sft/``), a short PPO
(``ppo/``), evaluation on the held-out matrices (``eval/``), and ``generate`` for one
real-structure matrix (``generate/``). On a GPU every reward and verdict comes from the
harness; ``compile_only`` runs the same stages on a CPU with compile-only rewards, and
``tiny`` shrinks the model and the data so that takes a minute or two (what CI runs).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)


STAGES = ("data", "pretrain", "sft", "ppo", "evaluate", "generate")


@dataclass(frozen=True)
class DemoConfig:
    out: str = "runs/demo"
    tiny: bool = False
    """Tiny model and data (minutes on a CPU); the default sizes target one H200 in under 20 minutes."""
    compile_only: bool = False
    """No GPU: compile-only rewards and checks (nothing is verified or timed)."""
    real_matrix: str | None = None
    """Matrix for the final generate step (default: a SuiteSparse file beside the checkout, else a generated one)."""
    seed: int = 0
    resume: bool = False
    """Skip the stages an earlier run of the same ``out`` finished (recorded in ``stages.json``)
    and continue the interrupted one from its last checkpoint."""


def _identity(cfg: DemoConfig) -> dict:
    """The settings that decide what the stages produce (a resume must not mix two of them)."""
    return {"tiny": cfg.tiny, "compile_only": cfg.compile_only, "real_matrix": cfg.real_matrix, "seed": cfg.seed}


def _stage(name: str, fn, report: dict, done: dict, record: Path, identity: dict):
    """Run one stage (or reuse its recorded result when resuming) and record it in ``record``."""
    if name in done:
        report[name] = done[name]
        log.info("== %s: done by an earlier run (%.1f s), skipped ==", name, done[name]["seconds"])
        return done[name]
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
    for cand in (Path(__file__).resolve().parents[3] / "shared" / "matrices" / "suitesparse" / "bcsstk13.mtx.gz",):
        if cand.exists():
            return str(cand)
    from sparserl.matrices import generate, save_matrix

    p = out / "real_like.mtx"
    save_matrix(generate("stencil3d_27", 3000 if cfg.tiny else 30000, seed=cfg.seed + 5), p)
    return str(p)


def run_demo(cfg: DemoConfig) -> dict:
    """Run every stage; returns where each artefact is, with timings."""
    from sparserl.data.corpus import CorpusConfig
    from sparserl.data.sft_build import SFTDataConfig, build_sft_data
    from sparserl.eval.compare import EvalConfig, evaluate
    from sparserl.generate import GenerateConfig, generate_kernel
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.model.config import TinyModelConfig
    from sparserl.rl.trainer import RLConfig, train_rl
    from sparserl.train.pretrain import PretrainConfig, pretrain
    from sparserl.train.sft import SFTConfig, sft

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ev = Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold",)))
    if not cfg.compile_only and not ev.has_gpu:
        ev.close()
        raise SparseRLError("no GPU visible: run 'sparserl demo --compile-only --tiny' on a CPU")
    tiny = cfg.tiny
    report: dict = {"config": cfg.__dict__}
    record = out / "stages.json"
    identity = _identity(cfg)
    done: dict = {}
    if cfg.resume and record.exists():
        saved = json.loads(record.read_text())
        if saved.get("config") != identity:
            ev.close()
            raise SparseRLError(f"{out} holds a demo run with other settings ({saved.get('config')}); "
                                "run without --resume, or give another --out")
        done = saved["stages"]
    if not cfg.resume:
        record.unlink(missing_ok=True)
    first_todo = next((n for n in STAGES if n not in done), None)

    def stage(name, fn):
        return _stage(name, fn, report, done, record, identity)

    def resume(name: str) -> bool:
        """Only the interrupted stage continues from its checkpoint; a later one starts afresh."""
        return cfg.resume and name == first_todo

    try:
        stage("data", lambda: {"summary": {k: v for k, v in build_sft_data(SFTDataConfig(
            out=str(out / "data"), matrices_per_family=3 if tiny else 16, min_rows=300 if tiny else 5_000,
            max_rows=2_000 if tiny else 100_000, compile_only=cfg.compile_only, targets_per_matrix=2 if tiny else 6,
            variants_per_matrix=None if tiny else 20,
            val_fraction=0.34 if tiny else 0.25, test_fraction=0.34 if tiny else 0.25, seed=cfg.seed), evaluator=ev).items()
            if k in ("matrices", "rows", "correct", "evaluations")}})
        shape = (TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=32) if tiny else TinyModelConfig())
        stage("pretrain", lambda: pretrain(PretrainConfig(
            out=str(out / "pretrain"), vocab_size=1024 if tiny else 8192, shape=shape, seq_len=128 if tiny else 512,
            batch_size=8 if tiny else 64, steps=30 if tiny else 1000, lr=3e-3 if tiny else 1e-3,
            warmup_steps=5 if tiny else 100, eval_every=30 if tiny else 500, save_every=30 if tiny else 500,
            heldout_tokens=5_000 if tiny else 200_000,
            corpus=CorpusConfig(max_bytes=(1 << 20) if tiny else (64 << 20), library_repeats=5 if tiny else 20),
            resume=resume("pretrain"), seed=cfg.seed)))
        stage("sft", lambda: sft(SFTConfig(
            data=str(out / "data"), model=str(out / "pretrain" / "model"), out=str(out / "sft"),
            steps=20 if tiny else 500, batch_size=4 if tiny else 16, lr=3e-3 if tiny else 3e-4,
            warmup_steps=2 if tiny else 30, max_nnz=32 if tiny else 128, eval_every=20 if tiny else 500,
            eval_samples=4 if tiny else 32, max_new_tokens=64 if tiny else 1536, save_every=20 if tiny else 200,
            compile_only=cfg.compile_only, resume=resume("sft"), seed=cfg.seed), evaluator=ev))
        stage("ppo", lambda: train_rl(RLConfig(
            algo="ppo", model=str(out / "sft" / "checkpoint"), matrices=str(out / "data"), out=str(out / "ppo"),
            steps=2 if tiny else 16, matrices_per_step=2 if tiny else 8, samples_per_matrix=2 if tiny else 8,
            minibatch=2 if tiny else 16, epochs=1 if tiny else 2, max_new_tokens=64 if tiny else 1536,
            lr=1e-4 if tiny else 2e-5, eval_every=2 if tiny else 4, save_every=2 if tiny else 4,
            compile_only=cfg.compile_only, resume=resume("ppo"), seed=cfg.seed), evaluator=ev))
        stage("evaluate", lambda: {"summary": evaluate(EvalConfig(
            matrices=str(out / "data"), split="test", out=str(out / "eval"), samples=2 if tiny else 4,
            max_new_tokens=64 if tiny else 1536, gen_batch=64, compile_only=cfg.compile_only,
            checkpoints=(f"sft={out / 'sft' / 'checkpoint'}", f"ppo={out / 'ppo' / 'checkpoint'}")),
            evaluator=ev)["summary"]})
        real = _real_matrix(cfg, out)

        def gen():
            try:
                rep = generate_kernel(GenerateConfig(
                    matrix=real, model=str(out / "ppo" / "checkpoint"), samples=4 if tiny else 16,
                    max_new_tokens=64 if tiny else 1536, out=str(out / "generate"), compile_only=cfg.compile_only,
                    seed=cfg.seed), evaluator=ev)
                return {"verdict": rep["verdict"], "source": rep["source"], "out": rep["out"]}
            except SparseRLError as exc:  # a tiny CPU model rarely writes a compiling kernel; say so
                return {"verdict": f"no kernel: {exc}", "out": None}

        stage("generate", gen)
    finally:
        ev.close()
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["stage_seconds"] = round(sum(report[n]["seconds"] for n in STAGES), 1)
    report["artefacts"] = {"data": str(out / "data"), "pretrained model": str(out / "pretrain" / "model"),
                           "sft checkpoint": str(out / "sft" / "checkpoint"), "ppo checkpoint": str(out / "ppo" / "checkpoint"),
                           "evaluation": str(out / "eval" / "eval.md"), "generated kernel": report["generate"].get("out")}
    (out / "demo.json").write_text(json.dumps(report, indent=1, default=str))
    return report
