"""Run contract kernels on a GPU through CuPy: upload a converted matrix once, launch many times.

This is the thin layer between :mod:`sparserl.kernels.contract` and the GPU: it binds a
:class:`~sparserl.formats.FormatData` to device buffers, loads a compiled cubin, and
launches a completion's kernels in the order of its ``LAUNCH:`` lines with the
contract's argument list. Output policy (zero-fill for formats that accumulate) is the
caller's: see :func:`prepare_output`.

CuPy is imported lazily: importing this module works on a machine without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from sparserl.errors import SparseRLError
from sparserl.formats.base import FormatData
from sparserl.kernels.contract import LaunchConfig, Op, kernel_params

_DEFAULT_SMEM_LIMIT = 48 * 1024


class GPUUnavailable(SparseRLError):
    """No usable NVIDIA GPU (or CuPy) on this machine."""


def cupy_module():
    """Import CuPy and check that a GPU is visible, or raise :class:`GPUUnavailable`."""
    try:
        import cupy
    except ImportError:
        raise GPUUnavailable("this needs a GPU and CuPy: pip install 'sparserl[gpu]' on a CUDA machine") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise GPUUnavailable("no CUDA GPU is visible")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise GPUUnavailable(f"no usable CUDA GPU: {exc}") from None
    return cupy


def device_arch() -> str:
    """``sm_XY`` of the current GPU."""
    cp = cupy_module()
    return f"sm_{cp.cuda.Device().compute_capability}"  # CuPy gives e.g. "90"


def num_sms() -> int:
    cp = cupy_module()
    return int(cp.cuda.Device().attributes["MultiProcessorCount"])


@dataclass
class DeviceMatrix:
    """A converted matrix resident on the GPU (upload once, launch many times)."""

    data: FormatData
    """The conversion's sizes and layout; its host arrays may be stand-ins without values
    (:meth:`FormatData.metadata_only`, the batched path's uploads): read values from ``arrays``."""
    arrays: dict[str, Any]  # cupy arrays in contract order

    @classmethod
    def upload(cls, data: FormatData) -> "DeviceMatrix":
        cp = cupy_module()
        return cls(data, {name: cp.asarray(arr) for name, arr in data.arrays.items()})


# CUfunction_attribute values of the driver API (fixed by it, whatever CuPy names them)
_ATTR_SHARED_SIZE_BYTES, _ATTR_LOCAL_SIZE_BYTES, _ATTR_NUM_REGS = 1, 3, 4


@dataclass(frozen=True)
class LoadedResources:
    """A loaded kernel's resources as the driver reads them from the cubin (``cuFuncGetAttribute``), not
    from the compiler's log: what the register and shared-memory limits hold the kernel to even where the
    ``ptxas -v`` report is missing or misread."""

    registers: int
    static_smem: int
    local_bytes: int


class LoadedKernels:
    """A cubin's kernels, looked up by name."""

    def __init__(self, cubin_path: str):
        cp = cupy_module()
        self.module = cp.RawModule(path=cubin_path)
        self._fns: dict[str, Any] = {}
        self._resources: dict[str, LoadedResources] = {}

    def get(self, name: str):
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = self.module.get_function(name)
        return fn

    def resources(self, name: str) -> LoadedResources:
        """The driver's view of kernel ``name``'s registers, static shared memory and local memory."""
        res = self._resources.get(name)
        if res is None:
            attr = cupy_module().cuda.driver.funcGetAttribute
            fn = self.get(name)
            ptr = getattr(fn, "kernel", fn).ptr  # a RawKernel holds the driver's function as .kernel
            res = self._resources[name] = LoadedResources(
                int(attr(_ATTR_NUM_REGS, ptr)), int(attr(_ATTR_SHARED_SIZE_BYTES, ptr)),
                int(attr(_ATTR_LOCAL_SIZE_BYTES, ptr)))
        return res


@lru_cache(maxsize=512)
def load_kernels(cubin_path: str) -> LoadedKernels:
    """Load a cubin once per process (least recently used modules are unloaded past 512)."""
    return LoadedKernels(cubin_path)


def kernel_args(op: Op, dev: DeviceMatrix, x: Any, y: Any, k: int | None = None) -> tuple:
    """The argument tuple in contract order (ints as int32, arrays as device pointers)."""
    fd = dev.data
    scalars = {"m": fd.m, "n": fd.n, "nnz": fd.nnz, **fd.sizes}
    if op is Op.SPMM:
        scalars["k"] = int(k or 0)
    out = []
    for p in kernel_params(fd.format, op):
        if p.name in scalars:
            out.append(np.int32(scalars[p.name]))
        elif p.name in ("x", "X"):
            out.append(x)
        elif p.name in ("y", "Y"):
            out.append(y)
        else:
            out.append(dev.arrays[p.name])
    return tuple(out)


def prepare_output(fd: FormatData, y: Any) -> None:
    """Apply the contract's output policy before the first launch: zero for formats that accumulate."""
    if fd.zero_fill_y:
        y.fill(0)


def ready_launches(kernels: LoadedKernels, launches: list[LaunchConfig]) -> Iterator[tuple[Any, LaunchConfig]]:
    """Each non-empty LAUNCH line in order with its kernel, allowed the dynamic shared memory it asks."""
    for cfg in launches:
        if cfg.empty:
            continue
        fn = kernels.get(cfg.kernel)
        if cfg.smem > _DEFAULT_SMEM_LIMIT:
            fn.max_dynamic_shared_size_bytes = cfg.smem
        yield fn, cfg


def launch_all(kernels: LoadedKernels, launches: list[LaunchConfig], args: tuple) -> None:
    """Launch every non-empty LAUNCH line in order on CuPy's current stream."""
    for fn, cfg in ready_launches(kernels, launches):
        fn(cfg.grid, cfg.block, args, shared_mem=cfg.smem)
