"""``sparserl library compile``: bad values are one-line errors, and an architecture the
compiler cannot build for is refused first and never cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.harness.compile import CompileOptions, compile_source, find_nvcc
from sparserl.harness.nvrtc import load_nvrtc
from tests.conftest import NEEDS_NVCC, one_line_error


def test_negative_jobs_is_a_one_line_error(cli, tmp_path: Path) -> None:
    one_line_error(cli("library", "compile", "--jobs", "-4", "--cache-dir", tmp_path), "--jobs", ">= 0")


@pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)
def test_unknown_arch_is_refused_before_building_and_twice_the_same(cli, tmp_path: Path) -> None:
    for _ in range(2):  # the second run must not find cached failures
        line = one_line_error(cli("library", "compile", "--arch", "sm_1000", "--cache-dir", tmp_path),
                              "--arch sm_1000", "sm_90")
        assert "cache hits" not in line
    assert not list(tmp_path.rglob("*.json")), "an environment failure was cached"


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
def test_a_compiler_that_rejects_its_options_is_not_cached(backend: str, tmp_path: Path) -> None:
    if (backend == "nvcc" and find_nvcc() is None) or (backend == "nvrtc" and load_nvrtc() is None):
        pytest.skip(f"needs {backend}")
    src = 'extern "C" __global__ void k(float* y) { y[0] = 1.f; }'
    for _ in range(2):
        r = compile_source(src, CompileOptions(arch="sm_1000", backend=backend), tmp_path)
        assert not r.ok and r.error_kind == "compiler_failure" and not r.cached
    assert not list(tmp_path.rglob("*.json"))
    broken = compile_source("this is not CUDA", CompileOptions(backend=backend), tmp_path)
    assert broken.error_kind == "compile_error"  # a source's own error is still cached
    assert compile_source("this is not CUDA", CompileOptions(backend=backend), tmp_path).cached
