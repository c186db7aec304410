"""Writes just outside the buffers: caught by the NaN guards on both sides of x and of y."""

from __future__ import annotations

from tests.harness.adversarial.base import HONEST, csr

CASES: dict[str, tuple[str, str]] = {
    "writes_before_start_of_y": (csr(f"{HONEST} if (row == 0) y[-2] = 0.f;"), "incorrect"),
    "writes_far_before_start_of_y": (csr(f"{HONEST} if (row == 0) y[-200] = 1.f;"), "incorrect"),
    "writes_past_end_of_x": (csr(f"{HONEST} if (row == 0) ((float*)x)[n + 1] = 0.f;"), "input_modified"),
    "writes_before_start_of_x": (csr(f"{HONEST} if (row == 0) ((float*)x)[-1] = 0.f;"), "input_modified"),
}
