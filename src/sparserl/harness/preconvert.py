"""Pattern conversions made on the caller's side, ahead of the GPU worker (batched path).

A worker on the batched path converts a matrix's *pattern* once per format and parameters, with each
nonzero's position as its value, and gathers its two versions' values into place on the GPU
(:class:`~sparserl.harness.launcher.TwinConversions`). That conversion depends on the pattern
alone, so the caller can make it: :class:`Preconverter` converts in the evaluator's compile threads,
while the worker verifies and times other candidates, and leaves the result in a folder that the
job names. The worker loads it instead of converting, so a first use of a format costs the worker a
load and an upload; the conversion itself overlaps the GPU's work and runs on as many cores as there
are candidates in flight. A folder that is missing or unreadable is converted by the worker, as
before, and a loaded conversion passes the same check on the GPU (every nonzero named exactly once)
as one the worker made.

The folders live in a temporary directory of the evaluator, at most ``budget_bytes`` of them (the
least recently used are removed first), and go when it closes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.formats import ConversionLimits, FormatData, convert

log = logging.getLogger(__name__)

BUDGET_BYTES = 8 << 30
"""Disk a :class:`Preconverter` keeps its conversions in, at most (least recently used removed)."""
MATRICES = 4
"""Matrices a :class:`Preconverter` keeps loaded (least recently used dropped)."""


def positions(nnz: int) -> np.ndarray:
    """Each nonzero's 1-based position as a float32 bit pattern: the values a pattern is converted
    with, so that every value slot of the result names the nonzero it holds."""
    return np.arange(1, nnz + 1, dtype=np.int32).view(np.float32)


def pattern(A: sp.csr_array) -> sp.csr_array:
    """``A``'s pattern with :func:`positions` as its values."""
    return sp.csr_array((positions(A.nnz), A.indices, A.indptr), shape=A.shape)


def convert_pattern(A: sp.csr_array, fmt: str, params: dict[str, int],
                    limits: ConversionLimits | None = None) -> FormatData:
    """The conversion of ``A``'s pattern (:func:`pattern`); raises the converter's FormatError."""
    return convert(pattern(A), fmt, params, limits)


def save(conversion: FormatData | str, folder: Path) -> int:
    """Write a conversion (or a converter's refusal message) into ``folder``, atomically (a reader
    sees all of it or nothing); returns the bytes written."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        if isinstance(conversion, str):
            meta: dict = {"refused": conversion}
            nbytes = 0
        else:
            meta = {"format": conversion.format, "params": conversion.params, "shape": list(conversion.shape),
                    "nnz": conversion.nnz, "sizes": conversion.sizes, "arrays": list(conversion.arrays),
                    "convert_seconds": conversion.convert_seconds}
            for i, arr in enumerate(conversion.arrays.values()):
                np.save(tmp / f"{i}.npy", arr, allow_pickle=False)
            nbytes = conversion.nbytes
        (tmp / "meta.json").write_text(json.dumps(meta))
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return nbytes


ALIGN = 256
"""Byte alignment of each array in a buffer :func:`load` reads into (what a device copy likes)."""


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGN`: an array's room in a shared buffer."""
    return -(-nbytes // ALIGN) * ALIGN


def _npy_layout(f) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype, shape and data bytes of the ``.npy`` file open at ``f``, left at its first data byte; ValueError
    for what :func:`save` never writes (another version's header, Fortran order, objects, a negative
    dimension, data of another length than the header says)."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unexpected .npy version {version}")
    if fortran and len(shape) > 1 or dtype.hasobject or not dtype.isnative:
        raise ValueError(f"unexpected .npy layout: {dtype}, Fortran order {fortran}")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"unexpected .npy shape {shape}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if (data := os.fstat(f.fileno()).st_size - f.tell()) != nbytes:
        raise ValueError(f"{data} bytes of data where the header says {shape} of {dtype}")
    return dtype, shape, nbytes


def load(folder: Path, buffer_for=None, on_read=None) -> FormatData | str:
    """What :func:`save` wrote: the conversion, or the refusal message. Raises OSError or ValueError
    when the folder is missing or damaged.

    ``buffer_for(nbytes)``, when given, returns a byte buffer (a 1-D uint8 array, e.g. page-locked
    staging memory) of at least ``nbytes``, or None: the arrays are then read straight into it, one
    after another at :data:`ALIGN`-byte offsets, and the conversion's arrays are views of it (valid
    for as long as the buffer's owner keeps it); with None, or no ``buffer_for``, each array gets
    memory of its own, as ``np.load`` gives. ``on_read(name, array)``, when given, is called with each
    array as soon as it is read (before the next is)."""
    meta = json.loads((folder / "meta.json").read_text())
    if "refused" in meta:
        return str(meta["refused"])
    names = list(meta["arrays"])
    with contextlib.ExitStack() as files:
        layouts = []
        for i in range(len(names)):
            f = files.enter_context(open(folder / f"{i}.npy", "rb"))
            layouts.append((f, *_npy_layout(f)))
        offsets = np.cumsum([0] + [aligned(nb) for *_, nb in layouts]).tolist()
        buffer = buffer_for(offsets[-1]) if buffer_for is not None else None
        arrays = {}
        for name, (f, dtype, shape, nbytes), at in zip(names, layouts, offsets):
            raw = buffer[at:at + nbytes] if buffer is not None else np.empty(nbytes, np.uint8)
            if _read_into(f, raw) != nbytes:
                raise ValueError(f"damaged conversion in {folder}: {name} is shorter than its header says")
            arrays[name] = raw.view(dtype).reshape(shape)
            if on_read is not None:
                on_read(name, arrays[name])
    try:
        return FormatData(format=meta["format"], params=dict(meta["params"]), shape=tuple(meta["shape"]),
                          nnz=int(meta["nnz"]), sizes=dict(meta["sizes"]), arrays=arrays,
                          convert_seconds=float(meta["convert_seconds"]))
    except (AssertionError, KeyError, TypeError) as exc:  # not the contract's layout
        raise ValueError(f"damaged conversion in {folder}: {exc}") from None


def _read_into(f, raw: np.ndarray) -> int:
    """Read from ``f`` into the byte array ``raw`` until it is full or the file ends; bytes read."""
    view, got = memoryview(raw), 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _remove_orphans(root: Path) -> None:
    """Remove the folders of evaluators whose process is gone (killed before it could close)."""
    for d in root.glob("conversions-*-*"):
        try:
            pid = int(d.name.split("-")[1])
            os.kill(pid, 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # another user's live process
            continue


class Preconverter:
    """The caller's pattern conversions for its jobs (module docstring). Thread-safe: one conversion
    per (matrix, format, parameters), whoever asks first makes it and the others wait for it."""

    def __init__(self, root: Path, budget_bytes: int = BUDGET_BYTES):
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        _remove_orphans(root)
        self.dir = Path(tempfile.mkdtemp(prefix=f"conversions-{os.getpid()}-", dir=root))
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._making: dict[tuple, threading.Lock] = {}
        self._done: OrderedDict[tuple, tuple[Path, int]] = OrderedDict()
        self._matrices: OrderedDict[str, sp.csr_array] = OrderedDict()

    def folder(self, key: str, path: str, fmt: str, params: dict[str, int]) -> str:
        """The folder holding the pattern conversion of the matrix saved at ``path`` (content key
        ``key``) into ``fmt`` with ``params``, made now if it is not there yet."""
        ckey = (key, fmt, tuple(sorted(params.items())))
        with self._lock:
            if ckey in self._done:
                self._done.move_to_end(ckey)
                return str(self._done[ckey][0])
            making = self._making.setdefault(ckey, threading.Lock())
        with making:
            with self._lock:
                if ckey in self._done:
                    return str(self._done[ckey][0])
            try:
                made: FormatData | str = convert_pattern(self._matrix(key, path), fmt, params)
            except FormatError as exc:
                made = str(exc)
            folder = self.dir / hashlib.sha1(repr(ckey).encode()).hexdigest()[:24]
            nbytes = save(made, folder)
            with self._lock:
                self._done[ckey] = (folder, nbytes)
                self._making.pop(ckey, None)
                self._evict()
        return str(folder)

    def _matrix(self, key: str, path: str) -> sp.csr_array:
        from sparserl.harness.matrix_files import load_matrix_file

        with self._lock:
            A = self._matrices.get(key)
            if A is not None:
                self._matrices.move_to_end(key)
                return A
        A = load_matrix_file(path)
        with self._lock:
            self._matrices[key] = A
            while len(self._matrices) > MATRICES:
                self._matrices.popitem(last=False)
        return A

    def _evict(self) -> None:
        """Remove the least recently used folders past the budget (never the newest); a worker that
        finds one gone converts for itself."""
        total = sum(n for _, n in self._done.values())
        while total > self.budget_bytes and len(self._done) > 1:
            _, (folder, nbytes) = self._done.popitem(last=False)
            shutil.rmtree(folder, ignore_errors=True)
            total -= nbytes

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
