"""metrics.jsonl across a kill and a resume: one row per step, nothing from the lost steps."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from sparserl.runtime.metrics import MetricLogger  # noqa: E402


def steps(folder) -> list[int]:
    return [json.loads(ln)["step"] for ln in (folder / "metrics.jsonl").read_text().splitlines()]


def test_resume_drops_rows_after_the_checkpoint(tmp_path) -> None:
    log = MetricLogger(tmp_path)  # a new run
    for s in range(0, 7):
        log.log(s, {"reward": s})
    log.file.write('{"step": 7, "rew')  # killed while writing step 7
    log.close()
    log = MetricLogger(tmp_path, resumed_at=4)  # the last checkpoint was at step 4
    for s in range(5, 9):
        log.log(s, {"reward": s})
    log.close()
    assert steps(tmp_path) == list(range(0, 9))
    MetricLogger(tmp_path).close()  # a new run starts the file anew
    assert steps(tmp_path) == []
