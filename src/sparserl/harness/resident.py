"""What a GPU worker keeps for each matrix it has seen: plan once, verify and time many kernels.

A :class:`ResidentMatrix` holds, for one matrix ``A``:

* ``A`` itself and ``A_alt``, the same sparsity pattern with fresh random values drawn from the
  OS when the matrix is loaded (no kernel can know them when it is compiled), one sign to a row
  (:func:`revalued`). Verification runs a
  kernel on both, and timing runs on ``A_alt``: a kernel that hard-codes ``A``'s values fails on
  ``A_alt``, and one that recognises ``A``'s values to skip reading them gains nothing when timed;
* their device conversions (plan once per format; on the batched path the pattern is converted
  once for both, :class:`~sparserl.harness.launcher.TwinConversions`), with a pristine copy of every uploaded array
  and a fingerprint of each copy, so a kernel that writes into the matrix is caught, the matrix is
  restored before the next job, and a stray write into the copies themselves is found too;
* their fp64 references (:class:`~sparserl.harness.reference.Fp64Reference`), fingerprinted the
  same way.

:class:`MatrixCache` keeps the most recently used few per worker, and before a conversion it does
not have it makes room on the GPU (:meth:`MatrixCache.make_room`, :mod:`sparserl.harness.memory`):
other matrices and then this one's least recently used conversions are let go while less than the
reserve is free; out of memory while loading a new matrix, it lets the others go and loads it once
more. Matrices travel from the parent
as files (:func:`~sparserl.harness.matrix_files.save_matrix_file`), named by a hash of their content.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from sparserl.harness.matrix_files import load_matrix_file
from sparserl.harness.memory import GiB, ShedPlan, reserve_bytes, shed_plan

log = logging.getLogger(__name__)

MAX_MATRICES = 4
"""Matrices a worker keeps (least recently used evicted)."""


def revalued(A: sp.csr_array, seed: int) -> sp.csr_array:
    """``A``'s pattern with new values: magnitudes |normal| (never below 1e-3) at a random scale, and
    one random sign per row.

    One sign per row so that with a non-negative x (every timed run's, and one verification input's)
    no row's terms cancel: ``|A x| = |A| |x|`` row by row, so the tolerance, which scales with
    ``|A| |x|``, holds ``|A x|`` itself, and a kernel that leaves out 1% of a long row fails. With
    products of random sign an error that has the sign of its terms grows like the square root of the
    terms left out while the bound grows with the row: leaving out the last 10% of a row of 10^6
    entries passed every signed input under the uncapped bound (docs/harness.md, "Verification").
    Signs still differ between rows, and the signed verification inputs give each row products of
    both signs."""
    rng = np.random.default_rng(seed)
    mag = np.abs(rng.standard_normal(A.nnz)).astype(np.float32)
    mag = np.where(mag < 1e-3, np.float32(0.5), mag) * np.float32(rng.choice([0.25, 1.0, 4.0]))
    row_sign = np.where(rng.random(A.shape[0]) < 0.5, np.float32(-1), np.float32(1))
    v = mag * np.repeat(row_sign, np.diff(A.indptr))
    return sp.csr_array((v, A.indices.copy(), A.indptr.copy()), shape=A.shape)


class ResidentMatrix:
    """One matrix on one worker's GPU (see the module docstring).

    ``batched`` (the batched path, :mod:`sparserl.harness.batched`): the balanced fp64 checks of
    both versions are kept too (:class:`~sparserl.harness.gpucheck.Fp64Check`, fingerprinted with
    the references), and matrix arrays are compared with their pristine copies by GPU kernels whose
    counts are read back together with the fingerprints (one wait for a job's whole damage check)."""

    def __init__(self, A: sp.csr_array, seed: int | None = None, batched: bool = False, sms: int = 132):
        import cupy as cp

        from sparserl.harness.launcher import MatrixOnDevice, TwinConversions
        from sparserl.harness.reference import Fp64Reference

        self.A = A
        self.alt_seed = secrets.randbits(63) if seed is None else seed
        """Seed of ``A_alt``'s values (from the OS unless given), kept for reproducing a verdict."""
        self.A_alt = revalued(A, self.alt_seed)
        self.references = {"A": Fp64Reference(A, cp), "A_alt": Fp64Reference(self.A_alt, cp)}
        self.twins: TwinConversions | None = None
        """Both versions' conversions (batched path: the pattern converted once, the values gathered)."""
        if batched:
            self.twins = TwinConversions(A, self.A_alt, {w: r.val for w, r in self.references.items()}, sms)
            self.on_device = {w: self.twins.view(w) for w in ("A", "A_alt")}
        else:
            self.on_device = {"A": MatrixOnDevice(A), "A_alt": MatrixOnDevice(self.A_alt)}
        self.batched = batched
        self.sms = sms
        self.checks: dict = {}
        """The balanced fp64 check of each version ("A", "A_alt"), batched path only."""
        if batched:
            from sparserl.harness.gpucheck import Fp64Check, RowPlan

            plan = RowPlan.of(A.indptr)
            self.checks = {w: Fp64Check(r, plan, sms) for w, r in self.references.items()}
        self.verifiers: dict = {}
        self._fingerprint_references()
        self.pristine: dict[tuple, dict] = {}
        self._pristine_sums: dict[tuple, tuple] = {}
        self._pristine_fp: dict[tuple, object] = {}
        self.baselines: dict = {}

    def _fingerprint_references(self) -> None:
        """(Re)build the fingerprint of the references, checks and verification inputs, and take it."""
        from sparserl.harness.gpucheck import WordSums

        arrays = [a for r in self.references.values() for a in r.device_arrays()]
        arrays += [a for c in self.checks.values() for a in c.device_arrays()]
        arrays += [a for v in self.verifiers.values() for a in v.device_arrays()]
        self._ref_fp = WordSums(arrays, self.sms)
        self._ref_sums = self._ref_fp.compute()

    def verifier(self, k: int | None, cfg):
        """The :class:`~sparserl.harness.verify.Verifier` for ``k`` columns under ``cfg`` (made once)."""
        from sparserl.harness.verify import Verifier

        key = (k, cfg)
        if key not in self.verifiers:
            m, n = self.A.shape
            self.verifiers[key] = Verifier(m, n, k, cfg)
            self._fingerprint_references()
        return self.verifiers[key]

    def keep_pristine(self, key: tuple, arrays: dict) -> None:
        """Copy a fresh conversion's arrays (restored from after every launch) and fingerprint them."""
        from sparserl.harness.gpucheck import WordSums

        self.pristine[key] = {n: a.copy() for n, a in arrays.items()}
        self._pristine_fp[key] = WordSums([self.pristine[key][n] for n in sorted(arrays)], self.sms)
        self._pristine_sums[key] = self._pristine_fp[key].compute()

    def modified(self, key: tuple, arrays: dict, restore: bool = True) -> list[str]:
        """Names of ``arrays`` that differ from their pristine copies (restored unless ``restore`` is off)."""
        import cupy as cp

        pristine = self.pristine[key]
        if self.batched:  # one kernel per array (differing words counted and restored), one read
            from sparserl.harness.gpucheck import enqueue_diff

            counts = cp.zeros(len(arrays), dtype=cp.uint64)
            for i, (n, a) in enumerate(arrays.items()):
                enqueue_diff(a, pristine[n], counts[i:], restore=restore, sms=self.sms, bitwise=True)
            host = cp.asnumpy(counts)
            return [n for i, n in enumerate(arrays) if host[i]]
        bad = [n for n, a in arrays.items() if not _same_bits(a, pristine[n])]
        if restore:
            for n in bad:
                arrays[n][...] = pristine[n]
        return bad

    def damage_report(self, targets: list[tuple[tuple, dict]]) -> tuple[dict[tuple, list[str]], bool]:
        """What differs from the upload, for each ``(key, arrays)`` of ``targets``: the names of its
        arrays unlike their pristine copies, and "their pristine copies" when those differ from their
        fingerprints; and whether the references, checks or verification inputs differ from theirs.
        Nothing is restored. On the batched path every comparison is a kernel and the counts come back
        in one copy (one wait); the sequential path compares the arrays with ``cp.array_equal``."""
        import cupy as cp

        from sparserl.harness.gpucheck import enqueue_diff

        fps = [self._pristine_fp[key] for key, _ in targets] + [self._ref_fp]
        n_diff = sum(len(arrays) for _, arrays in targets) if self.batched else 0
        tally = cp.zeros(n_diff + sum(f.size for f in fps), dtype=cp.uint64)
        pos = 0
        if self.batched:
            for key, arrays in targets:
                for name, a in arrays.items():
                    enqueue_diff(a, self.pristine[key][name], tally[pos:], restore=False, sms=self.sms)
                    pos += 1
        spans = []
        for f in fps:
            f.enqueue(tally[pos:pos + f.size])
            spans.append((pos, pos + f.size))
            pos += f.size
        host = [int(v) for v in cp.asnumpy(tally)]
        out: dict[tuple, list[str]] = {}
        pos = 0
        for (key, arrays), (lo, hi) in zip(targets, spans):
            if self.batched:
                bad = [name for i, name in enumerate(arrays) if host[pos + i]]
                pos += len(arrays)
            else:
                bad = self.modified(key, arrays, restore=False)
            if tuple(host[lo:hi]) != self._pristine_sums[key]:
                bad.append("their pristine copies")
            out[key] = bad
        lo, hi = spans[-1]
        return out, tuple(host[lo:hi]) != self._ref_sums

    # -- memory: what a conversion holds, and letting one go (sparserl.harness.memory) ----------

    def _conversion_caches(self) -> list[dict]:
        if self.twins is not None:
            return [self.twins._cache]
        return [self.on_device[w]._cache for w in ("A", "A_alt")]

    def has_conversion(self, key: tuple) -> bool:
        """Whether the (format, sorted parameters) conversion is here (or was refused: no memory)."""
        return all(key in c for c in self._conversion_caches())

    def _uploaded(self) -> dict[tuple, list]:
        """The device matrices of each uploaded conversion (both versions), by cache key, least
        recently used first."""
        out: dict[tuple, list] = {}
        for cache in self._conversion_caches():
            for key, got in cache.items():
                if not isinstance(got, str):
                    out.setdefault(key, []).extend(got if isinstance(got, tuple) else (got,))
        return out

    @staticmethod
    def _data_key(dev) -> tuple:
        """The key pristine copies go by: the conversion's resolved (format, parameters), which is
        :attr:`~sparserl.harness.launcher.BoundKernel.conversion_key` (a header may leave defaults out)."""
        return dev.data.format, tuple(sorted(dev.data.params.items()))

    def conversion_sizes(self) -> list[tuple[tuple, int]]:
        """(key, device bytes) of every uploaded conversion, both versions and their pristine copies,
        least recently used first; refusals hold no memory and are left out."""
        sizes: list[tuple[tuple, int]] = []
        counted: set[tuple] = set()
        for key, devs in self._uploaded().items():
            size = sum(int(a.nbytes) for d in devs for a in d.arrays.values())
            for which in ("A", "A_alt"):
                pkey = (which, self._data_key(devs[0]))
                if pkey in self.pristine and pkey not in counted:
                    counted.add(pkey)
                    size += sum(int(a.nbytes) for a in self.pristine[pkey].values())
            sizes.append((key, size))
        return sizes

    def device_bytes(self) -> int:
        """The matrix's device memory as far as it is known: conversions, pristine copies, references."""
        refs = sum(int(a.nbytes) for r in self.references.values() for a in r.device_arrays())
        return refs + sum(size for _, size in self.conversion_sizes())

    def drop_conversion(self, key: tuple) -> None:
        """Let one conversion go, both versions and their pristine copies (unless another cached key
        resolves to the same conversion); the next candidate that asks for it gets a fresh conversion,
        pristine copy and fingerprint. A refusal is kept (it holds no memory)."""
        uploaded = self._uploaded()
        devs = uploaded.pop(key, [])
        for cache in self._conversion_caches():
            if not isinstance(cache.get(key), str):
                cache.pop(key, None)
        if not devs:
            return
        data_key = self._data_key(devs[0])
        if any(self._data_key(d[0]) == data_key for d in uploaded.values()):
            return
        for which in ("A", "A_alt"):
            self.pristine.pop((which, data_key), None)
            self._pristine_sums.pop((which, data_key), None)
            self._pristine_fp.pop((which, data_key), None)

    def damage(self, key: tuple, arrays: dict) -> list[str]:
        """What differs from the upload: arrays unlike their pristine copies, pristine copies unlike
        their fingerprints, references unlike theirs (empty when all is intact)."""
        per, refs = self.damage_report([(key, arrays)])
        return per[key] + (["the verification references or inputs"] if refs else [])


class MatrixCache:
    """The worker's resident matrices, least recently used evicted past ``capacity``; ``options`` are
    passed to every :class:`ResidentMatrix` (``batched``, ``sms``). ``free_blocks`` hands the memory
    pool's idle blocks back to the device and ``out_of_memory`` is the error a failed allocation
    raises (CuPy's, unless given)."""

    def __init__(self, capacity: int = MAX_MATRICES, free_blocks: Callable[[], None] | None = None,
                 out_of_memory: type[BaseException] | None = None, **options):
        self.capacity = capacity
        self.options = options
        self._free_blocks = free_blocks
        self._out_of_memory = out_of_memory
        self._items: OrderedDict[str, ResidentMatrix] = OrderedDict()

    def get(self, ref: dict) -> ResidentMatrix:
        """The matrix of a job's ``{"key", "path"}`` reference, loaded from its file when not resident."""
        st = self._items.get(ref["key"])
        if st is None:
            st = self._load(ref)
            self._items[ref["key"]] = st
        self._items.move_to_end(ref["key"])
        return st

    def _load(self, ref: dict) -> ResidentMatrix:
        """A matrix not resident, loaded with room made first: at ``capacity`` the least recently used
        goes before the load (so at most ``capacity`` are ever held); out of GPU memory while loading,
        every other matrix is let go, the pool's idle blocks handed back, and the load tried once
        more (a second failure is raised: the job's matrix does not fit beside nothing)."""
        from sparserl.harness import profile

        while len(self._items) >= self.capacity:
            self._items.popitem(last=False)
            self._hand_back()
        oom = self._out_of_memory or _cupy_out_of_memory()
        for attempt in (0, 1):
            try:
                with profile.step("matrix_load"):
                    return ResidentMatrix(load_matrix_file(ref["path"]), **self.options)
            except oom:
                if attempt:
                    raise
            # outside the except block: its traceback holds the half-built matrix's arrays
            log.warning("out of GPU memory loading matrix %s; letting the %d other resident matrices go",
                        ref.get("name", ref["key"]), len(self._items))
            self._items.clear()
            self._hand_back()
        raise AssertionError("unreachable")

    def _hand_back(self) -> None:
        if self._free_blocks is not None:
            self._free_blocks()
            return
        import cupy as cp

        cp.get_default_memory_pool().free_all_blocks()

    def drop(self, key: str) -> None:
        self._items.pop(key, None)

    def make_room(self, current: str, conversion: tuple, reserve_fraction: float,
                  mem_info: Callable[[], tuple[int, int]], free_blocks: Callable[[], None]) -> ShedPlan:
        """Before matrix ``current`` makes ``conversion``: when the device's free memory (``mem_info``:
        free and total bytes) is under the reserve, drop other matrices and then ``current``'s other
        conversions, least recently used first (:func:`~sparserl.harness.memory.shed_plan`), and hand
        the freed blocks back (``free_blocks``; called first too, since the pool's idle blocks are not
        free to the device). Nothing happens when the conversion is already here."""
        st = self._items.get(current)
        if st is None or st.has_conversion(conversion):
            return ShedPlan()
        free, total = mem_info()
        if free >= reserve_bytes(total, reserve_fraction):
            return ShedPlan()
        free_blocks()  # blocks the pool keeps but nothing uses (earlier jobs' buffers) come back first
        free, total = mem_info()
        if free >= reserve_bytes(total, reserve_fraction):
            return ShedPlan()
        others = [(k, m.device_bytes()) for k, m in self._items.items() if k != current]
        convs = [(k, size) for k, size in st.conversion_sizes() if k != conversion]
        plan = shed_plan(free, total, reserve_fraction, others, convs)
        for k in plan.matrices:
            self.drop(k)
        for k in plan.conversions:
            st.drop_conversion(k)
        if not plan.empty:
            free_blocks()
            log.info("GPU memory: %.1f of %.1f GiB free, under the reserve of %.0f%%: dropped %d other matrices "
                     "and %d conversions (about %.1f GiB)", free / GiB, total / GiB, 100 * reserve_fraction,
                     len(plan.matrices), len(plan.conversions), plan.freed_bytes / GiB)
        return plan


def _same_bits(a, b) -> bool:
    """Whether two device arrays of one dtype hold the same bytes (a -0 written over a +0 differs: ``array_equal``
    would take them for equal, and the sign bit could carry state from launch to launch)."""
    import cupy as cp

    return a.shape == b.shape and bool(cp.array_equal(a.view(cp.uint8), b.view(cp.uint8)))


def _cupy_out_of_memory() -> type[BaseException]:
    import cupy as cp

    return cp.cuda.memory.OutOfMemoryError
