"""Kernels aimed at the batched path's shortcuts: early stopping, and a conversion shared by every
kernel that asks for the same format.

* an honest kernel far slower than cuSPARSE stops early: ``slow``, verified, with its measured time
  (``none`` on the sequential path, which times it in full);
* a kernel that is slow *and* wrong when timed is ``incorrect``, never ``slow``: every timed run
  before the early-stop decision is checked first;
* a kernel that writes into the (shared) matrix arrays only when timed, keeping its own output right,
  is ``input_modified``, slow or not, and the arrays are restored for the next kernel;
* so is one that writes only into the fresh-valued twin's arrays (it recognises the matrix's own
  values, which are public): the batched path converts the two from one conversion of their pattern,
  into separate buffers, each checked and restored against its own pristine copy.

Beside the cases, :data:`SLOW_FIRST_LAUNCH` (and its wrong twin) is an honest kernel whose every
launch takes most of a second: the batched verifier stops after its first launch, ``timeout``,
because the others would run past the verify limit (``speed.predicted_overrun``); the wrong twin is
``incorrect``. Not a case: the sequential path, with no such prediction, would run it for minutes.

A kernel cannot behave differently after some number of runs: it has no state across launches (the
source and PTX checks refuse writable global data), so neither the adaptive number of timed runs nor
early stopping can be played by counting runs.
"""

from __future__ import annotations

from tests.harness.adversarial.base import DOT, csr
from tests.harness.adversarial.timed import LOOKS_TIMED

SPIN = ("float spin = sum; for (int i = 0; i < 50000; ++i) spin = fmaf(spin, 1.0000001f, 1e-7f); "
        "if (spin == 12345.678f) sum = spin;")
"""About 200k dependent cycles per thread (some 100 us): an honest but hopeless kernel. The result is
used, so the loop stays; it never equals that value, so the output is the honest one."""
MASKED_DOT = ("float sum = 0.f; for (int j = row_ptr[row]; j < row_ptr[row + 1]; ++j) "
              "sum += val[j] * x[col_idx[j] & 0x7fffffff];")
"""The dot product with the high bit of every column index ignored."""
MARK_WHEN_TIMED = (f"{LOOKS_TIMED} if (timed && row == 0 && row_ptr[1] > row_ptr[0]) "
                   "((int*)col_idx)[row_ptr[0]] |= (int)0x80000000;")
"""When timed, row 0's thread sets the high bit of its first column index after reading it: the matrix
arrays change, the kernel's outputs (which mask that bit) stay right."""

def _first_value() -> float:
    """The first stored value of the GPU suite's matrix (random20k: generated, seeded, public)."""
    from sparserl.matrices import generate

    return float(generate("random", 20_000, seed=3, nnz_per_row=12).data[0])


MARK_ON_TWIN = (f"if (row == 0 && val[0] != {_first_value()!r}f && row_ptr[1] > row_ptr[0]) "
                "((int*)col_idx)[row_ptr[0]] |= (int)0x80000000;")
"""When the values are not the matrix's own (the twin), row 0's thread sets the high bit of its first
column index after reading it; the outputs (which mask that bit) stay right."""

LONG_SPIN = ("float spin = sum; for (int i = 0; i < 400000000; ++i) spin = fmaf(spin, 1.0000001f, 1e-7f); "
             "if (spin == 12345.678f) sum = spin;")
""":data:`SPIN` 8000 times longer: some 1.6e9 dependent cycles per thread, about 0.8 s per launch at
2 GHz (0.4-1.2 s allowing for the FMA latency and the clock). On a matrix whose verify limit is the
2 s floor, the first launch finishes within it and the 10 remaining launches would not (over
1.25 x 2 s once a launch takes more than 0.25 s)."""
SLOW_FIRST_LAUNCH = csr(f"if (row >= m) return; {DOT} {LONG_SPIN} y[row] = sum;")
"""Correct, and every launch takes most of a second: ``timeout`` after its first launch."""
SLOW_FIRST_LAUNCH_WRONG = csr(f"if (row >= m) return; {DOT} {LONG_SPIN} y[row] = 2.f * sum;")
"""The same, writing twice the product: ``incorrect`` (a kernel slow and wrong is wrong)."""

NOT_A_CONTENDER = csr(f"if (row >= m) return; {DOT} {LONG_SPIN.replace('400000000', '60000000')} y[row] = sum;")
"""Correct, about 0.12 s a launch (60-180 ms): past the 50 ms below which no first launch predicts
anything, and thousands of times cuSPARSE's time on the GPU suite's matrix, yet under the GPU test's
6 s verify floor for its 10 remaining launches. An ordinary job verifies it and stops it early, ``slow``; a
contender job (the oracle's: ``Evaluator.evaluate_many(..., contenders=True)``) stops after its
first launch, ``timeout``."""

SHORT_NOT_A_CONTENDER = csr(f"if (row >= m) return; {DOT} {LONG_SPIN.replace('400000000', '8000000')} y[row] = sum;")
"""Correct, about 16 ms a launch (8-24 ms): under a 50 ms floor, so a contender job with
``SpeedConfig.contender_min_s`` at 50 ms verifies it in full (``slow``), and over a 5 ms one, so a
contender job with that floor stops it after its first launch (``timeout``). (The default, 10 ms,
may go either way on it; the GPU test sets the floor.)"""

CASES: dict[str, tuple[str, str]] = {
    "slow_honest": (csr(f"if (row >= m) return; {DOT} {SPIN} y[row] = sum;"), "slow"),
    "slow_and_wrong_when_timed": (csr(f"if (row >= m) return; {DOT} {SPIN} {LOOKS_TIMED} "
                                      "if (timed && (row & 1)) return; y[row] = sum;"), "incorrect"),
    "slow_and_writes_matrix_when_timed": (csr(f"if (row >= m) return; {MASKED_DOT} {SPIN} y[row] = sum; "
                                              f"{MARK_WHEN_TIMED}"), "input_modified"),
    "writes_matrix_when_timed": (csr(f"if (row >= m) return; {MASKED_DOT} y[row] = sum; {MARK_WHEN_TIMED}"),
                                 "input_modified"),
    "writes_twin_matrix_only": (csr(f"if (row >= m) return; {MASKED_DOT} y[row] = sum; {MARK_ON_TWIN}"),
                                "input_modified"),
}
SEQUENTIAL = {"slow_honest": "none"}
"""The verdicts the sequential path gives instead (it never stops early)."""
