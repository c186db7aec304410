"""Uploads through one reusable page-locked buffer (sparserl.harness.staging) on the CPU: the device
side is played by NumPy arrays, the page-locked buffer by a plain one, so what is checked is what
reaches the "device", which buffer it went through, and when the buffer is made again."""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.harness import preconvert, staging
from sparserl.harness.staging import PinnedStaging
from sparserl.matrices import generate


class FakeDevice:
    """Allocation, copies and the wait of a PinnedStaging, recorded; the copies into the 'device'
    are made at ``wait`` (as an asynchronous copy lands only by then)."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.pinned_copies = self.pageable_copies = self.waits = 0

    def allocate(self, nbytes: int):
        self.made.append(nbytes)
        buf = np.full(nbytes, 0xAB, np.uint8)
        return buf, buf

    def copy(self, dev: np.ndarray, host: np.ndarray) -> None:
        self.pinned_copies += 1
        self.pending.append((dev, host))

    def asarray(self, host: np.ndarray) -> np.ndarray:
        self.pageable_copies += 1
        return host.copy()

    def wait(self) -> None:
        self.waits += 1
        for dev, host in self.pending:
            dev[...] = host
        self.pending.clear()

    def staging(self, cap: int = staging.CAP_BYTES) -> PinnedStaging:
        return PinnedStaging(cap, self.allocate, self.copy, self.wait, np.empty, self.asarray)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) if a.dtype.itemsize == 4 else a


def test_a_saved_conversion_reaches_the_device_bit_for_bit_through_the_buffer(tmp_path) -> None:
    """Every array of a saved conversion lands on the 'device' unchanged, each copied from the
    staging buffer (none from elsewhere), the copies waited for before ``load`` returns; the host
    side keeps sizes, shape and byte counts but no values. A second conversion reuses the buffer
    (made once) and the first's device arrays do not change. Kills a load that reads an array at
    the wrong offset (arrays overlapping in the buffer), that returns before the copies land, or
    that makes the buffer again for every conversion."""
    A = generate("banded", 3000, seed=3)
    dev = FakeDevice()
    st = dev.staging()
    got = {}
    for fmt, params in (("SELL", {"C": 32, "sigma": 64}), ("COO", {})):
        fd = preconvert.convert_pattern(A, fmt, params)
        preconvert.save(fd, tmp_path / fmt)
        host, arrays = st.load(tmp_path / fmt)
        assert dev.pending == [] and dev.pageable_copies == 0
        assert list(arrays) == list(fd.arrays)
        for name in fd.arrays:
            assert arrays[name].dtype == fd.arrays[name].dtype
            assert np.array_equal(_bits(arrays[name]), _bits(fd.arrays[name])), (fmt, name)
        assert (host.sizes, host.shape, host.nbytes, host.stored_slots) == (fd.sizes, fd.shape, fd.nbytes,
                                                                            fd.stored_slots)
        assert all(not a.flags.writeable and not a.any() for a in host.arrays.values())
        got[fmt] = (fd, arrays)
    assert len(dev.made) == 1 and st.grown == 1
    fd, arrays = got["SELL"]
    assert all(np.array_equal(_bits(arrays[n]), _bits(fd.arrays[n])) for n in fd.arrays)


def test_the_buffer_grows_only_when_a_conversion_does_not_fit_and_never_past_its_cap() -> None:
    """A small upload makes one buffer of the first size; a larger one makes it again (at least
    twice as large); past the cap the arrays are copied without it, correctly, and the buffer is
    left as it was. A buffer that cannot be made is no failure: the arrays go from pageable memory
    and no buffer is tried again. Kills growth on every call, a buffer past the cap, and an
    allocation failure that fails the upload."""
    rng = np.random.default_rng(0)
    small = {"a": rng.integers(0, 9, 1000, dtype=np.int32), "b": rng.random(777, dtype=np.float32)}
    dev = FakeDevice()
    st = dev.staging(cap=3 * staging.FIRST_BYTES)
    out = st.upload(small)
    assert all(np.array_equal(out[k], small[k]) for k in small) and dev.pinned_copies == 2
    assert dev.made == [staging.FIRST_BYTES]
    st.upload(small)
    assert dev.made == [staging.FIRST_BYTES]
    big = {"v": np.arange(staging.FIRST_BYTES // 4 + 10, dtype=np.int32)}
    assert np.array_equal(st.upload(big)["v"], big["v"])
    assert dev.made == [staging.FIRST_BYTES, 2 * staging.FIRST_BYTES]
    larger = {"v": np.ones(5 * staging.FIRST_BYTES // 8, dtype=np.int32)}  # 2.5 first sizes: doubling passes the cap
    assert st.upload(larger)["v"].all()
    assert dev.made == [staging.FIRST_BYTES, 2 * staging.FIRST_BYTES, 3 * staging.FIRST_BYTES]
    huge = {"v": np.zeros(3 * staging.FIRST_BYTES // 4 + 1, dtype=np.int32)}
    huge["v"][-1] = 7
    out = st.upload(huge)
    assert out["v"][-1] == 7 and dev.pageable_copies == 1 and len(dev.made) == 3

    def refuse(nbytes):
        raise MemoryError("no page-locked memory")

    broken = PinnedStaging(staging.CAP_BYTES, refuse, dev.copy, dev.wait, np.empty, dev.asarray)
    out = broken.upload(small)
    assert all(np.array_equal(out[k], small[k]) for k in small) and broken.cap_bytes == 0


def test_a_damaged_or_short_folder_is_an_error_not_a_partial_conversion(tmp_path) -> None:
    """A conversion file cut short, or longer than its header says, is a ValueError (the worker then
    converts for itself), read into the buffer or not; a refusal comes back as its message. Kills a
    short read that leaves the buffer's old bytes in an array, and a file whose header and data
    disagree taken for a conversion."""
    A = generate("banded", 2000, seed=4)
    fd = preconvert.convert_pattern(A, "COO", {})
    preconvert.save(fd, tmp_path / "coo")
    path = tmp_path / "coo" / "1.npy"
    whole = path.read_bytes()
    st = FakeDevice().staging()
    for damaged in (whole[:-4], whole + b"\0" * 4):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match="header says"):
            st.load(tmp_path / "coo")
        with pytest.raises(ValueError, match="header says"):
            preconvert.load(tmp_path / "coo")
    preconvert.save("DIA would store too much", tmp_path / "refused")
    assert st.load(tmp_path / "refused") == "DIA would store too much"


def test_copies_under_way_are_waited_for_even_when_a_later_array_fails(tmp_path) -> None:
    """Device memory running out for the second array of a conversion raises, but only after the
    first array's copy from the buffer has been waited for (the buffer is reused next); the same
    folder then loads bit for bit. Kills a wait that only a successful load reaches."""
    A = generate("banded", 3000, seed=6)
    fd = preconvert.convert_pattern(A, "COO", {})
    preconvert.save(fd, tmp_path / "coo")
    dev = FakeDevice()
    st = dev.staging()
    calls = []

    def empty_then_out_of_memory(shape, dtype):
        calls.append(shape)
        if len(calls) == 2:
            raise MemoryError("out of device memory")
        return np.empty(shape, dtype)

    st._empty = empty_then_out_of_memory
    with pytest.raises(MemoryError):
        st.load(tmp_path / "coo")
    assert dev.pending == [] and dev.waits == 1
    st._empty = np.empty
    _, arrays = st.load(tmp_path / "coo")
    assert all(np.array_equal(_bits(arrays[n]), _bits(fd.arrays[n])) for n in fd.arrays)


@pytest.mark.gpu
def test_on_the_gpu_a_loaded_conversion_is_what_cupy_uploads(tmp_path) -> None:
    """GPU: through a real page-locked buffer, a saved conversion and in-memory arrays reach the
    device bit for bit as ``cupy.asarray`` puts them there, the buffer made once for both and still
    right for a third upload after them. Kills a copy from the wrong address or size."""
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no usable CUDA GPU")
    A = generate("powerlaw", 50_000, seed=5)
    st = PinnedStaging()
    fd = preconvert.convert_pattern(A, "SELL", {"C": 32, "sigma": 512})
    preconvert.save(fd, tmp_path / "sell")
    _, loaded = st.load(tmp_path / "sell")
    coo = preconvert.convert_pattern(A, "COO", {})
    uploaded = st.upload(coo.arrays)
    again = st.upload({"x": np.arange(12345, dtype=np.int32)})
    for want, got in ((fd.arrays, loaded), (coo.arrays, uploaded)):
        for name, a in want.items():
            assert bool(cp.array_equal(got[name].view(cp.uint32), cp.asarray(a).view(cp.uint32))), name
    assert bool(cp.array_equal(again["x"], cp.arange(12345, dtype=cp.int32))) and st.grown == 1
