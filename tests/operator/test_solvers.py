"""The CG solver's CPU side: its kernels compile with nvcc for the GPUs we run on, and its argument
checks refuse bad requests in one line before anything runs. Mutations killed: a syntax or type
error in the device source (found here, not on the GPU), a solver that accepts maxiter 0 or a
negative tolerance."""

from __future__ import annotations

import subprocess

import pytest

from sparserl.harness.compile import find_nvcc
from sparserl.operator import solvers


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_the_cg_kernels_compile(tmp_path, arch) -> None:
    src = tmp_path / "cg.cu"
    src.write_text(solvers.CG_SOURCE)
    out = subprocess.run([find_nvcc(), "-std=c++17", f"-arch={arch}", "--ptx", "-o", str(tmp_path / "cg.ptx"),
                          str(src)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "cg.ptx").read_text()
    for name in ("cg_dot", "cg_update", "cg_scalars", "cg_direction"):
        assert f".entry {name}(" in ptx
    assert "atom.global.add.f64" in ptx  # the sums are float64 on the device


class _FakeOp:
    """Only what the checks read before any GPU work: the operator kind and shape."""

    def __init__(self, shape, op="spmv"):
        from sparserl.kernels.contract import Op

        self.op = Op.SPMV if op == "spmv" else Op.SPMM
        self.shape = shape


@pytest.mark.parametrize("kwargs, words", [
    ({"maxiter": 0}, "maxiter"), ({"rtol": -1.0}, "rtol"), ({"atol": -1.0}, "atol"),
    ({"check_every": 0}, "check_every"),
])
def test_bad_arguments_are_one_line(kwargs, words) -> None:
    from sparserl.errors import SparseRLError

    with pytest.raises(SparseRLError, match=words) as exc:
        solvers.solve_cg(_FakeOp((4, 4)), None, **kwargs)
    assert "\n" not in str(exc.value)


def test_cg_needs_a_square_spmv_operator() -> None:
    from sparserl.errors import SparseRLError

    with pytest.raises(SparseRLError, match="square"):
        solvers.solve_cg(_FakeOp((4, 5)), None)
    with pytest.raises(SparseRLError, match="SpMV"):
        solvers.solve_cg(_FakeOp((4, 4), "spmm"), None)
