"""Host-to-device copies through one page-locked buffer that a worker keeps and reuses.

``cupy.asarray`` on a host array copies it into page-locked memory taken from CuPy's pinned pool,
which keeps one block per size it has seen: a conversion of a size not seen before costs a fresh
``cudaHostAlloc`` (page-locking that many bytes, slower than the copy itself), and each such block
stays page-locked for the life of the process. A worker uploads a conversion of a new size for
nearly every first use of a format, so :class:`PinnedStaging` keeps one page-locked buffer instead,
grown (by doubling, up to ``cap_bytes``) only when a conversion does not fit, and

* :meth:`PinnedStaging.load` reads a caller's conversion folder (:mod:`sparserl.harness.preconvert`)
  straight into it, so the file's bytes are copied once on the host, not twice (into a NumPy
  array, into a pinned block) before the device copy, and each array's device copy is enqueued
  as soon as it is read, so it runs while the next is read;
* :meth:`PinnedStaging.upload` does the same for arrays already in memory (one host copy each).

Both wait for their copies before they return: the buffer is then free for the next. The host
conversion they return holds stand-ins for its arrays (:meth:`FormatData.metadata_only`), since its
arrays' only copy is on the device. A conversion past ``cap_bytes`` is copied as ``cupy.asarray``
copies (``cap_bytes`` 0: every one, as before the buffer).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from sparserl.formats import FormatData
from sparserl.harness import preconvert
from sparserl.harness.speed import STAGING_CAP_BYTES

log = logging.getLogger(__name__)

CAP_BYTES = STAGING_CAP_BYTES
"""The largest page-locked buffer a worker keeps by default (``SpeedConfig.staging_bytes``; 0 turns the buffer
off; ``benchmarks/harness_speed.py --paths unstaged,batched`` times both)."""
FIRST_BYTES = 64 << 20
"""The buffer's size when it is first made (or the first need, rounded up to a multiple of this)."""


class PinnedStaging:
    """One reusable page-locked host buffer and the copies through it (module docstring).

    ``allocate(nbytes)`` returns ``(buffer, keep)``: a 1-D uint8 array of ``nbytes`` page-locked
    bytes and the object that owns them; ``empty(shape, dtype)`` makes a device array,
    ``copy(device_array, host_view)`` enqueues one copy from the buffer into it, ``wait()`` waits
    for all enqueued ones, and ``asarray(host_array)`` copies an array from elsewhere (past the
    cap). The defaults are CuPy's; tests on a machine without a GPU pass their own."""

    def __init__(self, cap_bytes: int = CAP_BYTES, allocate=None, copy=None, wait=None, empty=None, asarray=None):
        self.cap_bytes = cap_bytes
        self._allocate = allocate or _pinned_buffer
        self._copy = copy or _copy_async
        self._wait = wait or _wait_current_stream
        self._empty = empty or _device_empty
        self._asarray = asarray or _asarray
        self._lock = threading.Lock()
        self._buffer: np.ndarray | None = None
        self._keep: Any = None
        self.grown = 0
        """How many times a buffer was made (the first time included)."""

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else int(self._buffer.size)

    def _buffer_for(self, nbytes: int) -> np.ndarray | None:
        """The buffer, grown first when ``nbytes`` does not fit; None past ``cap_bytes``."""
        if nbytes <= 0 or nbytes > self.cap_bytes:
            return None
        if self._buffer is None or self._buffer.size < nbytes:
            size = max(-(-nbytes // FIRST_BYTES) * FIRST_BYTES, 2 * self.nbytes)
            size = min(size, self.cap_bytes)
            self._buffer = self._keep = None  # the old one goes before the new one is made
            try:
                self._buffer, self._keep = self._allocate(size)
            except Exception as exc:  # host memory short: page-locking is an optimisation, not a need
                log.warning("could not page-lock %.2f GiB of host memory for uploads (%s); copying as "
                            "cupy.asarray copies from now on", size / 2**30, exc)
                self.cap_bytes = 0
                return None
            self.grown += 1
        return self._buffer

    def load(self, folder: Path) -> tuple[FormatData, dict[str, Any]] | str:
        """The conversion :func:`preconvert.save` left in ``folder`` on the device: its host side
        (stand-ins for its arrays) and its device arrays by name, or the converter's refusal message.
        Each array's copy is enqueued as soon as it is read, so it runs while the next is read.
        Raises OSError or ValueError as :func:`preconvert.load` does (the copies enqueued are waited
        for first, whatever is raised)."""
        with self._lock:
            out: dict[str, Any] = {}
            try:
                fd = preconvert.load(folder, self._buffer_for, on_read=lambda name, a: self._add(out, name, a))
            finally:
                self._wait()
            if isinstance(fd, str):
                return fd
            if self.cap_bytes > 0 and fd.nbytes > 0 and not any(map(self._in_buffer, fd.arrays.values())):
                log.info("a conversion of %.1f GiB is past the staging buffer's cap; copied as cupy.asarray copies",
                         fd.nbytes / 2**30)
            return fd.metadata_only(), out

    def upload(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """``arrays`` on the device, by name, each copied once into the buffer and from there (its
        device copy enqueued before the next is copied into the buffer), all waited for."""
        with self._lock:
            sizes = [preconvert.aligned(a.nbytes) for a in arrays.values()]
            buffer = self._buffer_for(sum(sizes))
            out: dict[str, Any] = {}
            try:
                at = 0
                for (name, a), size in zip(arrays.items(), sizes):
                    if buffer is not None:
                        raw = buffer[at:at + a.nbytes]
                        raw[...] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                        a = raw.view(a.dtype).reshape(a.shape)
                    self._add(out, name, a)
                    at += size
            finally:
                self._wait()
            return out

    def _add(self, out: dict[str, Any], name: str, a: np.ndarray) -> None:
        """``a`` copied into new device memory ``out[name]``: from the buffer, enqueued (the caller
        waits); from elsewhere (past the cap), as ``cupy.asarray`` copies."""
        if self._in_buffer(a):
            out[name] = self._empty(a.shape, a.dtype)
            self._copy(out[name], a)
        else:
            out[name] = self._asarray(a)

    def _in_buffer(self, a: np.ndarray) -> bool:
        if self._buffer is None or a.nbytes == 0:
            return False
        start = self._buffer.ctypes.data
        return start <= a.ctypes.data and a.ctypes.data + a.nbytes <= start + self._buffer.size


_STAGING: PinnedStaging | None = None
_STAGING_LOCK = threading.Lock()


def staging() -> PinnedStaging:
    """The process's staging buffer (made on first use)."""
    global _STAGING
    with _STAGING_LOCK:
        if _STAGING is None:
            _STAGING = PinnedStaging()
        return _STAGING


def _pinned_buffer(nbytes: int) -> tuple[np.ndarray, Any]:
    import cupy as cp

    mem = cp.cuda.PinnedMemoryPointer(cp.cuda.PinnedMemory(nbytes), 0)
    return np.frombuffer(mem, np.uint8, nbytes), mem


def _device_empty(shape, dtype):
    import cupy as cp

    return cp.empty(shape, dtype)


def _asarray(host: np.ndarray):
    import cupy as cp

    return cp.asarray(host)


def _copy_async(dev, host: np.ndarray) -> None:
    import ctypes

    import cupy as cp

    if host.nbytes:
        dev.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), host.nbytes,
                                      cp.cuda.get_current_stream())


def _wait_current_stream() -> None:
    import cupy as cp

    cp.cuda.get_current_stream().synchronize()
