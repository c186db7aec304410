"""The farm's cost and scaling: Ray against the in-process evaluator.

GPU part (needs a GPU, CuPy and Ray): the same candidates (the library's kernels for one matrix,
every format that takes it, repeated to ``--candidates``; compiles cached by a first pass, the memo
off) through the in-process evaluator on one GPU, then through the farm on a local Ray instance with
one GPU and with every visible GPU. Prints evaluations/s, the farm's overhead per candidate on one
GPU against the in-process evaluator (target: at most 10%), the N-GPU scaling (target: at least
0.9 x N), and the mean time per candidate of each profile step on both, the farm's own among them
(``farm_compile_hop``, ``farm_slot_wait``, ``farm_actor_own``, ``farm_actor_wait``: where the
overhead goes).

CPU part (``--cpu-scaling``, no GPU needed): compile-only candidates, each compiled for real (a
fresh compile cache per measurement; the library's kernels cycled, each copy made distinct by a
comment), on a local multi-node Ray cluster (a head without CPUs and 1, then 2 worker nodes of one
CPU each; ``--nodes 1,2,4,8``: more counts): compiles/s per node count, each after an untimed
warm-up of other distinct texts that starts every node's worker process, beside the in-process
evaluator's compile-only rate with 1 and 2 compile threads, and beside as many plain
processes as nodes (each a compile-only evaluator, fed by a process pool): the machine's own scaling, what
the same compiles reach without Ray.

    python benchmarks/farm_bench.py --out $OUT/farm_bench.json                 # GPU part
    python benchmarks/farm_bench.py --cpu-scaling --out $OUT/farm_cpu.json     # CPU part
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("farm_bench")


def library_texts(A) -> list[str]:
    """The library's SpMV kernels whose format takes ``A``, each once."""
    from sparserl.formats import accepts
    from sparserl.kernels.contract import FORMAT_NAMES as FORMATS
    from sparserl.kernels.library import variants

    texts = []
    for fmt in FORMATS:
        vs = variants("spmv", fmt, None)
        if vs and accepts(A, fmt, dict(vs[0].format_params)):
            texts += [v.render() for v in vs if accepts(A, fmt, dict(v.format_params))]
    if not texts:
        raise SystemExit("no library kernel takes this matrix")
    return texts


def candidates(A, n: int) -> list[str]:
    """:func:`library_texts` cycled to ``n`` texts."""
    texts = library_texts(A)
    return [texts[i % len(texts)] for i in range(n)]


def distinct(texts: list[str], n: int, tag: str) -> list[str]:
    """``n`` texts cycled from ``texts``, each made distinct by a trailing comment (so each is a
    compile of its own, not a cache hit)."""
    return [f"{texts[i % len(texts)]}\n// {tag} {i}\n" for i in range(n)]


def passed(n: int, seconds: float, verdicts: dict[str, int]) -> dict:
    """What a timed pass of ``n`` candidates reports."""
    return {"n": n, "seconds": seconds, "per_s": n / seconds, "per_candidate_ms": 1e3 * seconds / n,
            "verdicts": verdicts}


def rate(ev, A, texts: list[str], parallel: int, warm: bool = True, warmup: list[str] = ()) -> dict:
    """Evaluations/s of ``texts`` through ``ev`` with ``parallel`` in flight (``warm``: after a first
    pass that caches the compiles and warms the workers; else every compile is real; ``warmup``:
    other texts evaluated first, untimed, so every worker process has started)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    ref = ev.register(A, "bench")
    if warm:
        ev.evaluate_many([(t, ref, "spmv", None) for t in sorted(set(texts))])
    if warmup:
        ev.evaluate_many([(t, ref, "spmv", None) for t in warmup])
    t0 = time.perf_counter()
    pending, i, kinds, steps = set(), 0, {}, {}
    while i < len(texts) or pending:
        while i < len(texts) and len(pending) < parallel:
            pending.add(ev.submit(texts[i], ref, "spmv", None))
            i += 1
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for f in done:
            r = f.result()
            kinds[r.error_kind.value] = kinds.get(r.error_kind.value, 0) + 1
            for step, sec in (r.profile.seconds if r.profile else {}).items():
                steps[step] = steps.get(step, 0.0) + sec
    return passed(len(texts), time.perf_counter() - t0, kinds) | {
        "mean_step_ms": {k: 1e3 * v / len(texts) for k, v in sorted(steps.items())}}


def gpu_part(args) -> dict:
    import ray

    from sparserl.devices import visible_gpus
    from sparserl.farm.ray_evaluator import RayEvaluator
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    A = load(args)
    texts = candidates(A, args.candidates)
    gpus = visible_gpus()
    if not gpus:
        raise SystemExit("no GPU visible: run the CPU part with --cpu-scaling")
    cfg = HarnessConfig(regimes=("cold",), memo=0, cache_dir=args.cache)
    out = {"matrix": args.matrix or f"banded {args.rows}", "gpus": len(gpus), "candidates": len(texts),
           "in_flight_per_gpu": args.parallel, "repeats": args.repeats}
    runs: dict[str, list[dict]] = {"in_process_1gpu": [], "farm_1gpu": []}
    with Evaluator(HarnessConfig(**{**cfg.__dict__, "devices": (gpus[0],)})) as local:
        ray.init(num_gpus=1, num_cpus=args.cpus, logging_level=logging.WARNING, include_dashboard=False)
        try:
            with RayEvaluator(cfg, "auto") as farm:
                for i in range(args.repeats):  # side by side, in alternating order (drift falls on both)
                    pair = [("in_process_1gpu", local), ("farm_1gpu", farm)]
                    for name, ev in (pair if i % 2 == 0 else pair[::-1]):
                        runs[name].append(rate(ev, A, texts, args.parallel, warm=i == 0))
                        log.info("repeat %d, %s: %.1f evaluations/s", i + 1, name, runs[name][-1]["per_s"])
        finally:
            ray.shutdown()
    for name, rs in runs.items():  # the median repeat stands for each; every repeat's figure is kept
        out[name] = dict(sorted(rs, key=lambda r: r["per_candidate_ms"])[len(rs) // 2],
                         per_candidate_ms_repeats=[r["per_candidate_ms"] for r in rs])
    one, ref = out["farm_1gpu"], out["in_process_1gpu"]
    out["overhead_per_candidate"] = one["per_candidate_ms"] / ref["per_candidate_ms"] - 1.0
    out["overhead_per_repeat"] = [f / i - 1.0 for f, i in zip(one["per_candidate_ms_repeats"],
                                                                ref["per_candidate_ms_repeats"])]
    if len(gpus) > 1:
        n = len(gpus)
        ray.init(num_gpus=n, num_cpus=args.cpus, logging_level=logging.WARNING, include_dashboard=False)
        try:
            with RayEvaluator(cfg, "auto") as ev:
                out[f"farm_{n}gpu"] = rate(ev, A, texts, args.parallel * n)
        finally:
            ray.shutdown()
        log.info("farm, %d GPUs: %.1f evaluations/s", n, out[f"farm_{n}gpu"]["per_s"])
        out["scaling"] = out[f"farm_{n}gpu"]["per_s"] / one["per_s"]
        out["scaling_target"] = 0.9 * n
    return out


_PROCESS: dict = {}


def _process_init(cache: str, matrix: str | None, rows: int) -> None:
    """A process of the machine's own scaling measurement: its compile-only evaluator and the matrix."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    ev = Evaluator(HarnessConfig(compile_only=True, memo=0, cache_dir=cache, compile_jobs=1))
    _PROCESS.update(ev=ev, ref=ev.register(load(argparse.Namespace(matrix=matrix, rows=rows)), "bench"))


def _process_compile(text: str) -> str:
    return _PROCESS["ev"].evaluate(text, _PROCESS["ref"], "spmv").error_kind.value


def process_rate(args, texts: list[str], warmup: list[str], processes: int, cache: str) -> dict:
    """Compiles/s of ``texts`` by ``processes`` plain processes of this machine, each with its own
    compile-only evaluator (what N Ray nodes of one CPU do, without Ray), after ``warmup``."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn"), initializer=_process_init,
                             initargs=(cache, args.matrix, args.rows)) as pool:
        list(pool.map(_process_compile, warmup))
        t0 = time.perf_counter()
        kinds: dict[str, int] = {}
        for kind in pool.map(_process_compile, texts):
            kinds[kind] = kinds.get(kind, 0) + 1
        s = time.perf_counter() - t0
    return passed(len(texts), s, kinds)


def cpu_part(args) -> dict:
    from sparserl.farm.local_cluster import LocalCluster
    from sparserl.farm.ray_evaluator import RayEvaluator
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    A = load(args)
    library = list(dict.fromkeys(library_texts(A)))  # distinct texts
    texts = distinct(library, args.candidates, "candidate")

    def cfg(tag: str, **kw) -> HarnessConfig:  # a cold compile cache per measurement
        return HarnessConfig(compile_only=True, memo=0, cache_dir=str(Path(args.cache) / tag), **kw)

    out = {"matrix": args.matrix or f"banded {args.rows}", "candidates": len(texts), "mode": "compile-only, cold"}
    counts = sorted({int(n) for n in args.nodes.split(",")} | {1})
    for threads in (1, 2):
        with Evaluator(cfg(f"local{threads}", compile_jobs=threads)) as ev:
            out[f"in_process_{threads}threads"] = rate(ev, A, texts, 2 * threads, warm=False,
                                                       warmup=distinct(library, 2 * threads, f"warm{threads}"))
        log.info("in process, %d compile threads: %.1f compiles/s", threads, out[f"in_process_{threads}threads"]["per_s"])
    for threads in counts:  # the machine's own scaling: the same compiles in N plain processes
        out[f"processes_{threads}"] = process_rate(args, texts, distinct(library, 2 * threads, f"pwarm{threads}"),
                                                   threads, str(Path(args.cache) / f"proc{threads}"))
        log.info("%d plain processes: %.1f compiles/s", threads, out[f"processes_{threads}"]["per_s"])
    with LocalCluster.start(workers=1, cpus_per_worker=1, head_cpus=0) as c:
        for nodes in counts:
            while len(c.nodes) - 1 < nodes:  # c.nodes: the head, then the worker nodes
                c.add_worker(1)
            with RayEvaluator(cfg(f"farm{nodes}"), c.address) as ev:
                out[f"farm_{nodes}nodes"] = rate(ev, A, texts, 2 * nodes, warm=False,
                                                 warmup=distinct(library, 4 * nodes, f"warm{nodes}"))
            log.info("farm, %d worker nodes: %.1f compiles/s", nodes, out[f"farm_{nodes}nodes"]["per_s"])
    for nodes in counts[1:]:
        out[f"scaling_{nodes}_nodes"] = out[f"farm_{nodes}nodes"]["per_s"] / out["farm_1nodes"]["per_s"]
        out[f"scaling_{nodes}_nodes_target"] = 0.9 * nodes
        out[f"machine_scaling_{nodes}_processes"] = out[f"processes_{nodes}"]["per_s"] / out["processes_1"]["per_s"]
        out[f"farm_over_machine_{nodes}"] = out[f"farm_{nodes}nodes"]["per_s"] / out[f"processes_{nodes}"]["per_s"]
    out["farm_vs_in_process_1"] = out["farm_1nodes"]["per_s"] / out["in_process_1threads"]["per_s"]
    return out


def load(args):
    from sparserl.matrices import generate, load_matrix

    return load_matrix(args.matrix) if args.matrix else generate("banded", args.rows, seed=0, bands=9)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", help="a .mtx/.mtx.gz/.npz file [default: a generated banded matrix]")
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the generated matrix")
    ap.add_argument("--candidates", type=int, default=96, help="candidates per measurement")
    ap.add_argument("--parallel", type=int, default=4, help="GPU part: candidates in flight per GPU")
    ap.add_argument("--repeats", type=int, default=3,
                    help="GPU part: timed passes of each evaluator, alternating (the median is reported)")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs the local Ray instance may use (GPU part)")
    ap.add_argument("--cpu-scaling", action="store_true", help="the CPU part: compile-only on a multi-node cluster")
    ap.add_argument("--nodes", default="1,2", help="CPU part: worker node counts (one CPU each), e.g. 1,2,4,8")
    ap.add_argument("--cache", default=None, help="harness cache [default: a temporary folder]")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.cache = args.cache or tempfile.mkdtemp(prefix="farm-bench-")
    res = cpu_part(args) if args.cpu_scaling else gpu_part(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    for key, v in res.items():
        if isinstance(v, dict) and "per_s" in v:
            print(f"{key:22s} {v['per_s']:8.2f}/s  {v['per_candidate_ms']:8.1f} ms per candidate  {v['verdicts']}")
    for key, v in res.items():
        if key.startswith(("overhead", "scaling", "farm_vs", "machine_scaling", "farm_over")):
            print(f"{key:22s} {v:.3f}" if isinstance(v, float) else f"{key:22s} {[round(x, 3) for x in v]}")
    runs = [k for k, v in res.items() if isinstance(v, dict) and "mean_step_ms" in v]
    names = sorted({s for k in runs for s in res[k]["mean_step_ms"]})
    if names:  # where a candidate's time went, mean ms per candidate per step (steps overlap across candidates)
        w = max(len(k) for k in runs) + 2
        print("step".ljust(22) + "".join(k.rjust(w) for k in runs))
        for n in names:
            print(n.ljust(22) + "".join(f"{res[k]['mean_step_ms'].get(n, 0.0):{w}.2f}" for k in runs))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
