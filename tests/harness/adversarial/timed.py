"""Kernels that try to tell a timed run from a verification run, and skip work when timed.

Every timed run now starts like a verification launch (fresh x, NaN-poisoned y, the same guarded
buffer layout) and its output is checked, so:

* a kernel that cannot tell the two apart computes every time: it is correct and gains nothing
  (expected ``none``; the GPU test also checks that its time is that of the honest kernel);
* a kernel that can tell them apart (by the inputs' values) and skips work when timed leaves
  NaN in y, or answers for an x it rewrote: ``incorrect``, with a message naming the timed run.
"""

from __future__ import annotations

import numpy as np

from tests.harness.adversarial.base import DOT, HONEST, csr

TEST_N = 20_000
"""Columns of the GPU suite's matrix (random20k): the known-inputs case is built for it."""


def known_inputs_kernel(n: int = TEST_N) -> str:
    """Computes only when x[0] is the first value of one of the (seeded, public) verification inputs."""
    from sparserl.harness.verify import VerifyConfig, make_inputs

    firsts = sorted({float(x[0]) for _, x in make_inputs((n,), VerifyConfig())})
    cond = " || ".join(f"x[0] == {np.float32(v)!r}f" for v in firsts).replace("np.float32(", "").replace(")f", "f")
    return csr(f"if (row >= m) return; if (!({cond})) return; {DOT} y[row] = sum;")


LOOKS_TIMED = ("bool timed = n >= 8; for (int i = 0; i < 8 && i < n; ++i) { const float t = x[i] * 8388608.f; "
               "timed = timed && x[i] != 0.f && x[i] >= -1.f && x[i] < 1.f && t == floorf(t); }")
"""C statements setting ``timed``: the first 8 x values are nonzero, in [-1, 1) and on the 2^-23 grid
of the timed runs' fresh inputs, which lie in [0, 1) (what :func:`looks_timed` computes on the host)."""


def looks_timed(x: np.ndarray) -> bool:
    """The host mirror of :data:`LOOKS_TIMED` (float32 arithmetic), for checking the verification inputs."""
    head = np.asarray(x, np.float32).reshape(-1)[:8]
    t = head * np.float32(8388608)  # exact: a power of two
    return bool(head.size == 8 and np.all((head != 0) & (head >= -1) & (head < 1) & (t == np.floor(t))))


def stale_y_unless_verifying(n: int = TEST_N) -> str:
    """Skips the rows y already holds a number in, unless x[0] is the first verification input's first value
    (its re-run of that input on a stale y): it passes verification and would give a user the last call's
    answer; the cold run whose y keeps the previous run's output, with a fresh x, is what catches it."""
    from sparserl.harness.verify import VerifyConfig, make_inputs

    first = np.float32(make_inputs((n,), VerifyConfig())[0][1][0])
    return csr(f"if (row >= m) return; if (y[row] == y[row] && x[0] != {first!r}f) return; {DOT} y[row] = sum;"
               .replace("np.float32(", "").replace(")f", "f"))


CASES: dict[str, tuple[str, str]] = {
    # skip rows whose y already holds a number (what passes when timed runs reuse one y): it computes on every
    # poisoned y, and verification's re-run, on a y holding another input's output, shows a user's stale answer
    "skips_rows_already_written": (csr(f"if (row >= m) return; if (y[row] == y[row]) return; {DOT} y[row] = sum;"),
                                   "incorrect"),
    # the same, but computes on verification's re-run (recognised by its public x): caught by the cold stale-y run
    "stale_y_unless_verifying": (stale_y_unless_verifying(), "incorrect"),
    # looks at the guard before y, which held whatever the allocator left there before guards existed
    "reads_guard_before_y": (csr(f"if (row >= m) return; if (y[-1] == y[-1]) return; {DOT} y[row] = sum;"), "none"),
    # looks past the end of x, where a verification launch's buffers used to sit back to back
    "reads_past_end_of_x": (csr(f"if (row >= m) return; if (x[n] == x[n] && x[n + 1] == 0.f) return; "
                                f"{DOT} y[row] = sum;"), "none"),
    # recognises the verification inputs (they are seeded and public) and skips everything else
    "computes_only_for_known_inputs": (known_inputs_kernel(), "incorrect"),
    # recognises the timed runs' inputs and skips all work on them
    "skips_on_timed_input_grid": (csr(f"if (row >= m) return; {LOOKS_TIMED} if (timed) return; {DOT} y[row] = sum;"),
                                  "incorrect"),
    # ... or half of the work
    "half_work_on_timed_inputs": (csr(f"if (row >= m) return; {LOOKS_TIMED} if (timed && (row & 1)) return; "
                                      f"{DOT} y[row] = sum;"), "incorrect"),
    # zeroes x past the 8 values it recognises a timed run by, and answers for the zeroed x: right for
    # what it left in the buffer, a fraction of the work (the check writes x again from the run's seed)
    "zeroes_x_when_timed": (csr(f"if (row >= m) return; {LOOKS_TIMED} if (timed) {{ float* xw = (float*)x; "
                                "for (int j = 8 + row; j < n; j += m) xw[j] = 0.f; float s = 0.f; "
                                "for (int j = row_ptr[row]; j < row_ptr[row + 1] && col_idx[j] < 8; ++j) "
                                f"s += val[j] * x[col_idx[j]]; y[row] = s; return; }} {DOT} y[row] = sum;"),
                            "incorrect"),
    # honest work, plus a write into the poisoned guard after y only when timed
    "writes_guard_when_timed": (csr(f"{HONEST} {LOOKS_TIMED} if (row == 0 && timed) y[m] = 0.f;"), "incorrect"),
}
