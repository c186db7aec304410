"""``sparserl check-kernel`` and ``sparserl baseline``: the harness from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from sparserl.checks import check_op
from sparserl.devices import compile_only_or_fallback
from sparserl.errors import SparseRLError
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import Op
from sparserl.matrices import load_matrix

console = Console(soft_wrap=True)  # piped or captured: one line per result, never cut at 80 columns


def _op(op: str, k: int | None) -> tuple[Op, int | None]:
    check_op(op, k)
    return Op(op), k


def read_kernel(path: Path) -> str:
    """A kernel file's text; a file that is not UTF-8 text is a one-line error."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SparseRLError(f"{path}: not a text file (byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
                            "UTF-8); a kernel file is CUDA source text with FORMAT/LAUNCH header lines") from None


def _fmt_us(t) -> str:
    return f"{t.median_us:.2f} us (p10 {t.p10_us:.2f}, p90 {t.p90_us:.2f})"


def check_kernel(
    kernel: Path = typer.Argument(..., help="completion file: FORMAT/LAUNCH header + CUDA"),
    matrix: Path = typer.Argument(None, help=".mtx, .mtx.gz or .npz", show_default=False),
    matrix_option: Path = typer.Option(None, "--matrix", "-m", help="the matrix, as an option (the positional "
                                                                     "MATRIX is the same) [default: none]"),
    op: str = typer.Option("spmv", help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
    regime: str = typer.Option("cold", help="regime for speedup/roofline: cold (L2 flushed) or warm"),
    compile_only: bool = typer.Option(False, "--compile-only",
                                      help="compile and check statically, do not run (the default without a GPU)"),
    as_json: bool = typer.Option(False, "--json", help="print the EvalResult as JSON"),
) -> None:
    """Check a kernel on a matrix: extract, static checks, compile, then (on a GPU) verify and time it
    against cuSPARSE. Exit status 0 when the kernel passes, 1 when it does not (the verdict says why)."""
    if matrix is None and matrix_option is None:
        raise SparseRLError("no matrix given: sparserl check-kernel KERNEL MATRIX")
    if matrix is not None and matrix_option is not None:
        raise SparseRLError("the matrix is given twice (as MATRIX and --matrix): give it once")
    matrix = matrix or matrix_option
    o, kk = _op(op, k)
    if regime not in ("cold", "warm"):
        raise SparseRLError("--regime must be cold or warm")
    if not kernel.exists():
        raise SparseRLError(f"{kernel}: no such file")
    if not kernel.is_file():
        raise SparseRLError(f"{kernel}: not a regular file (a kernel file is CUDA source text)")
    text = read_kernel(kernel)
    A = load_matrix(matrix)
    compile_only, note = compile_only_or_fallback(compile_only)
    if note:
        typer.echo(f"note: {note}", err=True)
    with Evaluator(HarnessConfig(compile_only=compile_only, reward_regime=regime)) as ev:
        res = ev.evaluate(text, ev.register(A, matrix.name), o, kk)
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=1, default=str))
    else:
        verdict = {ErrorKind.NONE: "[green]CORRECT[/green]", ErrorKind.NO_GPU: "[yellow]COMPILED (not run)[/yellow]",
                   ErrorKind.SLOW: "[yellow]CORRECT, SLOW (timing stopped early: hopeless against cuSPARSE)[/yellow]"}
        console.print(f"{escape(matrix.name)}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros; {op}"
                      f"{f' k={kk}' if kk else ''}")
        console.print(f"verdict: {verdict.get(res.error_kind, '[red]' + res.error_kind.value.upper() + '[/red]')}"
                      f"{': ' + escape(res.message) if res.message else ''}")
        if res.format:
            console.print(f"format: {res.format}"
                          + (f"; conversion {res.conversion_seconds * 1e3:.1f} ms" if res.conversion_seconds else "")
                          + (f"; registers {res.registers}" if res.registers is not None else "")
                          + (f"; shared memory {res.smem_bytes} B" if res.smem_bytes is not None else ""))
        for r, t in res.timings.items():
            b = res.baseline.get(r)
            console.print(f"{r:5} kernel {_fmt_us(t)}   cuSPARSE {_fmt_us(b) if b else '-'}"
                          + (f"   speedup {b.median_us / t.median_us:.2f}x" if b else ""))
        if res.speedup is not None:
            be = f"{res.break_even_calls:.0f} calls" if res.break_even_calls is not None else "never (not faster)"
            console.print(f"speedup vs cuSPARSE ({res.regime}): {res.speedup:.2f}x ({res.baseline_alg}); "
                          f"roofline fraction {res.roofline:.2f}; conversion pays off after {be}")
        if res.log_tail and not res.ok:  # as the compiler wrote it: no markup, no wrap
            console.print(res.log_tail[-1500:], markup=False, highlight=False, soft_wrap=True)
    if not (res.ok or res.error_kind is ErrorKind.NO_GPU):  # slow is correct: it passed every check
        raise typer.Exit(1)


def baseline(
    matrix: Path = typer.Argument(..., help=".mtx, .mtx.gz or .npz"),
    op: str = typer.Option("spmv", help="spmv or spmm"),
    k: int = typer.Option(None, help="SpMM: columns of X (required with --op spmm, refused with spmv) "
                                     "[default: none]"),
) -> None:
    """Time cuSPARSE (every CSR algorithm, best kept) on a matrix, cold and warm L2 (needs a GPU)."""
    o, kk = _op(op, k)
    A = load_matrix(matrix)
    with Evaluator() as ev:
        if not ev.has_gpu:
            raise SparseRLError("no CUDA GPU visible: cuSPARSE needs a GPU (run this on the GPU machine)")
        res = ev.baseline(ev.register(A, matrix.name), o, kk)
    if "baselines" not in res:
        raise SparseRLError(f"baseline failed: {res.get('message')}")
    console.print(f"{escape(matrix.name)}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros; {op}{f' k={kk}' if kk else ''}; "
                  f"{res['gpu']}, copy bandwidth {res['bandwidth_Bps'] / 1e9:.0f} GB/s")
    for r, b in res["baselines"].items():
        per = ", ".join(f"{a.removeprefix('CUSPARSE_')} {t:.2f}" for a, t in b["per_alg_us"].items())
        console.print(f"{r:5} cuSPARSE {b['median_us']:.2f} us (p10 {b['p10_us']:.2f}, p90 {b['p90_us']:.2f}) "
                      f"best {b['alg']}; roofline fraction {b['roofline']:.2f}; per algorithm (us): {per}")
