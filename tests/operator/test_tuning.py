"""tune's choice on a machine without a GPU: the store first (by structure fingerprint, compiled from
the disk cache the second time), a kernel slower than cuSPARSE left to the library, a store miss
searched (compile-only: nothing verified, so the library), and the request checks.

The store rows here are written as a GPU search writes them (times are fixture values: no GPU
measures anything here). Mutations this kills: a lookup that ignores op, k, architecture or the
fingerprint (another structure's kernel used); a store hit that searches anyway; a kernel slower
than cuSPARSE used instead of the library; a compile that misses its cache on the second call; a
search result claimed as verified without a GPU."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import SparseRLError
from sparserl.harness.compile import find_nvcc
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.operator.tuning import LIBRARY, SEARCH, STORE, TuneConfig, check_request, choose_kernel
from sparserl.search.store import BestStore, VerifiedKernel, harness_version, kernel_sha
from tests.conftest import NEEDS_NVCC
from tests.search.doubles import racy_landscape

ARCH = "sm_90"


def record(store_path, A, text: str, *, op="spmv", k=None, arch=ARCH, time_us=5.0, cusparse_us=7.5,
           regime="warm", cid="fixture", version: str | None = None) -> str:
    """Write one verified result as the search's store sink does; returns the fingerprint."""
    card = matrix_card(A)
    with BestStore(store_path) as st:
        st.add_matrix(card, "fixture")
        st.record(VerifiedKernel(card.fingerprint, op, k, arch, "NVIDIA H200", regime, text, time_us, cusparse_us,
                                 cusparse_us / time_us, None, "CSR", None, cid, "seed", None, None, "run-fixture",
                                 version or harness_version()))
    return card.fingerprint


@pytest.fixture()
def banded():
    return generate("banded", 3000, seed=0)


needs_compiler = pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)


@needs_compiler
def test_store_hit_compiles_once_and_searches_nothing(tmp_path, banded) -> None:
    text = variants("spmv", "CSR")[2].render()
    fp = record(tmp_path / "s.db", banded, text, cid="seed/csr")
    cfg = TuneConfig(budget=4, store=tmp_path / "s.db")
    first = choose_kernel(banded, Op.SPMV, None, cfg, ARCH, cache_dir=tmp_path / "cubin")
    assert first.action == STORE and first.searched == 0 and first.fingerprint == fp
    assert first.text == text and first.header.format == "CSR" and first.kernel == "seed/csr"
    assert first.speedup == pytest.approx(1.5)
    t = time.perf_counter()
    again = choose_kernel(banded.copy(), Op.SPMV, None, cfg, ARCH, cache_dir=tmp_path / "cubin")
    took = time.perf_counter() - t
    assert again.action == STORE and again.cubin_path == first.cubin_path
    assert took < 1.0, f"a second lookup of a known structure took {took:.2f} s (target: under 1 s)"
    # the same structure with other values is the same key; one more nonzero is not
    revalued = sp.csr_array((banded.data * 3, banded.indices, banded.indptr), shape=banded.shape)
    assert choose_kernel(revalued, Op.SPMV, None, cfg, ARCH, cache_dir=tmp_path / "cubin").action == STORE


@needs_compiler
def test_store_rows_of_another_key_are_not_used(tmp_path, banded) -> None:
    """Rows for another op, k or architecture are no hit: the search runs (compile-only here)."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    record(tmp_path / "s.db", banded, variants("spmv", "CSR")[2].render(), arch="sm_80")
    record(tmp_path / "s.db", banded, variants("spmm", "CSR", 8)[0].render(), op="spmm", k=8)
    ev = Evaluator(HarnessConfig(compile_only=True, regimes=("warm",), reward_regime="warm",
                                 cache_dir=str(tmp_path / "cache")))
    try:
        cfg = TuneConfig(budget=2, store=tmp_path / "s.db", evaluator=ev)
        choice = choose_kernel(banded, Op.SPMV, None, cfg, ARCH, cache_dir=tmp_path / "cubin")
    finally:
        ev.close()
    assert choice.action == LIBRARY and choice.searched == 2 and choice.text is None
    assert "without a GPU" in choice.why
    report = choice.report(Op.SPMV, None, 1.0)
    assert report.line.startswith(f"tune {choice.fingerprint[:12]}: searched 2 candidates;")
    assert "library" in report.line
    with BestStore(tmp_path / "s.db") as st:  # nothing compile-only enters the store
        assert len(st.results(fingerprint=choice.fingerprint, op="spmv", arch=ARCH)) == 0


def test_a_stored_kernel_slower_than_cusparse_leaves_it_to_the_library(tmp_path, banded) -> None:
    record(tmp_path / "s.db", banded, variants("spmv", "CSR")[0].render(), time_us=9.0, cusparse_us=7.5)
    cfg = TuneConfig(store=tmp_path / "s.db")
    choice = choose_kernel(banded, Op.SPMV, None, cfg, ARCH, cache_dir=tmp_path / "cubin")
    assert choice.action == LIBRARY and choice.searched == 0 and choice.text is None
    assert "0.83x" in choice.why
    line = choice.report(Op.SPMV, None, 0.1).line
    assert "found in the store" in line and "library (cuSPARSE)" in line and "\n" not in line
    # a user who wants the kernel anyway lowers the bar
    if find_nvcc() is not None:
        kept = choose_kernel(banded, Op.SPMV, None, TuneConfig(store=tmp_path / "s.db", min_speedup=0.5), ARCH,
                             cache_dir=tmp_path / "cubin")
        assert kept.action == STORE


def test_the_best_row_prefers_this_regime_then_the_fastest(tmp_path, banded) -> None:
    from sparserl.operator.tuning import best_known

    vs = variants("spmv", "CSR")
    record(tmp_path / "s.db", banded, vs[0].render(), time_us=4.0, regime="cold", cid="cold-fast")
    record(tmp_path / "s.db", banded, vs[1].render(), time_us=6.0, regime="warm", cid="warm-slow")
    record(tmp_path / "s.db", banded, vs[2].render(), time_us=5.0, regime="warm", cid="warm-fast")
    fp = matrix_card(banded).fingerprint
    with BestStore(tmp_path / "s.db") as st:
        assert best_known(st, fp, Op.SPMV, None, ARCH, "warm").candidate_id == "warm-fast"
        assert best_known(st, fp, Op.SPMV, None, ARCH, "cold").candidate_id == "cold-fast"
        assert best_known(st, fp[:-1] + ("0" if fp[-1] != "0" else "1"), Op.SPMV, None, ARCH, "warm") is None


def test_a_row_of_another_harness_version_is_not_taken_as_verified(tmp_path, banded) -> None:
    """A faster row verified by another harness version (one that checked less) is never the operator's kernel;
    the search seeds from it and verifies it again. Kills: rows of every version taken, this one preferred."""
    from sparserl.operator.tuning import best_known

    vs = variants("spmv", "CSR")
    record(tmp_path / "s.db", banded, vs[0].render(), time_us=2.0, regime="cold", cid="older", version="1")
    fp = matrix_card(banded).fingerprint
    with BestStore(tmp_path / "s.db") as st:
        assert best_known(st, fp, Op.SPMV, None, ARCH, "cold") is None
    record(tmp_path / "s.db", banded, vs[1].render(), time_us=6.0, regime="warm", cid="this")
    with BestStore(tmp_path / "s.db") as st:
        assert best_known(st, fp, Op.SPMV, None, ARCH, "cold").candidate_id == "this"


@pytest.mark.parametrize("op,k,msg", [("spmx", None, "op must be"), ("spmm", None, "needs k"),
                                      ("spmm", 0, "needs k"), ("spmv", 4, "leave k out")])
def test_bad_requests_are_one_line_errors(op, k, msg) -> None:
    with pytest.raises(SparseRLError, match=msg) as e:
        check_request(op, k)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,msg", [({"budget": 0}, "budget"), ({"regime": "hot"}, "regime"),
                                    ({"seconds": 0}, "seconds"), ({"retime": -1}, "retime")])
def test_bad_configs_are_one_line_errors(kw, msg) -> None:
    with pytest.raises(SparseRLError, match=msg):
        TuneConfig(**kw)


def test_tune_without_a_gpu_is_one_line() -> None:
    """On a machine without CuPy or a GPU, tune says so in one line before doing any work."""
    import sparserl

    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: the no-GPU path is not reachable")
    except ImportError:
        pass
    with pytest.raises(SparseRLError) as e:
        sparserl.tune(generate("banded", 100, seed=0))
    assert "GPU" in str(e.value) and "\n" not in str(e.value)


def test_search_outcome_line_names_what_won() -> None:
    from sparserl.operator.tuning import KernelChoice

    c = KernelChoice(SEARCH, "ab" * 16, searched=16, kernel="spmv/dia/x", speedup=1.4, time_us=5.0,
                     cusparse_us=7.0, why="the winner spmv/dia/x is 1.40x cuSPARSE, kept in the store")
    r = c.report(Op.SPMV, None, 12.3)
    assert r.line == ("tune abababababab: searched 16 candidates; the winner spmv/dia/x is 1.40x cuSPARSE, "
                      "kept in the store (12.30 s)")
    assert r.action == SEARCH and r.searched == 16 and r.seconds == 12.3


def test_values_are_excluded_from_the_key() -> None:
    A = generate("powerlaw", 500, seed=1)
    B = sp.csr_array((np.ones_like(A.data), A.indices, A.indptr), shape=A.shape)
    assert matrix_card(A).fingerprint == matrix_card(B).fingerprint


def test_a_kernel_found_wrong_is_never_tune_s_kernel(tmp_path, banded) -> None:
    """A kernel found wrong in one regime is not handed back from another regime's row: the retraction takes its
    rows in every regime (killed by: retract cleaning only its own key), and the lookup leaves out a kernel found
    wrong whose best row is still there (written by hand here: nothing is taken from the store then, and the
    search runs; killed by: the store's ``best`` not leaving found-wrong kernels out)."""
    from sparserl.operator.tuning import best_known

    vs = variants("spmv", "CSR")
    record(tmp_path / "s.db", banded, vs[0].render(), time_us=4.0, regime="cold", cid="racy")
    record(tmp_path / "s.db", banded, vs[0].render(), time_us=4.0, regime="warm", cid="racy")
    record(tmp_path / "s.db", banded, vs[1].render(), time_us=6.0, regime="cold", cid="slow")
    record(tmp_path / "s.db", banded, vs[2].render(), time_us=5.0, regime="cold", cid="left")
    fp = matrix_card(banded).fingerprint
    with BestStore(tmp_path / "s.db") as st:
        assert best_known(st, fp, Op.SPMV, None, ARCH, "warm").candidate_id == "racy"
        assert st.retract(fp, "spmv", None, ARCH, "cold", harness_version(), vs[0].render()) == 2
        row = best_known(st, fp, Op.SPMV, None, ARCH, "warm")
        assert (row.candidate_id, row.regime) == ("left", "cold")  # no warm row is left: the cold one
        with st.transaction():  # found wrong by hand, its rows left
            st.db.execute("INSERT INTO found_wrong (fingerprint, op, k, kernel_sha, arch, regime, harness_version, "
                          "reason, found_at) VALUES (?, 'spmv', 0, ?, ?, 'cold', ?, 'by hand', 'then')",
                          (fp, kernel_sha(vs[2].render()), ARCH, harness_version()))
        assert best_known(st, fp, Op.SPMV, None, ARCH, "warm") is None


def _tuning_double(time_of):
    """The search's GPU-path double (tests/search/doubles.py) with what tune asks of an evaluator: the regimes
    it times and ranks by."""
    from types import SimpleNamespace

    from tests.search.doubles import FakeTimingDouble

    ev = FakeTimingDouble(time_of)
    ev.config = SimpleNamespace(regimes=("cold",), reward_regime="cold")
    return ev


@needs_compiler
def test_tune_s_search_winner_is_chosen_by_a_second_look(tmp_path, banded) -> None:
    """A kernel that was fastest once and fails when evaluated again is not tune's kernel: the second look drops
    it, it leaves the store as found wrong, and the next fastest is handed back with the look's median on the line.
    Killed by: tune taking the search's first timings (``retime`` not passed on, or no look), the retraction not
    made, the first timing quoted instead of the look's median. With ``retime=0`` the first timings decide, and the racy kernel wins (the control)."""
    from sparserl.search.space import normalised

    time_of, order = racy_landscape(faster_again=1.0)
    cfg = TuneConfig(budget=5, store=tmp_path / "s.db", regime="cold", evaluator=_tuning_double(time_of))
    choice = choose_kernel(banded, Op.SPMV, None, cfg, ARCH)
    racy = next(t for t, r in order.items() if r == 0)
    assert choice.action == SEARCH and normalised(choice.text) != racy
    assert choice.time_us == 20.0 and choice.speedup == pytest.approx(100.0 / 20.0)  # the look's, not the first
    assert "second look: median 20.00 us over 3 fresh evaluations" in choice.why
    with BestStore(tmp_path / "s.db") as st:
        assert [normalised(t) for t in st.found_wrong_texts(matrix_card(banded).fingerprint, "spmv", None)] == [racy]

    time_of, order = racy_landscape(faster_again=1.0)
    cfg0 = TuneConfig(budget=5, store=tmp_path / "t.db", regime="cold", evaluator=_tuning_double(time_of), retime=0)
    choice0 = choose_kernel(banded, Op.SPMV, None, cfg0, ARCH)
    assert normalised(choice0.text) == next(t for t, r in order.items() if r == 0) and choice0.time_us == 5.0
    assert "second look" not in choice0.why


def test_tune_refuses_an_evaluator_that_ranks_by_another_regime(tmp_path, banded) -> None:
    """An evaluator timing both regimes but ranking (its reward regime) by cold, asked to tune in warm: a one-line
    error before any search, since the candidate pool and the second look rank by the reward regime (killed by:
    the check removed, which handed back the fastest cold kernel as warm's, 60 us warm against 16)."""
    ev = _tuning_double(lambda text: 5.0)
    ev.config.regimes = ("cold", "warm")
    cfg = TuneConfig(budget=4, store=tmp_path / "s.db", regime="warm", evaluator=ev)
    with pytest.raises(SparseRLError) as e:
        choose_kernel(banded, Op.SPMV, None, cfg, ARCH)
    assert "reward_regime" in str(e.value) and "regime='cold'" in str(e.value) and "\n" not in str(e.value)
    assert ev.submitted == []


@needs_compiler
def test_when_the_second_look_drops_every_kernel_the_library_runs_it(tmp_path, banded) -> None:
    """Every kernel correct once and wrong when evaluated again: tune hands the operator to the library and says
    why, instead of raising or using a kernel the look dropped (killed by: SecondLookFailed not caught, or the
    first winner used)."""
    seen: dict[str, int] = {}

    def time_of(text: str):
        seen[text] = seen.get(text, 0) + 1
        return 5.0 if seen[text] == 1 else None

    cfg = TuneConfig(budget=4, store=tmp_path / "s.db", regime="cold", evaluator=_tuning_double(time_of))
    choice = choose_kernel(banded, Op.SPMV, None, cfg, ARCH)
    assert choice.action == LIBRARY and choice.text is None
    assert choice.why.startswith("the second look dropped every kernel it evaluated again (every verified kernel")
    assert choice.why.endswith("so the library (cuSPARSE) runs it")
