"""A worker's GPU memory (harness/memory.py, resident.py): what it lets go of before a new conversion.

On the CPU: the pure plan (:func:`shed_plan`), a matrix's conversions counted and dropped with numpy
arrays standing in for device arrays (the same ``nbytes`` and ``dict`` bookkeeping), least recently
used order kept by the conversion caches, and :meth:`MatrixCache.make_room` applying a plan. What the
GPU gives back is tested on the device (``test_memory_gpu.py``)."""

from __future__ import annotations

import pytest

from sparserl.formats import convert
from sparserl.harness.device import DeviceMatrix
from sparserl.harness.launcher import MatrixOnDevice
from sparserl.harness.memory import ShedPlan, reserve_bytes, shed_plan
from sparserl.harness.resident import MatrixCache, ResidentMatrix
from sparserl.matrices import generate

GB = 1 << 30


def test_nothing_is_dropped_while_the_reserve_is_free() -> None:
    """Kills: shedding on every new conversion (a search would convert everything again and again)."""
    plan = shed_plan(30 * GB, 100 * GB, 0.3, [("m1", 10 * GB)], [("c1", 5 * GB)])
    assert plan.empty and plan.freed_bytes == 0


def test_other_matrices_go_first_then_conversions_least_recently_used_first() -> None:
    """10 GB short of the reserve: the least recently used other matrix (6 GB) and then the next
    (6 GB) cover it; no conversion of the matrix in use is touched. 17 GB short: both matrices and
    then conversions in order, stopping once covered (at 18 GB). Kills: conversions dropped before matrices, the
    most recently used dropped first, a plan that does not stop when the shortfall is covered."""
    mats = [("old", 6 * GB), ("newer", 6 * GB)]
    convs = [("c_old", 3 * GB), ("c_mid", 3 * GB), ("c_new", 3 * GB)]
    plan = shed_plan(20 * GB, 100 * GB, 0.3, mats, convs)
    assert plan == ShedPlan(["old", "newer"], [], 12 * GB)
    plan = shed_plan(13 * GB, 100 * GB, 0.3, mats, convs)
    assert plan == ShedPlan(["old", "newer"], ["c_old", "c_mid"], 18 * GB)
    plan = shed_plan(0, 100 * GB, 0.3, mats, convs)  # not enough to drop: all of it
    assert plan.matrices == ["old", "newer"] and plan.conversions == ["c_old", "c_mid", "c_new"]


def test_reserve_fraction_is_checked() -> None:
    assert reserve_bytes(100, 0.25) == 25
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="reserve_fraction"):
            reserve_bytes(100, bad)


A100 = generate("random", 100, seed=0, nnz_per_row=3)


def _dev(fmt: str, params: dict) -> DeviceMatrix:
    """A real conversion, its host arrays standing in for device ones."""
    fd = convert(A100, fmt, params)
    return DeviceMatrix(fd, {n: a.copy() for n, a in fd.arrays.items()})


def _bytes(dev: DeviceMatrix) -> int:
    return sum(a.nbytes for a in dev.arrays.values())


def _resident(conversions: dict) -> ResidentMatrix:
    """A ResidentMatrix on the unbatched path with host arrays in place of device ones."""
    st = ResidentMatrix.__new__(ResidentMatrix)
    st.twins = None
    st.on_device = {w: MatrixOnDevice(A100) for w in ("A", "A_alt")}
    st.references = {}
    st.pristine, st._pristine_sums, st._pristine_fp = {}, {}, {}
    for key, got in conversions.items():
        for w in ("A", "A_alt"):
            st.on_device[w]._cache[key] = got if isinstance(got, str) else got(w)
            if not isinstance(got, str):
                dev = st.on_device[w]._cache[key]
                pkey = (w, (dev.data.format, tuple(sorted(dev.data.params.items()))))
                st.pristine[pkey] = {n: a.copy() for n, a in dev.arrays.items()}
                st._pristine_sums[pkey] = (0,)
                st._pristine_fp[pkey] = object()
    return st


def test_a_conversion_counts_both_versions_and_their_pristine_copies_and_drops_them_all() -> None:
    """ELL counted four times (two versions, two pristine copies); a refusal holds nothing and
    stays. Dropping it frees the caches and the pristine copies, sums and fingerprints of both
    versions. Kills: one version counted or dropped, pristine copies kept (the memory would stay
    held), a refusal forgotten (the converter would run again for nothing)."""
    ell = ("ELL", ())
    st = _resident({("DIA", ()): "DIA would store too much",
                    ell: lambda w: _dev("ELL", {})})
    assert st.conversion_sizes() == [(ell, 4 * _bytes(_dev("ELL", {})))]
    assert st.has_conversion(ell) and st.has_conversion(("DIA", ()))
    st.drop_conversion(ell)
    assert not st.has_conversion(ell) and st.conversion_sizes() == []
    assert st.pristine == {} and st._pristine_sums == {} and st._pristine_fp == {}
    st.drop_conversion(("DIA", ()))
    assert st.has_conversion(("DIA", ()))


def test_a_pristine_copy_shared_by_two_header_spellings_stays_until_both_go() -> None:
    """A header that leaves a default out and one that spells it resolve to one conversion: one
    pristine copy (keyed by the resolved parameters). Dropping one spelling keeps the copy the other
    is checked against. Kills: the copy dropped with the first (the next job's damage check would
    find no pristine copy for its conversion)."""
    short, spelled = ("SELL", ()), ("SELL", (("C", 32),))
    st = _resident({short: lambda w: _dev("SELL", {}), spelled: lambda w: _dev("SELL", {"C": 32})})
    assert len(st.pristine) == 2  # one per version, shared by both spellings
    size = _bytes(_dev("SELL", {}))
    assert sum(s for _, s in st.conversion_sizes()) == 4 * size + 2 * size
    st.drop_conversion(short)
    assert ("A", ("SELL", (("C", 32), ("sigma", 1)))) in st.pristine
    st.drop_conversion(spelled)
    assert st.pristine == {}


def test_the_conversion_cache_keeps_least_recently_used_first() -> None:
    """A hit moves the conversion last, so make_room lets go of the one unused longest. Kills: the
    insertion order kept (a conversion every candidate uses would be dropped first)."""
    mod = MatrixOnDevice(A100)
    for fmt in ("ELL", "SELL", "HYB"):
        mod._cache[(fmt, ())] = _dev(fmt, {})
    mod.get("ELL", {})
    assert list(mod._cache) == [("SELL", ()), ("HYB", ()), ("ELL", ())]


class _Fake:
    """A resident matrix as make_room sees it."""

    def __init__(self, sizes: dict[tuple, int]):
        self.sizes = dict(sizes)

    def has_conversion(self, key):
        return key in self.sizes

    def conversion_sizes(self):
        return list(self.sizes.items())

    def device_bytes(self):
        return sum(self.sizes.values())

    def drop_conversion(self, key):
        self.sizes.pop(key, None)


def test_make_room_applies_the_plan_and_hands_blocks_back() -> None:
    """Under the reserve: the other matrix goes, then the current one's least recently used
    conversion, never the one about to be made; the pool's blocks are freed before the plan and after
    the drop. Over the reserve, or for a conversion already there: nothing. Kills: the current matrix dropped, blocks not freed
    (CuPy's pool would keep the memory), a check of free memory skipped."""
    cache = MatrixCache()
    cache._items["other"] = _Fake({("ELL", ()): 5 * GB})
    cache._items["cur"] = cur = _Fake({("SELL", ()): 4 * GB, ("HYB", ()): 4 * GB})
    freed = []
    plan = cache.make_room("cur", ("CSR", ()), 0.3, lambda: (21 * GB, 100 * GB), lambda: freed.append(1))
    assert plan.matrices == ["other"] and plan.conversions == [("SELL", ())]
    assert list(cache._items) == ["cur"] and list(cur.sizes) == [("HYB", ())] and freed == [1, 1]
    assert cache.make_room("cur", ("HYB", ()), 0.3, lambda: (0, 100 * GB), lambda: freed.append(1)).empty
    assert cache.make_room("cur", ("CSR", ()), 0.3, lambda: (31 * GB, 100 * GB), lambda: freed.append(1)).empty
    assert freed == [1, 1] and list(cur.sizes) == [("HYB", ())]


def test_make_room_asks_again_after_the_pool_hands_its_idle_blocks_back() -> None:
    """The pool's idle blocks (earlier jobs' buffers) are not free to the device: the first reading is
    under the reserve, the one after ``free_blocks`` over it, so nothing is dropped. Kills: a plan
    made from the first reading (matrices and conversions dropped while the memory was there)."""
    cache = MatrixCache()
    cache._items["other"] = _Fake({("ELL", ()): 5 * GB})
    cache._items["cur"] = _Fake({("SELL", ()): 4 * GB})
    readings = iter([(10 * GB, 100 * GB), (40 * GB, 100 * GB)])
    freed = []
    plan = cache.make_room("cur", ("CSR", ()), 0.3, lambda: next(readings), lambda: freed.append(1))
    assert plan.empty and freed == [1] and list(cache._items) == ["other", "cur"]


def test_twin_conversions_count_both_versions_and_keep_least_recently_used_first() -> None:
    """The batched path keeps a (matrix, twin) pair per conversion: both are counted, and a hit moves
    the pair last. Kills: one of the pair counted, the twins' cache left in insertion order."""
    from sparserl.harness.launcher import TwinConversions

    st = ResidentMatrix.__new__(ResidentMatrix)
    st.twins = TwinConversions(A100, A100, {})
    st.references, st.pristine, st._pristine_sums, st._pristine_fp = {}, {}, {}, {}
    for fmt in ("ELL", "HYB"):
        st.twins._cache[(fmt, ())] = (_dev(fmt, {}), _dev(fmt, {}))
    st.twins._cache[("DIA", ())] = "DIA would store too much"
    assert st.conversion_sizes() == [(("ELL", ()), 2 * _bytes(_dev("ELL", {}))),
                                     (("HYB", ()), 2 * _bytes(_dev("HYB", {})))]
    st.twins.get("A", "ELL", {})
    assert [k for k, _ in st.conversion_sizes()] == [("HYB", ()), ("ELL", ())]
    st.drop_conversion(("ELL", ()))
    assert not st.has_conversion(("ELL", ())) and st.has_conversion(("DIA", ()))


class _OOM(MemoryError):
    """Stands in for cupy.cuda.memory.OutOfMemoryError."""


def _fake_cp():
    from types import SimpleNamespace

    pool = SimpleNamespace(free_all_blocks=lambda: None)
    return SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(memGetInfo=lambda: (0, 100 * GB)),
                                                memory=SimpleNamespace(OutOfMemoryError=_OOM)),
                           get_default_memory_pool=lambda: pool)


def _binding_worker(fail_times: int):
    """A Worker whose binding runs out of memory on the twin ``fail_times`` times (CuPy doubled)."""
    from types import SimpleNamespace

    from sparserl.harness import worker as W

    w = W.Worker.__new__(W.Worker)
    w.gpu = SimpleNamespace(cp=_fake_cp())
    w.memory_reserve = 0.3
    rooms, dropped = [], []
    w.matrices = SimpleNamespace(make_room=lambda key, conv, reserve, mem_info, free: rooms.append(reserve))
    st = SimpleNamespace(twins=SimpleNamespace(files={}), drop_conversion=dropped.append)
    left = [fail_times]

    def bind(job, header, st_, which):
        if which == "A_alt" and left[0]:
            left[0] -= 1
            raise _OOM("out of memory")
        return ("bound", which)  # not a str: a str is a refusal

    w._bind = bind
    return w, st, rooms, dropped


def test_out_of_memory_while_binding_lets_everything_go_and_binds_once_more() -> None:
    """The twin's conversion runs out of memory once: the half-made conversion is dropped, the
    caller's pattern folder put back for the retry, room made with the reserve nothing meets (every
    other matrix and conversion let go), and the second binding returned. Twice: the error is raised
    (the candidate is not retried forever). Kills: no retry, a retry that keeps the normal reserve,
    the pattern lost (the retry would convert on the host again), the half-made conversion kept."""
    from types import SimpleNamespace

    from sparserl.harness import worker as W

    w, st, rooms, dropped = _binding_worker(1)
    header = SimpleNamespace(format="ELL", params={})
    job = {"pattern": "/patterns/ell"}
    got = w._bind_both(job, header, st, "m", ("ELL", ()))
    assert got == (("bound", "A"), ("bound", "A_alt"))
    assert rooms == [0.3, W.EVERYTHING] and dropped == [("ELL", ())]
    assert st.twins.files == {("ELL", ()): "/patterns/ell"}
    w, st, rooms, dropped = _binding_worker(2)
    with pytest.raises(_OOM):
        w._bind_both(job, header, st, "m", ("ELL", ()))
    assert rooms == [0.3, W.EVERYTHING]


def test_a_reserve_outside_zero_to_one_is_refused_in_one_line() -> None:
    """Bad input: a memory_reserve of 1 or more (nothing could ever be kept) or below 0."""
    from sparserl.errors import SparseRLError
    from sparserl.harness.evaluator import HarnessConfig

    assert HarnessConfig(memory_reserve=0.0).memory_reserve == 0.0
    for bad in (-0.5, 1.0, 2.0):
        with pytest.raises(SparseRLError, match="memory_reserve must be in") as exc:
            HarnessConfig(memory_reserve=bad)
        assert "\n" not in str(exc.value)


def _loading_cache(monkeypatch, fails: tuple[int, ...] = (), capacity: int = 2):
    """A MatrixCache whose loads build a stand-in matrix, the loads numbered in ``fails`` (from 0)
    running out of memory; it records how many matrices were held at each load and at each hand-back, and whether
    a hand-back ran while an exception was being handled (whose traceback would still hold the
    half-built matrix's arrays)."""
    import sys

    from sparserl.harness import resident as R

    seen = {"held_at_load": [], "hand_backs": [], "in_except": []}
    cache = None

    class Loaded:
        def __init__(self, A, **options):
            seen["held_at_load"].append(len(cache._items))
            if len(seen["held_at_load"]) - 1 in fails:
                raise _OOM("out of memory")
            self.A = A

    def hand_back():
        seen["hand_backs"].append(len(cache._items))
        seen["in_except"].append(sys.exc_info()[0] is not None)

    monkeypatch.setattr(R, "ResidentMatrix", Loaded)
    monkeypatch.setattr(R, "load_matrix_file", lambda path: f"matrix from {path}")
    cache = MatrixCache(capacity=capacity, free_blocks=hand_back, out_of_memory=_OOM)
    return cache, seen


def test_a_full_cache_lets_its_least_recently_used_matrix_go_before_loading(monkeypatch) -> None:
    """At capacity, the least recently used matrix goes (and the pool's blocks are handed back)
    before the new one is built, so never more than ``capacity`` are held; a hit loads nothing and
    becomes the most recently used. Kills: eviction after the load (capacity + 1 held while the new
    one is built, the way it was), the hit not moved last (the wrong matrix evicted)."""
    cache, seen = _loading_cache(monkeypatch)
    cache.get({"key": "a", "path": "a.npz"})
    cache.get({"key": "b", "path": "b.npz"})
    assert cache.get({"key": "a", "path": "a.npz"}).A == "matrix from a.npz"
    cache.get({"key": "c", "path": "c.npz"})
    assert seen["held_at_load"] == [0, 1, 1] and seen["hand_backs"] == [1]
    assert list(cache._items) == ["a", "c"]


def test_out_of_memory_while_loading_lets_the_other_matrices_go_and_loads_once_more(monkeypatch) -> None:
    """The load runs out of memory once: every other matrix goes, the pool's blocks are handed back
    outside the exception's handling, and the second load is kept. Twice: raised, nothing half-made
    kept. Kills: no retry (the job lost as an internal error), a retry that keeps the other matrices,
    blocks handed back while the traceback still holds the failed load's arrays."""
    cache, seen = _loading_cache(monkeypatch, fails=(2,), capacity=4)
    cache.get({"key": "a", "path": "a.npz"})
    cache.get({"key": "b", "path": "b.npz"})
    got = cache.get({"key": "c", "path": "c.npz"})
    assert got.A == "matrix from c.npz" and list(cache._items) == ["c"]
    assert seen["held_at_load"] == [0, 1, 2, 0] and seen["hand_backs"] == [0] and seen["in_except"] == [False]
    cache, seen = _loading_cache(monkeypatch, fails=(0, 1), capacity=4)
    with pytest.raises(_OOM):
        cache.get({"key": "d", "path": "d.npz"})
    assert "d" not in cache._items and seen["held_at_load"] == [0, 0]
