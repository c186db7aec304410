"""benchmarks/model_scale.py runs end to end on a CPU at tiny sizes, its PPO step included (the
step crashed with "pg_token_share < 1 needs the rollout's entropies" once that default changed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def test_model_scale_cpu_smoke(tmp_path: Path, monkeypatch) -> None:
    """In this process (a subprocess paid a second torch and transformers start-up): SFT steps, both
    decode engines, the profile and the PPO step. Each engine's token count is what its ids hold:
    at most batch x steps, at least one token a row."""
    from tests.conftest import load_benchmark

    out = tmp_path / "scale.json"
    monkeypatch.setattr(sys, "argv", ["model_scale.py", "--shape", "tiny-test", "--bf16", "--decode", "bucketed,static",
                                      "--gen-tokens", "16", "--gen-batch", "4", "--batch", "2", "--steps", "1",
                                      "--device", "cpu", "--out", str(out), "--profile", str(tmp_path / "prof.txt")])
    assert load_benchmark("model_scale").main() in (0, None)
    res = json.loads(out.read_text())
    assert res["bf16"] and res["ppo_batch"] == 2 and res["ppo_step_s"] > 0
    for engine in ("static", "bucketed"):
        g = res["generation"][engine]
        assert 4 <= g["tokens"] <= 4 * g["steps"] and 1 <= g["steps"] <= 16, g
        assert g["tokens_per_s"] == pytest.approx(g["tokens"] / g["seconds"])
        assert g["memory_bound_tokens_per_s"] > 0
    prof = (tmp_path / "prof.txt").read_text()  # a CPU run: no kernels, the operators' table instead
    assert prof.startswith("# bucketed decode, batch 4, 16 tokens") and "aten::mm" in prof


def test_kernel_kinds_of_a_decode_profile() -> None:
    from tests.conftest import load_benchmark

    kind = load_benchmark("model_scale").kernel_kind
    assert kind("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64, 64>>") == "attention"
    assert kind("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"
    assert kind("nvjet_tst_128x64_64x8_1x1_v_bz_coopB_TNN") == "matmul"
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64") == "matmul"
    assert kind("void at::native::(anonymous namespace)::multinomial_with_replacement") == "sampling"
    assert kind("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>") == "softmax (attention or sampler)"
    assert kind("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>") == "matmul"
    assert kind("Memcpy DtoD (Device -> Device)") == "memcpy/memset"
    assert kind("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>") == "reduction/norm"
    assert kind("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") \
        == "elementwise/other"
