"""``sparserl check-kernel`` from a new user's side: bad files and flags are one-line errors, on a
machine without a GPU it says that it falls back to compile-only, a failing verdict exits 1, and
--json and the report of a kernel that ran say what the result holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.devices import NO_GPU_NOTE, visible_gpus
from sparserl.harness.compile import find_nvcc
from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix
from tests.conftest import NEEDS_NVCC, one_line_error


@pytest.fixture
def mtx(tmp_path: Path) -> Path:
    p = tmp_path / "m.mtx"
    save_matrix(generate("banded", 500, seed=0), p)
    return p


def test_a_kernel_file_that_is_not_text_is_one_line(cli, mtx: Path, tmp_path: Path) -> None:
    noise = tmp_path / "b.cu"
    noise.write_bytes(bytes(range(128, 256)) * 24)  # 3000 bytes that are not UTF-8
    one_line_error(cli("check-kernel", noise, "-m", mtx), "b.cu", "not a text file", "UTF-8")


def test_k_is_refused_with_spmv(cli, mtx: Path, tmp_path: Path) -> None:
    k = tmp_path / "k.cu"
    k.write_text(variants("spmv", "CSR")[0].render())
    one_line_error(cli("check-kernel", k, "-m", mtx, "--k", "8"), "--k", "spmm", "leave --k out")
    one_line_error(cli("baseline", mtx, "--k", "8"), "--k", "spmm")


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_without_a_gpu_it_says_it_falls_back(cli, mtx: Path, tmp_path: Path) -> None:
    if visible_gpus():
        pytest.skip("a GPU is visible: no fallback to see")
    k = tmp_path / "k.cu"
    k.write_text(variants("spmv", "DIA")[0].render())
    res = cli("check-kernel", k, "-m", mtx)
    assert res.rc == 0 and f"note: {NO_GPU_NOTE}" in res.err and "COMPILED (not run)" in res.out
    res = cli("check-kernel", k, "-m", mtx, "--compile-only")  # asked for: no note
    assert res.rc == 0 and "note:" not in res.err


# -- the exit code, --json and the output of a run kernel ----------------------------------------


def test_a_kernel_refused_before_compiling_exits_1(cli, mtx: Path, tmp_path: Path) -> None:
    """A failing verdict is exit status 1 (2 is for bad input), here a static-check refusal, which
    needs no compiler. Mutation killed: check_kernel without its ``raise typer.Exit(1)``."""
    from tests.harness.adversarial.base import csr

    k = tmp_path / "k.cu"
    k.write_text(csr('if (row == 0) printf("%d", m);'))
    res = cli("check-kernel", k, "-m", mtx, "--compile-only")
    assert res.rc == 1 and "verdict: STATIC_CHECK" in res.out, (res.rc, res.out, res.err)
    res = cli("check-kernel", k, "-m", mtx, "--compile-only", "--json")
    assert res.rc == 1 and json.loads(res.out)["error_kind"] == "static_check"


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_json_and_exit_status_after_a_compile(cli, mtx: Path, tmp_path: Path) -> None:
    """--json prints the EvalResult: a kernel that compiles is no_gpu on a CPU, exit 0; one that does
    not compile is compile_error with the compiler's words in its log tail, exit 1."""
    good, bad = tmp_path / "good.cu", tmp_path / "bad.cu"
    good.write_text(variants("spmv", "CSR")[0].render())
    bad.write_text(variants("spmv", "CSR")[0].render().replace("y[row] = sum;", "y[row] = summ;"))  # undeclared
    res = cli("check-kernel", good, "-m", mtx, "--compile-only", "--json")
    d = json.loads(res.out)
    assert res.rc == 0 and (d["error_kind"], d["compiled"], d["correct"], d["format"]) == ("no_gpu", True, False, "CSR")
    assert d["matrix"] == "m.mtx" and d["op"] == "spmv" and d["k"] is None
    res = cli("check-kernel", bad, "-m", mtx, "--compile-only", "--json")
    d = json.loads(res.out)
    assert res.rc == 1 and (d["error_kind"], d["compiled"]) == ("compile_error", False) and "error" in d["log_tail"]
    res = cli("check-kernel", bad, "-m", mtx, "--compile-only")
    assert res.rc == 1 and "verdict: COMPILE_ERROR" in res.out


class EvaluatorDouble:
    """Stands in for the harness's Evaluator in the CLI: answers every kernel with the given result,
    so the output of a kernel that ran on a GPU is checked on a CPU (the GPU test runs it for real)."""

    result = None

    def __init__(self, cfg=None):
        self.cfg = cfg

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def register(self, A, name: str) -> str:
        return name

    def evaluate(self, text, ref, op, k=None):
        return EvaluatorDouble.result


def timed(kind: ErrorKind = ErrorKind.NONE, **kw) -> EvalResult:
    t = KernelTiming("cold", 10.0, 9.0, 11.0, 0.2)
    b = KernelTiming("cold", 25.0, 24.0, 26.0, 0.08)
    base = dict(op="spmv", k=None, matrix="m.mtx", error_kind=kind, compiled=True, correct=kind is ErrorKind.NONE,
                format="CSR", timings={"cold": t}, baseline={"cold": b}, baseline_alg="CUSPARSE_SPMV_CSR_ALG2",
                speedup=2.5, roofline=0.68, conversion_seconds=1.5e-3, break_even_calls=100.0, registers=32,
                smem_bytes=0)
    return EvalResult(**(base | kw))


@pytest.mark.parametrize("result, rc, lines", [
    (timed(), 0, ["verdict: CORRECT", "format: CSR; conversion 1.5 ms; registers 32; shared memory 0 B",
                  "cold  kernel 10.00 us (p10 9.00, p90 11.00)   cuSPARSE 25.00 us (p10 24.00, p90 26.00)   "
                  "speedup 2.50x",
                  "speedup vs cuSPARSE (cold): 2.50x (CUSPARSE_SPMV_CSR_ALG2); roofline fraction 0.68; conversion "
                  "pays off after 100 calls"]),
    (timed(speedup=0.8, break_even_calls=None), 0, ["conversion pays off after never (not faster)"]),
    (timed(ErrorKind.INCORRECT, message="input 'normal0': 3 rows out of tolerance", timings={}, speedup=None,
           log_tail="worker log"), 1,
     ["verdict: INCORRECT: input 'normal0': 3 rows out of tolerance", "worker log"]),
    (timed(ErrorKind.TIMEOUT, message="did not finish the verify phase", timings={}, speedup=None), 1,
     ["verdict: TIMEOUT: did not finish the verify phase"]),
    (timed(ErrorKind.SLOW, correct=True, speedup=0.25, break_even_calls=None), 0,  # correct: it passed every check
     ["verdict: CORRECT, SLOW (timing stopped early: hopeless against cuSPARSE)"]),
])
def test_what_a_run_kernel_prints(cli, mtx: Path, tmp_path: Path, monkeypatch, result, rc: int, lines) -> None:
    """The GPU path's report on a CPU: verdict, format line, per-regime times with cuSPARSE's and
    the ratio, the speedup line with roofline and break-even; a failing verdict exits 1 with the
    worker's log tail. Mutation killed: the Exit(1) removed, or given to a correct kernel."""
    import sparserl.cli.check as check_cli

    monkeypatch.setattr(check_cli, "Evaluator", EvaluatorDouble)
    monkeypatch.setattr(EvaluatorDouble, "result", result)
    k = tmp_path / "k.cu"
    k.write_text(variants("spmv", "CSR")[0].render())
    res = cli("check-kernel", k, "-m", mtx)
    assert res.rc == rc, res.out
    flat = " ".join(res.out.split())  # the console wraps long lines
    assert flat.startswith(f"m.mtx: 500 x 500, {mtx_nnz(mtx)} nonzeros; spmv verdict: ")
    for line in lines:
        assert " ".join(line.split()) in flat, (line, flat)
    res = cli("check-kernel", k, "-m", mtx, "--json")
    assert res.rc == rc and json.loads(res.out) == json.loads(json.dumps(result.to_dict(), default=str))


def mtx_nnz(path: Path) -> int:
    from sparserl.matrices import load_matrix

    return int(load_matrix(path).nnz)


@pytest.mark.gpu
def test_check_kernel_on_a_gpu(cli, mtx: Path, tmp_path: Path) -> None:
    """On a GPU: an honest kernel is CORRECT with a timed speedup line (exit 0), one that leaves a
    row unwritten is INCORRECT (exit 1), and --json says the same."""
    from tests.harness.adversarial.base import DOT, GOOD, csr

    good, bad = tmp_path / "good.cu", tmp_path / "bad.cu"
    good.write_text(GOOD)
    bad.write_text(csr(f"if (row >= m - 1) return; {DOT} y[row] = sum;"))
    res = cli("check-kernel", good, "-m", mtx)
    assert res.rc == 0 and "verdict: CORRECT" in res.out and "speedup vs cuSPARSE (cold): " in res.out
    res = cli("check-kernel", bad, "-m", mtx)
    assert res.rc == 1 and "verdict: INCORRECT" in res.out
    d = json.loads(cli("check-kernel", bad, "-m", mtx, "--json").out)
    assert d["error_kind"] == "incorrect" and d["compiled"] and not d["correct"]


@pytest.mark.gpu
@pytest.mark.parametrize("extra, what", [((), "spmv"), (("--op", "spmm", "--k", "8"), "spmm k=8")])
def test_baseline_on_a_gpu_times_cusparse_cold_and_warm(cli, mtx: Path, extra: tuple, what: str) -> None:
    """``sparserl baseline`` succeeds (exit 0) with the matrix's line, then one line per regime (cold,
    warm), each with a positive median between its p10 and p90 and the algorithm kept."""
    import re

    res = cli("baseline", mtx, *extra)
    assert res.rc == 0, res.err
    lines = res.out.splitlines()
    assert lines[0].startswith("m.mtx: 500 x 500, ") and f"; {what}; " in lines[0] and "GB/s" in lines[0]
    for regime in ("cold", "warm"):
        line = next(ln for ln in lines if ln.startswith(regime))
        med, p10, p90 = (float(v) for v in re.search(r"cuSPARSE ([\d.]+) us \(p10 ([\d.]+), p90 ([\d.]+)\)",
                                                      line).groups())
        assert 0 < p10 <= med <= p90, line
        assert " best " in line and "per algorithm (us): " in line


def test_the_kernel_and_matrix_arguments_say_what_is_wrong(cli, mtx: Path, tmp_path: Path) -> None:
    """A folder given as the kernel is not "no such file"; no matrix at all is not "give the matrix once"."""
    one_line_error(cli("check-kernel", tmp_path, "-m", mtx), str(tmp_path), "not a regular file")
    one_line_error(cli("check-kernel", tmp_path / "none.cu", "-m", mtx), "none.cu", "no such file")
    k = tmp_path / "k.cu"
    k.write_text(variants("spmv", "CSR")[0].render())
    one_line_error(cli("check-kernel", k), "no matrix given")
    one_line_error(cli("check-kernel", k, mtx, "-m", mtx), "given twice")
