"""A Ray cluster of several nodes on this one machine: a head and worker nodes, each its own ``ray start``.

For the tests and the farm benchmark (and to try the farm's multi-node behaviour on one host). Each
node is a ``ray start --block`` process in its own session, so one node can be killed whole (its
raylet, object store and workers: what a machine's death looks like to the others) while the rest
run on. Nodes get ``PYTHONPATH`` pointing at this checkout's ``src``, as a real cluster's nodes get
SparseRL installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.farm.auth import node_auth_env

SRC = Path(__file__).resolve().parents[2]


def ray_cli() -> str:
    """The ``ray`` command of this Python's environment."""
    exe = Path(sys.executable).parent / "ray"
    if not exe.exists():
        raise SparseRLError("Ray is not installed: pip install -e '.[farm]'")
    return str(exe)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalCluster:
    """``address`` of the head; ``nodes``: the ``ray start --block`` processes, head first."""

    address: str = ""
    nodes: list[subprocess.Popen] = field(default_factory=list)
    temp: Path | None = None
    env: dict = field(default_factory=dict)

    @classmethod
    def start(cls, workers: int = 2, cpus_per_worker: int = 1, head_cpus: int = 0, gpus: int = 0,
              cache: Path | None = None, token: Path | None = None) -> LocalCluster:
        """``cache``: the nodes' harness cache ($SPARSERL_CACHE_DIR), default the temporary folder's.
        ``token``: a file holding a Ray authentication token: every node then wants it
        (``RAY_AUTH_MODE=token``), as a cluster started where a token exists does."""
        temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay short
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
                   RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
                   SPARSERL_CACHE_DIR=str(cache or temp / "cache"))
        if token is not None:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        env.update(node_auth_env(env))  # a token of this machine's: the worker nodes must send it too
        c = cls(f"127.0.0.1:{port}", [], temp, env)
        common = ["--block", "--disable-usage-stats", f"--num-gpus={gpus}", "--include-dashboard=false"]
        try:
            c._wait_started(c._node([ray_cli(), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                                     f"--num-cpus={head_cpus}", f"--temp-dir={temp}", *common]))
            for _ in range(workers):  # one after another: on a loaded machine a raylet has 30 s to register
                c.add_worker(cpus_per_worker, gpus)
        except BaseException:
            c.stop()
            raise
        return c

    def add_worker(self, cpus: int = 1, gpus: int = 0) -> subprocess.Popen:
        """Start one more worker node and wait until it is up."""
        args = [ray_cli(), "start", f"--address={self.address}", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
                f"--num-gpus={gpus}", "--block", "--disable-usage-stats"]
        p = self._node(args)
        self._wait_started(p)
        return p

    def _wait_started(self, p: subprocess.Popen, timeout: float = 180.0) -> None:
        """Until the node's ``ray start`` says the runtime started (it registered with the head)."""
        i = self.nodes.index(p)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = (self.temp / f"node{i}.log").read_text()
            if "Ray runtime started" in text:
                return
            if p.poll() is not None:
                raise RuntimeError(f"a Ray node exited while starting: {text[-800:]}")
            time.sleep(0.2)
        raise RuntimeError(f"a Ray node did not start in {timeout:g} s: {self.log_tail()}")

    def _node(self, args: list[str]) -> subprocess.Popen:
        log = open(self.temp / f"node{len(self.nodes)}.log", "w")  # noqa: SIM115 (closed with the process)
        p = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes.append(p)
        return p

    def log_tail(self) -> str:
        return " | ".join((self.temp / f"node{i}.log").read_text()[-400:] for i in range(len(self.nodes))
                          if (self.temp / f"node{i}.log").exists())

    def kill(self, node: subprocess.Popen) -> None:
        """A node's death: SIGKILL to every process of its session (ray start, raylet, object store,
        its workers), found by session id, the node's own process id."""
        for pid in session_pids(node.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.wait(30)

    def close(self) -> None:
        """Leave the cluster (when this process joined one) and stop every node."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stop(self) -> None:
        for p in reversed(self.nodes):
            self.kill(p)
        import shutil

        shutil.rmtree(self.temp, ignore_errors=True)


def session_pids(sid: int) -> list[int]:
    """Process ids whose session is ``sid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and int(fields[3]) == sid:  # state, ppid, pgrp, session
            out.append(int(d.name))
    return out
