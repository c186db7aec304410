"""NVRTC, CUDA's runtime compiler, through ctypes: CUDA C++ source to a cubin, in process.

Compiling in process skips nvcc's driver and its chain of subprocesses (cicc, ptxas,
fatbinary), which is most of nvcc's time on a kernel this small: about 0.05 s against 0.23 s
for a library kernel, the same ptxas underneath and the same ``ptxas -v`` resource report
(``--ptxas-options=-v`` puts it in the program log). No GPU is needed.

The library is looked for in this order: ``$SPARSERL_NVRTC`` (a path to ``libnvrtc.so*``),
the ``nvidia-cuda-nvrtc`` wheel (``nvidia/cu13/lib``, which CuPy's CUDA 13 build depends
on), the CUDA toolkit's ``lib64``, then the loader's search path. NVRTC loads its
``libnvrtc-builtins`` by name at the first compile, so that library is loaded first from the
same folder, and a candidate must compile a trivial kernel before it is used.

A compile runs in a process of its own (:mod:`sparserl.harness.nvrtc_child`, one kept per
compile thread, so compiles on several threads run in parallel): a running NVRTC call cannot be
stopped, so one that runs past its limit is stopped by ending its process, reported as a timeout,
and the next compile starts a new process. That process runs with ``CUDA_CACHE_DISABLE=1``: where a
driver is installed (the GPU machine), NVRTC 13 otherwise reuses the driver's cache of earlier
compiles, even across processes and for a source that differs only in its comments, and such a
compile returns its cubin with an empty log, without the ``ptxas -v`` report that the resource
limits read (measured on an H100: the registers and static shared memory of every such kernel read
as none). Compiles are cached by this package instead (:mod:`sparserl.harness.compile`). (In a
thread, a source that inlines itself twice a level kept a core and gigabytes of memory after its
time-out, for as long as it pleased.) Only NVRTC's
"compilation failed" and "invalid option" are compile errors (cacheable: the same source fails
again); any other failure is ``failure`` and is never cached.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import glob
import logging
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sparserl.harness.processes import process_cpu_seconds

log = logging.getLogger(__name__)


_COMPILE_ERRORS = (5, 6)  # NVRTC_ERROR_INVALID_OPTION, NVRTC_ERROR_COMPILATION
_PROBE = 'extern "C" __global__ void probe(float* y) { y[threadIdx.x] = 1.f; }'
PRINTED_CHARS = 2000
"""How much of what a compile process printed during one compile is kept (its end)."""
CHILD_START_S = 60.0
"""How long a new compile process may take to load the library and compile its probe."""


@dataclass(frozen=True)
class NvrtcOutput:
    """One NVRTC compile: ``status`` is ok, compile_error, failure (NVRTC itself failed) or timeout."""

    status: str
    cubin: bytes | None
    log: str
    ptx: str = ""
    """The PTX NVRTC produced on the way to the cubin (what :mod:`.ptx_check` inspects)."""
    cpu_s: float | None = None
    """For a timeout: the CPU seconds its process had used when it was ended."""
    printed: str = ""
    """What the compile process wrote to its standard error during this compile (ptxas's and LLVM's
    own failures, "Memory allocation failure", "LLVM ERROR: out of memory", land there, not in the
    program's log); its last :data:`PRINTED_CHARS` characters."""


def _wheel_dirs() -> list[str]:
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return []
    return [os.path.join(p, sub, "lib") for p in getattr(nvidia, "__path__", [])
            for sub in ("cu13", "cuda_nvrtc")]


def candidates() -> list[str]:
    """Paths of libnvrtc to try, most specific first."""
    out = []
    if env := os.environ.get("SPARSERL_NVRTC"):
        out.append(env)
    dirs = _wheel_dirs()
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            dirs += [os.path.join(home, "lib64"), os.path.join(home, "targets", "x86_64-linux", "lib")]
    for d in dirs:
        out += sorted(p for p in glob.glob(os.path.join(d, "libnvrtc.so*")) if ".alt." not in p)
    if found := ctypes.util.find_library("nvrtc"):
        out.append(found)
    return out


class Nvrtc:
    """A loaded libnvrtc."""

    def __init__(self, path: str):
        folder = os.path.dirname(path)
        if folder:  # a bare name (from the loader's search path) has no folder to look in
            for b in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))):
                if ".alt." not in b:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)  # found by name when NVRTC needs it
        self.lib = ctypes.CDLL(path)
        self.path = path
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        real = os.path.realpath(path)
        size = os.path.getsize(real) if os.path.exists(real) else 0
        # the file's name and size tell patch releases apart (nvrtcVersion gives major.minor only)
        self.version = f"nvrtc {major.value}.{minor.value} {os.path.basename(real)} {size}"
        probe = self._compile(_PROBE, ["--gpu-architecture=sm_80"])
        if probe.status != "ok":
            raise RuntimeError(f"cannot compile a trivial kernel: {probe.log.strip()[:300]}")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def _compile(self, source: str, options: list[str]) -> NvrtcOutput:
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None),
                    "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            text = buf.value.decode(errors="replace")
            if rc != 0:
                kind = "compile_error" if rc in _COMPILE_ERRORS else "failure"
                return NvrtcOutput(kind, None, text or self.lib.nvrtcGetErrorString(rc).decode())
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            if size.value == 0:
                return NvrtcOutput("compile_error", None, text + "\nNVRTC made no cubin (was a real sm_XX target given?)")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            ptx = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
            return NvrtcOutput("ok", cubin.raw, text, ptx.value.decode(errors="replace"))
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def compile(self, source: str, options: list[str], timeout_s: float,
                memory_limit_mb: int | None = None) -> NvrtcOutput:
        """Compile ``source`` with NVRTC ``options`` in this thread's compile process, allowed
        ``memory_limit_mb`` of data (None: no limit); past ``timeout_s`` the process is ended (a
        timeout). What the process printed meanwhile is in ``printed``. Raises nothing but an
        interruption."""
        limit = None if memory_limit_mb is None else memory_limit_mb << 20
        try:
            child = _thread_child(self.path, math.inf if limit is None else limit)
        except (OSError, RuntimeError, EOFError) as exc:
            return NvrtcOutput("failure", None, f"NVRTC's compile process did not start: {exc}")
        before = process_cpu_seconds(child.pid)  # the process lives on between compiles: this one's share
        try:
            got = child.request((source, options, limit), timeout_s)
        except (OSError, EOFError, ValueError) as exc:  # it died: killed, out of memory, a crash in NVRTC
            printed = child.printed()
            end_thread_process()
            return NvrtcOutput("failure", None, f"NVRTC's compile process ended: {exc or type(exc).__name__}",
                               printed=printed)
        except BaseException:  # interrupted between request and answer: the answer must not reach the next request
            end_thread_process()
            raise
        printed = child.printed()
        if got is None:
            after = process_cpu_seconds(child.pid)
            cpu_s = after - before if after is not None and before is not None else None
            end_thread_process()
            return NvrtcOutput("timeout", None, f"NVRTC ran past its {timeout_s:g} s limit (its process was ended)",
                               cpu_s=cpu_s, printed=printed)
        status, cubin, text, ptx = got
        return NvrtcOutput(status, cubin, text, ptx, printed=printed)


class _Child:
    """One compile process (:mod:`sparserl.harness.nvrtc_child`) and its pipes."""

    def __init__(self, path: str):
        import sparserl

        root = str(Path(sparserl.__file__).resolve().parent.parent)  # where this sparserl is imported from
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
                   CUDA_CACHE_DISABLE="1")  # see the module's docstring: NVRTC's use of the driver's cache
        fd, name = tempfile.mkstemp(prefix="sparserl-nvrtc-", suffix=".err")
        os.close(fd)
        self.err = os.open(name, os.O_RDWR | os.O_APPEND)  # appended to, read and emptied between compiles
        os.unlink(name)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "sparserl.harness.nvrtc_child", path],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=env,
                                         start_new_session=True)
        except BaseException:
            os.close(self.err)
            raise
        self.widest = 0.0
        """The largest data limit (bytes) it has compiled under."""
        self.owner = threading.current_thread()
        """The thread it compiles for: only that thread reads its pipes, or ends it while that thread lives."""
        _children.add(self)  # after its fields: other threads read them
        try:
            ready = self._read(CHILD_START_S)
        except (OSError, EOFError, ValueError) as exc:
            self.end()
            raise RuntimeError(f"it ended before it was ready ({exc or type(exc).__name__})") from None
        if ready is None or ready[0] != "ready":
            self.end()
            raise RuntimeError(f"it was not ready within {CHILD_START_S:g} s")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, message, timeout_s: float):
        """Send ``message``; its answer, or None when none came within ``timeout_s``."""
        from sparserl.harness.nvrtc_child import write_message

        write_message(self.proc.stdin, message)
        return self._read(timeout_s)

    def _read(self, timeout_s: float):
        """The next message (:mod:`~sparserl.harness.nvrtc_child`'s framing), or None past ``timeout_s``."""
        import pickle

        from sparserl.harness.nvrtc_child import LENGTH

        fd = self.proc.stdout.fileno()
        poller = select.poll()  # not select.select: it refuses descriptors past 1023
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        deadline = time.monotonic() + timeout_s
        buf = bytearray()  # grown in place: a large answer is read in linear time
        need = LENGTH.size
        size = None
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(max(1, int(left * 1000))):
                return None
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                raise EOFError(f"the process ended (exit status {self.proc.poll()})")
            buf += chunk
            if size is None and len(buf) >= LENGTH.size:
                (size,) = LENGTH.unpack(buf[:LENGTH.size])
                need = LENGTH.size + size
        return pickle.loads(bytes(buf[LENGTH.size:need]))

    def end(self) -> None:
        """End the process (and anything it started) and reap it."""
        _children.discard(self)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.wait()
        err, self.err = self.err, -1  # closed once: the number may soon name another file
        if err >= 0:
            os.close(err)

    def printed(self) -> str:
        """What the process wrote to its standard error since the last call (its tail), and empty it."""
        try:
            size = os.fstat(self.err).st_size
            data = os.pread(self.err, PRINTED_CHARS, max(0, size - PRINTED_CHARS))
            os.ftruncate(self.err, 0)
        except OSError:
            return ""
        return data.decode(errors="replace")


_children: set[_Child] = set()
_local = threading.local()


def _thread_child(path: str, limit: float) -> _Child:
    """The calling thread's compile process, for a compile allowed ``limit`` bytes of data: a new
    one when it has ended, or when it ever compiled under a larger limit. Memory the process freed
    stays mapped to it, and a compile may use that whatever its limit (the limit only stops new
    mappings): in the test suite, a process holding 218 MB of data from earlier compiles built at
    80 MiB a source that needs about 150."""
    for other in list(_children):  # the processes of threads that ended: ended and reaped (never a living thread's:
        if _reapable(other):  # it may be reading its pipes); the death signal may not have come yet
            other.end()
    child = getattr(_local, "child", None)
    if child is None or child.proc.poll() is not None or child.widest > limit:
        if child is not None:
            child.end()
        _local.child = child = _Child(path)
    child.widest = max(child.widest, limit)
    return child


def _reapable(child: _Child) -> bool:
    """Whether another thread may end ``child``: its thread has ended, or (a thread not started by
    :mod:`threading`, which reads as alive for ever) its process has ended."""
    if isinstance(child.owner, getattr(threading, "_DummyThread", ())):
        return child.proc.poll() is not None
    return not child.owner.is_alive()


def end_thread_process() -> None:
    """End the calling thread's compile process: its next compile starts a new one."""
    child = getattr(_local, "child", None)
    _local.child = None
    if child is not None:
        child.end()


def thread_compile_process() -> int | None:
    """The process id of the calling thread's compile process, None before its first compile."""
    child = getattr(_local, "child", None)
    return child.pid if child is not None and child.proc.poll() is None else None


def compile_processes() -> list[int]:
    """The process ids of the compile processes running now (one per thread that compiled)."""
    return [c.pid for c in list(_children) if c.proc.poll() is None]


@atexit.register
def _end_children() -> None:
    for child in list(_children):
        child.end()


@lru_cache(maxsize=1)
def load_nvrtc() -> Nvrtc | None:
    """The first libnvrtc that loads and answers its version, or None."""
    for path in candidates():
        try:
            lib = Nvrtc(path)
        except (OSError, RuntimeError, AttributeError) as exc:
            log.debug("libnvrtc at %s not usable: %s", path, exc)
            continue
        log.debug("using %s (%s)", path, lib.version)
        return lib
    return None


def nvrtc_options(arch: str, flags: tuple[str, ...], include_dir: Path | None) -> list[str]:
    """NVRTC options for nvcc-style ``flags``: ``-O3`` is dropped (NVRTC optimises device code
    by default, as nvcc does), the rest is passed on; the target is a real ``sm_XX`` so NVRTC
    makes a cubin, and ``ptxas -v`` output goes to the log for the resource report."""
    opts = [f"--gpu-architecture={arch}", "--ptxas-options=-v"]
    opts += [f for f in flags if f not in ("-O3", "-O2")]
    if include_dir is not None:  # the toolkit's headers, and CCCL's (cuda/std/...), in include/cccl since CUDA 13
        opts += [f"--include-path={d}" for d in (include_dir / "cccl", include_dir) if d.is_dir()]
    return opts
