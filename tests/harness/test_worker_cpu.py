"""What of the GPU worker (harness/worker.py) runs on a CPU: the pipe's phase accounting and GPU
lease, the settings it is started with, the timing configuration it derives, the speed figures of
a timed job (speedup, roofline, break-even), and the serving loop's protocol, including a CUDA
error that leaves the context usable and one that poisons it (the process exits, in a child here).

The loop runs with doubles (named so) for the job handler and for CuPy's error types: what is
under test is the protocol, not a GPU. The figures are checked against hand-derived numbers."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sparserl.harness import worker as W
from sparserl.harness.evaluator import HarnessConfig


def test_channel_accounts_phases_and_reports_them_once_serving(monkeypatch) -> None:
    """Seconds per phase add up across visits (a clock reading 0, 1, 3, 6, 10: prepare 1 + 3,
    verify 2, check 4 once the next phase starts); nothing is sent before "ready" (serving False);
    after it every phase is announced, and the GPU lease waits for the parent's ("gpu", None).

    Mutations killed: phases sent before serving, a phase's time not accumulated, the lease not
    waiting or accepting another reply, a lease asked for in a job granted the GPU whole."""
    clock = iter([0.0, 1.0, 3.0, 6.0, 10.0])
    monkeypatch.setattr(W, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    parent, child = mp.Pipe()
    ch = W.Channel(child)
    secs = ch.begin_job()
    for name in ("prepare", "verify", "prepare", "check"):
        ch.phase(name)
    assert secs == {"prepare": 4.0, "verify": 2.0}
    assert not parent.poll()
    ch.lease_gpu()  # not serving: no lease needed
    assert not parent.poll()
    ch.serving = True
    ch.phase("time")
    assert parent.recv() == ("phase", "time") and ch.seconds["check"] == 4.0
    parent.send(("gpu", None))
    ch.lease_gpu()
    assert parent.recv() == ("want_gpu", None)
    ch.granted = True  # a job the parent leased the GPU for, whole: nothing to ask
    ch.lease_gpu()
    assert not parent.poll()
    ch.granted = False
    parent.send(("stop", None))
    with pytest.raises(RuntimeError, match="expected the GPU lease, got 'stop'"):
        ch.lease_gpu()
    assert ch.begin_job() == {} and ch.seconds == {}


def test_settings_are_plain_and_picklable() -> None:
    """The worker gets the flat settings of a HarnessConfig: paths as strings, nested configs left out."""
    import pickle

    s = W.settings_dict(HarnessConfig(cache_dir=Path("/tmp/x"), cold_trials=9))
    assert s["cache_dir"] == "/tmp/x" and s["cold_trials"] == 9 and s["regimes"] == ("cold", "warm")
    assert not {"verify", "limits", "compile"} & set(s)
    assert pickle.loads(pickle.dumps(s)) == s


def bare_worker(settings: dict | None = None, bandwidth: float = 4e12) -> W.Worker:
    """A Worker without a GPU: its settings, a channel on a pipe, and a GPU double for the bandwidth."""
    w = W.Worker.__new__(W.Worker)
    w.settings = settings or W.settings_dict(HarnessConfig())
    w.channel = W.Channel(mp.Pipe()[1])
    w.gpu = SimpleNamespace(bandwidth=lambda lease: bandwidth)
    return w


def test_timing_configs_follow_the_settings() -> None:
    """cold: cold_trials and warmup; warm: warm_trials, warmup and the target time per sample.

    Mutation killed: the two regimes' trial counts swapped."""
    w = bare_worker(W.settings_dict(HarnessConfig(cold_trials=11, warm_trials=5, warmup=1, warm_target_ms=0.7)))
    c, h = w.timing_config("cold"), w.timing_config("warm")
    assert (c.regime, c.trials, c.warmup) == ("cold", 11, 1)
    assert (h.regime, h.trials, h.warmup, h.warm_target_ms) == ("warm", 5, 1, 0.7)


@dataclass
class Conversion:
    m: int
    n: int
    nnz: int
    convert_seconds: float


@pytest.mark.parametrize("k", [None, 4])
def test_speed_figures_are_the_documented_ones(k) -> None:
    """Kernel 10 us, cuSPARSE 25 us, 10^6 x 8 10^5 with 5 10^6 nonzeros, 4 TB/s: speedup 2.5;
    roofline = compulsory bytes (values, x and y once: 4 (nnz + n k + m k)) / 10 us / 4e12
    = 27.2 MB / 10 us / 4 TB/s = 0.68 (SpMV), 48.8 MB -> 1.22 (k = 4: a hack signal, but the
    arithmetic's); break-even = conversion 3 ms / 15 us saved = 200 calls.

    Mutations killed: the ratio inverted, index bytes counted, k ignored, break-even on the wrong
    difference."""
    w = bare_worker()
    timings = {"cold": {"regime": "cold", "median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "spread": 0.2}}
    base = {"cold": {"regime": "cold", "median_us": 25.0, "p10_us": 24.0, "p90_us": 26.0, "spread": 0.08,
                     "alg": "csr_alg1", "extra": "dropped"}}
    out = w._speed(timings, base, "cold", Conversion(10**6, 8 * 10**5, 5 * 10**6, 3e-3), k)
    kk = k or 1
    assert out["error_kind"] == "none" and out["speedup"] == 2.5 and out["baseline_alg"] == "csr_alg1"
    assert out["roofline"] == pytest.approx(4 * (5e6 + 8e5 * kk + 1e6 * kk) / 10e-6 / 4e12)
    assert out["roofline"] == pytest.approx(0.68 if k is None else 1.22)
    assert out["break_even_calls"] == pytest.approx(200.0)
    assert out["baseline"] == {"cold": {kk2: base["cold"][kk2] for kk2 in ("regime", "median_us", "p10_us",
                                                                            "p90_us", "spread")}}
    slower = w._speed({"cold": dict(timings["cold"], median_us=30.0)}, base, "cold",
                      Conversion(10**6, 8 * 10**5, 5 * 10**6, 3e-3), k)
    assert slower["speedup"] == pytest.approx(25 / 30) and slower["break_even_calls"] is None


# -- the serving loop ------------------------------------------------------------------------------


class CudaErrorDouble(Exception):
    """Stands in for CuPy's CUDA error types."""


def cupy_double(usable: bool) -> SimpleNamespace:
    """A CuPy double: its two CUDA error types, and a context that is usable or poisoned."""
    def sync() -> None:
        if not usable:
            raise CudaErrorDouble("context poisoned")

    runtime = SimpleNamespace(CUDARuntimeError=CudaErrorDouble, deviceSynchronize=sync)
    return SimpleNamespace(cuda=SimpleNamespace(driver=SimpleNamespace(CUDADriverError=CudaErrorDouble),
                                                runtime=runtime), ones=np.ones, float32=np.float32)


class JobHandlerDouble:
    """Stands in for a Worker's job methods: returns, or raises, what the job asks for (and says
    whether its channel was told the GPU was granted for the whole job)."""

    def __init__(self):
        self.channel = W.Channel(None)

    def evaluate(self, job: dict) -> dict:
        if "speedup" in job:
            return {"error_kind": "none", "speedup": job["speedup"], "granted": self.channel.granted}
        if job.get("raise") == "cuda":
            raise CudaErrorDouble("an illegal memory access was encountered")
        if job.get("raise") == "python":
            raise KeyError("no such matrix")
        if job.get("raise") == "contract":
            from sparserl.errors import ContractError

            raise ContractError("LAUNCH expression 'ceil_div(m,' cannot be parsed")
        raise AssertionError(f"unexpected job {job}")

    def baseline_job(self, job: dict) -> dict:
        return {"baselines": job["name"]}


def test_the_loop_answers_every_job_and_survives_errors() -> None:
    """eval and baseline jobs are answered with "done" and the worker's seconds; a Python error is an
    internal_error with its traceback (the loop goes on); a CUDA error in a usable context is a
    launch_error; "stop" ends the loop.

    Mutations killed: a Python error ending the loop, a usable-context CUDA error reported as a crash,
    a job's whole-GPU grant not passed to the channel or kept for the next job."""
    parent, child = mp.Pipe()
    for job in (("eval", {"speedup": 2.0, "gpu_granted": True}), ("baseline", {"name": "m"}),
                ("eval", {"raise": "python"}), ("eval", {"raise": "cuda"}), ("eval", {"speedup": 3.0}),
                ("stop", None)):
        parent.send(job)
    W._serve(child, JobHandlerDouble(), cupy_double(usable=True))
    got = [parent.recv() for _ in range(5)]
    assert not parent.poll()
    assert got[0][0] == "done" and got[0][1]["speedup"] == 2.0 and got[0][1]["worker_seconds"] >= 0
    assert got[0][1]["granted"] and not got[4][1]["granted"]  # each job says for itself
    assert got[1] == ("done", {"baselines": "m", "worker_seconds": got[1][1]["worker_seconds"]})
    assert got[2][0] == "done" and got[2][1]["error_kind"] == "internal_error"
    assert got[2][1]["message"] == "KeyError: 'no such matrix'" and "Traceback" in got[2][1]["log_tail"]
    assert got[3] == ("done", {"error_kind": "launch_error", "message": "an illegal memory access was encountered"})


def test_the_loop_ends_when_the_parent_is_gone() -> None:
    parent, child = mp.Pipe()
    parent.close()
    W._serve(child, JobHandlerDouble(), cupy_double(usable=True))  # returns instead of raising EOFError


def _serve_poisoned(conn) -> None:
    W._serve(conn, JobHandlerDouble(), cupy_double(usable=False))


@pytest.mark.parametrize("raised", ["cuda", "python"])
def test_a_poisoned_context_ends_the_process(raised: str) -> None:
    """After an error that leaves the CUDA context unusable, the worker says "fatal" (crashed) and
    exits with code 3, so the parent starts a new one (run in a child process here).

    Mutation killed: a crash reported as "done" with the worker kept serving on a dead context."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_serve_poisoned, args=(child,))
    p.start()
    try:
        parent.send(("eval", {"raise": raised}))
        assert parent.poll(30)
        tag, payload = parent.recv()
        p.join(10)
        assert (tag, payload["error_kind"], p.exitcode) == ("fatal", "crashed", 3)
    finally:
        if p.is_alive():
            p.kill()
            p.join()


def test_a_contract_error_in_the_worker_is_the_candidates() -> None:
    """A ContractError raised while the worker serves a job (it reads the job's header again) is the
    candidate's contract_error, not an internal_error that every learning loop leaves out of its
    update; the loop goes on. Kills: the ContractError clause removed (the catch-all answers
    internal_error)."""
    parent, child = mp.Pipe()
    for job in (("eval", {"raise": "contract"}), ("eval", {"speedup": 2.0}), ("stop", None)):
        parent.send(job)
    W._serve(child, JobHandlerDouble(), cupy_double(usable=True))
    got = [parent.recv() for _ in range(2)]
    assert got[0] == ("done", {"error_kind": "contract_error",
                               "message": "LAUNCH expression 'ceil_div(m,' cannot be parsed"})
    assert got[1][1]["speedup"] == 2.0
