"""The operator's packed launch on the CPU: the parameter block's layout, what reaches the driver call
(a recorder stands in for cuLaunchKernel), two threads on one operator, and the output policy on the
raw path. The launches themselves run in the GPU suite, where every operator product goes through them."""

import ctypes

import numpy as np
import pytest

from sparserl.operator.launch import pack_arguments


class _Array:
    """Stands for a device array: only its address is packed."""

    def __init__(self, ptr: int):
        self.data = type("Mem", (), {"ptr": ptr})()


def _read(block, i: int, ctype):
    return ctypes.cast(block[i], ctypes.POINTER(ctype)).contents.value


def test_the_block_holds_ints_as_int32_and_arrays_as_their_address():
    # a SpMM CSR kernel's arguments: m, n, nnz, k, row_ptr, col_idx, val, X, Y
    args = (np.int32(7), np.int32(5), np.int32(11), np.int32(64), _Array(0x1000), _Array(0x2000), _Array(0x3000),
            "x", "y")
    block, x, y = pack_arguments(args, 7, 8)
    assert len(block) == 9
    # kills: scalars packed as 64-bit (the kernel would read the next argument's bytes) or in the wrong order
    assert [ctypes.sizeof(s) for s in block._slots[:4]] == [4, 4, 4, 4]
    assert [_read(block, i, ctypes.c_int32) for i in range(4)] == [7, 5, 11, 64]
    assert [_read(block, i, ctypes.c_void_p) for i in (4, 5, 6)] == [0x1000, 0x2000, 0x3000]
    # the operand slots are the ones a call writes, and the block points at them
    x.value, y.value = 0xA000, 0xB000
    assert _read(block, 7, ctypes.c_void_p) == 0xA000 and _read(block, 8, ctypes.c_void_p) == 0xB000


def test_what_is_not_an_int_or_a_device_array_is_refused():
    with pytest.raises(TypeError, match="argument 1"):
        pack_arguments((np.int32(1), 2.5, "x", "y"), 2, 3)
    with pytest.raises(ValueError, match="does not fit"):
        pack_arguments((np.int64(2**31), "x", "y"), 1, 2)


class _Kernels:
    """Stands for a loaded cubin: each kernel name has a function handle; records the shared memory asked."""

    def __init__(self):
        self.smem: dict[str, int] = {}

    def get(self, name: str):
        kernels = self

        class Fn:
            kernel = type("F", (), {"ptr": 0x5000 + len(name)})()

            @property
            def max_dynamic_shared_size_bytes(self):
                return kernels.smem.get(name, 0)

            @max_dynamic_shared_size_bytes.setter
            def max_dynamic_shared_size_bytes(self, v):
                kernels.smem[name] = v

        return Fn()


def _recorder(calls: list, delay: float = 0.0):
    """A stand-in for cuLaunchKernel that reads the block as the driver would (x and y in slots 3, 4)."""
    import time

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        if delay:
            time.sleep(delay)  # the real call releases the GIL: another thread may run here
        block = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        x = ctypes.cast(block[3], ctypes.POINTER(ctypes.c_void_p)).contents.value
        y = ctypes.cast(block[4], ctypes.POINTER(ctypes.c_void_p)).contents.value
        calls.append(((f, gx, gy, gz, bx, by, bz, smem, stream, extra), x, y))

    return launch


def _packed(calls, delay=0.0):
    from sparserl.kernels.contract import LaunchConfig
    from sparserl.operator.launch import PackedLaunch

    kernels = _Kernels()
    launches = [LaunchConfig("ab", (3, 1, 1), (256, 1, 1), 0), LaunchConfig("abc", (0, 1, 1), (32, 1, 1), 0),
                LaunchConfig("abcd", (5, 2, 1), (64, 1, 1), 60000)]
    args = (np.int32(4), _Array(0x10), np.int32(5), "x", "y")
    return PackedLaunch(kernels, launches, args, 3, 4, launch_kernel=_recorder(calls, delay)), kernels


def test_each_nonempty_launch_goes_to_the_driver_in_order_with_the_operands():
    """Mutations killed: an empty launch (a zero grid) sent to the driver, the grid and block swapped,
    large shared memory not allowed first, the stream not passed, x and y not written before the launch."""
    calls: list = []
    packed, kernels = _packed(calls)
    packed(0xAA, 0xBB, 7)
    assert [c[0] for c in calls] == [(0x5002, 3, 1, 1, 256, 1, 1, 0, 7, 0), (0x5004, 5, 2, 1, 64, 1, 1, 60000, 7, 0)]
    assert [(x, y) for _, x, y in calls] == [(0xAA, 0xBB)] * 2
    assert kernels.smem == {"abcd": 60000}


def test_two_threads_on_one_operator_each_launch_their_own_operands():
    """The driver call releases the GIL; the two operand slots are shared. Mutation killed: no lock
    around writing the slots and launching (then most launches read the other thread's x or y)."""
    import threading

    calls: list = []
    packed, _ = _packed(calls, delay=0.0005)

    def work(x: int) -> None:
        for _ in range(40):
            packed(x, x + 1, 0)

    threads = [threading.Thread(target=work, args=(0x1000 * i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 160
    assert all(y == x + 1 for _, x, y in calls)  # never one call's x with another's y
    # and each call's two launches are back to back (a product is not split across two callers)
    pairs = [calls[i:i + 2] for i in range(0, len(calls), 2)]
    assert all(a[1] == b[1] for a, b in pairs)


@pytest.mark.parametrize("zero_fill", [True, False])
def test_the_output_is_zeroed_first_only_for_a_format_that_accumulates(zero_fill):
    """The contract's output policy on the raw path: a format that accumulates into y (COO, HYB ...)
    gets one memset on the launch's stream before it, any other none. Mutations killed: no memset (a
    COO product adds onto the last one's output), a memset for a format that writes every entry, a
    memset on another stream or of another size."""
    from types import SimpleNamespace

    from sparserl.operator.backends import KernelBackend

    events: list = []
    backend = object.__new__(KernelBackend)
    backend.zero_fill = zero_fill
    backend._cp = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(
        memsetAsync=lambda ptr, value, size, stream: events.append(("memset", ptr, value, size, stream)))))
    backend.launch = lambda x, y, stream: events.append(("launch", x, y, stream))
    backend.run_pointers(0xA0, 0xB0, 4096, 9)
    assert events == ([("memset", 0xB0, 0, 4096, 9)] if zero_fill else []) + [("launch", 0xA0, 0xB0, 9)]
