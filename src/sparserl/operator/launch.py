"""The operator's light launch path: a kernel's arguments packed once, only ``x``, ``y`` and the stream
set per call.

CuPy's kernel call reads and converts every argument of the tuple on each launch (a contract kernel has
8-14 of them), and a PyTorch product first had to wrap both tensors in CuPy arrays. Inside a GCN
forward on a graph of a few hundred thousand edges those microseconds on the host are the whole
difference. :class:`PackedLaunch` lays the arguments out once as the driver's parameter block (one
slot per argument, ``void*`` for arrays and ``int`` for scalars, the contract's types), and a call
writes the two operand addresses into their slots and calls ``cuLaunchKernel`` for each LAUNCH line.
The driver copies the block at the call, so the next call may overwrite it at once.

The launches, grid, block and shared memory are the ones the harness planned and verified; this is
the same sequence :func:`~sparserl.harness.device.launch_all` enqueues, through a shorter door.
The two slots are shared, so a call holds a lock from writing them to its last launch: two threads
using one operator each get their own operands (the driver call releases the GIL).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Sequence

import numpy as np

from sparserl.harness.device import ready_launches
from sparserl.kernels.contract import LaunchConfig


def pack_arguments(args: Sequence[Any], ix: int, iy: int) -> tuple[ctypes.Array, ctypes.c_void_p, ctypes.c_void_p]:
    """The parameter block of ``args`` in contract order (NumPy int32 scalars as ``int``, device arrays
    as their address): the pointer array the driver reads, and the two slots that hold ``x`` and ``y``
    (set to 0 here). Anything else is refused (the contract has no other kind of argument)."""
    slots: list[ctypes._SimpleCData] = []
    for i, a in enumerate(args):
        if i in (ix, iy):
            slots.append(ctypes.c_void_p(0))
        elif isinstance(a, (np.integer, int)) and not isinstance(a, bool):
            value = int(a)
            if not -2**31 <= value < 2**31:
                raise ValueError(f"argument {i} ({value}) does not fit the contract's int")
            slots.append(ctypes.c_int32(value))
        elif hasattr(a, "data") and hasattr(a.data, "ptr"):
            slots.append(ctypes.c_void_p(int(a.data.ptr)))
        else:
            raise TypeError(f"argument {i} is neither an int nor a device array: {type(a).__name__}")
    block = (ctypes.c_void_p * len(slots))(*(ctypes.addressof(s) for s in slots))
    block._slots = slots  # the values the pointers point at live as long as the block
    return block, slots[ix], slots[iy]


class PackedLaunch:
    """Every non-empty LAUNCH line of a bound kernel, enqueued by ``cuLaunchKernel`` on packed arguments."""

    def __init__(self, kernels, launches: Sequence[LaunchConfig], args: Sequence[Any], ix: int, iy: int,
                 launch_kernel: Callable[..., None] | None = None):
        """``launch_kernel``: the driver call, CuPy's ``launchKernel`` by default (the tests pass a recorder)."""
        if launch_kernel is None:
            from cupy_backends.cuda.api.driver import launchKernel as launch_kernel

        self._launch_kernel = launch_kernel
        self._lock = threading.Lock()
        self._block, self._x, self._y = pack_arguments(args, ix, iy)
        self._address = ctypes.addressof(self._block)
        self.calls: list[tuple[int, ...]] = []
        """Per launch: (function, grid x, y, z, block x, y, z, dynamic shared memory bytes)."""
        functions = []
        for fn, cfg in ready_launches(kernels, launches):
            function = getattr(fn, "kernel", fn)  # a RawKernel's loaded function (CUfunction in .ptr)
            functions.append(function)
            self.calls.append((int(function.ptr), *map(int, cfg.grid), *map(int, cfg.block), int(cfg.smem)))
        # what the packed addresses name stays alive with the launch: the device arrays, and the
        # functions (their module) whose handles the calls hold
        self._keep = (tuple(args), kernels, tuple(functions))

    def __call__(self, x_ptr: int, y_ptr: int, stream_ptr: int) -> None:
        """Enqueue the launches on ``stream_ptr`` (0: the legacy default stream) reading ``x_ptr`` and
        writing ``y_ptr``; the current device must be the one the kernels were loaded on."""
        launch, address = self._launch_kernel, self._address
        with self._lock:  # the driver copies the block at each launch: another call may write it after
            self._x.value = x_ptr
            self._y.value = y_ptr
            for f, gx, gy, gz, bx, by, bz, smem in self.calls:
                launch(f, gx, gy, gz, bx, by, bz, smem, stream_ptr, address, 0)
