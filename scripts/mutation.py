"""Mutation testing of the judges: the modules that decide correctness, rewards and the figures runs
are compared by, each mutated with mutmut against the tests that exercise it.

For each module the script copies ``src/``, ``tests/`` and ``pyproject.toml`` into its own folder
under ``--work`` (mutmut writes its mutants next to the code it is run on: nothing is written into
this checkout), adds a ``[tool.mutmut]`` table restricted to the module and its tests, runs
``mutmut run``, and collects every mutant's status and, for the survivors, the diff. Modules run
one after another (the CPU may be shared). A summary table is printed and ``--out`` gets the JSON.

    python scripts/mutation.py --out mutation.json                  # every module below
    python scripts/mutation.py --modules rewards --out rewards.json  # one of them

Needs the ``mutation`` extra (``pip install -e '.[mutation,dev,train]'``) and, for the rewards'
and the RL maths' tests, torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODULES: dict[str, tuple[str, list[str]]] = {
    # name: (module file, the tests that exercise it)
    "reference": ("src/sparserl/harness/reference.py",
                  ["tests/harness/test_reference.py", "tests/harness/test_verify_host.py"]),
    "verify": ("src/sparserl/harness/verify.py", ["tests/harness/test_verify_host.py"]),
    "rewards": ("src/sparserl/rewards.py", ["tests/test_rewards.py"]),
    "core": ("src/sparserl/rl/core.py", ["tests/rl/test_core.py", "tests/rl/test_core_edges.py",
                                         "tests/rl/test_advantage_signs.py"]),
    "speed": ("src/sparserl/harness/speed.py", ["tests/harness/test_speed.py", "tests/harness/test_verify_host.py",
                                                "tests/harness/test_batched_cpu.py"]),
    "best_known": ("src/sparserl/rl/best_known.py", ["tests/rl/test_best_known.py"]),
    "turns": ("src/sparserl/rl/turns.py", ["tests/rl/test_turns.py", "tests/rl/test_best_known.py"]),
    "buffers": ("src/sparserl/harness/buffers.py", ["tests/harness/test_verify_host.py"]),
    "contract": ("src/sparserl/kernels/contract.py",
                 ["tests/kernels/test_contract.py", "tests/kernels/test_contract_edges.py",
                  "tests/kernels/test_params.py", "tests/harness/test_extract.py",
                  "tests/harness/test_static_check.py"]),
    "export": ("src/sparserl/search/export.py",
               ["tests/search/test_export_trains.py", "tests/search/test_export_refinements.py",
                "tests/search/test_export_length.py", "tests/search/test_export_filter.py",
                "tests/search/test_export_edges.py",
                "tests/kernels/test_template_unseen.py"]),
    "source": ("src/sparserl/harness/source.py", ["tests/harness/test_source.py", "tests/harness/test_source_edges.py",
                                                  "tests/harness/test_static_check.py"]),
    "static_check": ("src/sparserl/harness/static_check.py",
                     ["tests/harness/test_static_check.py", "tests/harness/test_static_check_edges.py",
                      "tests/harness/test_source_edges.py",
                      "tests/kernels/test_template_kernels.py::test_every_render_passes_the_static_check"]),
    "ptx_check": ("src/sparserl/harness/ptx_check.py", ["tests/harness/test_ptx_check.py"]),
    "metrics": ("src/sparserl/eval/metrics.py",
                ["tests/eval/test_metrics.py", "tests/eval/test_compare.py::test_summarize",
                 "tests/eval/test_compare.py::test_a_matrix_without_a_correct_kernel_never_beats_one_with_a_slow_kernel",
                 "tests/improve/test_improve.py::test_validation_figures_and_the_keep_rule"]),
}
GPU_ONLY: dict[str, set[str]] = {
    # functions that run only with CuPy on a GPU (the GPU tests judge them); their mutants have no CPU test
    "reference": {"cuda_check_kernel"},
    "buffers": {"_refresh_kernel"},
}
GPU_ONLY_LINES: dict[str, list[str]] = {
    # lines, in functions a CPU runs too, that only a GPU run reaches or reads (matched on the mutated line)
    "reference": [r'type\(a\)\.__module__\.startswith\("cupy"\)', r'return a\.get\(\) if hasattr\(a, "get"\)',
                  r"else cuda_check_kernel\("],
    # the CUDA refresh's launch (grid, arguments, y's count) and the default to CuPy when no xp is given; the GPU
    # test test_the_host_refresh_is_what_the_gpu_writes holds that launch to the host path bit for bit
    "buffers": [r"grid = max\(1, min\(1024", r"_refresh_kernel\(\)\(\(grid,\)", r"ny = self\.ny if poison else 0",
                r"cp = xp if xp is not None else cupy_module\(\)"],
}
STATUS = re.compile(r"^\s*(\S+): (\w[\w ]*)$")


def settings(work: Path, module: str, tests: list[str]) -> None:
    """The copy's pyproject.toml: this checkout's, plus mutmut's settings for one module (its time-outs
    are checked again by :func:`recheck`)."""
    table = ["", "[tool.mutmut]", 'source_paths = ["src/sparserl"]', f"only_mutate = [{json.dumps(module)}]",
             f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
             'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x", "--hypothesis-profile=mutation"]',
             # a fork server free of torch's threads forks the test processes (forked from a process that
             # had run torch, children hung and were counted as time-outs)
             'process_isolation = "forkserver"',
             # tests that read the docs (the contract's generated page) run in mutmut's copy too
             'also_copy = ["docs"]']
    (work / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text() + "\n".join(table) + "\n")


def prepare(work: Path, module: str, tests: list[str]) -> None:
    """A copy of the project for one module, with its mutmut settings."""
    if work.exists():
        shutil.rmtree(work)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "mutants")
    for part in ("src", "tests", "docs"):
        shutil.copytree(REPO / part, work / part, ignore=ignore)
    settings(work, module, tests)


def mutmut(work: Path, *args: str, timeout: float = 7200) -> subprocess.CompletedProcess:
    """``python -m mutmut ARGS`` in ``work`` (the copy), its output captured."""
    # mutmut puts its mutants first on sys.path itself; one math thread per test process (forked
    # children that each start a thread pool on a shared CPU were read as hangs)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)


RECHECK_MEMORY = 8 << 30
"""Address space a rechecked mutant may take (bytes): a mutant that grows without bound (a macro
expansion with its limit removed) fails there instead of taking the machine's memory."""


def _memory_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (RECHECK_MEMORY, RECHECK_MEMORY))


def recheck(work: Path, mutant: str, tests: list[str], limit: float = 600) -> str:
    """A mutant mutmut timed out, run once more under plain pytest (stop at the first failure, a wall
    limit of ``limit`` s, an address-space limit of ``RECHECK_MEMORY``): "killed after a time-out" when the
    tests fail, hang or run out of memory, else "survived".
    mutmut's limits, derived from the clean run's time, misread a loaded CPU or a hypothesis search
    shrinking a failure as a hang."""
    env = dict(os.environ, MUTANT_UNDER_TEST=mutant, PYTHONPATH="src", PYTHONDONTWRITEBYTECODE="1")
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            "--hypothesis-profile=mutation", *tests],
                           cwd=work / "mutants", env=env, capture_output=True, text=True, timeout=limit,
                           preexec_fn=_memory_limit)
    except subprocess.TimeoutExpired:
        return "killed after a time-out"
    return "survived" if p.returncode == 0 else "killed after a time-out"


def statuses_of(work: Path) -> dict[str, str]:
    listing = mutmut(work, "results", "--all", "true")
    if listing.returncode != 0:  # older mutmut: no --all, survivors only
        listing = mutmut(work, "results")
    return {m.group(1): m.group(2) for line in listing.stdout.splitlines() if (m := STATUS.match(line))}


def run_module(name: str, work_root: Path, rerun: bool = False, children: int = 2,
               recheck_limit: float = 600) -> dict:
    """Mutate one module (``rerun``: keep the earlier run's mutants and results, take this checkout's
    tests, and test again only the mutants they did not kill)."""
    module, tests = MODULES[name]
    work = work_root / name
    names: list[str] = []
    if rerun and (work / "mutants").is_dir():
        shutil.rmtree(work / "tests")
        shutil.copytree(REPO / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        settings(work, module, tests)
        names = sorted(m for m, st in statuses_of(work).items() if st not in ("killed", "timeout"))
    else:
        prepare(work, module, tests)
    t0 = time.perf_counter()
    run = mutmut(work, "run", "--max-children", str(children), *names) if names or not rerun else None
    seconds = time.perf_counter() - t0
    if run is not None and run.returncode != 0:
        raise SystemExit(f"error: mutmut run on {module} failed (exit {run.returncode}):\n{run.stdout[-3000:]}\n"
                         f"{run.stderr[-3000:]}")
    statuses = statuses_of(work)
    for m in sorted(x for x, st in statuses.items() if st == "timeout"):
        statuses[m] = recheck(work, m, tests, recheck_limit)
    counts = {"total": len(statuses)} | {k: sum(st == k for st in statuses.values())
                                         for k in ("killed", "survived", "timeout", "no tests", "suspicious")}
    counts["killed after a time-out"] = sum(st == "killed after a time-out" for st in statuses.values())
    left = {m: st for m, st in statuses.items() if st in ("survived", "no tests", "timeout", "suspicious")}
    diffs = _diffs(work, sorted(left))
    survivors = [{"mutant": m, "status": st, "function": _function(m),
                  "diff": [ln for ln in diffs.get(m, "").splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]}
                 for m, st in sorted(left.items())]
    total = counts["total"]
    for x in survivors:
        removed = [ln[1:] for ln in x["diff"] if ln.startswith("-")]
        x["gpu_only"] = (x["status"] == "no tests" and x["function"] in GPU_ONLY.get(name, ())) or any(
            re.search(pat, ln) for pat in GPU_ONLY_LINES.get(name, ()) for ln in removed)
    gpu_only = sum(x["gpu_only"] for x in survivors)
    cpu = total - gpu_only
    detected = counts["killed"] + counts["killed after a time-out"]
    return {"module": module, "tests": tests, "seconds": round(seconds, 1), "rerun": bool(names), "counts": counts,
            "detected": detected, "score": detected / total if total else None, "gpu_only_mutants": gpu_only,
            "score_cpu": detected / cpu if cpu else None,
            "gpu_only_functions": sorted(GPU_ONLY.get(name, ())), "survivors": survivors}


_DIFFS = """
import json, sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
out = {}
for name in json.loads(sys.stdin.read()):
    out[name] = get_diff_for_mutant(name, path=find_mutant(name).path)
print(json.dumps(out))
"""


def _diffs(work: Path, names: list[str]) -> dict[str, str]:
    """Each mutant's diff, from one process (``mutmut show`` costs a start-up per mutant)."""
    if not names:
        return {}
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    p = subprocess.run([sys.executable, "-c", _DIFFS], cwd=work, env=env, input=json.dumps(names),
                       capture_output=True, text=True, timeout=3600)
    return json.loads(p.stdout) if p.returncode == 0 else {}


def _function(mutant: str) -> str:
    """The mutated function of a mutmut name (``pkg.mod.x_func__mutmut_3``, methods ``xǁClassǁname``)."""
    tail = mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    return tail.removeprefix("x_").replace("xǁ", "").replace("ǁ", ".")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", default=",".join(MODULES), help=f"comma-separated, of: {', '.join(MODULES)}")
    ap.add_argument("--work", help="folder for the copies and mutants (default: a temporary folder, removed after)")
    ap.add_argument("--out", required=True, help="JSON report")
    ap.add_argument("--rerun", action="store_true", help="with --work of an earlier run: test only the mutants its "
                    "tests did not kill, with this checkout's tests (after adding tests; the module unchanged)")
    ap.add_argument("--max-children", type=int, default=2,
                    help="test processes at once (mutmut's default is every core; the CPU may be shared)")
    ap.add_argument("--recheck-limit", type=float, default=600,
                    help="seconds a timed-out mutant's second run may take before it counts as killed (default 600; "
                    "a module whose tests take seconds can use far less: each hanging mutant costs this much)")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = sorted(set(names) - set(MODULES))
    if unknown:
        print(f"error: unknown modules {unknown}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    if importlib_missing("mutmut"):
        print("error: mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    own = args.work is None
    work_root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sparserl-mutation-"))
    report = {"tool": "mutmut", "modules": {}}
    try:
        for name in names:
            print(f"{name}: mutating {MODULES[name][0]} against {' '.join(MODULES[name][1])}", flush=True)
            res = run_module(name, work_root, rerun=args.rerun, children=args.max_children,
                             recheck_limit=args.recheck_limit)
            report["modules"][name] = res
            c = res["counts"]
            print(f"{name}: {res['detected']} of {c['total']} killed ({res['score']:.1%}; {res['score_cpu']:.1%} of "
                  f"the {c['total'] - res['gpu_only_mutants']} outside GPU-only code), {c['survived']} survived, "
                  f"{c['killed after a time-out']} killed after a time-out, {c['no tests']} without tests, "
                  f"{res['seconds']:.0f} s", flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    finally:
        if own:
            shutil.rmtree(work_root, ignore_errors=True)
    mods = report["modules"].values()
    killed = sum(r["detected"] for r in mods)
    total = sum(r["counts"]["total"] for r in mods)
    gpu = sum(r["gpu_only_mutants"] for r in mods)
    report["total"] = {"detected": killed, "mutants": total, "gpu_only_mutants": gpu,
                       "score": killed / total if total else None,
                       "score_cpu": killed / (total - gpu) if total > gpu else None}
    Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"\n{'module':<10} {'detected':>8} {'mutants':>8} {'GPU-only':>9} {'score':>7} {'CPU score':>10} {'seconds':>8}")
    for name, r in report["modules"].items():
        print(f"{name:<10} {r['detected']:>8} {r['counts']['total']:>8} {r['gpu_only_mutants']:>9} "
              f"{r['score']:>7.1%} {r['score_cpu']:>10.1%} {r['seconds']:>8.0f}")
    t = report["total"]
    print(f"{'all':<10} {killed:>8} {total:>8} {gpu:>9} {t['score']:>7.1%} {t['score_cpu']:>10.1%}")
    return 0


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


if __name__ == "__main__":
    sys.exit(main())
