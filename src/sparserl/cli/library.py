"""``sparserl library``: list, render and compile the reference kernel library."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import FORMAT_NAMES, split_completion
from sparserl.kernels.library import get_variant, variants
from sparserl.progress import progress

app = typer.Typer(
    help="The reference kernel library: parameterised SpMV/SpMM kernels for every format, "
    "rendered as completions in the kernel contract (FORMAT/LAUNCH header + device code).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
console = Console()


def _select(op: str | None, fmt: str | None):
    if op is not None and op not in ("spmv", "spmm"):
        raise SparseRLError(f"--op must be spmv or spmm, got {op!r}")
    if fmt is not None and fmt.upper() not in FORMAT_NAMES:
        raise SparseRLError(f"--format must be one of {', '.join(FORMAT_NAMES)}, got {fmt!r}")
    return variants(op, fmt)


@app.command("list")
def list_cmd(
    op: str = typer.Option(None, "--op", help="spmv or spmm [default: both]"),
    fmt: str = typer.Option(None, "--format", help="CSR, COO, ELL, SELL, DIA, BSR or HYB [default: every format]"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """List library variants (id, strategy, what it is good for)."""
    vs = _select(op, fmt)
    if as_json:
        typer.echo(json.dumps([{"id": v.id, "op": v.op.value, "format": v.format, "strategy": v.strategy,
                                "format_params": dict(v.format_params), "tunables": dict(v.tunables),
                                "k_multiple": v.k_multiple, "atomic": v.atomic, "doc": v.doc} for v in vs], indent=1))
        return
    table = Table(title=f"{len(vs)} library variants")
    table.add_column("id", no_wrap=True, min_width=max((len(v.id) for v in vs), default=2))  # whole: render takes it
    table.add_column("atomics")
    table.add_column("what it does", ratio=1)
    for v in vs:
        table.add_row(v.id, "yes" if v.atomic else "", v.doc)
    out = console if console.is_terminal else Console(width=max(console.width, 200))  # piped: no ids cut
    out.print(table)
    counts = Counter((v.op.value, v.format) for v in vs)
    console.print(", ".join(f"{o}/{f}: {c}" for (o, f), c in sorted(counts.items())))


@app.command()
def render(variant_id: str = typer.Argument(..., help="a variant id from 'sparserl library list'")) -> None:
    """Print one variant as a completion (header lines + CUDA device code)."""
    typer.echo(get_variant(variant_id).render(), nl=False)


_PROBE = 'extern "C" __global__ void probe(float* y) { y[threadIdx.x] = 1.f; }'


def check_arch(options, cache_dir) -> None:
    """Refuse an architecture the compiler cannot build for, before building anything: one
    trivial kernel is compiled first (a failure of that kind is never cached)."""
    from sparserl.harness.compile import compile_source, find_nvcc

    probe = compile_source(_PROBE, options, cache_dir)
    if probe.ok:
        return
    reason = next((" ".join(ln.split()) for ln in probe.log.splitlines() if ln.strip()), probe.error_kind or "failed")
    known = ""
    if nvcc := find_nvcc(options.nvcc):
        import subprocess

        try:
            codes = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=30).stdout.split()
            known = f"; this CUDA toolkit builds for {', '.join(c for c in codes if c.startswith('sm_'))}"
        except (OSError, subprocess.TimeoutExpired):
            pass
    raise SparseRLError(f"--arch {options.arch}: the compiler cannot build for it ({reason}){known}")


@app.command()
def compile(
    op: str = typer.Option(None, "--op", help="spmv or spmm [default: both]"),
    fmt: str = typer.Option(None, "--format", help="only this format [default: every format]"),
    arch: str = typer.Option("sm_90", help="target architecture (sm_90 = H100/H200)"),
    backend: str = typer.Option("auto", help="auto (NVRTC when its library loads, else nvcc), nvrtc or nvcc"),
    jobs: int = typer.Option(0, help="parallel compiles (0 = one per CPU core)"),
    cache_dir: Path = typer.Option(None, help="compile cache [default: $SPARSERL_CACHE_DIR or ~/.cache/sparserl]"),
) -> None:
    """Compile every selected variant with NVRTC or nvcc (no GPU needed); report times and cache hits."""
    from sparserl.harness.compile import CompileOptions, available_backend, compile_many

    if jobs < 0:
        raise SparseRLError(f"--jobs must be >= 0 (0 = one per CPU core), got {jobs}")
    try:
        options = CompileOptions(arch=arch, backend=backend)
    except ValueError as exc:
        raise SparseRLError(str(exc)) from None
    used = available_backend(options)
    if used is None:
        raise SparseRLError(f"no compiler for backend {backend!r}: install the CUDA toolkit (nvcc) or the "
                            "nvidia-cuda-nvrtc wheel, or set CUDA_HOME / SPARSERL_NVRTC")
    vs = _select(op, fmt)
    check_arch(options, cache_dir)
    codes = [split_completion(v.render(), v.op)[1] for v in vs]
    t0 = time.perf_counter()
    with progress(console=console) as bar:
        task = bar.add_task("compiling", total=len(codes))
        results = compile_many(codes, options, cache_dir, jobs or None,
                               on_done=lambda i, r: bar.advance(task))
    wall = time.perf_counter() - t0
    failed = [(v, r) for v, r in zip(vs, results) if not r.ok]
    hits = sum(r.cached for r in results)
    builds = [r.build_seconds for r in results]
    console.print(
        f"{len(results)} variants for {arch} with {used} in {wall:.1f} s wall: {hits} cache hits, "
        f"{len(results) - hits} built; build time per variant median {statistics.median(builds):.2f} s, "
        f"max {max(builds):.2f} s; {len(failed)} failed"
    )
    by_log: dict[str, list[str]] = {}  # one copy of each distinct compiler output
    for v, r in failed:
        by_log.setdefault(f"{r.error_kind}\n{r.log[-1500:]}", []).append(v.id)
    for text, ids in by_log.items():
        console.print(f"[red]FAILED[/red] {', '.join(ids)}: {escape(text)}")
    if failed:
        raise typer.Exit(1)
