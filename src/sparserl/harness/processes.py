"""The CPU time a process group has used, read from Linux's ``/proc``.

A compile stopped at its limit is the machine's fault when the machine was too loaded to give it
the time (it is built again) and the source's when it used its whole limit computing
(:func:`sparserl.harness.compile.compile_source`). Each build runs as the leader of a session of
its own, so its group holds nvcc and every step it started (cicc, ptxas), or NVRTC's process.
"""

from __future__ import annotations

import os


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of process ``pid`` alone; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        fields = stat[stat.rfind(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def group_cpu_seconds(pgid: int) -> float | None:
    """User and system CPU seconds of the running processes in group ``pgid``, with the children they
    have waited for; None where ``/proc`` cannot be read."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        names = os.listdir("/proc")
    except (OSError, ValueError):
        return None
    total = 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
        if len(fields) < 15 or int(fields[2]) != pgid:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / tick
