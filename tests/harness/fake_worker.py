"""A CPU-only stand-in for the GPU worker, speaking the same pipe protocol.

Jobs are scripts: ``{"steps": [["phase", "verify"], ["phase", "verify", 8, 0.4], ["lease"], ["sleep", 2.0], ["exit", 3], ["fatal"], ...]}``
followed by a "done" reply, so the pool's limits and restarts can be tested without a GPU.
``["exit_once", PATH, CODE]`` exits only when PATH does not exist yet (creating it first): a
death that a second attempt on a fresh worker does not meet. With ``settings["no_start"]`` naming
a file that exists, a (re)starting worker fails its start-up as a worker without a GPU does.

Bound with :func:`functools.partial` (the farm's GPU actors take it as their worker): ``echo``
puts what the job said of the best time known into the reply's message (``best_us=...``);
``kill_parent_once=PATH`` kills the worker's parent process, the farm's GPU actor, at the first
job when PATH does not exist yet (creating it first): an actor's death mid-job; ``job_seconds``:
how long every job takes; ``slow_us=(t, t_cusparse)``: every job comes back ``slow``, timed at
``t`` us against cuSPARSE's ``t_cusparse`` (cold regime).
"""

from __future__ import annotations

import os
import signal
import time


def _first(path: str) -> bool:
    """Whether this process created ``path`` (one winner among workers racing for it)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def fake_worker_main(conn, device: int, settings: dict, *, echo: bool = False,
                     kill_parent_once: str | None = None, job_seconds: float = 0.0,
                     slow_us: tuple[float, float] | None = None) -> None:
    if settings.get("no_start") and os.path.exists(settings["no_start"]):
        conn.send(("fatal", {"error_kind": "internal_error", "message": "worker could not start: no GPU"}))
        return
    conn.send(("ready", {"gpu": "fake", "pid": os.getpid(), "device": device}))
    while True:
        try:
            kind, job = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "stop":
            return
        if kill_parent_once and _first(kill_parent_once):
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)  # the job never ends here: its actor is gone
        for step in job.get("steps", []):
            if step[0] == "phase":  # ["phase", name] or ["phase", name, launches, seconds]
                conn.send(("phase", step[1] if len(step) == 2 else tuple(step[1:])))
            elif step[0] == "lease" and not job.get("gpu_granted"):  # as the real worker does before timing
                conn.send(("want_gpu", None))
                conn.recv()
            elif step[0] == "sleep":
                time.sleep(step[1])
            elif step[0] == "exit":
                os._exit(step[1])
            elif step[0] == "exit_once" and not os.path.exists(step[1]):
                open(step[1], "w").close()
                os._exit(step[2])
            elif step[0] == "fatal":
                conn.send(("fatal", {"error_kind": "crashed", "message": "poisoned context"}))
                os._exit(3)
        time.sleep(job_seconds)
        reply = {"error_kind": "none", "pid": os.getpid()}
        if echo:
            reply["message"] = f"best_us={job.get('best_us')}"
        if slow_us is not None:
            timing = lambda us: {"regime": "cold", "median_us": us, "p10_us": us, "p90_us": us,  # noqa: E731
                                 "spread": 0.0}
            reply |= {"error_kind": "slow", "regime": "cold", "timings": {"cold": timing(slow_us[0])},
                      "baseline": {"cold": timing(slow_us[1])}}
        conn.send(("done", reply))
