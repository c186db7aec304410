"""benchmarks/compile_survey.py on the CPU: each distinct kernel text of the templates' points compiled once
with NVRTC, and its figures read off what ptxas reported. Mutations killed: texts compiled again for every
card that renders them (a generic template's one text counted per matrix), a spilling or failed kernel left
out of the summary, a stack frame counted as a spill (a local array is not one), a time-out counted as a
template's compile error, and a compile error that leaves the exit status at 0."""

from __future__ import annotations

import json

import pytest

from sparserl.harness.compile import CompileOptions, available_backend
from tests.conftest import load_benchmark

NEEDS_NVRTC = pytest.mark.skipif(available_backend(CompileOptions(backend="nvrtc")) is None,
                                 reason="needs NVRTC (libnvrtc)")


@NEEDS_NVRTC
def test_each_distinct_text_is_compiled_once_and_reported(tmp_path, capsys) -> None:
    bench = load_benchmark("compile_survey")
    out = tmp_path / "s.json"
    rc = bench.main(["--rows", "3000", "--families", "banded,stencil2d", "--templates", "csr_vector,dia_window_spec",
                     "--random", "2", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    kernels, per = result["kernels"], result["summary"]["per_template"]
    assert set(per) == {"csr_vector", "dia_window_spec"}
    assert all(k["ok"] and k["seconds"] > 0 and k["registers"] > 0 for k in kernels)
    # the figures are ptxas's for the kernel: the most registers among the source's kernels (csr_vector's body and
    # its y-zeroing kernel, where it has one), and no spill on these small cards
    assert all(k["spill_bytes"] == 0 and k["stack_bytes"] == 0 for k in kernels)
    # csr_vector is generic: its seed points render one text per point whatever the card, so both cards meet
    # the same texts and each is compiled once
    generic = [k for k in kernels if k["template"] == "csr_vector"]
    assert generic and all(k["matrix"] == "banded_3000" for k in generic) and max(k["met"] for k in generic) >= 2
    # dia_window_spec bakes each card's offsets: each card has texts of its own
    assert {k["matrix"] for k in kernels if k["template"] == "dia_window_spec"} == {"banded_3000", "stencil2d_3000"}
    assert per["csr_vector"]["kernels"] == len(generic) and result["summary"]["errors"] == 0
    assert "| dia_window_spec |" in capsys.readouterr().out


def test_the_summary_counts_failures_spills_and_slow_builds() -> None:
    bench = load_benchmark("compile_survey")
    rows = [{"template": "a", "matrix": "m", "point": {}, "ok": True, "seconds": 0.5, "registers": 40, "spill_bytes": 0,
             "stack_bytes": 64},  # a local array: a stack frame and no spill
            {"template": "a", "matrix": "m", "point": {}, "ok": True, "seconds": 9.0, "registers": 255,
             "spill_bytes": 208, "stack_bytes": 208},
            {"template": "b", "matrix": "m", "point": {}, "ok": False, "seconds": 0.1, "registers": None,
             "spill_bytes": None, "error": "x", "error_kind": "compile_error"},
            {"template": "b", "matrix": "m", "point": {}, "ok": False, "seconds": 60.0, "registers": None,
             "spill_bytes": None, "error": "timed out", "error_kind": "timeout"}]
    s = bench.summarize(rows, worst=1)
    assert (s["kernels"], s["errors"], s["timeouts"], s["slow"], s["spilling"]) == (4, 1, 1, 1, 1)
    assert s["per_template"]["a"] == {"kernels": 2, "errors": 0, "median_s": 4.75, "max_s": 9.0, "slow": 1,
                                      "timeouts": 0, "spilling": 1, "max_registers": 255}
    assert s["per_template"]["b"]["errors"] == 1 and s["per_template"]["b"]["timeouts"] == 1
    assert s["slowest"][0]["seconds"] == 9.0


@NEEDS_NVRTC
def test_a_point_that_does_not_build_fails_the_run(tmp_path, monkeypatch) -> None:
    bench = load_benchmark("compile_survey")
    from sparserl.kernels.templates import get_template

    t = get_template("spmv", "csr_vector")
    monkeypatch.setattr(type(t), "render", lambda self, p, card=None: "FORMAT: CSR\nLAUNCH: grid=1, block=32\n"
                        "__global__ void spmv_kernel() { undefined_name = 1; }\n")
    out = tmp_path / "s.json"
    assert bench.main(["--rows", "2000", "--families", "banded", "--templates", "csr_vector", "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["summary"]["errors"] == 1 and "undefined_name" in result["kernels"][0]["error"]


def test_bad_input_is_one_line(tmp_path, capsys) -> None:
    bench = load_benchmark("compile_survey")
    assert bench.main(["--suitesparse", str(tmp_path / "none"), "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --suitesparse") and err.count("\n") == 1
    with pytest.raises(SystemExit, match="no SpMV template"):
        bench.main(["--rows", "100", "--families", "banded", "--templates", "nope", "--out", str(tmp_path / "s.json")])


@NEEDS_NVRTC
def test_a_kernel_that_spills_is_counted_from_its_spill_stores(tmp_path) -> None:
    """csr_merge at block=512 spills a little (ptxas: 16 bytes stored, a 16-byte frame): the survey records the
    spill stores and the frame apart. Kills recording the frame plus the spill (a double count), the spill
    loads (12 bytes here), or nothing."""
    bench = load_benchmark("compile_survey")
    from sparserl.harness.compile import CompileOptions, compile_many
    from sparserl.kernels.contract import Op, split_completion
    from sparserl.kernels.templates import get_template
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    t, card = get_template(Op.SPMV, "csr_merge"), matrix_card(generate("diagonal", 20_000, seed=1))
    code = split_completion(t.render({"block": 512, "ipt": 11}, card), Op.SPMV)[1]
    found = [{"template": "csr_merge", "matrix": "diagonal", "point": {}, "code": code, "met": 1}]
    bench.compile_all(found, jobs=1)
    (direct,) = compile_many([code], CompileOptions(backend="nvrtc"), cache_dir=tmp_path, jobs=1)
    res = direct.resources_of("spmv_kernel")
    if res.spill_store_bytes == 0:
        pytest.skip("this NVRTC does not spill csr_merge at block=512")
    assert found[0]["spill_bytes"] == res.spill_store_bytes and found[0]["stack_bytes"] == res.stack_bytes
    assert bench.summarize(found, worst=1)["spilling"] == 1
