"""A kernel bound to a matrix, with the host conversion of a structure remembered in the process.

Tuning the same structure again in one process (a new matrix object for the next Newton step, a
second layer with the same graph) skips the host conversion: the last few conversions are kept
with their value maps, and a new matrix of a known structure gets its format's value arrays by one
gather from its CSR values (:mod:`sparserl.formats.value_map`) instead of a conversion. The kernel
is then bound exactly as :meth:`BoundKernel.bind <sparserl.harness.launcher.BoundKernel.bind>`
binds it (the same upload, the same LAUNCH evaluation).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.formats import ConversionLimits, FormatData, convert
from sparserl.formats.value_map import ValueMap, value_map
from sparserl.kernels.contract import Header, Op

log = logging.getLogger(__name__)

KEEP = 4
"""Conversions remembered per process (host memory: about the matrix's size in its format each)."""


@dataclass
class Conversion:
    """A structure's conversion to one format, and the map that revalues it."""

    data: FormatData
    map: ValueMap | None = None


_KEPT: OrderedDict[tuple, Conversion] = OrderedDict()
_LOCK = threading.Lock()


def conversion(A: sp.csr_array, fingerprint: str, fmt: str, params: dict[str, int],
               limits: ConversionLimits | None = None) -> Conversion:
    """``A`` in ``fmt`` (raises :class:`FormatError` when refused): converted, or, for a structure
    converted before in this process, the remembered arrays revalued with ``A``'s values."""
    key = (fingerprint, fmt, tuple(sorted(params.items())), limits)
    with _LOCK:
        kept = _KEPT.get(key)
        if kept is not None:
            _KEPT.move_to_end(key)
    if kept is None:
        conv = Conversion(convert(A, fmt, params, limits))
        with _LOCK:
            _KEPT[key] = conv
            while len(_KEPT) > KEEP:
                _KEPT.popitem(last=False)
        return conv
    if kept.map is None:
        kept.map = value_map(A, kept.data)
    arrays = dict(kept.data.arrays)
    arrays.update(kept.map.apply(A.data))
    log.debug("%s %s: conversion reused for a known structure", fingerprint[:12], fmt)
    return Conversion(replace(kept.data, arrays=arrays, convert_seconds=0.0), kept.map)


def bind(A: sp.csr_array, fingerprint: str, header: Header, op: Op, cubin_path: str, k: int | None):
    """The compiled kernel bound to ``A``'s conversion on the current GPU, with the conversion's value
    map when known; or why it does not bind (a refused format, LAUNCH expressions invalid here)."""
    from sparserl.harness.device import DeviceMatrix, load_kernels, num_sms
    from sparserl.harness.launcher import BoundKernel, plan_launches

    try:
        conv = conversion(A, fingerprint, header.format, header.params)
    except FormatError as exc:
        return str(exc), None
    launches = plan_launches(header, op, conv.data, k, num_sms())
    if isinstance(launches, str):
        return launches, None
    dev = DeviceMatrix.upload(conv.data)
    return BoundKernel(header, op, load_kernels(cubin_path), dev, k, launches), conv.map


def forget() -> None:
    """Drop every remembered conversion."""
    with _LOCK:
        _KEPT.clear()
