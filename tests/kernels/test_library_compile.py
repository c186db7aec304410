"""Every library variant compiles with nvcc for sm_90 (no GPU needed), in parallel, cached;
and with NVRTC where its library is installed, to the same ptxas resource report.

Uses the test run's compile cache (``$SPARSERL_CACHE_DIR``: a fresh folder per run unless it is set, see
tests/conftest.py; set it to a lasting folder to make reruns fast). The cache behaviour itself is tested in
``tests/harness/test_compile.py`` on a private folder.
"""

from __future__ import annotations

from collections import Counter

import pytest

from sparserl.harness.compile import CompileOptions, compile_many, find_nvcc
from sparserl.harness.nvrtc import load_nvrtc
from sparserl.kernels.contract import FORMAT_NAMES, Op, split_completion
from sparserl.kernels.library import all_variants, variants

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit needed to compile)")


@pytest.fixture(scope="module")
def compiled():
    vs = all_variants()
    codes = [split_completion(v.render(), v.op)[1] for v in vs]
    return list(zip(vs, compile_many(codes, CompileOptions(arch="sm_90", backend="nvcc"))))


def test_all_variants_compile_for_sm90(compiled) -> None:
    failed = [(v.id, r.log[-800:]) for v, r in compiled if not r.ok]
    assert not failed, failed
    refused = [(v.id, r.ptx_violation) for v, r in compiled if r.ptx_violation is not None]
    assert not refused, refused  # the compiled-code rules refuse none of the library


def test_no_variant_spills_or_uses_local_memory(compiled) -> None:
    spills = [
        (v.id, res) for v, r in compiled for res in r.resources
        if res.spill_store_bytes or res.spill_load_bytes or res.stack_bytes
    ]
    assert not spills, spills


def test_resources_reported_for_every_launched_kernel(compiled) -> None:
    for v, r in compiled:
        header, _ = split_completion(v.render(), v.op)
        for name in header.kernel_names(v.op):
            res = r.resources_of(name)
            assert res is not None and 0 < res.registers <= 255, (v.id, name)


def test_every_op_and_format_has_variants() -> None:
    counts = Counter((v.op, v.format) for v in all_variants())
    for op in Op:
        for fmt in FORMAT_NAMES:
            assert counts[(op, fmt)] >= 1, (op, fmt)
    strategies = {v.strategy for v in variants(Op.SPMV)}
    assert {"csr_scalar", "csr_vector", "csr_merge", "coo_atomic", "coo_segmented", "ell_rows",
            "sell_lanes", "dia_rows", "bsr_group", "hyb_ell_coo"} <= strategies
    assert {v.t("tpr") for v in variants(Op.SPMV, "CSR") if v.strategy == "csr_vector"} == {2, 4, 8, 16, 32}


@pytest.mark.skipif(load_nvrtc() is None, reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
def test_nvrtc_builds_every_variant_with_nvccs_resources(compiled) -> None:
    codes = [split_completion(v.render(), v.op)[1] for v, _ in compiled]
    by_nvrtc = compile_many(codes, CompileOptions(arch="sm_90", backend="nvrtc"))
    failed = [(v.id, r.log[-800:]) for (v, _), r in zip(compiled, by_nvrtc) if not r.ok]
    assert not failed, failed
    assert all(r.backend == "nvrtc" for r in by_nvrtc) and all(r.backend == "nvcc" for _, r in compiled)
    differ = [(v.id, a.resources, b.resources) for (v, a), b in zip(compiled, by_nvrtc) if a.resources != b.resources]
    assert not differ, differ[:3]


def test_eight_columns_a_lane_load_and_store_in_16_bytes(tmp_path) -> None:
    """The SpMM helpers move VEC columns in 16-byte pieces whenever VEC is a multiple of 4, not only at 4:
    a COO-runs body under PARAMS VEC=8 (a choice of numbers a policy or a search may make) compiles to
    128-bit loads of X and stores of Y, and no 32-bit ones. Kills: the helpers' vector path kept for VEC == 4
    only (8 scalar loads a row), a loop that covers only the first 4 columns (fewer vector loads)."""
    import re
    import subprocess

    from sparserl.kernels.library import get_variant

    counts = {}
    for vec in (4, 8):  # 32 lanes of 4 columns or 16 of 8: 128 columns a group, 4 rows of X in flight either way
        text = get_variant("spmm/coo_runs_stored/zero_y=0/g=16,vec=4,nzpg=256,block=256").render()
        code = split_completion(text.replace("G=16, VEC=4", f"G={128 // vec}, VEC={vec}"), Op.SPMM)[1]
        src, ptx = tmp_path / f"v{vec}.cu", tmp_path / f"v{vec}.ptx"
        src.write_text(code)
        out = subprocess.run([find_nvcc(), "-arch=sm_90", "--ptx", "-o", str(ptx), str(src)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        body = ptx.read_text()
        counts[vec] = (len(re.findall(r"ld\.global\.nc\.v4\.f32", body)), len(re.findall(r"ld\.global\.nc\.f32", body)),
                       len(re.findall(r"st\.global\.v4\.f32", body)))
    v4_loads, scalar_loads, v4_stores = counts[8]
    assert scalar_loads == counts[4][1] == 1  # the value array's one load; X is read in 16-byte pieces only
    assert v4_loads == 2 * counts[4][0] and v4_stores >= 2 * counts[4][2] > 0
