"""The CPU time a process group has used, read from Linux's ``/proc``.

A compile stopped at its limit is the machine's fault when the machine was too loaded to give it
the time (it is built again) and the source's when it used its whole limit computing
(:func:`sparserl.harness.compile.compile_source`). Each build runs as the leader of a session of
its own, so its group holds nvcc and every step it started (cicc, ptxas), or NVRTC's process.
"""

from __future__ import annotations

import os


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the name (state first), or None (ended, no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return fields if len(fields) >= 15 else None


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of process ``pid`` alone; None where it cannot be read."""
    fields = _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def group_cpu_seconds(pgid: int) -> float | None:
    """User and system CPU seconds of the running processes in group ``pgid``, with the children they
    have waited for; None where ``/proc`` cannot be read."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    total = 0
    for name in names:
        if name.isdigit() and (fields := _stat(name)) is not None and int(fields[2]) == pgid:
            total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")
