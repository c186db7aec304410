"""The evaluator without a GPU: every cheat that can be caught statically is, with its kind;
runtime cheats compile and stop with no_gpu; the library compiles through the same path."""

from __future__ import annotations

import pytest

from sparserl.errors import SparseRLError
from sparserl.harness.compile import find_nvcc
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from tests.harness.adversarial import ADVERSARIAL, COMPILED_CODE_CASES, GOOD, RUNTIME_KINDS

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    e = Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path_factory.mktemp("cache"))))
    yield e
    e.close()


@pytest.fixture(scope="module")
def mat(ev):
    return ev.register(generate("random", 500, seed=0, nnz_per_row=8), "random500")



@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_without_gpu(ev, mat, name: str) -> None:
    """What ``sparserl check-kernel --compile-only`` gives each case: static and compile-time cases
    their verdict (refused before compiling, or at compile time from the compiled code), runtime
    cases no_gpu after a clean compile."""
    text, kind = ADVERSARIAL[name]
    res = ev.evaluate(text, mat, "spmv")
    if kind in RUNTIME_KINDS:
        assert res.error_kind is ErrorKind.NO_GPU and res.compiled, (name, res.message)
    else:
        assert res.error_kind.value == kind, (name, res.error_kind, res.message)
        assert res.compiled == (kind not in ("extract_error", "contract_error", "static_check", "compile_error"))
        assert res.message and "\n" not in res.message
    if name in COMPILED_CODE_CASES:
        assert res.message.startswith("compiled code"), res.message


def test_no_file_content_reaches_a_result(ev, mat) -> None:
    """The preprocessor cases never reach the compiler, and nothing of another file reaches the result."""
    for name in ("include_file_named_by_macro", "include_absolute_path", "include_path_escape", "embed_a_file",
                 "digraph_include", "pragma_reaches_a_file"):
        res = ev.evaluate(ADVERSARIAL[name][0], mat, "spmv")
        assert res.error_kind is ErrorKind.STATIC and not res.log_tail, name
        assert "root:" not in res.message


@pytest.mark.parametrize("launch, fragment", [
    ("grid=ceil_div(m, 256), block=2048", "not a valid CUDA block"),
    ("grid=ceil_div(m, 0), block=256", "ceil_div by zero"),
    ("grid=-5, block=256", "negative"),
    ("grid=ceil_div(m, 256), block=256, smem=300000", "smem"),
])
def test_launch_lines_are_evaluated_against_the_matrix_without_a_gpu(ev, mat, launch: str, fragment: str) -> None:
    """The compile-only path plans the launches on the host exactly as a worker does on the GPU."""
    res = ev.evaluate(GOOD.replace("grid=ceil_div(m, 256), block=256", launch), mat, "spmv")
    assert res.error_kind is ErrorKind.CONTRACT and fragment in res.message, res.message


def test_format_refusal_without_a_gpu(ev, mat) -> None:
    v = variants("spmv", "DIA")[0]
    res = ev.evaluate(v.render(), mat, "spmv")
    assert res.error_kind is ErrorKind.FORMAT_REFUSED and "would store" in res.message


def test_memo_key_covers_settings_and_harness_version(tmp_path) -> None:
    from sparserl.harness.result import HARNESS_VERSION
    from sparserl.harness.verify import VerifyConfig

    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path))) as a, \
            Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path), cold_trials=9,
                                    verify=VerifyConfig(revalued_inputs=1))) as b:
        m = a.register(generate("random", 500, seed=0, nnz_per_row=8), "random500")
        ka, kb = a._memo_key(GOOD, m, Op.SPMV, None), b._memo_key(GOOD, m, Op.SPMV, None)
        assert ka != kb and ka[-1] == HARNESS_VERSION
        m2 = a.register(generate("random", 500, seed=1, nnz_per_row=8), "random500")  # same name, new content
        assert a._memo_key(GOOD, m2, Op.SPMV, None) != ka


def test_good_kernel_and_library_compile(ev, mat) -> None:
    res = ev.evaluate(GOOD, mat, "spmv")
    assert res.error_kind is ErrorKind.NO_GPU and res.compiled and res.registers
    many = ev.evaluate_many([(v.render(), mat, "spmv", None) for v in variants("spmv", "CSR")])
    assert all(r.error_kind is ErrorKind.NO_GPU for r in many)


def test_memo_shares_the_first_result(tmp_path, mat) -> None:
    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path), memo=2)) as e:
        m = e.register(generate("random", 500, seed=0, nnz_per_row=8), "random500")
        a = e.evaluate(GOOD, m, "spmv")
        assert e.evaluate(GOOD, m, "spmv") is a and e.memo_hits == 1
        other = e.register(generate("random", 400, seed=1, nnz_per_row=8), "random400")
        assert e.evaluate(GOOD, other, "spmv") is not a  # another matrix is another evaluation
        bad = ADVERSARIAL["noop"][0]
        e.evaluate(bad, m, "spmv")  # a third entry pushes the oldest (GOOD on m) out of a memo of 2
        assert e.evaluate(GOOD, m, "spmv") is not a and e.memo_hits == 1
        # fresh: evaluated again, and not remembered (kills a fresh submission answered from the memo, and
        # one that replaces the remembered result)
        kept = e.evaluate(GOOD, m, "spmv")
        again = e.submit(GOOD, m, "spmv", fresh=True).result()
        assert again is not kept and e.memo_hits == 2
        assert e.evaluate(GOOD, m, "spmv") is kept and e.memo_hits == 3
    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path), memo=0)) as e:
        m = e.register(generate("random", 500, seed=0, nnz_per_row=8), "random500")
        assert e.evaluate(GOOD, m, "spmv") is not e.evaluate(GOOD, m, "spmv") and e.memo_hits == 0
    with pytest.raises(SparseRLError, match="memo"):
        HarnessConfig(memo=-1)


def test_spmm_needs_k(ev, mat) -> None:
    with pytest.raises(SparseRLError, match="k >= 1"):
        ev.evaluate(GOOD, mat, "spmm")


def test_config_validation() -> None:
    with pytest.raises(SparseRLError, match="reward_regime"):
        HarnessConfig(regimes=("warm",), reward_regime="cold")
    with pytest.raises(SparseRLError, match="regimes"):
        HarnessConfig(regimes=("hot",))


@pytest.mark.parametrize("reported, loaded, count, over", [(50, 40, 50, False), (None, 40, 40, False),
                                                           (50, 80, 80, True), (None, None, None, False)])
def test_the_register_count_takes_the_larger_of_the_report_and_the_loaded_cubin(mat, reported, loaded, count,
                                                                                over) -> None:
    """A worker's payload carries the driver's register count of the loaded cubin; the result keeps the larger
    of it and the compiler's report, and a count past ``max_registers`` from either flags the kernel. Kills: the
    loaded count ignored (rows 2-3), or taking the loaded count over a larger report (row 1)."""
    import time
    from types import SimpleNamespace

    host = SimpleNamespace(config=HarnessConfig(max_registers=64))
    payload = {"error_kind": "none"} | ({} if loaded is None else {"loaded_registers": loaded})
    extra = {"format": "CSR", "registers": reported, "spill_bytes": 0, "over_resource_limit": False, "front": {}}
    r = Evaluator._finish(host, payload, extra, mat, Op.SPMV, None, time.perf_counter())
    assert (r.registers, r.over_resource_limit) == (count, over)
