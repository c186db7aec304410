"""``sparserl check-kernel`` from a new user's side: bad files and flags are one-line errors,
and on a machine without a GPU it says that it falls back to compile-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.devices import NO_GPU_NOTE, visible_gpus
from sparserl.harness.compile import find_nvcc
from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix
from tests.conftest import NEEDS_NVCC, one_line_error


@pytest.fixture
def mtx(tmp_path: Path) -> Path:
    p = tmp_path / "m.mtx"
    save_matrix(generate("banded", 500, seed=0), p)
    return p


def test_a_kernel_file_that_is_not_text_is_one_line(cli, mtx: Path, tmp_path: Path) -> None:
    noise = tmp_path / "b.cu"
    noise.write_bytes(bytes(range(128, 256)) * 24)  # 3000 bytes that are not UTF-8
    one_line_error(cli("check-kernel", noise, "-m", mtx), "b.cu", "not a text file", "UTF-8")


def test_k_is_refused_with_spmv(cli, mtx: Path, tmp_path: Path) -> None:
    k = tmp_path / "k.cu"
    k.write_text(variants("spmv", "CSR")[0].render())
    one_line_error(cli("check-kernel", k, "-m", mtx, "--k", "8"), "--k", "spmm", "leave --k out")
    one_line_error(cli("baseline", mtx, "--k", "8"), "--k", "spmm")


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_without_a_gpu_it_says_it_falls_back(cli, mtx: Path, tmp_path: Path) -> None:
    if visible_gpus():
        pytest.skip("a GPU is visible: no fallback to see")
    k = tmp_path / "k.cu"
    k.write_text(variants("spmv", "DIA")[0].render())
    res = cli("check-kernel", k, "-m", mtx)
    assert res.rc == 0 and f"note: {NO_GPU_NOTE}" in res.err and "COMPILED (not run)" in res.out
    res = cli("check-kernel", k, "-m", mtx, "--compile-only")  # asked for: no note
    assert res.rc == 0 and "note:" not in res.err
