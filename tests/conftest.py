"""Shared fixtures: where the real SuiteSparse matrices are, and the GPU marker's skip."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# A test run writes nothing into the checkout's src/: no bytecode caches, from this process or from
# the commands the tests start (pytest_sessionfinish below checks).
sys.dont_write_bytecode = True
os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")

from tests.postgres import pg_url, postgres_server  # noqa: E402, F401 (fixtures: a real PostgreSQL server)

# A test run leaves the user's cache (~/.cache/sparserl: the best-known store, compiles, cost models) alone and
# reads nothing from it: every test and every command a test starts shares one fresh folder, removed at the end
# (pytest_sessionfinish) by the process that made it: the xdist workers, and the processes mutation testing forks,
# inherit it and leave it. A run given SPARSERL_CACHE_DIR (not empty) keeps it.
_OWN_CACHE, _CACHE_OWNER = None, os.getpid()
if not os.environ.get("SPARSERL_CACHE_DIR"):
    import tempfile

    _OWN_CACHE = os.environ["SPARSERL_CACHE_DIR"] = tempfile.mkdtemp(prefix="sparserl-test-cache-")

# Triton's kernels (the split-key decode attention) run on CPU tensors in its interpreter, which must
# be chosen before Triton is first imported; on a GPU machine they compile as in production.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker gets one core's worth of threads (and so do the processes the tests
# start, which inherit this environment): N workers with N threads each on N cores spin against each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
# --hypothesis-profile=mutation (scripts/mutation.py): a property that fails is reported as it is
# found, not shrunk to its smallest case (shrinking made mutmut read a killed mutant as a hang)
try:
    from hypothesis import Phase, settings

    settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)
except ImportError:  # hypothesis is in the dev extra
    pass

REPO = Path(__file__).resolve().parents[1]
NEEDS_NVCC = "needs nvcc, the CUDA toolkit's compiler (no GPU needed): install the toolkit or set CUDA_HOME"


def assert_no_gpu_is_one_line(main, argv: list[str], out: Path, capsys) -> None:
    """A GPU benchmark's ``main`` where CuPy is missing: exit 2, one ``error:`` line that names the GPU, and
    no output file. Skips where CuPy is installed (the path without a GPU cannot be reached there)."""
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "GPU" in err and "\n" not in err
    assert not out.exists()


def load_benchmark(name: str):
    """The module of ``benchmarks/NAME.py`` (the scripts are not a package), imported from its file."""
    import importlib.util

    import sys

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return sys.modules[name]


def suitesparse_dir() -> Path | None:
    """The folder of real SuiteSparse matrices (``$SPARSERL_SUITESPARSE`` or ``../shared``)."""
    env = os.environ.get("SPARSERL_SUITESPARSE")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "matrices" / "suitesparse", REPO / ".devdata" / "suitesparse"]
    for c in candidates:
        if c.is_dir() and any(c.glob("*.mtx.gz")):
            return c
    return None


@pytest.fixture(scope="session")
def suitesparse() -> Path:
    d = suitesparse_dir()
    if d is None:
        pytest.skip("real SuiteSparse matrices not found (set SPARSERL_SUITESPARSE)")
    return d


def _why_no_gpu() -> str | None:
    """None when kernels can run here; otherwise why not, in words for someone new to the project."""
    try:
        import cupy
    except ImportError:
        return ("needs an NVIDIA GPU and CuPy, which is not installed here "
                "(on a GPU machine: python -m pip install -e '.[gpu]')")
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception:
        pass
    return "needs an NVIDIA GPU: CuPy sees none on this machine"


def _src_files() -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(REPO / "src") for f in files}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SRC] = _src_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a test left a file in src/ (a cache, a result, bytecode): tests write under
    pytest's tmp_path only. Skipped under mutation testing, whose copy of src/ is its own."""
    if _OWN_CACHE is not None and os.getpid() == _CACHE_OWNER:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
    before = session.config.stash.get(_SRC, None)
    if before is None or REPO.name == "mutants" or "MUTANT_UNDER_TEST" in os.environ:
        return
    new = sorted(_src_files() - before)
    if new:
        session.config.get_terminal_writer().line(
            f"error: the tests wrote into src/: {', '.join(os.path.relpath(f, REPO) for f in new[:5])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_SRC = pytest.StashKey[set]()


def slow_seconds(item: pytest.Item) -> float:
    """How long a ``slow``-marked test takes on one idle core (``@pytest.mark.slow(seconds=N)``; 10 when
    not given), 0 for the others."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("seconds", 10))


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (``-n``), unless another --dist is asked for: a module at a time to a worker, in the
    # order below (slow modules first), handed out as workers free up; module fixtures (a Ray cluster,
    # a data set) are then made once, and one worker's first batch never holds every slow test.
    if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load"):
        config.option.dist = "loadscope"
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _why_no_gpu() if any("gpu" in item.keywords for item in items) else None
    if why:
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # The modules that hold slow tests first, slowest first, each module's tests kept together and in
    # their order (module fixtures are set up once): the workers start on the long tests and end on
    # short ones, instead of one worker finishing the demo while the other waits.
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    module_cost: dict[str, float] = {}
    for item in items:
        module_cost[module(item)] = max(module_cost.get(module(item), 0.0), slow_seconds(item))
    items.sort(key=lambda it: -module_cost[module(it)])  # a stable sort: each module's order is kept


# -- the command line, in process -------------------------------------------------------------


@dataclass
class CliResult:
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """``cli("matrix", "info", path)``: run ``sparserl`` in this process exactly as the console
    entry point does (:func:`sparserl.cli.main`); returns exit status, stdout and stderr."""
    from sparserl.cli import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(rc, out, err)

    return run


def one_line_error(res: CliResult, *needles: str) -> str:
    """Assert ``res`` is a user error: exit status 2, one ``error:`` line on stderr, no
    traceback, every needle in it; returns the line."""
    lines = [ln for ln in res.err.splitlines() if ln.strip() and not ln.startswith(("INFO ", "WARNING ", "note: "))]
    assert res.rc == 2, (res.rc, res.err[-2000:])
    assert "Traceback" not in res.err and len(lines) == 1 and lines[0].startswith("error: "), res.err[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- tiny model fixtures for the model-side tests (need the train extra) -------------------------


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A BPE tokenizer trained on the rendered kernel library (600 tokens)."""
    pytest.importorskip("transformers")
    from sparserl.data.corpus import library_texts
    from sparserl.model.tokenizer import train_tokenizer

    return train_tokenizer(library_texts(), vocab_size=600)


def tiny_config_for(tokenizer):
    """A two-layer Qwen3 config of hidden size 64 (random weights, CPU-fast) on ``tokenizer``."""
    from sparserl.model.config import TinyModelConfig, hf_config

    shape = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, max_position_embeddings=2048)
    t = tokenizer
    return hf_config(len(t), shape, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id,
                     pad_token_id=t.pad_token_id)


@pytest.fixture(scope="session")
def tiny_hf_config(tiny_tokenizer):
    """The tiny model's config on the library-trained tokenizer."""
    return tiny_config_for(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer, tiny_hf_config) -> Path:
    """That model with random weights saved as a Hugging Face folder (model + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny_model")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_hf_config).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


# -- the real harness on a GPU, for the loop tests (search, RL, improve; gpu-marked) --------------


@pytest.fixture(scope="session")
def loop_evaluator(tmp_path_factory):
    """The harness the GPU loop tests run their loops through: cold regime only, 15 timed runs
    per kernel (a median stable to a few percent), its own cache folder. Shared by the search, RL
    and improve GPU tests so that its worker starts once."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    ev = Evaluator(HarnessConfig(regimes=("cold",), reward_regime="cold", cold_trials=15,
                                 cache_dir=str(tmp_path_factory.mktemp("loop_harness"))))
    yield ev
    ev.close()


@pytest.fixture(scope="session")
def fresh_evaluator(tmp_path_factory):
    """A second, independent harness (its own workers, compile cache, saved matrices and cuSPARSE
    times, nothing remembered between calls) that re-evaluates what a loop stored."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    ev = Evaluator(HarnessConfig(regimes=("cold",), reward_regime="cold", cold_trials=15, memo=0,
                                 cache_dir=str(tmp_path_factory.mktemp("fresh_harness"))))
    yield ev
    ev.close()
