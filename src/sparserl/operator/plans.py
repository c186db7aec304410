"""A kernel bound to a matrix: the pattern converted once per structure, the values gathered on the GPU.

:func:`bind` converts the matrix's *pattern* to the kernel's format (each nonzero's position as
its value, :mod:`sparserl.operator.values`), uploads the index arrays and the value map, and fills
the value arrays by one gather per array from the matrix's CSR values on the GPU; the kernel is
then bound exactly as :meth:`BoundKernel.bind <sparserl.harness.launcher.BoundKernel.bind>` binds
it (the same LAUNCH evaluation, the same launch path). The map stays on the device for
``update_values``.

A pattern conversion depends on the structure alone, so the process keeps the last few: tuning a
known structure again (a new matrix object for the next Newton step, a second layer on the same
graph) skips the host conversion.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.formats import ConversionLimits, FormatData
from sparserl.kernels.contract import Header, Op
from sparserl.operator.values import ValueMap, pattern_conversion

log = logging.getLogger(__name__)

KEEP = 4
"""Pattern conversions remembered per process (host memory: about the matrix's size in its format each)."""

_KEPT: OrderedDict[tuple, tuple[FormatData, ValueMap]] = OrderedDict()
_LOCK = threading.Lock()


def conversion(A: sp.csr_array, fingerprint: str, fmt: str, params: dict[str, int],
               limits: ConversionLimits | None = None) -> tuple[FormatData, ValueMap]:
    """``A``'s pattern in ``fmt`` and its value map, converted or remembered from an earlier call for
    this structure (raises :class:`FormatError` when the format refuses it)."""
    key = (fingerprint, fmt, tuple(sorted(params.items())), limits)
    with _LOCK:
        kept = _KEPT.get(key)
        if kept is not None:
            _KEPT.move_to_end(key)
            log.debug("%s %s: pattern conversion reused", fingerprint[:12], fmt)
            return kept
    kept = pattern_conversion(A, fmt, params, limits)
    with _LOCK:
        _KEPT[key] = kept
        while len(_KEPT) > KEEP:
            _KEPT.popitem(last=False)
    return kept


def upload(fd: FormatData, vmap: ValueMap, values) -> tuple[object, dict]:
    """The conversion on the device with ``values`` (device float32, CSR order) gathered into its value
    arrays: (DeviceMatrix, the device value map by array: int32 positions, or None for a copy)."""
    import cupy as cp

    from sparserl.harness.device import DeviceMatrix
    from sparserl.operator.backends import gather_values

    arrays, where = {}, {}
    for name, arr in fd.arrays.items():
        if name not in vmap.where:
            arrays[name] = cp.asarray(arr)
        elif vmap.where[name] is None:
            arrays[name], where[name] = values.copy(), None
        else:
            where[name] = cp.asarray(vmap.where[name])
            arrays[name] = cp.empty(arr.size, dtype=cp.float32)
            gather_values(values, where[name], arrays[name])
    return DeviceMatrix(fd, arrays), where


def bind(A: sp.csr_array, fingerprint: str, header: Header, op: Op, cubin_path: str, k: int | None):
    """The compiled kernel bound to ``A`` on the current GPU and the device value map; or (why it
    does not bind: a refused format, LAUNCH expressions invalid here, None)."""
    import cupy as cp

    from sparserl.harness.device import load_kernels, num_sms
    from sparserl.harness.launcher import BoundKernel, plan_launches

    try:
        fd, vmap = conversion(A, fingerprint, header.format, header.params)
    except FormatError as exc:
        return str(exc), None
    launches = plan_launches(header, op, fd, k, num_sms())
    if isinstance(launches, str):
        return launches, None
    dev, where = upload(fd, vmap, cp.asarray(A.data, dtype=cp.float32))
    return BoundKernel(header, op, load_kernels(cubin_path), dev, k, launches), where


def forget() -> None:
    """Drop every remembered conversion."""
    with _LOCK:
        _KEPT.clear()
