"""Progress displays: a bar on a terminal, log lines when output goes to a file or a pipe."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console
from rich.progress import Progress

from sparserl.progress import LineProgress, progress


def test_a_terminal_gets_the_bar_anything_else_gets_lines() -> None:
    assert isinstance(progress(console=Console(file=io.StringIO(), force_terminal=True)), Progress)
    assert isinstance(progress(console=Console(file=io.StringIO())), LineProgress)
    assert isinstance(progress(enabled=False, console=Console(file=io.StringIO())), Progress)  # shows nothing


def test_lines_at_each_tenth_and_at_the_end(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sparserl.progress")
    with progress(console=Console(file=io.StringIO()), min_gap_s=0) as bar:
        task = bar.add_task("sft", total=20)
        for i in range(20):
            bar.update(task, advance=1, description=f"sft loss {1 / (i + 1):.3f}")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10, lines  # one per tenth; the last one is the end
    assert lines[0].startswith("sft loss 0.500: 2/20 (10%)") and "left" in lines[0]
    assert lines[-1].startswith("sft loss 0.050: 20/20 (100%)") and "left" not in lines[-1]


def test_a_quick_loop_says_only_its_end_and_a_resumed_one_counts_from_where_it_was(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sparserl.progress")
    bar = LineProgress(every_s=60, min_gap_s=5)
    with bar:
        task = bar.add_task("compiling", total=103)
        for _ in range(103):
            bar.advance(task)
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["compiling: 103/103 (100%)"]
    caplog.clear()
    bar = LineProgress(every_s=0, min_gap_s=0)
    with bar:
        task = bar.add_task("ppo", total=10, completed=6)  # resumed at step 6
        bar.update(task, advance=1)
    assert caplog.records[0].getMessage().startswith("ppo: 7/10 (70%)")


def test_an_interrupted_loop_says_where_it_stopped(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sparserl.progress")
    try:
        with LineProgress(every_s=60, min_gap_s=60) as bar:
            task = bar.add_task("pretrain", total=100)
            for _ in range(37):
                bar.advance(task)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert caplog.records[-1].getMessage().startswith("pretrain: 37/100 (37%)")


def test_a_long_step_still_gets_a_line_every_so_often(caplog) -> None:
    """'generate' samples its 16 kernels in one batch and a validation runs between two steps:
    the loop calls nothing for minutes. Off a terminal there must still be a line now and then
    (under nohup nothing printed until the end)."""
    import time

    caplog.set_level(logging.INFO, logger="sparserl.progress")
    with LineProgress(every_s=0.2, min_gap_s=5) as bar:
        task = bar.add_task("sampling kernels", total=16)
        time.sleep(0.7)  # one batch of 16 samples, still running
        assert any(r.getMessage().startswith("sampling kernels: 0/16 (0%)") for r in caplog.records), caplog.records
        bar.update(task, advance=16)
    n = len(caplog.records)
    time.sleep(0.3)
    assert len(caplog.records) == n  # nothing more once the display is closed
    assert caplog.records[-1].getMessage().startswith("sampling kernels: 16/16 (100%)")


@pytest.mark.slow(seconds=11)
def test_hugging_face_bars_stay_out_of_a_log(tiny_model_dir) -> None:
    """With output in a file, loading a model printed transformers' "Loading weights" tqdm bar
    (carriage returns and all) into the log; every sparserl command turns those bars off there.
    One process: a load before the command prints the bar (what a log got before), one after it
    does not (a second process cost as much again)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    script = (
        "import contextlib, io\n"
        "from transformers import AutoModelForCausalLM\n"
        "def bar():\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stderr(buf):\n"
        f"        AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})\n"
        "    return 'Loading weights' in buf.getvalue()\n"
        "before = bar()\n"
        "from sparserl.cli import main\n"
        "try:\n    main(['matrix', 'families'])\nexcept SystemExit:\n    pass\n"
        "print('BARS', before, bar())\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "BARS True False" in p.stdout, (p.stdout[-500:], p.stderr[-2000:])