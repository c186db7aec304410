"""What runs ``y = A x`` inside an operator: a tuned kernel, or the library.

:class:`KernelBackend` is a contract kernel bound to the matrix's conversion on the device
(:class:`~sparserl.harness.launcher.BoundKernel`), run as the harness runs it (the output policy,
then every LAUNCH line) on arguments packed once (:mod:`sparserl.operator.launch`).
:class:`LibraryBackend` is cuSPARSE's generic SpMV/SpMM on CSR (row-major dense operands, the same
calls the harness times as its baseline), used when no kernel beats it. Both update their values in place on the GPU, so the device pointers a launch reads
never change: :meth:`set_values` takes the new values in CSR order.

Everything here needs a GPU and CuPy (imported when a backend is built).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import scipy.sparse as sp

from sparserl.harness.device import cupy_module
from sparserl.kernels.contract import Op

log = logging.getLogger(__name__)

_GATHER_SOURCE = r"""
extern "C" __global__ void sparserl_value_gather(const float* __restrict__ v, const int* __restrict__ where,
                                                 float* __restrict__ dst, long long slots)
{
    // one thread per slot of a format's value array: the value of the 1-based CSR position it holds, 0 for padding
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < slots) {
        const int p = where[i];
        dst[i] = p > 0 ? v[p - 1] : 0.0f;
    }
}
"""
_GATHER = None


def gather_values(values, where, dst) -> None:
    """``dst[i] = values[where[i] - 1]``, or 0 where ``where[i]`` is 0 (padding), in place: one pass over a
    format's value array (a raw kernel: a light launch, which an update's cost mostly is)."""
    global _GATHER
    if _GATHER is None:
        _GATHER = cupy_module().RawKernel(_GATHER_SOURCE, "sparserl_value_gather")
    slots = int(dst.size)
    if slots:
        _GATHER(((slots + 255) // 256,), (256,), (values, where, dst, np.int64(slots)))


def copy_values(dst, src) -> None:
    """``dst[:] = src`` (two float32 device arrays of one size) as one device-to-device copy on the current
    stream: lighter on the host than an elementwise kernel (``cupy.copyto``), which a small update is bound by."""
    cp = cupy_module()
    if dst.data.ptr != src.data.ptr:
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)


class _Backend:
    """What both backends share: ``run`` on CuPy arrays, by way of their ``run_pointers``."""

    _cp: object

    def value_array(self):
        """The one device array the kernel reads all its values from, when it holds them in CSR order (CSR,
        COO, the library): new values can be written straight into it. None for the other formats."""
        return None

    def run(self, x, y) -> None:
        """``y = A x`` (or ``Y = A X``) on CuPy's current stream; ``x``, ``y`` CuPy arrays."""
        self.run_pointers(x.data.ptr, y.data.ptr, y.nbytes, self._cp.cuda.get_current_stream().ptr)

    def run_pointers(self, x_ptr: int, y_ptr: int, y_bytes: int, stream_ptr: int) -> None:
        raise NotImplementedError


class KernelBackend(_Backend):
    """A tuned contract kernel on the matrix's device conversion."""

    def __init__(self, bound, A: sp.csr_array, where: dict):
        self._cp = cupy_module()
        self.bound = bound
        """The :class:`~sparserl.harness.launcher.BoundKernel` every launch goes through."""
        self.A = A
        self.format = bound.dev.data.format
        self.where = where
        """Per value array, the device int32 map (1-based CSR positions, 0 padding), or None (a copy)."""
        from sparserl.harness.device import kernel_args

        marks = (object(), object())
        args = kernel_args(bound.op, bound.dev, marks[0], marks[1], bound.k)
        from sparserl.operator.launch import PackedLaunch

        ix, iy = (next(i for i, a in enumerate(args) if a is mark) for mark in marks)  # by identity: arrays have no ==
        self.launch = PackedLaunch(bound.kernels, bound.launches, args, ix, iy)
        """The kernel's launches on packed arguments: ``launch(x_ptr, y_ptr, stream_ptr)``."""
        self.zero_fill: bool = bound.dev.data.zero_fill_y
        """Whether the format's kernels accumulate into a zeroed output (the contract's output policy;
        read once: a product reads it on every call)."""

    @property
    def name(self) -> str:
        return f"{self.bound.dev.data.header_line().removeprefix('FORMAT: ')} kernel"

    def run_pointers(self, x_ptr: int, y_ptr: int, y_bytes: int, stream_ptr: int) -> None:
        """``y = A x`` on raw device addresses (a CuPy array's, a PyTorch tensor's ``data_ptr()``) and a
        raw stream, no array objects made on the way: the harness's launch sequence (its output
        policy, then every LAUNCH line) on arguments packed once per operator, where only ``x`` and
        ``y`` change from call to call."""
        if self.zero_fill:
            self._cp.cuda.runtime.memsetAsync(y_ptr, 0, y_bytes, stream_ptr)
        self.launch(x_ptr, y_ptr, stream_ptr)

    def runner(self, x, y):
        """A function that enqueues ``y = A x`` on the current stream, arguments built once (a CUDA graph
        can capture it)."""
        return self.bound.runner(x, y)

    def csr_values(self):
        """The device array that holds the values in CSR order, when the format stores them so."""
        name = next((n for n, w in self.where.items() if w is None), None)
        return self.bound.dev.arrays[name] if name is not None else None

    def current_values(self):
        """The values the kernel reads now, in CSR order: the value array itself (CSR, COO), or read
        back from the format's value arrays through the value map (a new array)."""
        own = self.csr_values()
        if own is not None:
            return own
        cp = self._cp
        out = cp.empty(self.A.nnz, dtype=cp.float32)
        for name, w in self.where.items():
            held = w > 0
            out[w[held] - 1] = self.bound.dev.arrays[name][held]
        return out

    def value_array(self):
        return self.csr_values() if len(self.where) == 1 else None

    def set_values(self, values) -> None:
        """Write new values (a CuPy float32 array in CSR order) into the format's value arrays: one
        copy (CSR, COO) or one gather per value array, padding slots kept zero."""
        for name, w in self.where.items():
            dst = self.bound.dev.arrays[name]
            if w is None:
                copy_values(dst, values)
            else:
                gather_values(values, w, dst)

    def close(self) -> None:
        pass


class LibraryBackend(_Backend):
    """cuSPARSE's generic SpMV / SpMM on the matrix in CSR, descriptors made once."""

    format = "CSR"
    name = "cuSPARSE (library)"

    def __init__(self, A: sp.csr_array, op: Op, k: int | None):
        cp = self._cp = cupy_module()
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as cs

        self._cs, self.op, self.k = cs, op, k
        m, n = A.shape
        self.shape = (int(m), int(n))
        self.indptr = cp.asarray(A.indptr, dtype=cp.int32)
        self.indices = cp.asarray(A.indices, dtype=cp.int32)
        self.data = cp.asarray(A.data, dtype=cp.float32)
        self.handle = device.get_cusparse_handle()
        self._f32 = 0  # CUDA_R_32F
        self._opn = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        self.alpha = np.array(1.0, np.float32)
        self.beta = np.array(0.0, np.float32)
        self.mat = cs.createCsr(m, n, A.nnz, self.indptr.data.ptr, self.indices.data.ptr, self.data.data.ptr,
                                cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_BASE_ZERO, self._f32)
        x = cp.zeros((n,) if op is Op.SPMV else (n, k), dtype=cp.float32)
        y = cp.zeros((m,) if op is Op.SPMV else (m, k), dtype=cp.float32)
        dx, dy = self._descriptors(x.data.ptr, y.data.ptr)
        try:
            if op is Op.SPMV:
                size = cs.spMV_bufferSize(self.handle, self._opn, self.alpha.ctypes.data, self.mat, dx,
                                          self.beta.ctypes.data, dy, self._f32, 0)
            else:
                size = cs.spMM_bufferSize(self.handle, self._opn, self._opn, self.alpha.ctypes.data, self.mat, dx,
                                          self.beta.ctypes.data, dy, self._f32, 0)
        finally:
            self._destroy(dx, dy)
        self.buffer = cp.empty(max(int(size), 1), dtype=cp.uint8)
        self._kept: dict[tuple[int, int], tuple[int, int]] = {}
        self._owned: list[tuple[int, int]] = []  # the runners' descriptors, destroyed at close
        self._lock = threading.RLock()  # one handle: its stream is set and the call made as one step

    def _descriptors(self, x_ptr: int, y_ptr: int) -> tuple[int, int]:
        cs, m, n = self._cs, *self.shape
        if self.op is Op.SPMV:
            return cs.createDnVec(n, x_ptr, self._f32), cs.createDnVec(m, y_ptr, self._f32)
        k = self.k
        return (cs.createDnMat(n, k, k, x_ptr, self._f32, cs.CUSPARSE_ORDER_ROW),
                cs.createDnMat(m, k, k, y_ptr, self._f32, cs.CUSPARSE_ORDER_ROW))

    def _destroy(self, dx: int, dy: int) -> None:
        destroy = self._cs.destroyDnVec if self.op is Op.SPMV else self._cs.destroyDnMat
        destroy(dx)
        destroy(dy)

    zero_fill = False
    """cuSPARSE writes y (beta 0): nothing to zero first."""

    def run_pointers(self, x_ptr: int, y_ptr: int, y_bytes: int, stream_ptr: int) -> None:
        """``y = A x`` on raw device addresses and a raw stream (cuSPARSE's default algorithm, beta 0: y
        is written whatever it held), on descriptors made once per (x, y) address pair and kept in a
        bounded cache."""
        with self._lock:  # the descriptors cannot be evicted by another thread before the call
            self._enqueue(*self._descriptors_of(x_ptr, y_ptr), stream_ptr)

    def runner(self, x, y):
        """A function that enqueues ``y = A x`` on the current stream, for as long as the backend is
        open: its descriptors are its own (kept to ``close``, never evicted from the cache ``run``
        uses), so a captured graph or a solver's loop can call it any time later."""
        pair = self._descriptors(x.data.ptr, y.data.ptr)
        self._owned.append(pair)
        cp = self._cp
        return lambda: self._enqueue(*pair, cp.cuda.get_current_stream().ptr)

    def _enqueue(self, dx: int, dy: int, stream_ptr: int) -> None:
        """The library call on two dense descriptors through ctypes (CuPy's wrappers refuse to run
        inside a CUDA-graph capture; cuSPARSE's SpMV/SpMM with the backend's own buffer can be
        captured)."""
        from sparserl.harness.baseline import _libcusparse

        lib, handle, opn = _libcusparse(), self.handle, self._opn
        with self._lock:  # another thread's call between the two would run on this thread's stream
            status = lib.cusparseSetStream(handle, stream_ptr)
            if status == 0 and self.op is Op.SPMV:
                status = lib.cusparseSpMV(handle, opn, self.alpha.ctypes.data, self.mat, dx, self.beta.ctypes.data,
                                          dy, self._f32, 0, self.buffer.data.ptr)
            elif status == 0:
                status = lib.cusparseSpMM(handle, opn, opn, self.alpha.ctypes.data, self.mat, dx,
                                          self.beta.ctypes.data, dy, self._f32, 0, self.buffer.data.ptr)
        if status != 0:
            raise RuntimeError(f"cuSPARSE {'SpMV' if self.op is Op.SPMV else 'SpMM'} failed with status {status}")

    def _descriptors_of(self, x_ptr: int, y_ptr: int) -> tuple[int, int]:
        """Dense descriptors for these two addresses, made once and kept (a few hundred, oldest dropped):
        a descriptor holds only an address and a shape, and the shapes are the operator's."""
        with self._lock:
            return self._descriptors_locked(x_ptr, y_ptr)

    def _descriptors_locked(self, x_ptr: int, y_ptr: int) -> tuple[int, int]:
        key = (x_ptr, y_ptr)
        found = self._kept.pop(key, None)
        if found is None:
            found = self._descriptors(x_ptr, y_ptr)
            if len(self._kept) >= 256:
                self._destroy(*self._kept.pop(next(iter(self._kept))))
        self._kept[key] = found  # most recent last
        return found

    def csr_values(self):
        return self.data

    def current_values(self):
        return self.data

    def value_array(self):
        return self.csr_values()

    def set_values(self, values) -> None:
        copy_values(self.data, values)

    def close(self) -> None:
        for dx, dy in [*self._kept.values(), *self._owned]:
            self._destroy(dx, dy)
        self._kept.clear()
        self._owned.clear()
        if self.mat is not None:
            self._cs.destroySpMat(self.mat)
            self.mat = None
