"""The operator's packed launch arguments (CPU: the parameter block's layout; the launches themselves
run in the GPU suite, where every operator product goes through them)."""

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
