"""The converted form of a matrix in one storage format, as the kernel contract lays it out.

:class:`FormatData` holds the integer sizes and the host arrays, in the exact order
and dtypes of :mod:`sparserl.kernels.contract`, plus the conversion's measured
cost. Its ``__post_init__`` checks it against the contract, so a converter that
drifts from the documented layout fails loudly in tests.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from sparserl.errors import FormatError
from sparserl.kernels.contract import FormatSpec, Op, format_spec

_DTYPES = {"int": np.dtype(np.int32), "float": np.dtype(np.float32)}


@dataclass(frozen=True)
class ConversionLimits:
    """Limits that stop a conversion from storing far more than the matrix holds."""

    max_fill: float = 10.0
    """Most stored slots (padding included) per nonzero for ELL, SELL, DIA, BSR, and HYB's ELL part."""
    max_slots: int = 1 << 30
    """Most stored slots in any one array (4 GiB of fp32), whatever the fill."""

    def __post_init__(self) -> None:
        if self.max_fill < 1.0:
            raise FormatError(f"max_fill must be at least 1.0, got {self.max_fill}")

    def check(self, fmt: str, slots: int, nnz: int, hint: str = "") -> None:
        """Raise :class:`FormatError` if ``slots`` stored entries is too many for ``nnz`` nonzeros."""
        if slots > self.max_slots or slots > self.max_fill * max(nnz, 1):
            ratio = slots / max(nnz, 1)
            raise FormatError(
                f"{fmt} would store {slots} slots for {nnz} nonzeros ({ratio:.1f}x, limit "
                f"{self.max_fill:g}x){'; ' + hint if hint else ''}"
            )


@dataclass
class FormatData:
    """A matrix converted to one format: sizes and arrays in contract order, plus metadata."""

    format: str
    """Format name as in the contract (upper case)."""
    params: dict[str, int]
    """Resolved FORMAT parameters (defaults filled, converter choices such as HYB's width made)."""
    shape: tuple[int, int]
    """(m, n) of the matrix."""
    nnz: int
    """Stored nonzeros of the source CSR matrix."""
    sizes: dict[str, int]
    """Integer size arguments, in the contract's order."""
    arrays: dict[str, np.ndarray]
    """Host arrays (int32 / float32, C-contiguous), in the contract's order; in a conversion made
    :meth:`metadata_only` (its arrays on the device alone), zero-stride stand-ins of their dtypes and
    lengths that hold no values (``dataclasses.replace`` refuses them: make a conversion anew)."""
    convert_seconds: float = 0.0
    """Host wall time the conversion took, in seconds."""
    extra: dict[str, object] = field(default_factory=dict)
    """Converter notes (e.g. how HYB's width was chosen)."""

    def __post_init__(self) -> None:
        spec = self.spec
        if tuple(self.sizes) != spec.sizes:
            raise AssertionError(f"{self.format} sizes {tuple(self.sizes)} != contract {spec.sizes}")
        if tuple(self.arrays) != tuple(a.name for a in spec.arrays):
            raise AssertionError(f"{self.format} arrays {tuple(self.arrays)} != contract")
        for a in spec.arrays:
            arr = self.arrays[a.name]
            if arr.dtype != _DTYPES[a.ctype] or arr.ndim != 1 or not arr.flags.c_contiguous:
                raise AssertionError(f"{self.format}.{a.name}: {arr.dtype}, ndim {arr.ndim}")

    @property
    def spec(self) -> FormatSpec:
        return format_spec(self.format)

    @property
    def m(self) -> int:
        return self.shape[0]

    @property
    def n(self) -> int:
        return self.shape[1]

    @property
    def zero_fill_y(self) -> bool:
        """Whether the contract zeroes y before the first launch for this conversion: the format's
        policy, unless its FORMAT line says ``zero_y=0`` (the kernel writes every entry itself)."""
        return self.spec.zero_fill_y and self.params.get("zero_y", 1) != 0

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays (what the device holds for A)."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    def metadata_only(self) -> FormatData:
        """A copy whose arrays are read-only stand-ins of the same dtype and length, all zeros and
        holding no memory: for a conversion whose arrays live on the device only (uploaded from a
        staging buffer that is reused, :mod:`sparserl.harness.staging`). Sizes, shape, ``nbytes``
        and ``stored_slots`` answer as before; the stand-ins' values are not the matrix's."""
        out = copy.copy(self)
        out.arrays = {name: np.broadcast_to(np.zeros(1, a.dtype), a.shape) for name, a in self.arrays.items()}
        return out

    @property
    def stored_slots(self) -> int:
        """Value slots stored, padding included (the largest float array)."""
        return int(sum(a.size for name, a in self.arrays.items() if a.dtype == np.float32))

    def header_line(self) -> str:
        """The ``FORMAT:`` line that names this conversion."""
        return "FORMAT: " + " ".join([self.format] + [f"{k}={v}" for k, v in self.params.items()])

    def launch_env(self, op: Op, k: int | None = None, num_sms: int = 132) -> dict[str, int]:
        """Names a LAUNCH expression can read, bound to this matrix's values."""
        env = {"m": self.m, "n": self.n, "nnz": self.nnz}
        if op is Op.SPMM:
            if k is None or k < 1:
                raise FormatError("SpMM needs k >= 1 columns")
            env["k"] = int(k)
        env.update(self.sizes)
        for key, value in self.params.items():
            env.setdefault(key, value)
        env["num_sms"] = int(num_sms)
        return env


def sorted_unique(a: np.ndarray, return_inverse: bool = False):
    """``np.unique`` by sorting: numpy 2.3+'s hash-based unique is ~100x slower on 10M int64."""
    if a.size == 0:
        return (a.copy(), np.zeros(0, np.int64)) if return_inverse else a.copy()
    order = np.argsort(a, kind="stable") if return_inverse else None
    s = a[order] if return_inverse else np.sort(a)
    first = np.empty(s.size, dtype=bool)
    first[0] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    uniq = s[first]
    if not return_inverse:
        return uniq
    inverse = np.empty(a.size, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return uniq, inverse


def row_of_each_entry(indptr: np.ndarray, m: int) -> np.ndarray:
    """Row index of each stored entry of a CSR matrix, as int32."""
    return np.repeat(np.arange(m, dtype=np.int32), np.diff(indptr))


def position_in_row(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """0-based position of each entry inside its row, as int64."""
    return np.arange(rows.size, dtype=np.int64) - indptr[rows].astype(np.int64)
