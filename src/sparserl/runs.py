"""Output folders of the stages: a run never overwrites an earlier one without being told to.

Every stage that writes a folder (``pretrain``, ``data build``, ``sft``, ``ppo``/``grpo``,
``improve``, ``demo``) checks it first with :func:`check_output`: a folder that holds an earlier run's files
is refused unless ``--resume`` (continue that run, where the stage can) or ``--force``
(write over it) is given; so does ``evaluate``, which cannot resume.
"""

from __future__ import annotations

from pathlib import Path

from sparserl.errors import SparseRLError

MARKERS = {
    "pretrain": ("state.pt", "model", "metrics.jsonl"),
    "data": ("summary.json", "train.jsonl"),
    "siblings": ("siblings.jsonl", "summary.json"),
    "sft": ("state.pt", "checkpoint", "metrics.jsonl"),
    "ppo": ("state.pt", "checkpoint", "metrics.jsonl"),
    "grpo": ("state.pt", "checkpoint", "metrics.jsonl"),
    "improve": ("state.json", "rounds.json", "metrics.jsonl", "best"),
    "demo": ("stages.json", "demo.json", "data", "pretrain", "sft", "ppo"),
    "evaluate": ("eval.json", "completions.jsonl"),
}
"""Per stage, the files or folders whose presence means the folder holds an earlier run."""


def check_output(out: str | Path, stage: str, force: bool, resume: bool | None = None) -> None:
    """Refuse to write ``stage``'s run into ``out`` when it holds an earlier one, unless
    ``force`` (or ``resume``; None = the stage cannot resume)."""
    if force and resume:
        raise SparseRLError("--force starts over and --resume continues: give one of them")
    if force or resume:
        return
    folder = Path(out)
    found = [name for name in MARKERS[stage] if (folder / name).exists()]
    if found:
        how = "--resume to continue it, --force to overwrite it" if resume is not None else "--force to overwrite it"
        raise SparseRLError(f"{folder} holds an earlier {stage} run ({', '.join(found)}): pass {how}, "
                            "or give another --out")
