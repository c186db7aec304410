"""Plan once, run many: a matrix's device conversions, and a completion bound to them.

:class:`MatrixOnDevice` converts a matrix to each format a completion asks for (once
per format and parameters; refusals are remembered as their message) and keeps the
device copies; :class:`TwinConversions` does the same for a matrix and its fresh-valued twin
together, converting their common pattern once (:func:`convert_twins`). :class:`BoundKernel` is a
compiled completion plus one of those conversions: ``runner(x, y)`` returns the one launch path every caller uses (the output
policy, then every LAUNCH line in order; verification, timing and
:func:`sparserl.load_kernel` alike), and ``run(x, y)`` calls it once.
:func:`plan_launches` evaluates the LAUNCH lines against a conversion; the compile-only path
uses it on the host exactly as a worker does on the GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparserl.errors import ContractError, FormatError
from sparserl.formats import ConversionLimits, FormatData, convert
from sparserl.harness import profile
from sparserl.harness.device import DeviceMatrix, LoadedKernels, kernel_args, launch_all, load_kernels, prepare_output
from sparserl.kernels.contract import Header, LaunchConfig, Op, evaluate_launches

log = logging.getLogger(__name__)


@dataclass
class MatrixOnDevice:
    """One matrix and its device conversions, keyed by (format, parameters)."""

    A: sp.csr_array
    limits: ConversionLimits = field(default_factory=ConversionLimits)
    _cache: dict[tuple, DeviceMatrix | str] = field(default_factory=dict)

    def get(self, fmt: str, params: dict[str, int]) -> DeviceMatrix | str:
        """The uploaded conversion, or the converter's refusal message."""
        key = (fmt, tuple(sorted(params.items())))
        if key not in self._cache:
            try:
                with profile.step("convert"):
                    fd = convert(self.A, fmt, params, self.limits)
                with profile.step("upload"):
                    self._cache[key] = DeviceMatrix.upload(fd)
            except FormatError as exc:
                self._cache[key] = str(exc)
        return self._cache[key]


def convert_twins(A: sp.csr_array, A_alt: sp.csr_array, fmt: str, params: dict[str, int],
                  limits: ConversionLimits | None = None) -> tuple[FormatData, FormatData]:
    """``convert(A)`` and ``convert(A_alt)`` for two matrices of one pattern, converting once.

    The pattern is converted with each nonzero's position (1-based, its int32 bits as the float32
    value) in place of its value: converters place values by the pattern alone and copy them bit
    for bit, so each value array of the result says which nonzero every slot holds (0: padding), and
    both matrices' values are gathered through it. Before they are, the positions are checked to
    be a permutation of the nonzeros (each placed once); if they are not, a converter looked at
    the values, and both matrices are converted separately. Raises the converter's
    :class:`~sparserl.errors.FormatError`, as :func:`~sparserl.formats.convert` does.
    """
    if A.shape != A_alt.shape or A.nnz != A_alt.nnz:
        raise ValueError("convert_twins needs two matrices of one pattern")
    t0 = time.perf_counter()
    tags = np.arange(1, A.nnz + 1, dtype=np.int32).view(np.float32)
    fd = convert(sp.csr_array((tags, A.indices, A.indptr), shape=A.shape), fmt, params, limits)
    maps = {name: arr.view(np.int32) for name, arr in fd.arrays.items() if arr.dtype == np.float32}
    placed = np.concatenate([m[m != 0] for m in maps.values()]) if maps else np.zeros(0, np.int32)
    if not (placed.size == A.nnz and (placed.size == 0 or (placed.min() >= 1 and placed.max() <= A.nnz
                                                             and np.bincount(placed - 1).max() == 1))):
        log.warning("%s: the converter did not place every nonzero exactly once by position; converting the "
                    "matrix and its fresh-valued twin separately", fmt)
        return convert(A, fmt, params, limits), convert(A_alt, fmt, params, limits)
    convert_s = time.perf_counter() - t0
    out = []
    for data in (A.data, A_alt.data):
        t1 = time.perf_counter()
        arrays = {name: (np.where(maps[name] > 0, data[maps[name] - 1], np.float32(0)).astype(np.float32)
                         if name in maps else arr) for name, arr in fd.arrays.items()}
        out.append(FormatData(format=fd.format, params=dict(fd.params), shape=fd.shape, nnz=fd.nnz,
                              sizes=dict(fd.sizes), arrays=arrays,
                              convert_seconds=convert_s + time.perf_counter() - t1, extra=dict(fd.extra)))
    return out[0], out[1]


@dataclass
class TwinConversions:
    """The device conversions of a matrix ``A`` and its fresh-valued twin ``A_alt`` (same pattern),
    made together by :func:`convert_twins`, keyed by (format, parameters). ``view(which)`` is what
    :meth:`BoundKernel.bind` takes for one of them."""

    A: sp.csr_array
    A_alt: sp.csr_array
    limits: ConversionLimits = field(default_factory=ConversionLimits)
    _cache: dict[tuple, tuple[DeviceMatrix, DeviceMatrix] | str] = field(default_factory=dict)

    def get(self, which: str, fmt: str, params: dict[str, int]) -> DeviceMatrix | str:
        key = (fmt, tuple(sorted(params.items())))
        if key not in self._cache:
            try:
                with profile.step("convert"):
                    fa, fb = convert_twins(self.A, self.A_alt, fmt, params, self.limits)
                with profile.step("upload"):
                    self._cache[key] = (DeviceMatrix.upload(fa), DeviceMatrix.upload(fb))
            except FormatError as exc:
                self._cache[key] = str(exc)
        got = self._cache[key]
        return got if isinstance(got, str) else got[0 if which == "A" else 1]

    def view(self, which: str) -> "_TwinView":
        if which not in ("A", "A_alt"):
            raise ValueError(f"which must be 'A' or 'A_alt', got {which!r}")
        return _TwinView(self, which)


@dataclass
class _TwinView:
    twins: TwinConversions
    which: str

    def get(self, fmt: str, params: dict[str, int]) -> DeviceMatrix | str:
        return self.twins.get(self.which, fmt, params)


def plan_launches(header: Header, op: Op, fd: FormatData | dict[str, int], k: int | None = None,
                  num_sms: int = 132) -> list[LaunchConfig] | str:
    """The concrete launches of ``header`` for this conversion (or its launch environment, the
    names LAUNCH expressions read), or why they break the contract."""
    try:
        env = fd if isinstance(fd, dict) else fd.launch_env(op, k, num_sms)
        return evaluate_launches(header, op, env)
    except (ContractError, FormatError) as exc:
        return str(exc)


@dataclass
class BoundKernel:
    """A compiled completion bound to a converted matrix on the device."""

    header: Header
    op: Op
    kernels: LoadedKernels
    dev: DeviceMatrix
    k: int | None
    launches: list[LaunchConfig]

    @classmethod
    def bind(cls, header: Header, op: Op, cubin_path: str, matrix: MatrixOnDevice, k: int | None,
             num_sms: int) -> "BoundKernel | str":
        """Bind, or return why not (format refused, LAUNCH expressions invalid for this matrix)."""
        dev = matrix.get(header.format, header.params)
        if isinstance(dev, str):
            return dev
        with profile.step("bind"):
            launches = plan_launches(header, op, dev.data, k, num_sms)
            if isinstance(launches, str):
                return launches
            return cls(header, op, load_kernels(cubin_path), dev, k, launches)

    @property
    def conversion_key(self) -> tuple:
        """(format, parameters) of the conversion this kernel runs on."""
        return self.dev.data.format, tuple(sorted(self.dev.data.params.items()))

    def runner(self, x: Any, y: Any) -> Callable[[], None]:
        """The launch sequence on ``x`` and ``y``: the output policy, then every LAUNCH line in order,
        enqueued on the current stream (arguments are built once, so a graph can capture it)."""
        args = kernel_args(self.op, self.dev, x, y, self.k)

        def run() -> None:
            prepare_output(self.dev.data, y)
            launch_all(self.kernels, self.launches, args)

        return run

    def run(self, x: Any, y: Any) -> None:
        """Run the launch sequence once on ``x`` and ``y``."""
        self.runner(x, y)()
