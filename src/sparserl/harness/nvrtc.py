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

A compile runs in a helper thread (ctypes releases the GIL, so compiles on several threads run
in parallel), and one that runs past its limit is reported as a timeout and left to finish in
the background, since a running NVRTC call cannot be stopped; :func:`stuck` counts those, and
the compile service sends work to nvcc while too many are still running. Only NVRTC's
"compilation failed" and "invalid option" are compile errors (cacheable: the same source fails
again); any other failure is ``failure`` and is never cached.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)


_COMPILE_ERRORS = (5, 6)  # NVRTC_ERROR_INVALID_OPTION, NVRTC_ERROR_COMPILATION
_PROBE = 'extern "C" __global__ void probe(float* y) { y[threadIdx.x] = 1.f; }'
_stuck = 0
_stuck_lock = threading.Lock()


def stuck() -> int:
    """Compiles that ran past their limit and are still running in the background."""
    return _stuck


@dataclass(frozen=True)
class NvrtcOutput:
    """One NVRTC compile: ``status`` is ok, compile_error, failure (NVRTC itself failed) or timeout."""

    status: str
    cubin: bytes | None
    log: str
    ptx: str = ""
    """The PTX NVRTC produced on the way to the cubin (what :mod:`.ptx_check` inspects)."""


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

    def compile(self, source: str, options: list[str], timeout_s: float) -> NvrtcOutput:
        """Compile ``source`` with NVRTC ``options``; a timeout leaves the call running in the background."""
        global _stuck
        box: list = []
        state = {"abandoned": False}
        lock = threading.Lock()

        def run() -> None:
            global _stuck
            try:
                box.append(self._compile(source, options))
            except Exception as exc:  # noqa: BLE001 - reported as a failed compile, never raised
                box.append(NvrtcOutput("failure", None, f"NVRTC failed: {exc}"))
            finally:
                with lock:
                    if state["abandoned"]:
                        with _stuck_lock:
                            _stuck -= 1

        t = threading.Thread(target=run, name="nvrtc", daemon=True)
        t.start()
        t.join(timeout_s)
        with lock:
            if box:
                return box[0]
            state["abandoned"] = True
            with _stuck_lock:
                _stuck += 1
        return NvrtcOutput("timeout", None, f"NVRTC ran past its {timeout_s:g} s limit")


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
