"""The caller's pattern conversions (sparserl.harness.preconvert) on the CPU: what a worker loads is
what it would have converted, each conversion is made once however many candidates ask at once, and
the folders stay within their budget."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sparserl.errors import FormatError
from sparserl.harness import preconvert
from sparserl.harness.matrix_files import save_matrix_file
from sparserl.matrices import generate


def _same(a, b) -> bool:
    return (a.format, a.params, a.shape, a.nnz, a.sizes, list(a.arrays)) == \
        (b.format, b.params, b.shape, b.nnz, b.sizes, list(b.arrays)) and \
        all(np.array_equal(a.arrays[n].view(np.uint32), b.arrays[n].view(np.uint32)) for n in a.arrays)


def test_saved_conversions_load_as_they_were_made(tmp_path) -> None:
    """Every format's pattern conversion and a refusal come back from their folders unchanged (bit for
    bit, in the contract's order); a folder missing a file or naming arrays out of the contract's
    order is an error the worker answers by converting. Kills a reload that reorders arrays, loses a
    size, or passes a damaged folder off as a conversion."""
    A = generate("banded", 2000, seed=1)
    for fmt, params in (("CSR", {}), ("COO", {}), ("ELL", {}), ("SELL", {"C": 32, "sigma": 64}), ("DIA", {}),
                        ("BSR", {"R": 2, "C": 2}), ("HYB", {})):
        fd = preconvert.convert_pattern(A, fmt, params)
        folder = tmp_path / fmt
        preconvert.save(fd, folder)
        assert _same(preconvert.load(folder), fd), fmt
    B = generate("random", 2000, seed=1, nnz_per_row=20)
    with pytest.raises(FormatError) as refused:
        preconvert.convert_pattern(B, "DIA", {})
    preconvert.save(str(refused.value), tmp_path / "refused")
    assert preconvert.load(tmp_path / "refused") == str(refused.value)
    (tmp_path / "SELL" / "2.npy").unlink()
    with pytest.raises(OSError):
        preconvert.load(tmp_path / "SELL")
    meta = (tmp_path / "COO" / "meta.json")
    meta.write_text(meta.read_text().replace('"row_idx", "col_idx"', '"col_idx", "row_idx"'))
    with pytest.raises(ValueError, match="damaged"):
        preconvert.load(tmp_path / "COO")
    with pytest.raises(OSError):
        preconvert.load(tmp_path / "never made")


def test_each_conversion_is_made_once_and_the_folders_keep_to_their_budget(tmp_path, monkeypatch) -> None:
    """Four candidates asking for one (matrix, format, parameters) at once get one folder and one
    conversion; another format gets its own; past the byte budget the least recently used folder goes
    (never the one just made) and asking again makes it anew; closing removes them all. Kills a race
    that converts twice, an eviction of the newest, a folder left behind."""
    A = generate("banded", 3000, seed=2)
    key, path = save_matrix_file(A, tmp_path / "matrices")
    made: list[str] = []
    real = preconvert.convert_pattern

    def counting(A_, fmt, params, limits=None):
        made.append(fmt)
        time.sleep(0.05)  # long enough for the others to arrive while it converts
        return real(A_, fmt, params, limits)

    monkeypatch.setattr(preconvert, "convert_pattern", counting)
    pre = preconvert.Preconverter(tmp_path / "conversions")
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(pre.folder(key, str(path), "ELL", {}))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == ["ELL"] and len(set(got)) == 1
    assert _same(preconvert.load(Path(got[0])), real(A, "ELL", {}))
    ell_bytes = real(A, "ELL", {}).nbytes
    pre.budget_bytes = ell_bytes + 1  # room for one of these
    coo = pre.folder(key, str(path), "COO", {})
    assert made == ["ELL", "COO"] and Path(coo).is_dir() and not Path(got[0]).exists()
    assert pre.folder(key, str(path), "ELL", {}) == got[0] and made == ["ELL", "COO", "ELL"]
    assert not Path(coo).exists()
    pre.close()
    assert not pre.dir.exists()


def test_folders_of_dead_evaluators_are_removed(tmp_path) -> None:
    """A process killed before it closed its evaluator leaves its conversions behind; the next
    Preconverter in the same folder removes them, and leaves a live process's alone."""
    import subprocess
    import sys

    root = tmp_path / "conversions"
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = root / f"conversions-{int(done.stdout)}-abc"
    alive = root / f"conversions-{os.getpid()}-def"
    for d in (dead, alive):
        d.mkdir(parents=True)
        (d / "meta.json").write_text("{}")
    pre = preconvert.Preconverter(root)
    assert not dead.exists() and alive.exists() and pre.dir.exists()
    pre.close()
