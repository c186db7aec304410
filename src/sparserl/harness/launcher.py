"""Plan once, run many: a matrix's device conversions, and a completion bound to them.

:class:`MatrixOnDevice` converts a matrix to each format a completion asks for (once
per format and parameters; refusals are remembered as their message) and keeps the
device copies. :class:`BoundKernel` is a compiled completion plus one of those
conversions: ``run(x, y)`` applies the output policy and launches every LAUNCH line,
and ``runner(x, y)`` returns that as a closure for :mod:`sparserl.harness.timing`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import scipy.sparse as sp

from sparserl.errors import ContractError, FormatError
from sparserl.formats import ConversionLimits, convert
from sparserl.harness.device import DeviceMatrix, LoadedKernels, kernel_args, launch_all, load_kernels, prepare_output
from sparserl.kernels.contract import Header, LaunchConfig, Op, evaluate_launches


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
                self._cache[key] = DeviceMatrix.upload(convert(self.A, fmt, params, self.limits))
            except FormatError as exc:
                self._cache[key] = str(exc)
        return self._cache[key]


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
        try:
            launches = evaluate_launches(header, op, dev.data.launch_env(op, k, num_sms))
        except (ContractError, FormatError) as exc:
            return str(exc)
        return cls(header, op, load_kernels(cubin_path), dev, k, launches)

    def run(self, x: Any, y: Any) -> None:
        """Apply the output policy to ``y`` and launch everything on the current stream."""
        prepare_output(self.dev.data, y)
        launch_all(self.kernels, self.launches, kernel_args(self.op, self.dev, x, y, self.k))

    def runner(self, x: Any, y: Any) -> Callable[[], None]:
        args = kernel_args(self.op, self.dev, x, y, self.k)

        def run() -> None:
            prepare_output(self.dev.data, y)
            launch_all(self.kernels, self.launches, args)

        return run
