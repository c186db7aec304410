"""The main job's logic with a stand-in sampler (fixed completions), compile-only on CPU and
verified on a GPU, plus load_kernel on the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sparserl.encoding import EncodingConfig  # noqa: E402
from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.generate import GenerateConfig, generate_kernel  # noqa: E402
from sparserl.harness.compile import find_nvcc  # noqa: E402
from sparserl.kernels.library import get_variant, variants  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")

BROKEN = "Here you go:\n```cuda\nFORMAT: CSR\nLAUNCH: grid=ceil_div(m, 128), block=128\nnot cuda at all\n```"


class FixedSampler:
    """Stands in for the policy's sampling only: returns given completions in turn."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.config = type("C", (), {"encoding": EncodingConfig(max_nnz=16)})()

    def generate(self, samples, **kw):
        return [self.texts[i % len(self.texts)] for i in range(len(samples))]


@pytest.fixture(scope="module")
def mtx(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("m") / "banded.mtx"
    save_matrix(generate("banded", 5000, seed=0, bands=5), p)
    return p


def test_compile_only_writes_an_unverified_kernel(mtx: Path, tmp_path: Path) -> None:
    dia = variants("spmv", "DIA")[0].render()
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=3, out=str(tmp_path / "g"), compile_only=True),
                          policy=FixedSampler([BROKEN, "Sure! Here it is.\n" + dia]))
    assert rep["verified"] is False and "NOT verified" in rep["verdict"]
    assert rep["samples"] == {"n": 3, "compiled": 1, "correct": 0}
    out = tmp_path / "g"
    from sparserl.harness.extract import extract
    from sparserl.kernels.contract import Op

    assert (out / "kernel.cu").read_text() == extract(dia, Op.SPMV).text  # the clean completion, chatter gone
    info = json.loads((out / "launch.json").read_text())
    assert info["format"] == "DIA" and info["sizes"] == {"num_diags": 5}
    assert info["kernel_args"][0] == "int m" and info["launches_for_this_matrix"][0]["kernel"] == "spmv_kernel"
    assert "NOT verified" in (out / "report.md").read_text()


def test_nothing_usable_is_a_clear_error(mtx: Path, tmp_path: Path) -> None:
    with pytest.raises(SparseRLError, match="no compiling kernel"):
        generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(tmp_path / "x"), compile_only=True),
                        policy=FixedSampler([BROKEN]))


def test_needs_a_gpu_unless_compile_only(mtx: Path, tmp_path: Path) -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible")
    with pytest.raises(SparseRLError, match="no GPU"):
        generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(tmp_path / "y")),
                        policy=FixedSampler([BROKEN]))


@pytest.mark.gpu
def test_verified_best_kernel_and_load_kernel(mtx: Path, tmp_path: Path) -> None:
    import cupy as cp
    import torch

    import sparserl
    from sparserl.matrices import load_matrix

    csr = get_variant("spmv/csr_scalar/-/block=128").render()
    dia = variants("spmv", "DIA")[0].render()
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=4, out=str(tmp_path / "g")),
                          policy=FixedSampler([BROKEN, csr, dia]))
    assert rep["verified"] and rep["samples"]["correct"] == 2 and rep["source"] == "model"
    assert rep["best"]["format"] == "DIA", "the faster of the two correct kernels is returned"
    kern = sparserl.load_kernel(tmp_path / "g")
    A = load_matrix(mtx)
    kern.plan(A)
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(np.float32)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(cp.asnumpy(kern(cp.asarray(x))), ref, rtol=1e-4, atol=1e-4)
    yt = kern(torch.as_tensor(x, device="cuda"))
    assert isinstance(yt, torch.Tensor) and yt.is_cuda
    np.testing.assert_allclose(yt.cpu().numpy(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(SparseRLError, match="shape"):
        kern(cp.zeros(3, dtype=cp.float32))


@pytest.mark.gpu
def test_library_fallback_when_no_sample_is_correct(mtx: Path, tmp_path: Path) -> None:
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(tmp_path / "f")),
                          policy=FixedSampler([BROKEN]))
    assert rep["source"].startswith("library") and rep["verified"] and rep["best"]["error_kind"] == "none"
