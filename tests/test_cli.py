"""The ``sparserl`` command itself: version, usage errors, Ctrl-C, and help that a new user can read."""

from __future__ import annotations


import pytest

import sparserl
from tests.conftest import one_line_error


def test_version(cli) -> None:
    res = cli("--version")
    assert res.rc == 0 and res.out.strip() == f"sparserl {sparserl.__version__}"


def test_usage_errors_use_the_one_error_prefix(cli) -> None:
    line = one_line_error(cli("--nope"), "--nope", "sparserl --help")
    assert "Error" not in line
    one_line_error(cli("matrix", "info"), "Missing argument", "sparserl matrix info --help")


def test_ctrl_c_is_one_line_and_status_130(cli, monkeypatch, tmp_path) -> None:
    import sparserl.cli.matrix as mcli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(mcli, "load_matrix", interrupted)
    res = cli("matrix", "info", tmp_path / "a.mtx")
    assert res.rc == 130 and res.err.strip() == "error: interrupted" and "Traceback" not in res.err


@pytest.mark.parametrize("error", [ImportError("initialization failed"), OSError("interrupted write")])
def test_an_interrupt_turned_into_another_error_is_still_an_interrupt(cli, monkeypatch, tmp_path, error) -> None:
    """Ctrl-C landing inside a C extension's import (scipy's Matrix Market writer, loaded on the first write)
    comes out as ``ImportError: initialization failed``; the command must still end as interrupted, status 130.
    Kills: the recorded interrupt ignored for errors other than KeyboardInterrupt."""
    import os
    import signal

    import sparserl.cli.matrix as mcli

    def interrupted_inside(*a, **k):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the command line's handler records it and raises here
            for _ in range(1000):  # the handler runs between two bytecodes, right after the kill
                pass
        except KeyboardInterrupt:
            raise error from None
        raise AssertionError("the interrupt never arrived")

    monkeypatch.setattr(mcli, "load_matrix", interrupted_inside)
    res = cli("matrix", "info", tmp_path / "a.mtx")
    assert res.rc == 130 and res.err.strip() == "error: interrupted" and "Traceback" not in res.err


def test_top_level_help_lists_every_stage_with_commas(cli) -> None:
    text = " ".join(cli("--help").out.split())
    assert "'generate' (the main job: a verified kernel for your matrix), 'search'" in text
    assert "export as SFT pairs), 'evaluate' (systems side by side), 'rescore'" in text
    assert "--version" in text


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_help_shows_defaults_and_no_bool_placeholder_or_double_negation(capsys) -> None:
    """Every option of every command is required, an on/off flag, or shows its default; no
    `<bool>` placeholder; no `--no-no-...` flag (each help rendered as `--help` renders it)."""
    from sparserl.cli import command

    checked = 0
    for path, cmd in _commands(command()):
        if not path:
            continue
        cmd.get_help(cmd.context_class(cmd, info_name=path[-1]))  # what --help prints (fills ppo's defaults)
        text = capsys.readouterr().out
        assert "Usage:" in text and "<bool>" not in text and "--no-no-" not in text, (path, text)
        assert "[default: no-" not in text, (path, text)  # an off-unless-given flag is one-sided
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option" or p.required or p.hidden or p.is_flag:
                continue
            shown = p.default is not None and p.show_default is not False
            assert shown or "[default:" in (p.help or ""), (path, p.opts)
            checked += 1
    assert checked > 100


def test_command_list_gives_each_command_one_line(cli, monkeypatch) -> None:
    """A list of commands shows each command's first paragraph: on a wide terminal, one row each
    (search's and improve's summaries took three and four rows, broken where their docstrings' lines
    were)."""
    from sparserl.cli import command

    monkeypatch.setenv("COLUMNS", "400")
    groups = [((), command())] + [((name,), sub) for name, sub in command().commands.items() if hasattr(sub, "commands")]
    for path, group in groups:
        lines = cli(*path, "--help").out.splitlines()
        start = next(i for i, line in enumerate(lines) if "Commands" in line)
        rows = [line.strip("│ ").split()[0] for line in lines[start + 1:] if line.startswith("│")]
        assert rows == list(group.commands), (path, rows)  # a wrapped row starts with no command name


def test_search_refuses_k_with_spmv(cli, tmp_path) -> None:
    from sparserl.matrices import generate, save_matrix
    from tests.conftest import one_line_error

    save_matrix(generate("banded", 200, seed=0), tmp_path / "a.mtx")
    one_line_error(cli("search", tmp_path / "a.mtx", "--k", "4", "--out", tmp_path / "s"), "--k", "leave --k out")
    assert not (tmp_path / "s").exists()


def test_rl_help_shows_the_config_defaults(cli) -> None:
    """ppo's options default to 'not given' (the config file, then RLConfig, decide); the help
    prints RLConfig's values, which are what a run without --config uses."""
    from sparserl.rl.trainer import RLConfig

    text = " ".join(cli("ppo", "--help").out.split())
    assert f"RL steps [default: {RLConfig.steps}]" in text
    assert f"[default: {RLConfig.pg_token_share}" in text and f"[default: {RLConfig.lr}]" in text


@pytest.mark.parametrize("module", ["sparserl.train_sft", "sparserl.train_minimal"])
def test_paper_entry_points_show_their_defaults(module: str, capsys) -> None:
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert info.value.code == 0 and "(default: None)" not in text and "(default: False)" not in text
    assert "--max-nnz MAX_NNZ coordinate tokens per matrix (default: 128)" in text
    assert ("(default: runs/pretrain/model)" in text) == (module == "sparserl.train_sft")


def test_log_lines_carry_the_time_only_when_asked() -> None:
    import logging

    from sparserl.cli.root import LOG_TIME, log_format

    rec = logging.LogRecord("sparserl.x", logging.INFO, __file__, 1, "done", None, None)
    plain = logging.Formatter(log_format({}), datefmt="%H:%M:%S").format(rec)
    assert plain == "INFO sparserl.x: done" and log_format({LOG_TIME: "0"}) == log_format({})
    timed = logging.Formatter(log_format({LOG_TIME: "1"}), datefmt="%H:%M:%S").format(rec)
    stamp, rest = timed.split(" ", 1)
    assert rest == plain and len(stamp) == 8 and stamp.count(":") == 2
