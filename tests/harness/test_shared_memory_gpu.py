"""GPU: shared memory that one launch leaves and the next reads, and the scrub of it.

Shared memory is not cleared between launches. A kernel could keep its slice of the matrix there,
tagged with the arrays' address, and read it back on the next timed run instead of from DRAM (cold)
or L2 (warm): a cache that the L2 flush does not reach (``matrix_cached_in_shared_memory`` in
``tests/harness/adversarial/state.py``). The cold flush therefore also overwrites every SM's shared
memory (``FlushBuffer(scrub_shared=True)``, the default), and in the warm regime the same scrub ends
each repetition's preparation. Mutations killed: the scrub left out of the flush or of the warm
repetitions (or out of only the runs' graph, so that the subtraction takes it from the kernel's time),
run on too few blocks to reach every SM, or with less shared memory than a block may take."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.matrices import generate
from tests.harness.adversarial.state import smem_cache_kernel

log = logging.getLogger(__name__)

_LEAVE_AND_LOOK = r"""
extern "C" __global__ void leave(unsigned long long tag)
{
    extern __shared__ unsigned long long s[];
    if (threadIdx.x == 0) { s[0] = tag; s[1] = blockIdx.x; }
}
extern "C" __global__ void look(unsigned long long tag, unsigned int* seen)
{
    extern __shared__ unsigned long long s[];
    if (threadIdx.x == 0 && s[0] == tag) { atomicAdd(seen, 1u); if (s[1] == blockIdx.x) atomicAdd(seen + 1, 1u); }
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on the PATH")
def test_the_scrub_kernel_keeps_its_stores(tmp_path: Path) -> None:
    """CPU: the scrub compiles for sm_90 and its stores to shared memory survive the compiler (stores never read
    back would be dead code: a scrub that writes nothing)."""
    from sparserl.harness.timing import _SCRUB_KERNEL

    src = tmp_path / "scrub.cu"
    src.write_text(_SCRUB_KERNEL)
    p = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "scrub.ptx"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    ptx = (tmp_path / "scrub.ptx").read_text()
    assert re.search(r"^\s*st\.shared\.", ptx, re.MULTILINE) and ".extern .shared" in ptx


class _Recorder:
    """Stands for the warm regime's io and scrub: records what the captured body enqueues, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def prepare(self, rep: int) -> None:
        self.events.append(f"prepare {rep}")

    def mark(self, rep: int) -> None:
        self.events.append(f"mark {rep}")

    def enqueue(self) -> None:
        self.events.append("scrub")


@pytest.mark.parametrize("with_io", [True, False])
def test_every_warm_repetition_is_scrubbed_in_both_graphs(with_io: bool) -> None:
    """CPU: the body the warm regime captures (``timing._reps``, on both evaluation paths): before every run
    a scrub with no run between them, each repetition's preparation first; and the body of the preparations
    alone, timed and subtracted, holds as many scrubs (the scrub's own time is not charged to the kernel).
    Kills: the scrub left out of either body, or run only once per graph."""
    from sparserl.harness.timing import _reps

    rec = _Recorder()
    io = rec if with_io else None
    _reps(lambda: rec.events.append("run"), io, 3, True, rec)()
    runs = [i for i, e in enumerate(rec.events) if e == "run"]
    assert len(runs) == 3
    for i, r in enumerate(runs):
        since = rec.events[(runs[i - 1] + 1 if i else 0):r]
        assert "scrub" in since, rec.events
        if with_io:
            assert since.index(f"prepare {i}") < since.index("scrub"), rec.events
    with_run = rec.events.count("scrub")
    rec.events.clear()
    _reps(lambda: rec.events.append("run"), io, 3, False, rec)()
    assert "run" not in rec.events and rec.events.count("scrub") == with_run


@pytest.mark.gpu
def test_no_block_finds_what_a_launch_before_the_flush_left() -> None:
    """A launch leaves a tag in each block's shared memory (96 KiB a block, two blocks an SM); a later launch
    of the same shape counts the blocks that find it: with nothing between, with the flush alone, and with the
    flush and its scrub. Only the last is asserted (none); the others are logged, the measurement of what the
    scrub is for."""
    import cupy as cp

    from sparserl.harness.timing import FlushBuffer

    mod = cp.RawModule(code=_LEAVE_AND_LOOK)
    leave, look = mod.get_function("leave"), mod.get_function("look")
    smem = 96 * 1024
    for f in (leave, look):
        f.max_dynamic_shared_size_bytes = smem
    grid = 2 * int(cp.cuda.Device().attributes["MultiProcessorCount"])
    stream = cp.cuda.Stream(non_blocking=True)
    bare, scrubbing = FlushBuffer(scrub_shared=False), FlushBuffer()
    rng = np.random.default_rng(0)

    own = []  # blocks that found what the block of their own index left: what the cheat needs

    def found_after(between) -> int:
        seen = cp.zeros(2, dtype=cp.uint32)
        tag = np.uint64(rng.integers(1, 2**63))
        with stream:
            leave((grid,), (256,), (tag,), shared_mem=smem)
            between()
            look((grid,), (256,), (tag, seen), shared_mem=smem)
        stream.synchronize()
        found = seen.get()
        own.append(int(found[1]))
        return int(found[0])

    def scrub_alone() -> None:
        with stream:
            scrubbing.scrub.enqueue()

    nothing = found_after(lambda: None)
    flushed = found_after(lambda: bare.flush(stream))
    scrubbed = found_after(lambda: scrubbing.flush(stream))
    warm = found_after(scrub_alone)  # what the warm regime puts between two repetitions
    log.warning("blocks of %d that found the tag: nothing between %d, the L2 flush %d, the flush and its scrub %d, "
                "the scrub alone %d (of them, left by the block of their own index: %s)", grid, nothing, flushed,
                scrubbed, warm, own)
    print(f"shared memory kept between launches: {nothing}/{grid} with nothing between, {flushed}/{grid} after the "
          f"L2 flush, {scrubbed}/{grid} after the flush and its scrub, {warm}/{grid} after the scrub alone; of them, "
          f"left by the block of their own index: {own}")
    assert scrubbed == 0 and warm == 0


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    e = Evaluator(HarnessConfig(cold_trials=15, regimes=("cold", "warm"), memo=0,
                                cache_dir=str(tmp_path_factory.mktemp("harness"))))
    yield e
    e.close()


@pytest.mark.gpu
def test_the_shared_memory_cache_gains_nothing(ev) -> None:
    """The cheat against its control (the same kernel looking for a tag it never writes: the same work, never a
    hit) on a matrix whose values and columns fit in the cheat's shared memory (500k rows, 2M nonzeros, 16 MB),
    in both regimes: both correct, and the cheat's time within 15% of the control's (a hit on every run would
    skip the 16 MB, most of what the kernel reads: from DRAM cold, from L2 warm)."""
    mat = ev.register(generate("random", 500_000, seed=5, nnz_per_row=4), "random500k_4")
    cheat = ev.evaluate(smem_cache_kernel(), mat, "spmv")
    control = ev.evaluate(smem_cache_kernel("0x1ull"), mat, "spmv")
    for res in (cheat, control):
        assert res.error_kind is ErrorKind.NONE and res.correct, res.message
    for regime in ("cold", "warm"):
        ratio = cheat.timings[regime].median_us / control.timings[regime].median_us
        print(f"{regime}: cheat {cheat.timings[regime].median_us:.2f} us, control "
              f"{control.timings[regime].median_us:.2f} us, ratio {ratio:.3f}")
        assert ratio > 0.85, (regime, cheat.timings[regime], control.timings[regime])
