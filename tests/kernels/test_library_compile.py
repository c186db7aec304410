"""Every library variant compiles with nvcc for sm_90 (no GPU needed), in parallel, cached;
and with NVRTC where its library is installed, to the same ptxas resource report.

Uses the user compile cache (``$SPARSERL_CACHE_DIR`` or ``~/.cache/sparserl``) so reruns
are fast; a fresh machine (CI) compiles everything. The cache behaviour itself is
tested in ``tests/harness/test_compile.py`` on a private folder.
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
