"""What a new user met in a first hour on a CPU, each as it was seen, and what they meet now.

Each test reproduces one report as it was written (the command, the input, what came out) and
fails on the behaviour reported. Interactive ones (a Ctrl-C at a given moment) are reproduced in
the process, with the signal sent where it landed."""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import uuid
from pathlib import Path

import pytest

from sparserl.harness.compile import find_nvcc
from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix
from tests.conftest import NEEDS_NVCC, one_line_error

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)


@pytest.fixture
def mtx(tmp_path: Path) -> Path:
    p = tmp_path / "banded.mtx"
    save_matrix(generate("banded", 500, seed=0, bands=3), p)
    return p


def _fake_stages(ran: list[str], overrides: dict):
    """demo._stages's stand-in: every stage records that it ran; ``overrides`` replace some."""
    from sparserl import demo

    def stages(*_a, **_k):
        out = {name: (lambda n=name: ran.append(n) or {}) for name in demo.STAGES}
        return out | overrides
    return stages


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt itself
def test_a_ctrl_c_swallowed_where_it_landed_still_stops_the_demo(cli, monkeypatch, tmp_path: Path) -> None:
    """Reported: Ctrl-C 20 s into `sparserl demo --tiny --compile-only --force`, during tokenisation,
    printed `Exception ignored in: <function Group.__del__ ...> KeyboardInterrupt`, then ran every
    remaining stage and exited 0. Here the Ctrl-C lands in a destructor, as it did in the regex
    module's; the demo must stop before its next stage and exit 130. Kills: dropping the interrupt
    record (sparserl.interrupts) or its check between the demo's stages."""
    pytest.importorskip("torch")
    from sparserl import demo

    ran: list[str] = []

    class Swallows:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # a loop checks for signals: the handler runs here, inside __del__,
                pass  # where Python can only print the KeyboardInterrupt it raises

    def tokenising():
        ran.append("data")
        Swallows()  # made and dropped at once
        return {}

    monkeypatch.setattr(demo, "_stages", _fake_stages(ran, {"data": tokenising}))
    res = cli("demo", "--tiny", "--compile-only", "--force", "--out", tmp_path / "dm")
    assert res.rc == 130 and "error: interrupted" in res.err, (res.rc, res.err[-2000:])
    assert ran == ["data"], "no stage after the interrupt ran"


@needs_nvcc
def test_compiler_errors_keep_their_square_brackets(cli, mtx: Path, tmp_path: Path) -> None:
    """Reported: compiler errors lose their square brackets in the terminal (`row_ptr[row]` shows as
    `row_ptr`, and the `^` points to the wrong place), and `matrix info 'y[red].mtx'` titles its table
    "y.mtx": rich read them as markup. Kills: printing the log, the message or the name as markup."""
    k = tmp_path / "k.cu"
    k.write_text("FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 128), block=128\n"
                 'extern "C" __global__ void spmv_kernel(int m, int n, int nnz, const int* __restrict__ row_ptr,\n'
                 "    const int* __restrict__ col_idx, const float* __restrict__ val, const float* __restrict__ x,\n"
                 "    float* __restrict__ y)\n{ int row = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "  if (row < m) y[row] = row_ptr[row] + not_declared; }\n")
    res = cli("check-kernel", k, mtx, "--compile-only")
    assert res.rc == 1 and "COMPILE_ERROR" in res.out, res.out
    lines = res.out.splitlines()
    src = next(i for i, ln in enumerate(lines) if "row_ptr[row] + not_declared" in ln)
    assert lines[src + 1].index("^") == lines[src].index("not_declared"), "the caret under the undeclared name"
    odd = tmp_path / "y[red].mtx"
    save_matrix(generate("banded", 50, seed=0, bands=3), odd)
    res = cli("matrix", "info", odd)
    assert res.rc == 0 and "y[red].mtx" in res.out


def test_a_bad_seed_is_one_line_and_leaves_nothing_behind(cli, tmp_path: Path) -> None:
    """Reported: `sparserl demo --seed -1 --out dm` printed a traceback and left dm/data/matrices/,
    so the next demo into dm refused. Kills: dropping DemoConfig's seed check (the traceback
    comes back from NumPy, after the folders are made)."""
    pytest.importorskip("torch")
    dm = tmp_path / "dm"
    one_line_error(cli("demo", "--tiny", "--compile-only", "--seed", "-1", "--out", dm), "--seed must be >= 0")
    assert not dm.exists()
    one_line_error(cli("data", "build", "--seed", "-1", "--out", tmp_path / "d"), "--seed must be >= 0")
    assert not (tmp_path / "d").exists()


@needs_nvcc
def test_a_failed_compile_leaves_no_file_in_the_temp_folder(monkeypatch, tmp_path: Path) -> None:
    """Reported: every failed compile left an empty /tmp/kernel-XXXX..lgenfe.bc (nvcc's front end
    writes it to the temp folder, not to --keep-dir). Kills: running nvcc without its own TMPDIR."""
    from sparserl.harness.compile import CompileOptions, compile_source

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    source = f'// {uuid.uuid4()}\nextern "C" __global__ void k(float* y) {{ y[0] = not_declared; }}\n'
    res = compile_source(source, CompileOptions(backend="nvcc"), cache_dir=tmp_path / "cache")
    assert not res.ok and res.error_kind == "compile_error"
    assert list(tmp.iterdir()) == []


def test_generate_after_the_demo_finds_the_demos_policy(monkeypatch, tmp_path: Path) -> None:
    """Reported: after the demo, `sparserl generate M.mtx` said "no model at runs/ppo/checkpoint"
    although the demo had just trained one at runs/demo/ppo/checkpoint. Kills: a default model
    that looks only at runs/ppo/checkpoint."""
    from sparserl.generate import DEFAULT_MODEL, find_model

    monkeypatch.chdir(tmp_path)
    assert find_model(None) == (DEFAULT_MODEL, None)  # nothing trained yet: the default, and no note
    for folder, age in (("runs/sft/checkpoint", 100), ("runs/demo/ppo/checkpoint", 10)):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "policy.json").write_text("{}")
        os.utime(tmp_path / folder / "policy.json", (1e9 - age, 1e9 - age))
    model, note = find_model(None)
    assert model == "runs/demo/ppo/checkpoint" and "no model at runs/ppo/checkpoint" in note and "--model" in note
    assert find_model("elsewhere") == ("elsewhere", None)  # a model given is taken as given


@needs_nvcc
def test_generate_without_a_search_does_not_say_it_searches(mtx: Path, tmp_path: Path, caplog) -> None:
    """Reported: generate logged "searching without one" when no search was asked for. Kills:
    logging the search note whatever --search-budget is."""
    pytest.importorskip("torch")
    from sparserl.generate import GenerateConfig, generate_kernel

    with caplog.at_level(logging.INFO):
        generate_kernel(GenerateConfig(matrix=str(mtx), model=str(tmp_path / "none"), out=str(tmp_path / "g"),
                                       compile_only=True))
    said = [r.getMessage().replace(str(tmp_path), "TMP") for r in caplog.records]
    assert said and not [m for m in said if "search" in m], said


def test_evaluate_without_a_policy_on_a_cpu_is_refused(cli, tmp_path: Path) -> None:
    """Reported: `evaluate --matrices families` with no checkpoint wrote a report with only the
    paper's row and exited 0 (on a CPU the baselines, which are timings, do not run). Kills:
    evaluating an empty set of systems."""
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible: the baselines run")
    one_line_error(cli("evaluate", "--matrices", "families", "--out", tmp_path / "e"), "nothing to evaluate")
    assert not (tmp_path / "e").exists()


def test_an_interrupted_search_without_a_gpu_does_not_claim_verified_kernels(mtx: Path, tmp_path: Path,
                                                                               caplog) -> None:
    """Reported: an interrupted search on a CPU said "verified ones are in the store" when nothing
    was verified. Kills: the old message whatever the store received."""
    from sparserl.harness.result import ErrorKind
    from sparserl.search.loop import SearchConfig
    from sparserl.search.run import SearchJob, search_matrix
    from tests.search.doubles import FakeTimingDouble

    class NoGpu(FakeTimingDouble):
        has_gpu = False

    ev = NoGpu(lambda t: ErrorKind.NO_GPU, interrupt_after=3)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        search_matrix(SearchJob(matrix=str(mtx), search=SearchConfig(budget=8), store=str(tmp_path / "s.db"),
                                out=str(tmp_path / "s")), evaluator=ev)
    said = [r.getMessage() for r in caplog.records if "interrupted" in r.getMessage()]
    assert said and "none was verified" in said[0] and "verified ones are in the store" not in said[0], said


def test_a_forced_demo_interrupted_in_its_data_stage_leaves_no_earlier_stage(cli, monkeypatch,
                                                                            tmp_path: Path) -> None:
    """Reported: interrupting `demo --force` during the data stage left new partial data beside the
    previous run's later stages. Kills: starting a forced run without clearing the earlier one."""
    pytest.importorskip("torch")
    from sparserl import demo

    out = tmp_path / "dm"
    for stage in ("pretrain", "sft", "ppo", "eval", "generate"):
        (out / stage).mkdir(parents=True)
        (out / stage / "from_the_earlier_run").write_text("x")
    (out / "stages.json").write_text(json.dumps({"config": {}, "stages": {"data": {"seconds": 1.0}}}))

    def interrupted_data():
        (out / "data").mkdir()
        (out / "data" / "partial").write_text("x")
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_stages", _fake_stages([], {"data": interrupted_data}))
    res = cli("demo", "--tiny", "--compile-only", "--force", "--out", out)
    assert res.rc == 130
    assert sorted(p.name for p in out.iterdir()) == ["data"], "only the new, partial data stage is there"


def test_validation_messages_name_the_flags(cli, mtx: Path, tmp_path: Path) -> None:
    """Reported: `search --parallel -1` said "need beam >= 1 ...", `pretrain --batch-size -1` said
    "need ... batch_size >= 1", `data build --per-family 0` wrote an empty data set and exited 0,
    and `evaluate --family-rows -5` left an empty folder behind. Kills: a config check that names
    its field instead of the flag, or accepts the empty data set."""
    one_line_error(cli("search", mtx, "--parallel", "-1", "--out", tmp_path / "s"), "--parallel must be >= 0")
    pytest.importorskip("torch")
    one_line_error(cli("pretrain", "--batch-size", "-1", "--out", tmp_path / "p"), "--batch-size must be >= 1")
    one_line_error(cli("data", "build", "--per-family", "0", "--out", tmp_path / "d"), "--per-family")
    one_line_error(cli("evaluate", "--matrices", "families", "--family-rows", "-5", "--out", tmp_path / "e"),
                   "--family-rows must be >= 1")
    assert not any((tmp_path / name).exists() for name in ("s", "p", "d", "e"))


def test_flags_agree_between_commands(cli, mtx: Path, tmp_path: Path) -> None:
    """Reported: `check-kernel --matrix` against a positional matrix elsewhere; the search size as
    --budget, --search and --search-budget; --k defaulting to none in some commands and to 32 in
    others (an spmv eval.json recorded "k": 32); no --max-new-tokens on generate. Kills: any of
    those coming back."""
    from sparserl.cli import command

    cmds = {name: cmd for name, cmd in command().commands.items()}
    pytest.importorskip("torch")
    flags = {name: {o for p in cmds[name].params for o in p.opts} for name in ("generate", "search", "improve")}
    assert all("--search-budget" in f for f in flags.values())
    assert "--max-new-tokens" in flags["generate"]
    defaults_k = {name: next(p.default for p in cmds[name].params if p.name == "k")
                  for name in ("generate", "search", "evaluate", "improve", "check-kernel", "baseline")}
    assert set(defaults_k.values()) == {None}, defaults_k
    if find_nvcc() is not None:
        k = tmp_path / "k.cu"
        k.write_text(variants("spmv", "CSR")[0].render())
        res = cli("check-kernel", k, mtx, "--compile-only")  # the matrix positional, as everywhere else
        assert res.rc == 0 and "COMPILED" in res.out, res.err


def test_library_ids_are_whole_and_an_empty_store_says_so(cli, tmp_path: Path) -> None:
    """Reported: `library list` cut ids at 80 columns although `library render` needs the whole id;
    `best list` on an empty store printed an empty 13-column table, and with --json nothing at all.
    Kills: a table that wraps or cuts the id column when piped; listing an empty store silently."""
    from sparserl.search.store import BestStore

    res = cli("library", "list")
    assert res.rc == 0
    assert all(any(v.id in ln.split() for ln in res.out.splitlines()) for v in variants()), "every id whole"
    BestStore(tmp_path / "s.db").close()
    res = cli("best", "list", "--store", tmp_path / "s.db")
    assert res.rc == 0 and "best known kernels" not in res.out and "no best-known kernels" in res.err
    res = cli("best", "list", "--store", tmp_path / "s.db", "--json")
    assert res.rc == 0 and res.out == "" and "no best-known kernels" in res.err


def test_a_ctrl_c_while_the_command_line_loads_is_one_line(monkeypatch, capsys) -> None:
    """Reported: one interrupt in ten ended with no message. Measured here, the interrupts without
    one landed while the command line was still loading its libraries (a traceback, then death by
    SIGINT) or as it exited. An interrupt during loading is reproduced by an import that is
    interrupted. Kills: loading the commands outside main's Ctrl-C handling."""
    import importlib.abc
    import sys

    import sparserl.cli as cli_pkg

    class Interrupted(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "sparserl.cli.root":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "sparserl.cli.root", raising=False)
    monkeypatch.delattr(cli_pkg, "root", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupted(), *sys.meta_path])
    with pytest.raises(SystemExit) as exc:
        cli_pkg.main(["--version"])
    assert exc.value.code == 130 and capsys.readouterr().err == "error: interrupted\n"


@pytest.mark.parametrize("stage", ["sft", "ppo", "grpo"])
def test_a_stage_that_fails_on_its_inputs_leaves_no_empty_out_folder(cli, tmp_path: Path, stage: str) -> None:
    """Reported: `sparserl sft --data nope --out o` and `sparserl ppo --model nope --out o` said what was wrong in
    one line and left an empty folder o behind. Kills: the output folder made before the data and the model load."""
    out = tmp_path / "o"
    argv = (["sft", "--data", tmp_path / "nope"] if stage == "sft" else
            [stage, "--matrices", tmp_path, "--model", tmp_path / "nope"])
    one_line_error(cli(*argv, "--out", out, "--device", "cpu"), "nope")
    assert not out.exists()
