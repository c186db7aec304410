"""GPU: the matrix arrays' tamper check compares bits, on both paths' primitives.

A kernel that wrote -0.0 over a +0.0 padding value (ELL, SELL, HYB, DIA and BSR fill) kept state across launches
in its sign bits, unseen by a float comparison (found by a review of the runtime checks). The adversarial suite's
matrix has rows of one length (no padding), so the case is pinned here on the comparison itself.

Mutation this kills: the float comparison back (``bitwise`` dropped in ``enqueue_diff``, ``cp.array_equal`` in
``resident._same_bits``): the -0 is not counted."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_a_negative_zero_over_a_padding_zero_is_a_change_and_is_restored() -> None:
    cp = pytest.importorskip("cupy")
    from sparserl.harness import gpucheck
    from sparserl.harness.resident import _same_bits

    want = cp.zeros(4096, dtype=cp.float32)
    want[::3] = 1.5
    cur = want.copy()
    cur.view(cp.uint32)[7] = 0x80000000  # -0.0 over a padding zero: its sign bit
    assert bool(cur[7] == want[7]), "as floats the two are equal: the case needs a bit comparison"
    assert not _same_bits(cur, want) and _same_bits(want.copy(), want)
    counts = cp.zeros(2, dtype=cp.uint64)
    gpucheck.enqueue_diff(cur, want, counts[1:], restore=False, sms=132)  # floats as floats (x, y): not counted
    gpucheck.enqueue_diff(cur, want, counts[0:], restore=True, sms=132, bitwise=True)
    assert cp.asnumpy(counts).tolist() == [1, 0]
    assert np.signbit(cp.asnumpy(cur)[7]) == False and _same_bits(cur, want)  # noqa: E712 (restored bit for bit)
