"""Compile CUDA device code to a cubin with NVRTC or nvcc, cached on disk by content hash.

* Two backends (``CompileOptions.backend``): NVRTC, in process and about 5x faster per
  kernel (:mod:`sparserl.harness.nvrtc`; found with CuPy's CUDA 13 build on the GPU machine,
  or the ``nvidia-cuda-nvrtc`` wheel), and nvcc (the CUDA toolkit; what a machine without
  NVRTC uses). ``auto`` (the default) takes NVRTC when it loads, else nvcc. A source NVRTC
  rejects is built again with nvcc when nvcc is there, so a verdict never depends on which
  backend a machine has (nvcc finds host headers such as ``stdint.h`` that NVRTC lacks).
* The cache key hashes the source, the target architecture, the flags and the compiler
  (backend and version), so a cached cubin is only reused for exactly the same build.
* Concurrent processes share the cache safely: a build takes a per-key file lock and
  looks in the cache again once it holds the lock (the first one builds, the others
  read its result). Files are written under a temporary name and renamed into place.
* Compiles run in parallel across CPU cores (:func:`compile_many`) with a time limit each.
* Works without a GPU: only nvcc or NVRTC is needed, so CI compiles the whole kernel library.
* ``ptxas -v`` (from either backend) is parsed into :class:`KernelResources` per kernel (registers, static
  shared memory, stack frame, spills) for resource penalties.
* The PTX each build produced is inspected (:mod:`sparserl.harness.ptx_check`: clocks, SM ids, traps,
  calls leaving the module, writes to module-scope data) and the verdict cached with the build, as
  is whether the code uses atomics (which decides how its determinism re-run is judged).
* The log a caller sees keeps only the compiler's lines about the candidate's own text
  (:func:`candidate_log`): a diagnostic located in any other file, with the lines it quotes, is
  dropped, so no file on the machine can reach a message, a reward or training data.

Failures are values (:class:`CompileResult` with ``ok=False`` and an ``error_kind``),
never exceptions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from filelock import FileLock

from sparserl.harness.processes import group_cpu_seconds
from sparserl.harness.ptx_check import RULES_VERSION as PTX_RULES_VERSION
from sparserl.harness.ptx_check import check_ptx

log = logging.getLogger(__name__)

LOG_TAIL_CHARS = 4000
BACKENDS = ("auto", "nvrtc", "nvcc")
_CACHE_FORMAT = 2  # bump when the cached metadata changes meaning (2: PTX verdict, filtered log)
SOURCE_NAME = "kernel.cu"
"""The name the candidate's text is compiled under (both backends); log lines about it are kept."""


@dataclass(frozen=True)
class CompileOptions:
    """How to build a kernel."""

    arch: str = "sm_90"
    """Target, as nvcc's -arch (sm_90 = Hopper H100/H200)."""
    flags: tuple[str, ...] = ("-O3", "--std=c++17")
    """Extra nvcc flags (part of the cache key)."""
    timeout_s: float = 60.0
    """Wall-clock limit of one build, in seconds."""
    confirm_timeout_s: float | None = 120.0
    """A build past ``timeout_s`` that the machine starved of CPU is built again with this limit (a
    quarter of the cores' worth at a time per process): past it too, the source is refused as a
    ``compile_error`` (cached; a source that takes minutes to build is the source's doing: it
    inlines itself twice a level, say). One that used most of ``timeout_s`` computing is refused at
    once (:data:`BUSY_SHARE`). None: a time-out is returned as ``timeout``, not cached."""
    memory_limit_mb: int | None = 2048
    """Memory a build may allocate, in MiB (``RLIMIT_DATA`` of NVRTC's compile process during a
    compile, and of nvcc and every step it starts; the process's own hard limit where that is lower,
    :func:`memory_limit_applied`); the library's kernels need under 100. A build that runs out of it
    is built once more: out of it again, while a trivial kernel builds under the same limit, the
    source is refused as a ``compile_error`` (cached; it lists or inlines itself into gigabytes, say).
    Without a limit, such a source grows until the machine's OOM killer ends a process, perhaps the
    trainer. None: no limit (running out of memory is then the machine's ``compiler_failure``)."""
    nvcc: str | None = None
    """Path of nvcc; default: $CUDA_HOME/bin/nvcc, then nvcc on the PATH."""
    backend: str = "auto"
    """'auto' (NVRTC when it loads, else nvcc), 'nvrtc' or 'nvcc'."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not re.fullmatch(r"sm_\d+[a-z]?", self.arch):
            raise ValueError(f"arch must look like sm_90, got {self.arch!r}")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if self.confirm_timeout_s is not None and not self.confirm_timeout_s >= self.timeout_s:
            raise ValueError("confirm_timeout_s must be at least timeout_s (or None)")
        if self.memory_limit_mb is not None and not self.memory_limit_mb > 0:
            raise ValueError("memory_limit_mb must be positive (or None)")


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel."""

    name: str
    registers: int
    smem_bytes: int  # static shared memory
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


@dataclass(frozen=True)
class CompileResult:
    """The outcome of one compile."""

    ok: bool
    key: str
    """Hash of (source, arch, flags, nvcc version): the cache key."""
    cubin_path: str | None
    """Path of the cubin in the cache (None when the build failed)."""
    seconds: float
    """Wall time of this call (near zero on a cache hit)."""
    cached: bool
    """True when the result came from the disk cache."""
    error_kind: str | None = None
    """None, or one of: compile_error (the source's, cached), timeout, compiler_failure (the compiler
    failed on its own: killed, out of memory, a bad option; not cached), no_compiler."""
    log: str = ""
    """Tail of nvcc's output (errors, warnings, ptxas report)."""
    resources: tuple[KernelResources, ...] = field(default_factory=tuple)
    build_seconds: float = 0.0
    """How long the original (uncached) build took."""
    backend: str = "nvcc"
    """The compiler that built it: 'nvrtc' or 'nvcc'."""
    ptx_violation: str | None = None
    """What :func:`~sparserl.harness.ptx_check.check_ptx` refused in the compiled code (None: nothing)."""
    uses_atomics: bool = False
    """The compiled code has atom/red instructions."""

    def resources_of(self, kernel: str) -> KernelResources | None:
        return next((r for r in self.resources if r.name == kernel), None)


def default_cache_dir() -> Path:
    """``$SPARSERL_CACHE_DIR`` or ``~/.cache/sparserl``; compiles go in its ``cubin/`` folder."""
    root = os.environ.get("SPARSERL_CACHE_DIR") or os.path.join(Path.home(), ".cache", "sparserl")
    return Path(root) / "cubin"


def find_nvcc(explicit: str | None = None) -> str | None:
    """Locate nvcc: the explicit path, $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, then PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cand = os.path.join(home, "bin", "nvcc")
            if os.access(cand, os.X_OK):
                return cand
    return shutil.which("nvcc")


@lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"release [\d.]+, V[\d.]+", out)
    return m.group(0) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def cache_key(source: str, options: CompileOptions, version: str) -> str:
    h = hashlib.sha256()
    for part in (f"{_CACHE_FORMAT}.{PTX_RULES_VERSION}", version, options.arch, "\0".join(options.flags), source):
        h.update(part.encode())
        h.update(b"\0\1")
    return h.hexdigest()


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(text: str) -> tuple[KernelResources, ...]:
    """Per-kernel resources from ``ptxas -v`` output."""
    out: list[KernelResources] = []
    name = None
    props = (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            name, props = m.group(1), (0, 0, 0)
        elif (m := _PROPS.search(line)) and name:
            props = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name:
            out.append(KernelResources(name, int(m.group(1)), int(m.group(2) or 0), *props))
            name = None
    return tuple(out)


def _tail(text: str) -> str:
    return text if len(text) <= LOG_TAIL_CHARS else "..." + text[-LOG_TAIL_CHARS:]


_DIAGNOSTIC = re.compile(r"^(?P<file>[^\s(:][^(]*?)(?:\(\d+\)|:\d+(?::\d+)?):\s*(?:catastrophic error|fatal error|"
                         r"error|warning|note|remark)\b")
_OWN_LINES = re.compile(r"^(?:ptxas\b|nvcc\b|NVRTC\b|\d+ (?:catastrophic )?errors? detected in the compilation of "
                        rf'"{re.escape(SOURCE_NAME)}")')


def candidate_log(text: str, name: str = SOURCE_NAME) -> str:
    """The compiler's lines about the candidate's own text, and nothing quoted from any other file.

    A diagnostic (``FILE(LINE): error: ...`` or ``FILE:LINE:COL: error: ...``) is kept with its
    indented continuation lines (the quoted source line, the caret, instantiation notes) only when
    FILE is the candidate's; ptxas, nvcc and NVRTC's own lines are kept; every other line
    ("In file included from", a header's diagnostic and the header lines it quotes) is dropped.
    """
    out: list[str] = []
    keep = False
    for line in text.splitlines():
        if m := _DIAGNOSTIC.match(line):
            keep = m.group("file") == name
        elif _OWN_LINES.match(line):
            keep = True
        elif not line.strip():
            keep = False
            continue
        elif not line[0].isspace() and line.lstrip()[:1] != "^":
            keep = False
        if keep:
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


_OUT_OF_MEMORY = re.compile(
    r"^(?:[^\s(:]+(?:\(\d+\)|:\d+(?::\d+)?):\s*catastrophic error: out of memory\s*$|LLVM ERROR: out of memory"
    r"|ptxas fatal\s*: Memory allocation failure|NVRTC failed: MemoryError\b|(?:[\w.+-]+: )?virtual memory exhausted"
    r"|Loop in catastrophic error processing\.)", re.MULTILINE)
"""The lines a compiler step (or NVRTC's compile process) that ran out of memory prints: the front
end's catastrophic error located in whatever file it was reading (when reporting it ran out too, it
says only "Loop in catastrophic error processing."), LLVM's, ptxas's and the host compiler's own
lines. Never a quoted source line (indented), nor the candidate's ``#error`` or ``static_assert``
text (a diagnostic of another kind; the file part holds no colon, so ``#error x:1: catastrophic
error: out of memory`` in gcc's ``kernel.cu:1:2: error:`` form cannot pass for one): an honest
comment saying "out of memory" does not read as running out of it, and a candidate cannot write its
way to a machine's failure."""
_MACHINE_FAULT = re.compile(
    r"out of memory|cannot allocate memory|memory exhausted|memory allocation failure|allocation failure occurred"
    r"|died due to signal|core dumped|error while loading shared libraries|^segmentation fault|^killed\s*$"
    r"|^aborted\b|^nvcc fatal\b", re.IGNORECASE | re.MULTILINE)
"""What a compiler that failed on its own prints (memory exhausted, a step killed by a signal, a
library it could not load, a bad option), looked for outside the candidate's own diagnostics."""
_SOURCE_ERROR = re.compile(r"^(?:[^\s(:][^(]*?(?:\(\d+\)|:\d+(?::\d+)?):\s*(?:catastrophic error|fatal error|error)\b"
                           r"|\d+ (?:catastrophic )?errors? detected in the compilation of|ptxas (?:error|fatal)\s*:)",
                           re.MULTILINE)
"""A diagnostic that blames the source: an error located in a file (the candidate's, or a header it
used), the front end's error count, or ptxas refusing the code."""


def _foreign_lines(text: str, name: str = SOURCE_NAME) -> str:
    """The compiler's output less the candidate's own diagnostics (a diagnostic located in the
    candidate's text, with its indented continuation lines): what the candidate cannot write into
    the log with ``#error`` or ``#warning``."""
    out, own = [], False
    for line in text.splitlines():
        if m := _DIAGNOSTIC.match(line):
            own = m.group("file") == name
        elif not line[:1].isspace() and line.lstrip()[:1] != "^":
            own = False
        if not own:
            out.append(line)
    return "\n".join(out)


def build_failure_kind(text: str, returncode: int | None = None,
                       memory_limited: bool = False) -> tuple[str, str | None]:
    """Whether a failed build is the source's fault: ``("compile_error", None)``, or
    ``("compiler_failure", why)`` when the compiler failed on its own, which is never cached, or
    ``("memory", why)`` when it ran out of memory under a limit (:attr:`CompileOptions.memory_limit_mb`).

    Fails closed: a compiler killed by a signal (``returncode`` < 0, or 129-192 from a step the
    driver ran through a shell), one that could not run a step (126, 127), one that printed a
    machine fault (memory exhausted, a step that died, ``nvcc fatal``) outside the candidate's own
    diagnostics, and one that failed without any diagnostic blaming the source are compiler
    failures. The candidate's own lines are not read for faults, so its ``#error`` text cannot
    turn its compile error into a machine's. A step's own report of running out of memory
    (:data:`_OUT_OF_MEMORY`) is read first: under a limit it is ``memory``, with none the machine's."""
    if m := _OUT_OF_MEMORY.search(text):  # with no limit, the machine's memory ran out
        return ("memory" if memory_limited else "compiler_failure"), f"it reported '{m.group(0).strip()}'"
    if returncode is not None and returncode < 0:
        return "compiler_failure", f"killed by signal {-returncode}"
    if returncode is not None and 128 < returncode <= 192:
        return "compiler_failure", f"a step was killed by signal {returncode - 128}"
    if returncode in (126, 127):
        return "compiler_failure", f"could not run a step (exit code {returncode})"
    if m := _MACHINE_FAULT.search(_foreign_lines(text)):
        return "compiler_failure", f"it reported '{m.group(0).strip().lower()}'"
    if _SOURCE_ERROR.search(text):
        return "compile_error", None
    return "compiler_failure", "it failed without a diagnostic about the source" + (
        f" (exit code {returncode})" if returncode is not None else "")


def _result_from_meta(meta: dict, cubin: Path, seconds: float) -> CompileResult:
    res = tuple(KernelResources(**r) for r in meta.get("resources", []))
    return CompileResult(
        ok=meta["ok"],
        key=meta["key"],
        cubin_path=str(cubin) if meta["ok"] else None,
        seconds=seconds,
        cached=True,
        error_kind=meta.get("error_kind"),
        log=meta.get("log", ""),
        resources=res,
        build_seconds=meta.get("build_seconds", 0.0),
        backend=meta.get("backend", "nvcc"),
        ptx_violation=meta.get("ptx_violation"),
        uses_atomics=meta.get("uses_atomics", False),
    )


def find_cuda_include() -> Path | None:
    """The CUDA toolkit's include folder (with the CCCL headers), or None."""
    cands = [os.path.join(h, "include") for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if h]
    if nvcc := find_nvcc():
        root = Path(os.path.realpath(nvcc)).parent.parent
        cands += [str(root / "include"), str(root / "targets" / "x86_64-linux" / "include")]
    cands.append("/usr/local/cuda/include")
    return next((Path(c) for c in cands if (Path(c) / "cuda_runtime.h").exists()), None)


def available_backend(options: CompileOptions) -> str | None:
    """The backend ``options`` resolves to on this machine, or None when it has neither."""
    from sparserl.harness import nvrtc

    if options.backend in ("auto", "nvrtc") and nvrtc.load_nvrtc() is not None:
        return "nvrtc"
    if options.backend in ("auto", "nvcc") and find_nvcc(options.nvcc) is not None:
        return "nvcc"
    return None


def compile_source(
    source: str,
    options: CompileOptions | None = None,
    cache_dir: Path | str | None = None,
) -> CompileResult:
    """Build ``source`` (device code) into a cubin, using and filling the disk cache.

    Failed builds are cached too (same source, same error), except time-outs and running out of
    memory that could be the machine's: a build past its limit is the source's ``compile_error``
    (cached) when it used the limit computing, or when built again (:func:`_build`) it runs past
    ``options.confirm_timeout_s`` too; one out of its memory limit is when it runs out again while a
    trivial kernel builds. Under 'auto', a source NVRTC rejects is built with nvcc as well (when there
    is one) and nvcc's result returned.
    """
    options = options or CompileOptions()
    t0 = time.perf_counter()
    backend = available_backend(options)
    if backend is None:
        want = {"auto": "NVRTC or nvcc", "nvrtc": "NVRTC (libnvrtc)", "nvcc": "nvcc"}[options.backend]
        return CompileResult(False, "", None, 0.0, False, "no_compiler",
                             f"{want} not found: install the CUDA toolkit (or the nvidia-cuda-nvrtc wheel), "
                             "or set CUDA_HOME / SPARSERL_NVRTC")
    result = _build(backend, source, options, cache_dir, t0)
    if (backend == "nvrtc" and options.backend == "auto" and result.error_kind in ("compile_error", "compiler_failure")
            and TOO_SLOW not in result.log and TOO_LARGE not in result.log
            and find_nvcc(options.nvcc) is not None):  # a bomb is not built twice
        log.debug("NVRTC rejected a source; building it with nvcc too: %s", result.log[-300:])
        result = _build("nvcc", source, options, cache_dir, t0)
    return result


TOO_SLOW = "a source this slow to build is refused"
"""In the log of a build refused for its time (:func:`_build`)."""
TOO_LARGE = "a source this large to build is refused"
"""In the log of a build refused for its memory (:func:`_build`)."""
BUSY_SHARE = 0.8
"""A build stopped at its limit after using this share of it in CPU time was not slowed by the
machine's load: the source's, refused without a second build."""
BUSY_MIN_S = 1.0
"""...and at least this many CPU seconds (a clock tick is 10 ms: a tiny limit is no reading)."""
_CONFIRMS = threading.BoundedSemaphore(max(1, (os.cpu_count() or 1) // 4))
"""Confirming builds (:attr:`CompileOptions.confirm_timeout_s`) running at once in a process."""
_CONFIRMED = ("timeout", "memory")
"""How a build can fail that is the source's when it happens again in the confirming build."""


def _build(backend: str, source: str, options: CompileOptions, cache_dir, t0: float) -> CompileResult:
    """:func:`_cached_build`, and a build past its limit that was starved of CPU, or one that ran
    out of memory under its limit, built again (with ``options.confirm_timeout_s``; a few such at a
    time): past the limit or out of memory again, the source's."""
    result = _cached_build(backend, source, options, cache_dir, t0)
    if result.error_kind == "memory" or (result.error_kind == "timeout" and options.confirm_timeout_s is not None):
        first = (result.error_kind, options)
        log.info("a build %s; building it again", _failed_how(*first))
        again = options if options.confirm_timeout_s is None else replace(options, timeout_s=options.confirm_timeout_s)
        with _CONFIRMS:
            result = _cached_build(backend, source, again, cache_dir, t0, first=first)
    return result


def memory_limit_applied(options: CompileOptions) -> int | None:
    """The memory limit a build gets, in MiB: ``options.memory_limit_mb``, or this process's hard
    ``RLIMIT_DATA`` where that is lower (a build's processes cannot raise it); None: none."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    hard_mb = None if hard == resource.RLIM_INFINITY else hard >> 20
    limits = [m for m in (options.memory_limit_mb, hard_mb) if m is not None]
    return min(limits) if options.memory_limit_mb is not None and limits else None


def _failed_how(kind: str, options: CompileOptions) -> str:
    """How a build failed that :func:`_build` builds again, in words."""
    if kind == "memory":
        return f"ran out of memory within its {memory_limit_applied(options)} MiB limit"
    return f"ran past its {options.timeout_s:g} s limit"


def _refusal(name: str, first: tuple[str, CompileOptions], kind: str, options: CompileOptions) -> str:
    """The log of a source refused because its confirming build failed as ``kind`` too."""
    second = _failed_how(kind, options)
    again = "and again when built again" if second == _failed_how(*first) else f"then {second} when built again"
    return f"{name} {_failed_how(*first)}, {again}: {TOO_SLOW if kind == 'timeout' else TOO_LARGE}\n"


def _refused_within(kind: str, first: CompileOptions, confirm_s: float | None) -> dict:
    """What a refusal for ``kind`` (timeout or memory) was given: read by :func:`_given_more`."""
    return {"kind": kind, "timeout_s": first.timeout_s, "confirm_timeout_s": confirm_s,
            "memory_limit_mb": memory_limit_applied(first)}


def _given_more(limits: dict | None, options: CompileOptions) -> bool:
    """Whether ``options`` would give a source refused under ``limits`` (:func:`_refused_within`)
    more of what it ran out of: more memory for a memory refusal; for a time-out, a longer first
    limit, or a longer confirming one where the refusal was confirmed."""
    if not limits:
        return False
    if limits.get("kind") == "memory":
        now, was = memory_limit_applied(options), limits.get("memory_limit_mb")
        return was is not None and (now is None or now > was)
    confirmed = limits.get("confirm_timeout_s")
    longest = options.confirm_timeout_s if options.confirm_timeout_s is not None else options.timeout_s
    return options.timeout_s > limits["timeout_s"] or (confirmed is not None and longest > confirmed)


def _cached_build(backend: str, source: str, options: CompileOptions, cache_dir, t0: float,
                  first: tuple[str, CompileOptions] | None = None) -> CompileResult:
    """Build (or find in the cache) ``source`` with ``backend``. A time-out or running out of
    memory is the source's (a cached ``compile_error``) when this is the confirming build of one
    that failed so (``first``: how, and under what options), out of memory only while a trivial kernel
    builds under the same limit; a time-out is the source's too when it used :data:`BUSY_SHARE` of
    its limit in CPU time (:data:`BUSY_MIN_S` at least; with ``options.confirm_timeout_s`` set);
    otherwise they are returned as ``timeout`` and ``memory``, not cached."""
    if backend == "nvrtc":
        from sparserl.harness.nvrtc import load_nvrtc, nvrtc_options

        lib = load_nvrtc()
        opts = nvrtc_options(options.arch, options.flags, find_cuda_include())
        version = "\0".join([lib.version, *opts])  # the options (include folders) are part of the build too

        def build():
            return _run_nvrtc(lib, source, opts, options)
    else:
        nvcc = find_nvcc(options.nvcc)
        version = nvcc_version(nvcc)

        def build():
            return _run_nvcc(nvcc, source, options)
    key = cache_key(source, options, version)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = folder / key[:2]
    folder.mkdir(parents=True, exist_ok=True)
    cubin, meta_path = folder / f"{key}.cubin", folder / f"{key}.json"

    def lookup() -> CompileResult | None:
        if not meta_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if meta.get("ok") and not cubin.exists():
            return None
        if _given_more(meta.get("refused_within"), options):
            return None  # refused under smaller limits than these give: built again under these
        return _result_from_meta(meta, cubin, time.perf_counter() - t0)

    if (hit := lookup()) is not None:
        return hit
    with FileLock(str(folder / f"{key}.lock"), timeout=max(600.0, 10 * options.timeout_s)):
        if (hit := lookup()) is not None:  # another process built it while we waited
            return hit
        ok, blob, text, error_kind, ptx, cpu_s = build()
        name = "NVRTC" if backend == "nvrtc" else "nvcc"
        refused_within = None
        if error_kind == "memory" and first is not None and not _probe_builds(backend, options):
            error_kind = "compiler_failure"  # the machine's limit, not the source's: a trivial kernel fails too
            text = (f"{name} {_failed_how(*first)}, then {_failed_how('memory', options)} when built again, and so "
                    "did a trivial kernel: the machine is out of memory, not the source's compile error\n")
        elif error_kind in _CONFIRMED and first is not None:
            refused_within = _refused_within(error_kind, first[1], options.timeout_s)
            text = _refusal(name, first, error_kind, options)
            error_kind = "compile_error"
        elif (error_kind == "timeout" and options.confirm_timeout_s is not None and cpu_s is not None
              and cpu_s >= max(BUSY_MIN_S, BUSY_SHARE * options.timeout_s)):
            refused_within = _refused_within("timeout", options, None)
            error_kind = "compile_error"
            text = (f"{name} ran past its {options.timeout_s:g} s limit using {cpu_s:.0f} s of CPU time (not slowed "
                    f"by the machine): {TOO_SLOW}\n")
        elif ok and (missing := _unreported_entries(ptx, text)):
            ok, error_kind = False, "compiler_failure"  # never cached: the resource limits would read nothing
            text += (f"\n{name} built the code without its ptxas report for {', '.join(missing)}: the resource "
                     "limits cannot be read\n")
        text = candidate_log(text)
        if error_kind in ("timeout", "memory", "compiler_failure"):  # not the source's fault (yet): not cached
            secs = time.perf_counter() - t0
            return CompileResult(False, key, None, secs, False, error_kind, text, (), secs, backend)
        report = check_ptx(ptx) if ok else None
        meta = {
            "ok": ok,
            "key": key,
            "error_kind": error_kind,
            "log": _tail(text),
            "resources": [asdict(r) for r in parse_ptxas(text)] if ok else [],
            "build_seconds": time.perf_counter() - t0,
            "arch": options.arch,
            "backend": backend,
            "ptx_violation": (report.violation if ptx else "the compiler produced no PTX to inspect") if ok else None,
            "uses_atomics": bool(report and report.uses_atomics),
            "refused_within": refused_within,
        }
        if ok:
            tmp_cubin = cubin.with_suffix(f".cubin.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp_cubin.write_bytes(blob)
            os.replace(tmp_cubin, cubin)
        tmp_meta = meta_path.with_suffix(f".json.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp_meta.write_text(json.dumps(meta))
        os.replace(tmp_meta, meta_path)
    result = _result_from_meta(meta, cubin, time.perf_counter() - t0)
    return CompileResult(**{**result.__dict__, "cached": False})


Build = tuple[bool, bytes | None, str, str | None, str, float | None]
"""(ok, cubin, log, error kind, PTX, CPU seconds used when stopped at the limit) of one backend run."""


_TRIVIAL = 'extern "C" __global__ void trivial(float* y) { y[threadIdx.x] = 1.f; }\n'


def _probe_builds(backend: str, options: CompileOptions) -> bool:
    """Whether a trivial kernel builds under ``options`` on ``backend`` (uncached): a source that ran
    out of memory twice is the source's only when it does (a limit the machine set, a ``ulimit`` lower
    than :attr:`CompileOptions.memory_limit_mb`, fails every source alike)."""
    if backend == "nvrtc":
        from sparserl.harness.nvrtc import end_thread_process, load_nvrtc, nvrtc_options

        end_thread_process()  # a new process: the failed build's freed memory would let the kernel build regardless
        done = _run_nvrtc(load_nvrtc(), _TRIVIAL, nvrtc_options(options.arch, options.flags, find_cuda_include()),
                          options)
    else:
        done = _run_nvcc(find_nvcc(options.nvcc), _TRIVIAL, options)
    return done[0]


_ENTRY_PTX = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)*\.entry\s+([A-Za-z_$][\w$]*)", re.MULTILINE)


def _unreported_entries(ptx: str, log_text: str) -> list[str]:
    """The kernels ``ptx`` defines that the build's ``ptxas -v`` report in ``log_text`` leaves out
    (a cubin NVRTC took from the driver's cache comes with no report)."""
    reported = {r.name for r in parse_ptxas(log_text)}
    return [e for e in dict.fromkeys(_ENTRY_PTX.findall(ptx)) if e not in reported]


def _run_nvrtc(lib, source: str, opts: list[str], options: CompileOptions) -> Build:
    out = lib.compile(source, opts, options.timeout_s, options.memory_limit_mb)
    kind = {"ok": None, "compile_error": "compile_error", "timeout": "timeout"}.get(out.status, "compiler_failure")
    log_text = out.log
    limited = options.memory_limit_mb is not None
    # ptxas's "Memory allocation failure" and LLVM's "out of memory" (which ends the process) are printed, not logged
    oom = kind in ("compile_error", "compiler_failure") and _OUT_OF_MEMORY.search(f"{out.log}\n{out.printed}")
    if oom and limited:
        kind = "memory"
        log_text += f"\nNVRTC {_failed_how('memory', options)}\n"
    elif oom:  # with no limit of ours, the machine's memory ran out (ptxas's log then says only "aborted")
        kind = "compiler_failure"
        log_text += (f"\nNVRTC failed on its own: it reported '{oom.group(0).strip()}' with no memory limit; "
                     "not a compile error of the source\n")
    elif kind == "compile_error" and out.log.lstrip().startswith("nvrtc: error:"):  # an option (arch) it rejects
        kind = "compiler_failure"
    elif kind == "compile_error":
        kind, why = build_failure_kind(out.log)
        if why is not None:
            log_text += f"\nNVRTC failed on its own: {why}; not a compile error of the source\n"
    return out.status == "ok", out.cubin, log_text, kind, out.ptx, out.cpu_s


def _run_nvcc(nvcc: str, source: str, options: CompileOptions) -> Build:
    with tempfile.TemporaryDirectory(prefix="sparserl-nvcc-") as tmp:
        src = Path(tmp) / SOURCE_NAME
        out = Path(tmp) / "kernel.cubin"
        src.write_text(source)
        cmd = [nvcc, "-cubin", f"-arch={options.arch}", "-Xptxas", "-v", *options.flags, "--keep", "--keep-dir", tmp,
               "-o", str(out), SOURCE_NAME]
        if (limit := memory_limit_applied(options)) is not None:  # nvcc and every step it starts (inherited)
            cmd = ["/bin/sh", "-c", 'ulimit -c 0 && ulimit -d "$0" && exec "$@"', str(limit * 1024), *cmd]
        # TMPDIR too: nvcc's front end leaves an empty kernel-*.lgenfe.bc in the temp folder when a build fails.
        # A session of its own: past the limit the whole group goes (nvcc starts cicc and ptxas through a
        # shell; killing nvcc alone left them running, gigabytes and a core each).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                                env=os.environ | {"TMPDIR": tmp}, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            cpu_s = group_cpu_seconds(proc.pid)  # before the group goes: nvcc, cicc, ptxas
            _kill_group(proc)
            return False, None, f"nvcc ran past its {options.timeout_s:g} s limit", "timeout", "", cpu_s
        except BaseException:  # interrupted: leave nothing running
            _kill_group(proc)
            raise
        text = (stdout + stderr).replace(tmp + "/", "")
        ok = proc.returncode == 0 and out.exists()
        if not ok:  # the source's error, or nvcc's own failure (a bad flag, memory, a step killed)?
            kind, why = build_failure_kind(text, proc.returncode, options.memory_limit_mb is not None)
            if kind == "memory":
                return False, None, text + f"\nnvcc {_failed_how('memory', options)}\n", kind, "", None
            if why is not None:
                return False, None, text + f"\nnvcc failed on its own: {why}; not a compile error of the source\n", \
                    kind, "", None
        ptx = Path(tmp) / "kernel.ptx"
        return (ok, out.read_bytes() if ok else None, text, None if ok else "compile_error",
                ptx.read_text(errors="replace") if ptx.exists() else "", None)


def _kill_group(proc: subprocess.Popen) -> None:
    """End ``proc``'s process group (it leads a session of its own) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.communicate()


def compile_many(
    sources: Sequence[str],
    options: CompileOptions | None = None,
    cache_dir: Path | str | None = None,
    jobs: int | None = None,
    on_done: Callable[[int, CompileResult], None] | None = None,
) -> list[CompileResult]:
    """Compile several sources in parallel (``jobs`` threads, default: CPU cores).

    ``on_done(index, result)`` is called as each finishes (for progress bars).
    Results come back in the order of ``sources``.
    """
    jobs = jobs or os.cpu_count() or 1
    results: list[CompileResult | None] = [None] * len(sources)

    def one(i: int) -> None:
        r = compile_source(sources[i], options, cache_dir)
        results[i] = r
        if on_done is not None:
            on_done(i, r)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, range(len(sources))))
    return [r for r in results if r is not None]
