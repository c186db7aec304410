"""The compile service: cache hits and misses, failures as values, concurrency, ptxas parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sparserl.harness import nvrtc
from sparserl.harness.compile import (
    CompileOptions,
    available_backend,
    compile_many,
    compile_source,
    find_nvcc,
    parse_ptxas,
)
from sparserl.harness.compile import TOO_LARGE, TOO_SLOW

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
needs_nvrtc = pytest.mark.skipif(nvrtc.load_nvrtc() is None, reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
NVCC = CompileOptions(backend="nvcc")
NVRTC = CompileOptions(backend="nvrtc")

GOOD = """
extern "C" __global__ void spmv_kernel(int m, int n, int nnz, const int* __restrict__ row_ptr,
    const int* __restrict__ col_idx, const float* __restrict__ val, const float* __restrict__ x,
    float* __restrict__ y)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) { float s = 0.f; for (int j = row_ptr[i]; j < row_ptr[i + 1]; ++j) s += val[j] * x[col_idx[j]]; y[i] = s; }
}
"""


@needs_nvcc
def test_miss_then_hit(tmp_path: Path) -> None:
    first = compile_source(GOOD, cache_dir=tmp_path)
    assert first.ok and not first.cached and first.cubin_path and Path(first.cubin_path).stat().st_size > 0
    second = compile_source(GOOD, cache_dir=tmp_path)
    assert second.ok and second.cached and second.key == first.key and second.cubin_path == first.cubin_path
    assert second.seconds < first.seconds
    assert second.resources == first.resources and second.resources[0].name == "spmv_kernel"


@needs_nvcc
def test_key_depends_on_source_arch_and_flags(tmp_path: Path) -> None:
    a = compile_source(GOOD, cache_dir=tmp_path)
    b = compile_source(GOOD + "\n// changed\n", cache_dir=tmp_path)
    c = compile_source(GOOD, CompileOptions(arch="sm_80"), cache_dir=tmp_path)
    d = compile_source(GOOD, CompileOptions(flags=("-O1",)), cache_dir=tmp_path)
    assert len({a.key, b.key, c.key, d.key}) == 4
    assert not any(r.cached for r in (b, c, d))


@needs_nvcc
def test_compile_error_is_a_value_and_is_cached(tmp_path: Path) -> None:
    bad = GOOD.replace("s += val[j]", "s += undefined_thing[j]")
    r = compile_source(bad, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "compile_error" and "undefined_thing" in r.log and r.cubin_path is None
    again = compile_source(bad, cache_dir=tmp_path)
    assert again.cached and again.error_kind == "compile_error"
    assert str(tmp_path) not in r.log, "logs must not leak the temporary build folder"


@needs_nvcc
def test_timeout_is_a_value_and_not_cached(tmp_path: Path) -> None:
    r = compile_source(GOOD, CompileOptions(timeout_s=0.001, confirm_timeout_s=None), cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "timeout"
    assert compile_source(GOOD, cache_dir=tmp_path).ok


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
def test_a_timeout_is_built_again_and_past_the_longer_limit_is_the_sources(tmp_path: Path, backend: str) -> None:
    """A build past its limit is built again with ``confirm_timeout_s``: an honest kernel that was only
    slow (a loaded machine) then builds; one past the longer limit too is a ``compile_error``, cached,
    never again an infrastructure failure that learning loops leave out of their updates (a 700-character
    template that inlines itself twice a level reached the limit every time). Kills: no second build
    (the honest kernel lost as a timeout), the confirmed time-out left a ``timeout`` or not cached."""
    if (backend == "nvrtc" and nvrtc.load_nvrtc() is None) or (backend == "nvcc" and find_nvcc() is None):
        pytest.skip(f"{backend} not found")
    slow_machine = CompileOptions(backend=backend, timeout_s=1e-4, confirm_timeout_s=120.0)
    r = compile_source(GOOD + "// only slow\n", slow_machine, cache_dir=tmp_path)
    assert r.ok and r.error_kind is None
    bomb = CompileOptions(backend=backend, timeout_s=1e-4, confirm_timeout_s=2e-4)
    r = compile_source(GOOD + "// a bomb\n", bomb, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "compile_error" and "when built again" in r.log and TOO_SLOW in r.log, r.log
    again = compile_source(GOOD + "// a bomb\n", bomb, cache_dir=tmp_path)
    assert again.cached and again.error_kind == "compile_error"
    longer = compile_source(GOOD + "// a bomb\n", CompileOptions(backend=backend), cache_dir=tmp_path)
    assert longer.ok and not longer.cached  # refused under a smaller limit than these options give: built again
    with pytest.raises(ValueError, match="confirm_timeout_s"):
        CompileOptions(timeout_s=60.0, confirm_timeout_s=30.0)
    if backend == "nvrtc" and find_nvcc() is not None:  # under auto, such a source is not built with nvcc as well
        auto = compile_source(GOOD + "// another bomb\n", CompileOptions(timeout_s=1e-4, confirm_timeout_s=2e-4),
                              cache_dir=tmp_path)
        assert auto.error_kind == "compile_error" and auto.backend == "nvrtc" and "built again" in auto.log


INLINED_BOMB = """template <int N> __device__ __forceinline__ float g(float x) { return g<N - 1>(x * 1.1f) + g<N - 1>(x * 0.9f); }
template <> __device__ __forceinline__ float g<0>(float x) { return x; }
extern "C" __global__ void k(float* y) { y[0] = g<13>(y[1]); }
"""
"""8192 inlined bodies: NVRTC's back end and ptxas need about 150 MB for them (7 s)."""
LISTED_BOMB = """#define A1 1,1,1,1,1,1,1,1,1,1
#define A2 A1,A1,A1,A1,A1,A1,A1,A1,A1,A1
#define A3 A2,A2,A2,A2,A2,A2,A2,A2,A2,A2
#define A4 A3,A3,A3,A3,A3,A3,A3,A3,A3,A3
#define A5 A4,A4,A4,A4,A4,A4,A4,A4,A4,A4
__device__ const int table[] = {TABLE};
extern "C" __global__ void k(int* y) { y[0] = table[y[1]]; }
"""
"""A table of TABLE's entries: at 500k, the front end needs about 300 MB (2 s)."""


@pytest.mark.parametrize(("backend", "source", "limit_mb"), [
    ("nvrtc", LISTED_BOMB.replace("TABLE", "A5, A5, A5, A5, A5"), 60),  # the front end: its log says so
    ("nvrtc", INLINED_BOMB, 60),  # LLVM: "LLVM ERROR: out of memory" printed, the process ended
    ("nvrtc", INLINED_BOMB, 80),  # ptxas: "Memory allocation failure" printed, the log says "aborted"
    ("nvcc", LISTED_BOMB.replace("TABLE", "A5, " * 19 + "A5"), 120),  # the front end: "out of memory"
], ids=["nvrtc-front-end", "nvrtc-llvm", "nvrtc-ptxas", "nvcc-front-end"])
def test_a_build_out_of_memory_twice_is_the_sources(tmp_path: Path, backend: str, source: str, limit_mb: int) -> None:
    """A build that runs out of its memory limit is built once more; out of it again, while a trivial
    kernel builds under the same limit, it is a ``compile_error``, cached, never an infrastructure
    failure that learning loops leave out of their updates. The limits fall in different steps on
    this machine (the ids). Kills: the limit not applied (it builds), the compile process's printing
    not read (a machine's ``compiler_failure``, or a plain compile error), no confirming build ("built
    again" missing), the refusal not cached, or standing for a larger limit (NVRTC's front end)."""
    if (backend == "nvrtc" and nvrtc.load_nvrtc() is None) or (backend == "nvcc" and find_nvcc() is None):
        pytest.skip(f"{backend} not found")
    limited = CompileOptions(backend=backend, memory_limit_mb=limit_mb)
    r = compile_source(source, limited, cache_dir=tmp_path)
    assert r.error_kind == "compile_error" and TOO_LARGE in r.log and "built again" in r.log, r.log
    assert f"out of memory within its {limit_mb} MiB limit, and again when built again" in r.log, r.log
    again = compile_source(source, limited, cache_dir=tmp_path)
    assert again.cached and again.error_kind == "compile_error"
    if backend == "nvrtc" and source.startswith("#define"):
        unlimited = compile_source(source, CompileOptions(backend=backend, memory_limit_mb=None), cache_dir=tmp_path)
        assert unlimited.ok and not unlimited.cached, unlimited.log
    with pytest.raises(ValueError, match="memory_limit_mb"):
        CompileOptions(memory_limit_mb=0)


@needs_nvrtc
def test_a_smaller_limit_gets_a_process_that_never_had_more(tmp_path: Path) -> None:
    """Memory a compile process freed stays mapped to it, and a later compile may use it whatever its
    limit (the limit only stops new mappings; in the suite a process holding 218 MB from earlier
    compiles built ``INLINED_BOMB`` at 80 MiB): a compile under a smaller limit than the process ever
    had gets a new process; one under the same limit keeps it. Kills: the process kept."""
    def pid_after(limit_mb: int | None, tag: str) -> int:
        opts = CompileOptions(backend="nvrtc", memory_limit_mb=limit_mb)
        assert compile_source(GOOD + f"// {tag}\n", opts, cache_dir=tmp_path).ok
        return nvrtc.thread_compile_process()

    unlimited = pid_after(None, "no limit")
    limited = pid_after(512, "a limit")
    assert limited != unlimited and pid_after(512, "the same limit") == limited
    assert pid_after(1024, "a larger limit") == limited and pid_after(512, "smaller again") != limited


@needs_nvrtc
def test_running_out_of_memory_once_is_the_machines(tmp_path: Path, monkeypatch) -> None:
    """A first build out of memory (another process took it, say) is built again: an honest source
    then builds. Its compile process died the first time, printing LLVM's message (doubled here).
    Kills: the first memory failure taken as the source's (a cached ``compile_error``)."""
    lib = nvrtc.load_nvrtc()
    real, calls = lib.compile, []

    def once_out_of_memory(*args):
        calls.append(args)
        if len(calls) == 1:
            return nvrtc.NvrtcOutput("failure", None, "NVRTC's compile process ended: the process ended",
                                     printed="LLVM ERROR: out of memory\n")
        return real(*args)

    monkeypatch.setattr(lib, "compile", once_out_of_memory)
    r = compile_source(GOOD + "// once\n", NVRTC, cache_dir=tmp_path)
    assert r.ok and len(calls) == 2


@needs_nvrtc
def test_ptxas_out_of_memory_with_no_limit_is_the_machines(tmp_path: Path, monkeypatch) -> None:
    """With no memory limit, ptxas inside NVRTC that runs out prints "Memory allocation failure" only to the
    compile process's output, and its log says only that assembly aborted (a ``ptxas fatal`` line, which reads
    as the source's): the build is the machine's ``compiler_failure``, not cached, as the option documents.
    The output is the one NVRTC gives for ``INLINED_BOMB`` at 80 MiB. Kills: the process's output read only
    under a limit (a cached ``compile_error``)."""
    lib = nvrtc.load_nvrtc()
    calls = []

    def ptxas_out_of_memory(*args):
        calls.append(args)
        return nvrtc.NvrtcOutput("compile_error", None, "ptxas fatal   : Ptx assembly aborted due to errors\n",
                                 printed="ptxas fatal   : Memory allocation failure\n")

    monkeypatch.setattr(lib, "compile", ptxas_out_of_memory)
    opts = CompileOptions(backend="nvrtc", memory_limit_mb=None)
    for _ in range(2):
        r = compile_source(GOOD + "// no limit\n", opts, cache_dir=tmp_path)
        assert r.error_kind == "compiler_failure" and not r.cached and "with no memory limit" in r.log, r.log
    assert len(calls) == 2


def test_a_refusal_stands_until_options_give_more_of_what_it_ran_out_of() -> None:
    """A cached refusal is built again only under options that give more of what it ran out of: more
    memory for a memory refusal, a longer first limit or (confirmed ones) a longer confirming limit
    for a time-out. Kills: the confirming limit compared with the next first limit (a source given
    600 s to confirm kept refused at 120), a memory refusal rebuilt for more time, a time-out for more
    memory."""
    from sparserl.harness.compile import _given_more, _refused_within

    default = CompileOptions()
    confirmed = _refused_within("timeout", default, 120.0)
    assert not _given_more(confirmed, default)
    assert _given_more(confirmed, CompileOptions(timeout_s=60.0, confirm_timeout_s=600.0))
    assert _given_more(confirmed, CompileOptions(timeout_s=100.0, confirm_timeout_s=120.0))
    assert not _given_more(confirmed, CompileOptions(timeout_s=30.0, confirm_timeout_s=120.0))
    assert not _given_more(confirmed, CompileOptions(memory_limit_mb=None))
    busy = _refused_within("timeout", default, None)  # refused at once: used its 60 s computing
    assert not _given_more(busy, CompileOptions(confirm_timeout_s=600.0))
    assert _given_more(busy, CompileOptions(timeout_s=90.0))
    memory = _refused_within("memory", CompileOptions(memory_limit_mb=512), 120.0)
    assert not _given_more(memory, CompileOptions(memory_limit_mb=512, timeout_s=600.0, confirm_timeout_s=900.0))
    assert _given_more(memory, CompileOptions(memory_limit_mb=1024)) and _given_more(memory, CompileOptions(
        memory_limit_mb=None))
    assert not _given_more(None, default)


@needs_nvcc
def test_a_hard_limit_below_the_options_is_the_limit_applied(tmp_path: Path) -> None:
    """A process whose hard ``RLIMIT_DATA`` is below ``memory_limit_mb`` cannot raise it: nvcc's
    steps get the hard limit, and an honest kernel builds. Kills: ``ulimit -d`` asked for more than
    the hard limit (the shell fails, every nvcc build a ``compiler_failure``)."""
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (1500 << 20, 1500 << 20))\n"
        "from sparserl.harness.compile import CompileOptions, compile_source, memory_limit_applied\n"
        "o = CompileOptions(backend='nvcc')\n"
        f"r = compile_source(sys.stdin.read(), o, cache_dir={str(tmp_path)!r})\n"
        "print(memory_limit_applied(o), r.ok, r.error_kind, r.log[-300:].replace(chr(10), ' '))\n")
    done = subprocess.run([sys.executable, "-c", script], input=GOOD, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("1500 True None"), done.stdout


@needs_nvrtc
def test_the_compile_process_keeps_no_driver_cache_and_no_core(tmp_path: Path) -> None:
    """NVRTC's process runs without the driver's compile cache (where a driver is installed, NVRTC 13
    returns a cubin it has compiled before, even for a source that differs in its comments, with an
    empty log: no ``ptxas -v`` report for the resource limits) and without core files (a compile
    out of its memory aborts). Kills: ``CUDA_CACHE_DISABLE`` not set, ``RLIMIT_CORE`` left as it was."""
    assert compile_source(GOOD + "// environment\n", NVRTC, cache_dir=tmp_path).ok
    pid = nvrtc.thread_compile_process()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"CUDA_CACHE_DISABLE=1" in environ
    limits = Path(f"/proc/{pid}/limits").read_text()
    core = next(line for line in limits.splitlines() if line.startswith("Max core file size"))
    assert core.split()[4:6] == ["0", "0"], core


@needs_nvrtc
def test_a_build_without_its_resource_report_is_not_trusted(tmp_path: Path, monkeypatch) -> None:
    """A cubin without the ``ptxas -v`` report of every kernel (what a driver's cache hit gave) would
    pass the register and shared-memory limits unread: a ``compiler_failure``, not cached. The real
    build's log is emptied here. Kills: the check removed (the build cached with no resources)."""
    lib = nvrtc.load_nvrtc()
    real = lib.compile
    monkeypatch.setattr(lib, "compile", lambda *a: replace(real(*a), log=""))
    r = compile_source(GOOD + "// no report\n", NVRTC, cache_dir=tmp_path)
    assert r.error_kind == "compiler_failure" and "spmv_kernel" in r.log, r.log
    monkeypatch.setattr(lib, "compile", real)
    again = compile_source(GOOD + "// no report\n", NVRTC, cache_dir=tmp_path)
    assert again.ok and not again.cached and again.resources_of("spmv_kernel") is not None


@needs_nvrtc
def test_a_thread_never_ends_another_living_threads_process(tmp_path: Path) -> None:
    """A compile process that died (out of memory, say) belongs to its thread until that thread reads
    what it printed: another thread's compile must not end it and close its pipes and error file
    meanwhile (its out-of-memory report was lost, and its numbers could name another file). Kills:
    reaping every ended process, whatever its thread."""
    import signal
    import threading
    import time

    ready, finish, held = threading.Event(), threading.Event(), {}

    def owner() -> None:
        assert compile_source(GOOD + "// owner\n", NVRTC, cache_dir=tmp_path).ok
        held["child"] = nvrtc._local.child
        ready.set()
        finish.wait(30)

    t = threading.Thread(target=owner)
    t.start()
    try:
        assert ready.wait(60)
        child = held["child"]
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while child.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert compile_source(GOOD + "// another thread\n", NVRTC, cache_dir=tmp_path).ok
        assert child.err >= 0 and child in nvrtc._children  # still its owner's to read
    finally:
        finish.set()
        t.join()
    assert compile_source(GOOD + "// after the owner\n", NVRTC, cache_dir=tmp_path).ok
    assert child not in nvrtc._children and child.err == -1  # its thread ended: reaped


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
@pytest.mark.parametrize("limit_mb", [2048, None])
def test_a_source_that_writes_out_of_memory_is_its_own_compile_error(tmp_path: Path, backend: str,
                                                                     limit_mb: int | None) -> None:
    """``#error`` with the words of a compiler out of memory, ``x:1:`` before them so that gcc's
    ``kernel.cu:1:2: error:`` line could pass for a located catastrophic error: the source's compile
    error at the first build, with or without a limit. Kills: the file part of the pattern allowed a
    colon (with no limit, a ``compiler_failure`` the source chose; with one, three builds and a false
    TOO_LARGE)."""
    if (backend == "nvrtc" and nvrtc.load_nvrtc() is None) or (backend == "nvcc" and find_nvcc() is None):
        pytest.skip(f"{backend} not found")
    source = "#error x:1: catastrophic error: out of memory\n" + GOOD
    r = compile_source(source, CompileOptions(backend=backend, memory_limit_mb=limit_mb), cache_dir=tmp_path)
    assert r.error_kind == "compile_error" and TOO_LARGE not in r.log and "built again" not in r.log, r.log


@needs_nvrtc
def test_the_trivial_kernel_builds_in_a_new_process(tmp_path: Path) -> None:
    """The trivial kernel that tells a source out of memory from a machine out of it builds in a new
    compile process: the failed build's freed memory stays mapped to the old one, where the kernel
    would build whatever the machine has left. Kills: the probe run in the process that failed."""
    from sparserl.harness.compile import _probe_builds

    assert compile_source(GOOD + "// before\n", NVRTC, cache_dir=tmp_path).ok
    before = nvrtc.thread_compile_process()
    assert _probe_builds("nvrtc", NVRTC)
    assert nvrtc.thread_compile_process() not in (None, before)


@needs_nvrtc
def test_the_process_of_a_thread_threading_did_not_start_is_reaped(tmp_path: Path) -> None:
    """A thread not started by :mod:`threading` (a C library's, Ray's) reads as alive for ever: its
    compile process is reaped once the process has ended (its death signal follows the thread).
    Kills: only threads that read as ended reaped (a zombie and three descriptors per such thread)."""
    import _thread
    import time

    done, held = _thread.allocate_lock(), {}
    done.acquire()

    def foreign() -> None:
        try:
            assert compile_source(GOOD + "// foreign\n", NVRTC, cache_dir=tmp_path).ok
            held["child"] = nvrtc._local.child
        finally:
            done.release()

    _thread.start_new_thread(foreign, ())
    assert done.acquire(timeout=60)
    child = held["child"]
    deadline = time.monotonic() + 10
    while child.proc.poll() is None and time.monotonic() < deadline:  # the thread's end sends the death signal
        time.sleep(0.02)
    assert compile_source(GOOD + "// after the foreign thread\n", NVRTC, cache_dir=tmp_path).ok
    assert child not in nvrtc._children and child.err == -1


@needs_nvrtc
def test_what_the_compile_process_prints_is_read_once(tmp_path: Path) -> None:
    """The NVRTC process's standard error is read per compile: a compile's ``printed`` holds what was
    written during it, and the next compile starts empty. Kills: the error stream not captured, or
    never emptied (one compile's ptxas failure blamed on every later source)."""
    lib = nvrtc.load_nvrtc()
    opts = nvrtc.nvrtc_options("sm_90", ("-O3",), None)
    first = lib.compile(INLINED_BOMB, opts, 60.0, 80)  # ptxas runs out: it prints, the log says only "aborted"
    second = lib.compile(GOOD, opts, 60.0, None)
    assert first.status in ("compile_error", "failure") and "memory" in (first.log + first.printed).lower()
    assert second.status == "ok" and second.printed == ""


@needs_nvcc
def test_a_timed_out_nvcc_leaves_nothing_running(tmp_path: Path, monkeypatch) -> None:
    """nvcc runs cicc and ptxas through a shell: killing nvcc alone at its limit left them compiling
    (gigabytes and a core each, for as long as the source asked). The whole group is ended. Kills:
    only the driver killed (subprocess.run's time-out), the group not started as a session."""
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this build's folder, so its processes are known
    source = BOMB.replace("BOMB_DEPTH", "30")
    r = compile_source(source, CompileOptions(backend="nvcc", timeout_s=2.0, confirm_timeout_s=None),
                       cache_dir=tmp_path)
    assert r.error_kind == "timeout"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _compilers_on(tmp_path):
        time.sleep(0.2)
    assert not _compilers_on(tmp_path), subprocess.run(["ps", "aux"], capture_output=True, text=True).stdout[-2000:]


BOMB = """template <int N> __device__ __forceinline__ float f(const float* x, int i, int n, float s) {
  if constexpr (N == 0) return s * 1.0001f + x[(i + N) % n];
  else return f<N - 1>(x, i + 1, n, s) + f<N - 1>(x, i * 3, n, s * 0.5f);
}
extern "C" __global__ void spmv_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = f<BOMB_DEPTH>(x, i, n, 0.f);
}
"""
"""A source that inlines itself twice a level: 2^BOMB_DEPTH bodies (at 30, no compiler finishes)."""


def _compilers_on(tmp: Path) -> list[str]:
    """The processes still running whose command line names a folder under ``tmp`` (a build's)."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if str(tmp) in line and "ps -ww" not in line]


def test_missing_compiler_is_a_value(tmp_path: Path, monkeypatch) -> None:
    r = compile_source(GOOD, CompileOptions(nvcc=str(tmp_path / "no-nvcc"), backend="nvcc"), cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "no_compiler" and "nvcc" in r.log
    monkeypatch.setattr(nvrtc, "load_nvrtc", lambda: None)
    r = compile_source(GOOD, NVRTC, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "no_compiler" and "NVRTC" in r.log
    r = compile_source(GOOD, CompileOptions(nvcc=str(tmp_path / "no-nvcc")), cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "no_compiler" and "NVRTC or nvcc" in r.log


def test_bad_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        CompileOptions(backend="clang")


def test_nvrtc_options_translate_nvcc_flags(tmp_path: Path) -> None:
    (tmp_path / "cccl").mkdir()
    opts = nvrtc.nvrtc_options("sm_90", ("-O3", "--std=c++17", "-DX=1"), tmp_path)
    assert opts == ["--gpu-architecture=sm_90", "--ptxas-options=-v", "--std=c++17", "-DX=1",
                    f"--include-path={tmp_path / 'cccl'}", f"--include-path={tmp_path}"]
    assert nvrtc.nvrtc_options("sm_80", (), None) == ["--gpu-architecture=sm_80", "--ptxas-options=-v"]


@needs_nvrtc
def test_nvrtc_builds_caches_and_reports_like_nvcc(tmp_path: Path) -> None:
    first = compile_source(GOOD, NVRTC, cache_dir=tmp_path)
    assert first.ok and first.backend == "nvrtc" and not first.cached and Path(first.cubin_path).stat().st_size > 0
    assert Path(first.cubin_path).read_bytes()[:4] == b"\x7fELF"  # a cubin, not PTX
    again = compile_source(GOOD, NVRTC, cache_dir=tmp_path)
    assert again.cached and again.key == first.key and again.backend == "nvrtc"
    assert available_backend(CompileOptions()) == "nvrtc"  # auto prefers it
    if find_nvcc() is not None:
        by_nvcc = compile_source(GOOD, NVCC, cache_dir=tmp_path)
        assert by_nvcc.key != first.key and by_nvcc.backend == "nvcc"
        assert by_nvcc.resources == first.resources and first.resources[0].name == "spmv_kernel"


@needs_nvrtc
def test_nvrtc_errors_and_timeouts_are_values(tmp_path: Path) -> None:
    bad = GOOD.replace("s += val[j]", "s += undefined_thing[j]")
    r = compile_source(bad, NVRTC, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "compile_error" and "undefined_thing" in r.log and r.cubin_path is None
    assert compile_source(bad, NVRTC, cache_dir=tmp_path).cached
    slow = compile_source(GOOD + "// timeout\n", CompileOptions(backend="nvrtc", timeout_s=1e-4, confirm_timeout_s=None),
                          cache_dir=tmp_path)
    assert not slow.ok and slow.error_kind == "timeout" and "limit" in slow.log
    assert compile_source(GOOD + "// timeout\n", NVRTC, cache_dir=tmp_path).ok  # not cached as failed


@needs_nvrtc
@needs_nvcc
def test_auto_builds_with_nvcc_what_nvrtc_rejects(tmp_path: Path) -> None:
    """<stdint.h> is a host header: NVRTC has none, nvcc finds the system's; a verdict must not
    depend on which backend the machine has, so 'auto' asks nvcc too."""
    src = "#include <stdint.h>\n" + GOOD
    strict = compile_source(src, NVRTC, cache_dir=tmp_path)
    assert not strict.ok and "stdint.h" in strict.log
    auto = compile_source(src, cache_dir=tmp_path)
    assert auto.ok and auto.backend == "nvcc"
    broken = compile_source(GOOD.replace("y[i] = s;", "y[i] = s"), cache_dir=tmp_path)
    assert not broken.ok and broken.error_kind == "compile_error" and broken.backend == "nvcc"


@needs_nvcc
def test_concurrent_processes_build_once(tmp_path: Path) -> None:
    """Four processes compile the same new source at once: all succeed, one builds."""
    src = GOOD + "\n// concurrency test\n"
    code = (
        "import json, sys; from sparserl.harness.compile import compile_source; "
        f"r = compile_source({src!r}, cache_dir={str(tmp_path)!r}); "
        "print(json.dumps({'ok': r.ok, 'cached': r.cached, 'key': r.key}))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(o["ok"] for o in outs)
    assert len({o["key"] for o in outs}) == 1
    assert sum(not o["cached"] for o in outs) == 1
    assert len(list(tmp_path.rglob("*.cubin"))) == 1


@needs_nvcc
def test_compile_many_keeps_order_and_reports_progress(tmp_path: Path) -> None:
    sources = [GOOD.replace("s = 0.f", f"s = {i}.f") for i in range(4)]
    seen = []
    results = compile_many(sources, cache_dir=tmp_path, jobs=2, on_done=lambda i, r: seen.append(i))
    assert sorted(seen) == [0, 1, 2, 3]
    assert [r.key for r in results] == [compile_source(s, cache_dir=tmp_path).key for s in sources]


def test_parse_ptxas() -> None:
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spmv_zero_y' for 'sm_90'
ptxas info    : Function properties for spmv_zero_y
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'spmv_kernel' for 'sm_90'
ptxas info    : Function properties for spmv_kernel
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 14356 bytes smem, 400 bytes cmem[0]
"""
    a, b = parse_ptxas(text)
    assert (a.name, a.registers, a.smem_bytes, a.stack_bytes) == ("spmv_zero_y", 8, 0, 0)
    assert (b.name, b.registers, b.smem_bytes, b.stack_bytes, b.spill_store_bytes, b.spill_load_bytes) == (
        "spmv_kernel", 40, 14356, 16, 4, 8)


@needs_nvrtc
def test_a_library_that_cannot_compile_is_not_used(monkeypatch) -> None:
    """A libnvrtc that answers its version but cannot build (its builtins library missing, say)."""
    monkeypatch.setattr(nvrtc.Nvrtc, "_compile", lambda self, src, opts: nvrtc.NvrtcOutput("failure", None, "broken"))
    with pytest.raises(RuntimeError, match="trivial kernel"):
        nvrtc.Nvrtc(nvrtc.load_nvrtc().path)


@needs_nvrtc
def test_an_nvrtc_failure_is_not_cached_and_auto_asks_nvcc(tmp_path: Path, monkeypatch) -> None:
    lib = nvrtc.load_nvrtc()
    real = lib.compile
    monkeypatch.setattr(lib, "compile", lambda *a: nvrtc.NvrtcOutput("failure", None, "NVRTC failed: out of memory"))
    r = compile_source(GOOD, NVRTC, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "compiler_failure" and "out of memory" in r.log
    if find_nvcc() is not None:
        auto = compile_source(GOOD, cache_dir=tmp_path)
        assert auto.ok and auto.backend == "nvcc"
    monkeypatch.setattr(lib, "compile", real)
    again = compile_source(GOOD, NVRTC, cache_dir=tmp_path)
    assert again.ok and not again.cached  # the failure was not remembered


@needs_nvrtc
def test_a_timed_out_nvrtc_compile_is_ended_with_its_process(tmp_path: Path) -> None:
    """A running NVRTC call cannot be stopped in its process: in a thread, a source that inlines
    itself twice a level kept a core and gigabytes after its time-out. Each compile thread's NVRTC
    runs in a process of its own, ended at the limit; the next compile starts a new one and builds.
    Kills: the compile back in a thread (the process would still run), the process not ended at the
    limit, a dead process reused (the next compile would fail)."""
    import threading

    assert compile_source(GOOD + "// warm\n", NVRTC, cache_dir=tmp_path).ok
    pid = nvrtc.thread_compile_process()
    assert pid is not None and pid in nvrtc.compile_processes()
    r = compile_source(BOMB.replace("BOMB_DEPTH", "30"), CompileOptions(backend="nvrtc", timeout_s=2.0,
                                                                        confirm_timeout_s=None), cache_dir=tmp_path)
    assert r.error_kind == "timeout" and "ended" in r.log
    assert pid not in nvrtc.compile_processes() and nvrtc.thread_compile_process() is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, reaped
    assert compile_source(GOOD + "// after\n", NVRTC, cache_dir=tmp_path).ok
    got = []
    t = threading.Thread(target=lambda: got.append((compile_source(GOOD + "// thread\n", NVRTC, cache_dir=tmp_path),
                                                    nvrtc.thread_compile_process())))
    t.start()
    t.join()
    assert got[0][0].ok and got[0][1] not in (None, nvrtc.thread_compile_process())  # its own process


def test_candidate_log_keeps_only_the_candidates_own_lines() -> None:
    from sparserl.harness.compile import candidate_log

    raw = "\n".join([
        'kernel.cu(4): error: identifier "q" is undefined',
        "      y[i] = q;",
        "             ^",
        "",
        '/secret/dir/other.h(1): error: expected a declaration',
        "  SECRET LINE OF ANOTHER FILE",
        "  ^",
        "In file included from kernel.cu:1:",
        "/usr/include/x.h:3:1: error: unknown type name 'SECRET2'",
        "kernel.cu:9:5: warning: unused variable",
        "ptxas info    : Used 12 registers, used 0 barriers",
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        '2 errors detected in the compilation of "kernel.cu".',
    ])
    out = candidate_log(raw)
    assert "SECRET" not in out and "/secret" not in out and "x.h" not in out
    for kept in ('identifier "q"', "y[i] = q;", "unused variable", "Used 12 registers", "0 bytes stack frame",
                 "2 errors detected"):
        assert kept in out


@pytest.mark.parametrize("backend", ["nvrtc", "nvcc"])
def test_no_line_of_another_file_reaches_the_log(tmp_path: Path, backend: str) -> None:
    if (backend == "nvrtc" and nvrtc.load_nvrtc() is None) or (backend == "nvcc" and find_nvcc() is None):
        pytest.skip(f"{backend} not found")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET_MARKER line one of a private file\nsecond TOPSECRET line\n")
    src = f'#include "{secret}"\n' + GOOD
    res = compile_source(src, CompileOptions(backend=backend), cache_dir=tmp_path / "cache")
    assert not res.ok and res.error_kind == "compile_error"
    assert "TOPSECRET" not in res.log and str(tmp_path) not in res.log, res.log


def _wrapper(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@needs_nvcc
def test_nvcc_out_of_memory_is_a_compiler_failure_and_not_cached(tmp_path: Path) -> None:
    """Kills the mutation that cached a compiler crash without "nvcc fatal" as the source's compile
    error: the real nvcc run under a virtual-memory limit fails (a catastrophic "out of memory" at
    exit code 1, or a segfault, depending on where the limit bites) and must not be remembered."""
    real = find_nvcc()
    failed = None
    for limit_kb in (120000, 100000, 90000, 60000):
        nvcc = _wrapper(tmp_path / f"nvcc{limit_kb}", f'ulimit -v {limit_kb}\nexec "{real}" "$@"\n')
        r = compile_source(GOOD, CompileOptions(backend="nvcc", nvcc=nvcc), cache_dir=tmp_path / "cache")
        if not r.ok:
            failed = (nvcc, r)
            break
    if failed is None:
        pytest.skip("nvcc built the kernel under every memory limit tried")
    nvcc, r = failed
    # out of memory twice under the wrapper's limit, and so is a trivial kernel: the machine's, not the source's
    # (kills the trivial kernel's build left out of the rule), or killed by a signal
    assert r.error_kind == "compiler_failure" and ("nvcc failed on its own" in r.log or "so did a trivial kernel"
                                                   in r.log), r.log
    assert not list((tmp_path / "cache").rglob("*.json")), "a compiler failure was cached"
    again = compile_source(GOOD, CompileOptions(backend="nvcc", nvcc=nvcc), cache_dir=tmp_path / "cache")
    assert not again.cached and again.error_kind == "compiler_failure"


@needs_nvcc
def test_a_step_killed_by_a_signal_is_a_compiler_failure(tmp_path: Path) -> None:
    """nvcc's host preprocessor killed by SIGSEGV while it reads the candidate: nvcc exits 139 and
    prints no "nvcc fatal"; the build is not the source's compile error."""
    import shutil

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc for nvcc's host steps")
    ccbin = _wrapper(tmp_path / "gcc", f'case "$*" in *kernel.cu*) kill -SEGV $$ ;; esac\nexec "{gcc}" "$@"\n')
    opts = CompileOptions(backend="nvcc", flags=("-O3", "--std=c++17", "-ccbin", ccbin))
    r = compile_source(GOOD, opts, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "compiler_failure" and "signal 11" in r.log, r.log
    assert not list(tmp_path.rglob("*.json"))


@needs_nvcc
@pytest.mark.parametrize("directive", ['#error "out of memory"', "#warning nvcc fatal : Killed",
                                       '#error "died due to signal 9"'])
def test_the_candidates_own_text_cannot_make_its_error_a_machine_fault(tmp_path: Path, directive: str) -> None:
    """A completion that prints machine-fault words through #error/#warning still gets (and caches)
    its compile error: otherwise it could escape the compile-failure reward as an infrastructure
    failure."""
    bad = directive + "\n" + GOOD.replace("s += val[j]", "s += undefined_thing[j]")
    r = compile_source(bad, NVCC, cache_dir=tmp_path)
    assert not r.ok and r.error_kind == "compile_error", r.log
    assert compile_source(bad, NVCC, cache_dir=tmp_path).cached


def test_build_failure_kind_reads_what_compilers_print() -> None:
    from sparserl.harness.compile import build_failure_kind

    source = 'kernel.cu(3): error: identifier "x" is undefined\n\n1 error detected in the compilation of "kernel.cu".\n'
    assert build_failure_kind(source, 1) == ("compile_error", None)
    assert build_failure_kind("ptxas error   : Entry function 'k' uses too much shared data (0x3a980 bytes, "
                              "0xc000 max)\n", 255) == ("compile_error", None)
    assert build_failure_kind("ptxas fatal   : Unresolved extern function '_Z3foof'\n", 255)[0] == "compile_error"
    machine = ["/usr/include/stdio.h(723): catastrophic error: out of memory\n  extern void rewind (FILE *__stream);\n"
               '              ^\n\n1 catastrophic error detected in the compilation of "kernel.cu".\n',
               "nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)\n",
               "nvcc error   : 'ptxas' core dumped\n",
               "ptxas fatal   : Memory allocation failure\n",
               "nvcc fatal   : Unsupported gpu architecture 'compute_10'\n",
               "nvcc: error while loading shared libraries: libm.so.6: failed to map segment from shared object\n",
               ""]
    for text in machine:
        kind, why = build_failure_kind(text, 1)
        assert kind == "compiler_failure" and why, text
    assert build_failure_kind(source, -9)[0] == "compiler_failure"  # killed, whatever it printed first
    assert build_failure_kind("Segmentation fault\n", 139)[1] == "a step was killed by signal 11"
    own = 'kernel.cu:1:2: error: #error "out of memory"\n    1 | #error "out of memory"\n      |  ^~~~~\n'
    assert build_failure_kind(own, 1) == ("compile_error", None)
    # under a memory limit, a step's own report of running out is read first, never the candidate's text: an
    # honest comment quoted under a diagnostic is not a memory failure (kills the search over the whole log)
    assert build_failure_kind(own, 1, memory_limited=True) == ("compile_error", None)
    quoted = ('kernel.cu(1): catastrophic error: cannot open source file "stdint.h"\n'
              '  #include <stdint.h> // without it the table would run out of memory\n'
              '                      ^\n\n1 catastrophic error detected in the compilation of "kernel.cu".\n')
    assert build_failure_kind(quoted, 1, memory_limited=True) == ("compile_error", None)
    forged = ['kernel.cu(1): error: #error directive: x: catastrophic error: out of memory\n',
              'kernel.cu:1:2: error: #error x:1: catastrophic error: out of memory\n    1 | #error x:1: catastrophic\n',
              'kernel.cu(2): error: static assertion failed with "a: catastrophic error: out of memory"\n',
              'kernel.cu:1:2: error: #error : virtual memory exhausted\n']
    for text in forged:  # the candidate's own text, limit or none: its compile error (kills a looser pattern)
        assert build_failure_kind(text, 1, memory_limited=True) == ("compile_error", None), text
        assert build_failure_kind(text, 1) == ("compile_error", None), text
    assert build_failure_kind("kernel.cu(7): catastrophic error: out of memory\n", 1)[0] == "compiler_failure"
    for text in ("LLVM ERROR: out of memory\n", "ptxas fatal   : Memory allocation failure\n",
                 "cc1plus: virtual memory exhausted: Cannot allocate memory\n",
                 "kernel.cu(7): catastrophic error: out of memory\n",
                 "<command-line>(1): catastrophic error: out of memory\n",
                 'Loop in catastrophic error processing.\n2 catastrophic errors detected in the compilation of "kernel.cu".\n'):
        assert build_failure_kind(text, 1, memory_limited=True)[0] == "memory", text
    assert build_failure_kind("nvcc error   : 'cicc' died due to signal 9\n", 1, memory_limited=True)[0] == \
        "compiler_failure"  # killed, not out of its limit: the machine's


def test_a_build_that_used_its_limit_computing_is_the_sources_at_once(tmp_path: Path, monkeypatch) -> None:
    """A build stopped at its limit after using most of it in CPU time was not slowed by the machine:
    no second build, a cached ``compile_error`` that says so; one starved of CPU is built again.
    The CPU reading is doubled here (the real one is tested below). Kills: the rule removed (the
    source built again: "built again" in the log), the reading ignored for NVRTC or nvcc."""
    from sparserl.harness import compile as C

    for backend, module, reading in (("nvcc", C, "group_cpu_seconds"), ("nvrtc", nvrtc, "process_cpu_seconds")):
        if (backend == "nvrtc" and nvrtc.load_nvrtc() is None) or (backend == "nvcc" and find_nvcc() is None):
            continue
        seen = iter([0.0, 1e9] if backend == "nvrtc" else [1e9])  # NVRTC's: before its request and at the limit
        monkeypatch.setattr(module, reading, lambda pid: next(seen))
        r = compile_source(GOOD + f"// busy {backend}\n", CompileOptions(backend=backend, timeout_s=1e-4,
                                                                         confirm_timeout_s=2e-4), cache_dir=tmp_path)
        assert r.error_kind == "compile_error" and "not slowed by the machine" in r.log and "built again" not in r.log, r.log
        monkeypatch.setattr(module, reading, lambda pid: 0.0)
        r = compile_source(GOOD + f"// starved {backend}\n", CompileOptions(backend=backend, timeout_s=1e-4),
                           cache_dir=tmp_path)
        assert r.ok  # built again with the longer limit


def test_the_cpu_a_process_group_used_is_read_whole() -> None:
    """:func:`group_cpu_seconds` counts every process of the group (a sleeping leader and its busy
    child: the child's time) and nothing of other groups. Kills: the leader alone counted, the
    fields misread (the name in parentheses may hold spaces)."""
    import signal
    import time

    from sparserl.harness.processes import group_cpu_seconds

    spin = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'while True: pass'])\ntime.sleep(60)\n"
    p = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(1.5)
        used = group_cpu_seconds(p.pid)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert used is not None and used > 0.5, used  # the busy child's; the leader only sleeps
    assert group_cpu_seconds(os.getpgrp()) is not None and group_cpu_seconds(2**22 + 12345) == 0.0


@needs_nvcc
@needs_nvrtc
def test_what_nvrtc_rejects_and_nvcc_times_out_on_is_built_again_too(tmp_path: Path, monkeypatch) -> None:
    """Under 'auto' a source NVRTC rejects is built with nvcc as well; that build's time-out is
    confirmed like any other (a source can steer itself there: ``#error`` under ``__CUDACC_RTC__``;
    NVRTC's rejection is doubled here so that only nvcc meets the tiny limits). Kills: the nvcc build
    without the second look (its time-out an infrastructure failure)."""
    lib = nvrtc.load_nvrtc()
    monkeypatch.setattr(lib, "compile", lambda *a: nvrtc.NvrtcOutput("compile_error", None,
                                                                    "kernel.cu(2): error: #error directive: not here"))
    r = compile_source(GOOD + "// slow nvcc\n", CompileOptions(timeout_s=1e-4), cache_dir=tmp_path)
    assert r.ok and r.backend == "nvcc"
    r = compile_source(GOOD + "// bomb nvcc\n", CompileOptions(timeout_s=1e-4, confirm_timeout_s=2e-4),
                       cache_dir=tmp_path)
    assert r.error_kind == "compile_error" and r.backend == "nvcc" and "built again" in r.log


@needs_nvrtc
def test_nvrtc_compiles_with_a_thousand_files_open(tmp_path: Path) -> None:
    """A process holding 1024 or more descriptors (a trainer with many files and sockets): the pipe of
    its compile process is then numbered past what ``select.select`` takes. Kills: select.select back
    (every NVRTC compile a compiler_failure)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"this process may open only {soft} files")
    nvrtc.end_thread_process()  # a new process, so its pipes take the high numbers
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        r = compile_source(GOOD + "// many files\n", NVRTC, cache_dir=tmp_path)
    finally:
        for fd in held:
            os.close(fd)
    assert r.ok, r.log


@needs_nvrtc
def test_an_interrupted_compile_never_answers_the_next_one(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C between a request and its answer left the answer in the pipe, and the next compile on the
    thread read it: another source's kernel, cached under the new source's key. The process is ended
    instead. Kills: the process kept after an interruption (the next PTX names the first kernel)."""
    first = GOOD.replace("spmv_kernel", "first_kernel") + "// interrupted\n"
    second = GOOD.replace("spmv_kernel", "second_kernel") + "// next\n"
    assert compile_source(GOOD + "// start\n", NVRTC, cache_dir=tmp_path).ok
    real = nvrtc._Child._read
    calls = []

    def interrupted(self, timeout_s):
        if not calls:
            calls.append(1)
            import time

            time.sleep(1.0)  # the answer arrives meanwhile
            raise KeyboardInterrupt
        return real(self, timeout_s)

    monkeypatch.setattr(nvrtc._Child, "_read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compile_source(first, NVRTC, cache_dir=tmp_path)
    monkeypatch.setattr(nvrtc._Child, "_read", real)
    r = compile_source(second, NVRTC, cache_dir=tmp_path)
    assert r.ok and r.resources_of("second_kernel") is not None and r.resources_of("first_kernel") is None


@needs_nvrtc
def test_the_process_of_a_thread_that_ended_is_reaped(tmp_path: Path) -> None:
    """The death signal of a compile process follows the thread that started it: when that thread
    ends the process ends, and the next compile reaps it (no zombie, no open pipes piling up).
    Kills: ended processes never reaped."""
    import threading
    import time

    pids = []

    def one(i: int) -> None:
        assert compile_source(GOOD + f"// thread {i}\n", NVRTC, cache_dir=tmp_path).ok
        pids.append(nvrtc.thread_compile_process())

    for i in range(3):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        t.join()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert compile_source(GOOD + "// after the threads\n", NVRTC, cache_dir=tmp_path).ok
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: not even a zombie


def _alive(pid: int) -> bool:
    """Running (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
