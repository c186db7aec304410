"""Plan once, run many: a matrix's device conversions, and a completion bound to them.

:class:`MatrixOnDevice` converts a matrix to each format a completion asks for (once
per format and parameters; refusals are remembered as their message) and keeps the
device copies; :class:`TwinConversions` does the same for a matrix and its fresh-valued twin
together, converting their pattern once. :class:`BoundKernel` is a compiled completion plus one of those
conversions: ``runner(x, y)`` returns the one launch path every caller uses (the output
policy, then every LAUNCH line in order; verification, timing and
:func:`sparserl.load_kernel` alike), and ``run(x, y)`` calls it once.
:func:`plan_launches` evaluates the LAUNCH lines against a conversion; the compile-only path
uses it on the host exactly as a worker does on the GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparserl.errors import ContractError, FormatError
from sparserl.formats import ConversionLimits, FormatData, convert
from sparserl.harness import profile
from sparserl.harness.device import DeviceMatrix, LoadedKernels, kernel_args, launch_all, load_kernels, prepare_output
from sparserl.harness.staging import staging
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
        if key in self._cache:
            self._cache[key] = self._cache.pop(key)  # most recently used last (memory.shed_plan's order)
        else:
            try:
                with profile.step("convert"):
                    fd = convert(self.A, fmt, params, self.limits)
                with profile.step("upload"):
                    self._cache[key] = DeviceMatrix.upload(fd)
            except FormatError as exc:
                self._cache[key] = str(exc)
        return self._cache[key]


@dataclass
class TwinConversions:
    """A matrix ``A`` and its fresh-valued twin ``A_alt`` (one pattern) converted together, keyed by
    (format, parameters): the pattern is converted once on the host, with each nonzero's 1-based
    position as its value (:func:`~sparserl.harness.preconvert.pattern`; the caller may have made it
    already, ``files``). Converters place values
    by the pattern alone and move them bit for bit, so every value slot of that conversion names the
    nonzero it holds; it is uploaded once (index arrays copied on the device for the twin), checked on
    the GPU to name every nonzero exactly once and nothing else, and both matrices' values are gathered
    into place on the GPU from ``values`` (their CSR values, already there). Bit for bit what two
    conversions give; if the check fails (a converter that looked at the values), the two are
    converted and uploaded separately. ``view(which)`` is what :meth:`BoundKernel.bind` takes."""

    A: sp.csr_array
    A_alt: sp.csr_array
    values: dict
    """Device float32 arrays of ``A``'s and ``A_alt``'s CSR values, by "A" and "A_alt"."""
    sms: int = 132
    limits: ConversionLimits = field(default_factory=ConversionLimits)
    files: dict[tuple, str] = field(default_factory=dict)
    """Folders of pattern conversions the caller made (:mod:`sparserl.harness.preconvert`), by
    (format, sorted parameters): loaded instead of converting; one that cannot be read is converted."""
    _cache: dict[tuple, tuple[DeviceMatrix, DeviceMatrix] | str] = field(default_factory=dict)

    def get(self, which: str, fmt: str, params: dict[str, int]) -> DeviceMatrix | str:
        """One version's uploaded conversion, or the converter's refusal message."""
        key = (fmt, tuple(sorted(params.items())))
        if key in self._cache:
            self._cache[key] = self._cache.pop(key)  # most recently used last (memory.shed_plan's order)
        else:
            try:
                self._cache[key] = self._convert(fmt, params)
            except FormatError as exc:
                self._cache[key] = str(exc)
        got = self._cache[key]
        return got if isinstance(got, str) else got[0 if which == "A" else 1]

    def _convert(self, fmt: str, params: dict[str, int]) -> tuple[DeviceMatrix, DeviceMatrix]:
        import cupy as cp

        from sparserl.harness import gpucheck, preconvert

        A = self.A
        fd: FormatData | str | None = None
        dev: dict | None = None
        if (folder := self.files.pop((fmt, tuple(sorted(params.items()))), None)) is not None:
            with profile.step("load_conversion"):  # read into the staging buffer and copied from it
                try:
                    got = staging().load(Path(folder))
                    fd, dev = (got, None) if isinstance(got, str) else got
                except (OSError, ValueError) as exc:
                    log.info("the caller's conversion in %s could not be read (%s); converting here", folder, exc)
        if fd is None:
            with profile.step("convert"):
                try:
                    fd = preconvert.convert_pattern(A, fmt, params, self.limits)
                except FormatError as exc:
                    fd = str(exc)
        if isinstance(fd, str):
            raise FormatError(fd)
        with profile.step("upload"):
            if dev is None:
                dev = staging().upload(fd.arrays)
                fd = fd.metadata_only()  # the arrays' one copy is on the device now
            # positions are compared and gathered as int32 words
            dev = {name: d.view(cp.int32) if d.dtype == np.float32 else d for name, d in dev.items()}
            wheres = [dev[name] for name, arr in fd.arrays.items() if arr.dtype == np.float32]
            if gpucheck.placed_once(wheres, A.nnz, self.sms):
                out = []
                for which in ("A", "A_alt"):
                    arrays = {name: (gpucheck.gather_values(d, self.values[which], self.sms)
                                     if fd.arrays[name].dtype == np.float32 else d if which == "A" else d.copy())
                              for name, d in dev.items()}
                    out.append(DeviceMatrix(fd, arrays))
                return out[0], out[1]
        log.warning("%s %s: the converter did not place every nonzero exactly once by its position; converting "
                    "the matrix and its fresh-valued twin separately", fmt, params)
        with profile.step("convert"):
            fa, fb = convert(A, fmt, params, self.limits), convert(self.A_alt, fmt, params, self.limits)
        with profile.step("upload"):
            return DeviceMatrix.upload(fa), DeviceMatrix.upload(fb)

    def view(self, which: str) -> "TwinView":
        if which not in ("A", "A_alt"):
            raise ValueError(f"which must be 'A' or 'A_alt', got {which!r}")
        return TwinView(self, which)


@dataclass
class TwinView:
    """One version of a :class:`TwinConversions`, with :class:`MatrixOnDevice`'s ``get``."""

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
    def bind(cls, header: Header, op: Op, cubin_path: str, matrix: "MatrixOnDevice | TwinView", k: int | None,
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
