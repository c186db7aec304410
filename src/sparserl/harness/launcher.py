"""Plan once, run many: a matrix's device conversions, and a completion bound to them.

:class:`MatrixOnDevice` converts a matrix to each format a completion asks for (once
per format and parameters; refusals are remembered as their message) and keeps the
device copies. :class:`BoundKernel` is a compiled completion plus one of those
conversions: ``runner(x, y)`` returns the one launch path every caller uses (the output
policy, then every LAUNCH line in order; verification, timing and
:func:`sparserl.load_kernel` alike), and ``run(x, y)`` calls it once.
:func:`plan_launches` evaluates the LAUNCH lines against a conversion; the compile-only path
uses it on the host exactly as a worker does on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import scipy.sparse as sp

from sparserl.errors import ContractError, FormatError
from sparserl.formats import ConversionLimits, FormatData, convert
from sparserl.harness import profile
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
                with profile.step("convert"):
                    fd = convert(self.A, fmt, params, self.limits)
                with profile.step("upload"):
                    self._cache[key] = DeviceMatrix.upload(fd)
            except FormatError as exc:
                self._cache[key] = str(exc)
        return self._cache[key]


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
