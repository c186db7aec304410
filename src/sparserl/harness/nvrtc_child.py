"""The process NVRTC compiles run in (:mod:`sparserl.harness.nvrtc`).

A running NVRTC call cannot be stopped inside a process, so a compile that runs past its limit
(a source that inlines itself twice a level, say) would go on using a core and memory in the
background. Each compile thread of the parent therefore keeps one of these processes; a compile past
its limit is stopped by ending the process, and the next compile starts a new one.

Protocol, on the process's standard input and a copy of its original standard output: every
message is a pickle preceded by its length (8 bytes, little-endian). The process answers
``("ready", version)`` once the library has compiled its probe, then one ``(status, cubin, log,
ptx)`` per ``(source, options, data_limit)`` request, and ends at the end of its input or when its
parent dies. ``data_limit`` (bytes, or None) caps the memory the compile may allocate
(``RLIMIT_DATA``, lifted again before the answer is written): NVRTC then reports running out of
memory, or its process ends printing so, instead of growing until the machine's OOM killer picks a
process, perhaps the trainer's.

    python -m sparserl.harness.nvrtc_child PATH_OF_LIBNVRTC
"""

from __future__ import annotations

import os
import pickle
import resource
import struct
import sys
from contextlib import contextmanager

LENGTH = struct.Struct("<Q")
"""The length that precedes every message."""


def read_message(stream):
    """The next message on a binary ``stream``, or None at its end."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        return None
    (size,) = LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def write_message(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(LENGTH.pack(len(data)) + data)
    stream.flush()


def _die_with_parent() -> None:
    """Ask Linux to end this process when its parent ends (a compile may be running then)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


@contextmanager
def _data_limit(limit: int | None):
    """``RLIMIT_DATA``'s soft limit at ``limit`` bytes for the block (None: as it was)."""
    if limit is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def main(argv: list[str]) -> int:
    parent = os.getppid()
    _die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a compile that runs out of its memory aborts: no core file
    if os.getppid() != parent:  # the parent ended before the request above
        return 1
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a library prints goes to standard error, never into the answers
    from sparserl.harness.nvrtc import Nvrtc, NvrtcOutput

    lib = Nvrtc(argv[1])
    write_message(out, ("ready", lib.version))
    inp = sys.stdin.buffer
    while (request := read_message(inp)) is not None:
        source, options, data_limit = request
        try:
            with _data_limit(data_limit):
                res = lib._compile(source, options)
        except Exception as exc:  # noqa: BLE001 - reported as a failed compile, never raised
            res = NvrtcOutput("failure", None, f"NVRTC failed: {exc!r}")
        write_message(out, (res.status, res.cubin, res.log, res.ptx))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
