"""The evaluator interface served by a Ray cluster: compiles as CPU tasks, one actor per GPU.

    ev = RayEvaluator(HarnessConfig(), "head-node:6379")   # sparserl farm --ray ADDRESS picks it
    ref = ev.register(A, "bcsstk13")
    res = ev.submit(text, ref, "spmv").result()             # an EvalResult, as Evaluator gives

A candidate travels: a **compile task** (``num_cpus=1``, any node: extraction, static checks,
NVRTC/nvcc, PTX checks; without GPUs also the host's conversion and launch plan, and there it
ends with ``no_gpu``) returns the job and the cubin's bytes; the driver hands them to a free slot of a
**GPU actor** (``num_gpus=1``: Ray gives it one GPU alone), which holds one harness worker
(:class:`~sparserl.harness.pool.WorkerPool` of one) and runs one job at a time, so one timed
kernel at a time per GPU (the driver keeps :data:`SLOTS_PER_GPU` jobs on it, the next one waiting
in the actor's queue, so the GPU does not wait for a round trip through the driver), under the
pool's phase limits, its restarts and its verdicts. A matrix
is shipped once per node through Ray's object store and saved in the node's harness cache.

Faults: a compile task whose worker or node dies is run again by Ray (``max_retries``); a GPU
job whose actor dies (its process, its node) is run again on another actor, up to
:data:`RERUNS` times, and the dead actor is asked whether Ray restarted it (``max_restarts``)
before it is given work again. A kernel that crashes its harness worker is the kernel's verdict
(``crashed``), as on one host: the actor survives it. Each GPU's health (shared, throttled:
:mod:`.health`) is asked at start and whenever :meth:`RayEvaluator.health` is called.

Every node must run the same SparseRL (checked at start: a node of another harness version is a
one-line error, so two versions' verdicts never mix in one farm).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.farm.auth import auth_token_source, use_token_auth
from sparserl.harness.evaluator import Evaluator, HarnessConfig, MatrixRef
from sparserl.harness.result import HARNESS_VERSION, ErrorKind, EvalProfile, EvalResult
from sparserl.kernels.contract import Op

log = logging.getLogger(__name__)

RERUNS = 3
"""How many times a GPU job whose actor died is run again on another actor before it comes back
as ``internal_error``."""

SLOTS_PER_GPU = 2
"""Jobs handed to one GPU actor at once. The second waits in the actor's own queue and starts the
moment the first ends, where one at a time left the GPU idle for a round trip through the driver
per candidate (18% of a 14 ms candidate on one H200). The actor still runs one job at a time, so
one timed kernel at a time per GPU."""

COMPILE_RETRIES = 5
"""Ray's retries of a compile task whose worker process or node died."""

NO_GPU_NOTE = ("the Ray cluster has no GPUs: the farm compiles and checks its candidates only (nothing is "
               "verified or timed, nothing enters the store)")


def ray_module():
    """Ray, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise SparseRLError("the farm needs Ray: pip install -e '.[farm]' (on every node of the cluster)") from None
    return ray


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def check_address(address: str, timeout: float = 5.0) -> None:
    """A one-line error unless something answers at ``address`` (``host:port`` or ``ray://host:port``;
    ``auto`` is left to Ray, which finds the cluster of this machine)."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise SparseRLError(f"--ray must be host:port, ray://host:port or auto, got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise SparseRLError(f"no Ray cluster answers at {address} ({exc.strerror or exc}): start one with "
                            "'ray start --head' or check the address") from None


def connect(address: str) -> bool:
    """Join the cluster at ``address``; False when this process was connected already."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    check_address(address)
    if (source := use_token_auth(address)) is not None:
        log.info("joining the Ray cluster with the authentication token of %s", source)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, namespace="sparserl")
    except Exception as exc:  # ConnectionError, RuntimeError, TimeoutError ... from Ray: one line
        hint = ""
        if "auth" in str(exc).lower() or auth_token_source() is None:
            hint = (" (if the cluster uses token authentication: run 'ray get-auth-token' on the head and give the "
                    "token to this machine as RAY_AUTH_TOKEN or ~/.ray/auth_token)")
        raise SparseRLError(f"cannot join the Ray cluster at {address}: {_first_line(exc)}{hint}") from None
    return True


# -- what runs on the nodes ------------------------------------------------------------------

_LOCAL: dict[str, Evaluator] = {}
_LOCAL_LOCK = threading.Lock()


def _local_evaluator(config: HarnessConfig) -> Evaluator:
    """This worker process's compile-only evaluator for ``config`` (its compile cache, its host plans)."""
    key = repr(config)
    with _LOCAL_LOCK:
        if key not in _LOCAL:
            _LOCAL[key] = Evaluator(replace(config, compile_only=True, compile_jobs=1, memo=0))
        return _LOCAL[key]


def _matrix_here(root: Path, key: str, blob_box: list) -> Path:
    """The node's copy of a registered matrix (fetched from the object store the first time)."""
    path = root / "matrices" / f"{key}.npz"
    if not path.exists():
        ray = ray_module()
        data = ray.get(blob_box[0])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{key}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


def node_facts() -> dict:
    """What a node says about itself at the farm's start."""
    import shutil

    from sparserl import __version__

    return {"host": socket.gethostname(), "harness_version": HARNESS_VERSION, "sparserl": __version__,
            "nvcc": shutil.which("nvcc") is not None, "pid": os.getpid()}


def one_gpu_model(models: list[str | None]) -> tuple[set[int], str | None]:
    """The actors to keep (indices into ``models``, each actor's GPU model) and a warning, when the cluster's
    GPUs are of several models: a search ranks its candidates by time and stops hopeless ones against its best
    time, so its candidates must run on one model. The largest group is kept (ties: the name first in order)."""
    groups: dict[str | None, list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(m, []).append(i)
    if len(groups) <= 1:
        return set(range(len(models))), None
    chosen = min(groups, key=lambda m: (-len(groups[m]), str(m)))
    counts = ", ".join(f"{m or 'unknown'} x{len(v)}" for m, v in sorted(groups.items(), key=lambda kv: str(kv[0])))
    return set(groups[chosen]), (f"the Ray cluster's GPUs are of several models ({counts}): times of two models are "
                                 f"not one scale, so the farm uses the {len(groups[chosen])} {chosen or 'unknown'} "
                                 "actors only (start it on GPUs of one model to use them all)")


def compile_task(config: HarnessConfig, text: str, mref: MatrixRef, blob_box: list, op: str, k: int | None,
                 gpu_mode: bool) -> tuple:
    """A compile task (see the module docstring): ``("done", EvalResult, host)`` when the candidate's
    evaluation ends here, or ``("ready", job, extra, cubin bytes, host)`` for a GPU actor."""
    ev = _local_evaluator(config)
    t0 = time.perf_counter()
    host = socket.gethostname()
    local = replace(mref, path=str(_matrix_here(ev.config.root, mref.key, blob_box)))
    ready, failed = ev._front(text, local, Op(op), k, t0, plan_on_host=not gpu_mode)
    if failed is not None:
        return "done", replace(failed, host=host), host
    job, extra = ready
    if not gpu_mode:
        front = extra.pop("front", {})
        return "done", EvalResult.failure(op, k, mref.name, ErrorKind.NO_GPU, "compiled; not run (no GPU or "
                                          "compile-only)", compiled=True, host=host,
                                          eval_seconds=time.perf_counter() - t0,
                                          profile=EvalProfile(seconds=front), **extra), host
    return "ready", job, extra, Path(job["cubin_path"]).read_bytes(), host


def farm_steps(ready: float, sent: float, back: float, payload: dict) -> dict[str, float]:
    """The farm's own share of a GPU job's time, as profile steps (seconds): ``farm_slot_wait``
    from the compile task's result to a free slot; ``farm_actor_own`` the actor's own work beyond
    the harness worker's call and its queue (the cubin written on the node, the matrix's path);
    ``farm_actor_wait`` the rest of the round trip: Ray's two hops, and the wait in the actor's own
    queue behind the other slot's job (GPU time when both slots are full, not overhead). ``ready``,
    ``sent``, ``back``: the driver's clock when the job was ready, sent and back."""
    pool = payload.get("call_seconds", 0.0) + payload.get("queue_seconds", 0.0)
    own = payload.get("actor_seconds", pool)
    return {"farm_slot_wait": max(0.0, sent - ready), "farm_actor_own": max(0.0, own - pool),
            "farm_actor_wait": max(0.0, back - sent - own)}


class GpuActor:
    """One GPU of the cluster (``num_gpus=1``) and the harness worker that owns it."""

    def __init__(self, config: HarnessConfig, target=None):
        from sparserl.harness.pool import WorkerPool
        from sparserl.harness.worker import settings_dict

        self.config = config
        self.host = socket.gethostname()
        settings = settings_dict(config) | {"cache_dir": str(config.root)}
        kw = {"target": target} if target is not None else {}
        self.pool = WorkerPool([0], settings, config.limits, **kw)  # Ray set CUDA_VISIBLE_DEVICES to our GPU
        self.started = time.time()

    def info(self) -> dict:
        ray = ray_module()
        w = self.pool.workers[0]
        return node_facts() | {"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "gpu": w.info.get("gpu"),
                               "arch": w.info.get("arch"), "worker_pid": w.info.get("pid"),
                               "sync_latency_ms": w.info.get("sync_latency_ms"),
                               "node_id": ray.get_runtime_context().get_node_id(), "jobs": w.jobs,
                               "busy_s": w.busy_s}

    def run(self, kind: str, job: dict, cubin: bytes | None, blob_box: list) -> dict:
        import hashlib

        t0 = time.perf_counter()
        root = self.config.root
        job = dict(job, matrix=dict(job["matrix"], path=str(_matrix_here(root, job["matrix"]["key"], blob_box))))
        if cubin is not None:
            path = root / "farm_cubin" / f"{hashlib.sha256(cubin).hexdigest()[:32]}.cubin"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(cubin)
                os.replace(tmp, path)
            job["cubin_path"] = str(path)
        out = self.pool.run(kind, job)
        out["host"] = self.host
        out["actor_seconds"] = time.perf_counter() - t0
        return out

    def health(self):
        from sparserl.farm.health import query

        ray = ray_module()
        ids = ray.get_gpu_ids()
        w = self.pool.workers[0]
        found = query(int(ids[0]) if ids and str(ids[0]).isdigit() else None, {w.info.get("pid") or -1},
                      w.info.get("sync_latency_ms"))
        return found[0] if found else None

    def close(self) -> None:
        self.pool.close()


# -- the driver ------------------------------------------------------------------------------


@dataclass
class _Actor:
    handle: object
    name: str
    info: dict = field(default_factory=dict)
    alive: bool = True
    jobs: int = 0
    busy_s: float = 0.0
    lost: int = 0
    checking: bool = False
    """Whether the driver is asking if Ray restarted it."""
    gen: int = 0
    """Bumped at each loss: a slot handed out before it is stale (dropped when taken)."""
    last_end: float = 0.0
    """When its last job came back (``busy_s`` counts overlapping slots once)."""


class GpuSlots:
    """Which GPU actor takes the next job: ``per_actor`` slots each (:data:`SLOTS_PER_GPU`), handed
    out and returned by the driver's GPU threads; no Ray in here (tested on the CPU).

    A slot carries its actor's generation; a loss bumps it, so the slots handed out before the loss
    (the other job in flight on it, a slot still queued) are dropped instead of coming back as extra
    ones, and a restarted actor gets exactly ``per_actor`` fresh slots."""

    def __init__(self, per_actor: int = SLOTS_PER_GPU, lock: threading.Lock | None = None):
        """``lock``: the one that guards the actors' counters (the evaluator's statistics lock)."""
        self.per_actor = per_actor
        self._queue: queue.Queue[tuple[_Actor, int]] = queue.Queue()
        self._lock = lock or threading.Lock()

    def free(self, a: _Actor) -> None:
        """Hand out a new (or restarted) actor's slots."""
        for _ in range(self.per_actor):
            self._queue.put((a, a.gen))

    def take(self, actors: list[_Actor], wait_s: float = 2.0) -> tuple[_Actor, int] | None:
        """A free slot of a live actor (waiting for one); None when no actor is alive or being asked
        whether Ray restarted it."""
        while True:
            try:
                a, gen = self._queue.get(timeout=wait_s)
            except queue.Empty:
                if not any(x.alive or x.checking for x in actors):
                    return None
                continue
            if a.alive and gen == a.gen:
                return a, gen

    def done(self, a: _Actor, gen: int, started: float, ended: float) -> None:
        """A job of the slot ``(a, gen)`` came back: count it (busy time of overlapping slots once)
        and give the slot back."""
        with self._lock:
            a.jobs += 1
            a.busy_s += max(0.0, ended - max(started, a.last_end))
            a.last_end = max(a.last_end, ended)
        self._queue.put((a, gen))

    def lost(self, a: _Actor, gen: int) -> bool:
        """The job of slot ``(a, gen)`` died with its actor: take the actor out of service. True for
        the first report of this loss (the caller then asks whether Ray restarted it), False for the
        others (the other slot's job of the same loss)."""
        with self._lock:
            if gen != a.gen:
                return False
            a.gen += 1
            a.alive, a.checking = False, True
            a.lost += 1
            return True


class RayEvaluator:
    """The evaluator interface (:class:`~sparserl.harness.interface.KernelEvaluator`) on a Ray cluster.

    ``address``: the cluster (``host:port``, ``ray://host:port`` or ``auto``). ``gpus``: use at
    most this many of its GPUs (None: all). ``worker_target``: the GPU worker's entry point
    (tests give the pool's CPU stand-in; default the real one)."""

    _finish = Evaluator._finish  # the payload -> EvalResult step is the in-process evaluator's own
    _memo_key = Evaluator._memo_key
    note_best = Evaluator.note_best  # and so is the early stop of hopeless candidates (``slow``)
    best_known = Evaluator.best_known
    _still_valid = Evaluator._still_valid
    _follow = Evaluator._follow
    submit = Evaluator.submit  # checks, the memo and the best time known, then this class's _submit
    evaluate = Evaluator.evaluate
    evaluate_many = Evaluator.evaluate_many

    def __init__(self, config: HarnessConfig | None = None, address: str = "auto", *, gpus: int | None = None,
                 worker_target=None):
        self.config = config or HarnessConfig()
        self.address = address
        ray = ray_module()
        self._own_connection = connect(address)
        try:
            self._setup(ray, gpus, worker_target)
        except BaseException:
            self.close()
            raise

    def _setup(self, ray, gpus: int | None, worker_target) -> None:
        self.nodes = self._check_nodes(ray)
        resources = ray.cluster_resources()
        self.cpus = int(resources.get("CPU", 0))
        n_gpus = int(resources.get("GPU", 0))
        if gpus is not None:
            n_gpus = min(n_gpus, gpus)
        self._gpu_mode = n_gpus > 0 and not self.config.compile_only
        if n_gpus == 0 and not self.config.compile_only:
            log.warning(NO_GPU_NOTE)
        if self.cpus < 1:
            raise SparseRLError(f"the Ray cluster at {self.address} has no CPUs for compile tasks")
        self._compile = ray.remote(compile_task).options(num_cpus=1, max_retries=COMPILE_RETRIES)
        self._blobs: dict[str, object] = {}
        self._memo: OrderedDict[tuple, Future] = OrderedDict()
        self._memo_lock = threading.Lock()
        self.memo_hits = 0
        self._best: dict[tuple, float] = {}
        self._best_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.compiles: dict[str, int] = {}
        """Compile tasks finished, per host."""
        self.reruns = 0
        """GPU jobs run again because their actor died."""
        self.actors: list[_Actor] = []
        self._slots = GpuSlots(lock=self._stats_lock)
        if self._gpu_mode:
            self._start_actors(ray, n_gpus, worker_target)
        self._gpu_exec = ThreadPoolExecutor(max_workers=max(1, SLOTS_PER_GPU * len(self.actors)),
                                            thread_name_prefix="farm-gpu")

    def _check_nodes(self, ray) -> list[dict]:
        """One probe task on every live node: all must run this harness version."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(node_facts)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        refs = [probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote() for n in alive]
        try:
            facts = ray.get(refs, timeout=self.config.limits.startup)
        except Exception as exc:
            raise SparseRLError(f"the nodes of the Ray cluster at {self.address} did not answer: "
                                f"{_first_line(exc)}") from None
        other = [f for f in facts if str(f["harness_version"]) != str(HARNESS_VERSION)]
        if other:
            hosts = ", ".join(sorted({f"{f['host']} (harness {f['harness_version']})" for f in other}))
            raise SparseRLError(f"nodes of the Ray cluster run another SparseRL: {hosts}; this one is harness "
                                f"{HARNESS_VERSION}: install the same sparserl on every node")
        log.info("Ray cluster at %s: %d nodes (%s)", self.address, len(facts),
                 ", ".join(sorted({f["host"] for f in facts})))
        return facts

    def _start_actors(self, ray, n: int, target) -> None:
        cls = ray.remote(GpuActor).options(num_gpus=1, num_cpus=0, max_restarts=-1, max_task_retries=0)
        handles = [cls.remote(self.config, target) for _ in range(n)]
        pending = {h.info.remote(): i for i, h in enumerate(handles)}
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=self.config.limits.startup)
        for ref in ready:
            i = pending[ref]
            try:
                info = ray.get(ref)
            except Exception as exc:
                log.warning("a GPU actor did not start: %s", _first_line(exc))
                ray.kill(handles[i])
                continue
            self.actors.append(_Actor(handles[i], f"{info['host']}/gpu{','.join(info['gpu_ids']) or '?'}", info))
        for ref, i in pending.items():
            if ref not in ready:
                ray.kill(handles[i])
        if not self.actors:
            raise SparseRLError(f"none of the {n} GPU actors of the Ray cluster at {self.address} started "
                                f"within {self.config.limits.startup:g} s")
        keep, note = one_gpu_model([a.info.get("gpu") for a in self.actors])
        if note:
            log.warning("%s", note)
            for i, a in enumerate(self.actors):
                if i not in keep:
                    ray.kill(a.handle)
            self.actors = [a for i, a in enumerate(self.actors) if i in keep]
        for a in self.actors:
            self._slots.free(a)
            log.info("GPU actor %s: %s (%s), launch latency %.2f ms", a.name, a.info.get("gpu"), a.info.get("arch"),
                     a.info.get("sync_latency_ms") or 0.0)

    # -- the interface -----------------------------------------------------------------------

    @property
    def has_gpu(self) -> bool:
        return self._gpu_mode and any(a.alive for a in self.actors)

    @property
    def arch(self) -> str | None:
        """The architecture of the cluster's GPUs (sm_XY); None without them, or when they differ."""
        archs = {a.info.get("arch") for a in self.actors if a.alive} if self.has_gpu else set()
        return archs.pop() if len(archs) == 1 else None

    def register(self, A, name: str = "matrix") -> MatrixRef:
        from sparserl.harness.matrix_files import save_matrix_file

        key, path = save_matrix_file(A, self.config.root / "matrices")
        ref = MatrixRef(key, str(path), name, (int(A.shape[0]), int(A.shape[1])), int(A.nnz))
        self._blob(ref)
        return ref

    def _blob(self, ref: MatrixRef):
        """The matrix's bytes in Ray's object store (put again from its file if :meth:`release` let them go while
        another search of the same matrix still runs)."""
        with self._stats_lock:
            if ref.key not in self._blobs:
                self._blobs[ref.key] = ray_module().put(Path(ref.path).read_bytes())
            return self._blobs[ref.key]

    def release(self, key: str) -> None:
        """A search of the matrix with content key ``key`` (:func:`~sparserl.harness.matrix_files.matrix_key`)
        ended (a farm's): its bytes leave Ray's object store (the tasks still running hold their own reference; a
        later job puts them again), so a long farm does not pin every matrix it searched."""
        with self._stats_lock:
            self._blobs.pop(key, None)

    def gpu_lease(self, device):
        """The cluster's GPUs are Ray's, not this process's: nothing to hold here (give the trainer's GPU
        to no actor: start that node with one GPU fewer, ``ray start --num-gpus``)."""
        return contextlib.nullcontext()

    def _submit(self, text: str, matrix: MatrixRef, op: Op, k: int | None, best_us: float | None = None,
                contender: bool = False, fresh: bool = False) -> Future:
        """A compile task, then a GPU actor (:meth:`Evaluator.submit <sparserl.harness.evaluator.Evaluator.submit>`
        calls it). The best time known is read again when the job leaves for its GPU: a best found
        while it waited for a slot stops it early too, unless the job is ``fresh`` (stopped early only
        against the caller's ``best_us``)."""
        t0 = time.perf_counter()
        out: Future = Future()
        out.contender = contender  # read by _still_valid
        ref = self._compile.remote(self.config, text, matrix, [self._blob(matrix)], op.value, k, self._gpu_mode)
        ref.future().add_done_callback(lambda f: self._after_compile(f, out, matrix, op, k, t0, best_us, contender,
                                                                        fresh))
        return out

    def _after_compile(self, f: Future, out: Future, matrix: MatrixRef, op: Op, k: int | None, t0: float,
                       best_us: float | None = None, contender: bool = False, fresh: bool = False) -> None:
        try:
            tag, *rest = f.result()
        except Exception as exc:  # the task failed past its retries, or the harness raised: not the kernel's
            out.set_result(EvalResult.failure(op.value, k, matrix.name, ErrorKind.INTERNAL,
                                              f"compile task failed: {_first_line(exc)}"))
            return
        with self._stats_lock:
            host = rest[-1]
            self.compiles[host] = self.compiles.get(host, 0) + 1
        if tag == "done":
            out.set_result(rest[0])
            return
        job, extra, cubin, _ = rest
        job["best_us"] = best_us
        if contender:
            job["contender"] = True
        ready = time.perf_counter()
        front = extra.get("front", {})
        extra = dict(extra, front=dict(front, farm_compile_hop=max(0.0, ready - t0 - sum(front.values()))))
        try:
            self._gpu_exec.submit(self._run_on_gpu, job, extra, cubin, matrix, op, k, t0, out, ready, fresh)
        except RuntimeError as exc:  # closed meanwhile
            out.set_result(EvalResult.failure(op.value, k, matrix.name, ErrorKind.INTERNAL, str(exc), compiled=True))

    def _run_on_gpu(self, job: dict, extra: dict, cubin: bytes, matrix: MatrixRef, op: Op, k: int | None,
                    t0: float, out: Future, t_ready: float, fresh: bool = False) -> None:
        """Run a compiled job on a GPU actor (``t_ready``: when the compile task's result came back,
        for the profile's ``farm_slot_wait``, which includes the wait for a driver thread)."""
        ray = ray_module()
        why = "no GPU actor is left in the cluster"
        for attempt in range(RERUNS + 1):
            slot = self._slots.take(self.actors)
            if slot is None:
                break
            a, gen = slot
            noted = None if fresh else self.best_known(matrix, op, k)
            known = [v for v in (job.get("best_us"), noted) if v is not None and v > 0]
            job["best_us"] = min(known) if known else None
            t = time.perf_counter()
            try:
                payload = ray.get(a.handle.run.remote("eval", job, cubin, [self._blob(matrix)]))
            except Exception as exc:  # the actor (its process, its node) died under the job: run it elsewhere
                why = f"GPU actor {a.name} died: {_first_line(exc)}"
                log.warning("%s; running the candidate again on another GPU (attempt %d of %d)", why, attempt + 1,
                            RERUNS)
                with self._stats_lock:
                    self.reruns += 1
                self._lost(a, gen)
                continue
            t_back = time.perf_counter()
            self._slots.done(a, gen, t, t_back)
            out.set_result(self._finish(payload, dict(extra, front=dict(extra["front"], **farm_steps(
                t_ready, t, t_back, payload))), matrix, op, k, t0))
            return
        rest = {key: v for key, v in extra.items() if key != "front"}  # the compile task's steps: the profile's
        out.set_result(EvalResult.failure(op.value, k, matrix.name, ErrorKind.INTERNAL, why, compiled=True,
                                          profile=EvalProfile(seconds=dict(extra.get("front", {}))), **rest))

    def _lost(self, a: _Actor, gen: int) -> None:
        """Take ``a`` out of service; back in when Ray has restarted it (asked in the background)."""
        if not self._slots.lost(a, gen):
            return

        def check() -> None:
            ray = ray_module()
            try:
                a.info = ray.get(a.handle.info.remote(), timeout=self.config.limits.startup)
            except Exception as exc:
                log.warning("GPU actor %s is gone: %s", a.name, _first_line(exc))
                a.checking = False
                return
            log.info("GPU actor %s is back (restarted on %s)", a.name, a.info.get("host"))
            a.alive, a.checking = True, False
            self._slots.free(a)
        threading.Thread(target=check, name=f"farm-check-{a.name}", daemon=True).start()

    # -- what the farm shows ---------------------------------------------------------------------

    def worker_stats(self) -> list[dict]:
        """Per GPU actor: host, GPU, jobs done, seconds busy, whether it is serving."""
        with self._stats_lock:
            return [{"name": a.name, "host": a.info.get("host"), "gpu": a.info.get("gpu"), "jobs": a.jobs,
                     "busy_s": a.busy_s, "alive": a.alive, "lost": a.lost,
                     "sync_latency_ms": a.info.get("sync_latency_ms")} for a in self.actors]

    def health(self) -> dict:
        """Per GPU actor's name, its :class:`~.health.GpuHealth` (None where nvidia-smi says nothing)."""
        ray = ray_module()
        refs = {a.name: a.handle.health.remote() for a in self.actors if a.alive}
        out = {}
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=30)
            except Exception as exc:
                log.debug("health of %s: %s", name, exc)
        return out

    def close(self) -> None:
        ray = ray_module()
        if getattr(self, "_gpu_exec", None) is not None:
            self._gpu_exec.shutdown(wait=True)
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):
                ray.get(a.handle.close.remote(), timeout=30)
            with contextlib.suppress(Exception):
                ray.kill(a.handle)
        self.actors = []
        if getattr(self, "_own_connection", False) and ray.is_initialized():
            ray.shutdown()
            self._own_connection = False

    def __enter__(self) -> RayEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
