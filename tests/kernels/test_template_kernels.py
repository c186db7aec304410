"""The new templates (irregular-matrix strategies and specialised forms): every seed, rendered for
matrices of every family and for edge cases, passes the contract's static check and compiles
(NVRTC, disk-cached) with no spills; specialised forms apply where the card allows and refuse
with a reason elsewhere; renders are deterministic and carry no values of the matrix."""

from __future__ import annotations

import numpy as np
import pytest

from sparserl.harness.compile import CompileOptions, available_backend, compile_many
from sparserl.harness.matrix_facts import materialise
from sparserl.harness.static_check import static_check
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card

NEW = ("csr_adaptive", "csr_adaptive_spec", "csr_lanes", "csr_lanes_spec", "csr_split_spec", "dia_window",
       "dia_window_spec", "bsr_stream", "bsr_stream_spec", "hyb_vec")
OPTIONS = CompileOptions(arch="sm_90", backend="auto")

pytestmark = pytest.mark.skipif(available_backend(OPTIONS) is None, reason="no CUDA compiler (NVRTC or nvcc)")


def _matrices() -> dict:
    return {
        "banded_m_odd": generate("banded", 4003, seed=1, bands=9),
        "stencil2d": generate("stencil2d", 4900, seed=1),
        "stencil3d_27": generate("stencil3d_27", 1000, seed=1),
        "block8": generate("block", 4000, seed=1, block=8, blocks_per_row=4),
        "block4_cut": generate("block", 4002, cols=3001, seed=1, block=4, blocks_per_row=3),
        "powerlaw": generate("powerlaw", 6000, seed=1),
        "skewed": generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002),
        "random": generate("random", 3001, seed=1, nnz_per_row=16),
        "rectangular": generate("rectangular", 1000, seed=1, nnz_per_row=6),
        "empty_rows": generate("empty_rows", 3000, seed=1),
        "dense_lines": generate("dense_lines", 3000, seed=1),
        "rmat": generate("rmat", 4096, seed=1),
        "one_row": generate("random", 1, cols=50, seed=1, nnz_per_row=7),
    }


@pytest.fixture(scope="module")
def rendered():
    out = []
    for name, A in _matrices().items():
        card = matrix_card(A)
        for tname in NEW:
            t = get_template(Op.SPMV, tname)
            for p in t.seeds(card):
                out.append((name, A, t, p, t.render(p, card)))
    return out


@pytest.fixture(scope="module")
def compiled(rendered):
    codes = [split_completion(materialise(text, Op.SPMV, lambda: matrix_card(A)), Op.SPMV)[1]
             for _, A, _, _, text in rendered]
    return compile_many(codes, OPTIONS)


def test_every_template_has_seeds_on_the_matrices_it_suits(rendered) -> None:
    have = {(name, t.name) for name, _, t, _, _ in rendered}
    for tname in NEW:
        assert any(t == tname for _, t in have), tname
    assert ("stencil2d", "dia_window_spec") in have and ("random", "dia_window_spec") not in have
    assert ("block8", "bsr_stream_spec") in have and ("powerlaw", "bsr_stream_spec") not in have
    assert ("random", "csr_lanes_spec") in have and ("rectangular", "csr_lanes_spec") in have
    assert ("powerlaw", "csr_lanes_spec") not in have and ("empty_rows", "csr_lanes_spec") not in have
    for name in ("powerlaw", "skewed", "dense_lines", "rmat", "one_row"):
        assert (name, "csr_adaptive_spec") in have


def test_every_render_passes_the_static_check(rendered) -> None:
    for name, _, t, p, text in rendered:
        header, code = split_completion(text, Op.SPMV)
        assert header.format == t.format
        assert static_check(code, header, Op.SPMV) is None, (name, t.candidate(p).id)


def test_every_render_compiles_without_spills(rendered, compiled) -> None:
    failed = [(name, t.candidate(p).id, r.log[-600:]) for (name, _, t, p, _), r in zip(rendered, compiled) if not r.ok]
    assert not failed, failed[:3]
    refused = [(name, t.candidate(p).id, r.ptx_violation) for (name, _, t, p, _), r in zip(rendered, compiled)
               if r.ptx_violation is not None]
    assert not refused, refused[:3]  # constant tables of the facts blocks are read, never written
    for (name, _, t, p, text), r in zip(rendered, compiled):
        header, _ = split_completion(text, Op.SPMV)
        for kernel in header.kernel_names(Op.SPMV):
            res = r.resources_of(kernel)
            assert res is not None and 0 < res.registers <= 255, (name, t.candidate(p).id, kernel)
            assert not (res.spill_store_bytes or res.spill_load_bytes or res.stack_bytes), (name, t.candidate(p).id)


def test_renders_are_deterministic_and_specialised_ones_differ_from_generic(rendered) -> None:
    mats = _matrices()
    specialised = 0
    for name, A, t, p, text in rendered:
        card = matrix_card(mats[name])
        assert t.render(p, card) == text
        if t.specialised and t.generic is not None:  # csr_split_spec has no generic form
            g = get_template(Op.SPMV, t.generic)
            assert g.format == t.format and not g.specialised
            if set(p) == {q.name for q in g.space} and g.check(p, card) is None:
                assert g.render(p, card) != text
                specialised += 1
    assert specialised > 10


def test_renders_carry_no_values(rendered) -> None:
    for name, A, t, p, text in rendered:
        vals = np.unique(np.abs(A.data))[:50]
        for v in vals:
            assert f"{float(v):.6f}" not in text and repr(float(v)) not in text, (name, t.candidate(p).id)


def test_specialised_checks_say_why_they_do_not_apply() -> None:
    powerlaw = matrix_card(generate("powerlaw", 3000, seed=1))
    assert "differ in length" in get_template("spmv", "csr_lanes_spec").check({"tpr": 4, "block": 256}, powerlaw)
    assert "no diagonal offsets" in get_template("spmv", "dia_window_spec").check({"block": 256, "v": 1}, powerlaw)
    assert "block" in get_template("spmv", "bsr_stream_spec").check({"R": 8, "C": 8, "g": 16, "block": 256}, powerlaw)
    long_random = matrix_card(generate("random", 200, seed=1, nnz_per_row=200))
    assert "more lanes" in get_template("spmv", "csr_lanes_spec").check({"tpr": 1, "block": 256}, long_random)
    gen = get_template("spmv", "csr_adaptive")
    assert "at most long_len" in gen.check({"rpw": 32, "items": 8, "long_len": 1024, "seg": 4096, "block": 256})


def test_specialised_dia_and_bsr_name_their_facts_and_read_the_shape() -> None:
    """dia_window_spec names the offsets and bsr_stream_spec the blocks per block row (the harness defines
    them: sparserl.harness.matrix_facts), and both read m and n at run time: every matrix renders the same text
    (nothing for a policy to copy digit by digit), and the source the harness judges differs with the
    structure only. Kills a facts block spelt again, one that names the rows or columns
    (``constexpr int M = ...``), and a materialised source that drops the offsets or K."""
    judged = lambda t, p, card: materialise(t.render(p, card), Op.SPMV, card)  # noqa: E731
    dia = get_template("spmv", "dia_window_spec")
    p = {"block": 256, "v": 2}
    a, b = (matrix_card(generate("banded", rows, seed=1, bands=9)) for rows in (4003, 1_000_001))
    assert a.dia_offsets == b.dia_offsets and a.rows != b.rows
    assert judged(dia, p, a) == judged(dia, p, b)
    five = matrix_card(generate("banded", 4003, seed=1, bands=5))
    assert five.dia_offsets != a.dia_offsets and judged(dia, p, five) != judged(dia, p, a)
    assert dia.render(p, five) == dia.render(p, a)
    assert "4003" not in judged(dia, p, a)
    bsr = get_template("spmv", "bsr_stream_spec")
    q = {"R": 4, "C": 4, "g": 8, "block": 256}
    cut, even = (matrix_card(generate("block", 4000, cols=cols, seed=1, block=4, blocks_per_row=3))
                 for cols in (3001, 3000))
    assert cut.block_row_len == even.block_row_len == 3 and cut.cols != even.cols
    assert judged(bsr, q, cut) == judged(bsr, q, even)
    four = matrix_card(generate("block", 4000, cols=3000, seed=1, block=4, blocks_per_row=4))
    assert judged(bsr, q, four) != judged(bsr, q, even) and bsr.render(q, four) == bsr.render(q, even)


def test_dia_window_spec_facts_are_the_cards_offsets_as_listed() -> None:
    """The one fact of dia_window_spec, defined by the harness, is the offsets item by item as the prompt's
    card lists them (a run ``a..b`` as ``a, b``, a single offset twice), and the text declares nothing above
    its body. Kills a definition that names the diagonals' count or clusters, or expands the runs, and a
    render that spells the facts again."""
    from sparserl.eval.library_match import template_body

    dia = get_template("spmv", "dia_window_spec")
    for family in ("stencil2d", "stencil3d_27", "banded"):
        card = matrix_card(generate(family, 30_001, seed=1))
        listed = card.prompt().split("diagonal offsets: ")[1].split("\n")[0].split()
        pairs = [item.split("..") if ".." in item else [item, item] for item in listed]
        text = dia.render({"block": 256, "v": 2}, card)
        for source, want in ((text, []), (materialise(text, Op.SPMV, card), [
                "__device__ constexpr int MATRIX_DIA_RUNS[] = {" + ", ".join(a for p in pairs for a in p) + "};"])):
            block = source.split("#define")[0].split("LAUNCH:")[1].split("\n", 1)[1]  # above the body
            code = [line for line in block.splitlines() if line.strip() and not line.startswith("//")]
            assert code == want, code
        assert template_body(text, Op.SPMV) == "dia_window_spec"  # still known as the template's body, facts aside


def test_dia_window_spec_compiler_lays_out_the_offsets_and_clusters_as_the_python_rule() -> None:
    """What the compiler works out from the facts (the offsets one by one, their count, the clusters that
    share a window of x) equals :func:`sparserl.kernels.templates.dia.clusters`, the rule the template
    was measured with: static_asserts appended to the rendered kernel, compiled. Offsets with runs,
    gaps of exactly CLUSTER_GAP and one more, and windows at the MAX_WINDOW limit. Kills the gap test
    off by one, the window limit off by one, and a run expanded without its last offset."""
    import scipy.sparse as sp

    from sparserl.kernels.templates.dia import CLUSTER_GAP, clusters

    m = 4001
    cases = [(-9, -8, -3, 0, 1, 7, 8, 40), (-1, 0, 1), (0,), (-2000, -1, 0, 1, 2, 3000),
             tuple(range(-16, 17)), (0, CLUSTER_GAP, 2 * CLUSTER_GAP + 1, 2 * CLUSTER_GAP + 2),
             (-101, -100, -99, -1, 0, 1, 99, 100, 101), (-30, -28, -21, -13, -6, 0, 3, 11, 17, 26, 28, 31)]
    dia = get_template("spmv", "dia_window_spec")
    sources = []
    for offsets in cases:
        card = matrix_card(sp.diags([np.ones(m - abs(o)) for o in offsets], offsets, shape=(m, m), format="csr"))
        assert card.dia_offsets == offsets
        groups = clusters(offsets)
        ends = np.cumsum([len(g) for g in groups]).tolist()
        checks = [f"DIAGS == {len(offsets)}", f"CLUSTERS == {len(groups)}"]
        checks += [f"OFFSETS.v[{d}] == {o}" for d, o in enumerate(offsets)]
        checks += [f"CLUSTER_END.v[{c}] == {e}" for c, e in enumerate(ends)]
        code = split_completion(materialise(dia.render({"block": 256, "v": 1}, card), Op.SPMV, card), Op.SPMV)[1]
        sources.append(code + "\n" + "".join(f'static_assert({c}, "{c}");\n' for c in checks))
    backends = [b for b in ("nvrtc", "nvcc") if available_backend(CompileOptions(arch="sm_90", backend=b)) == b]
    for backend in backends:  # each compiler on its own (auto would fall back to nvcc when NVRTC refuses)
        for offsets, r in zip(cases, compile_many(sources, CompileOptions(arch="sm_90", backend=backend))):
            assert r.ok, (backend, offsets, r.log[-800:])


@pytest.mark.slow(seconds=8)
def test_dia_window_spec_on_the_widest_card_compiles_without_spills() -> None:
    """64 diagonals 37 apart (the most a card lists; each its own cluster of x): the seeds compile
    with no spills. Kills an inner loop over every diagonal that skips those outside the cluster
    (64 x 64 iterations to unroll: 255 registers, spills and a stack, and 23 s of NVRTC at v=2
    against 2.3 s on a 2-core machine)."""
    import scipy.sparse as sp

    m, offsets = 20003, [i * 37 - 1000 for i in range(64)]
    card = matrix_card(sp.diags([np.ones(m - abs(o)) for o in offsets], offsets, shape=(m, m), format="csr"))
    assert card.dia_offsets is not None and len(card.dia_offsets) == 64
    t = get_template("spmv", "dia_window_spec")
    points = t.seeds(card)
    results = compile_many([split_completion(materialise(t.render(p, card), Op.SPMV, card), Op.SPMV)[1]
                            for p in points], OPTIONS)
    for p, r in zip(points, results):
        assert r.ok, r.log[-600:]
        res = r.resources_of("spmv_kernel")
        assert not (res.spill_store_bytes or res.stack_bytes) and res.registers < 128, (p, res)


def test_bsr_stream_refuses_to_compile_a_group_its_blocks_do_not_divide() -> None:
    """Numbers out of step (``G=8`` for 8x8 blocks: 4*G is no multiple of R*C, so a lane's values would drift
    across the blocks' positions) are a compile error that says why, in both BSR stream templates, where such a
    kernel once compiled and wrote wrong sums (5 samples of the full preset on ``block``). Kills the assertion left
    out or weakened (``G=8`` compiles), and one that also refuses a valid group (``G=16``)."""
    card = matrix_card(generate("block", 4000, seed=1, block=8, blocks_per_row=4))
    texts = []
    for name in ("bsr_stream", "bsr_stream_spec"):
        text = materialise(get_template("spmv", name).render({"R": 8, "C": 8, "g": 16, "block": 256}, card),
                           Op.SPMV, card)
        assert "PARAMS: G=16, BLOCK=256" in text
        texts += [split_completion(t, Op.SPMV)[1] for t in (text, text.replace("G=16", "G=8"))]
    results = compile_many(texts, OPTIONS)
    assert [r.ok for r in results] == [True, False, True, False], [r.log[-300:] for r in results]
    assert all("4*G must be a multiple of R*C" in r.log for r in results[1::2])


def test_csr_lanes_spec_compiles_for_rows_shorter_than_four() -> None:
    """Rows of 1, 2 or 3 entries (a diagonal matrix, say) take the single-entry path; the 16-byte path
    the compiler still sees must not declare arrays of size zero. Kills ``KC = (L / 4 + TPR - 1) / TPR``
    unguarded (every seed a compile error there), and a card of empty rows passed to it."""
    import dataclasses

    t = get_template("spmv", "csr_lanes_spec")
    texts = []
    for L in (1, 2, 3, 5):
        card = matrix_card(generate("random", 3001, seed=1, nnz_per_row=L))
        assert card.row_len_min == card.row_len_max == L
        points = [p for p in t.seeds(card) if t.check(p, card) is None]
        assert points, L
        texts += [split_completion(materialise(t.render(p, card), Op.SPMV, card), Op.SPMV)[1] for p in points]
    failed = [r.log[-300:] for r in compile_many(texts, OPTIONS) if not r.ok]
    assert not failed, failed[:1]
    empty = dataclasses.replace(card, row_len_min=0, row_len_max=0, row_len_mean=0.0)
    assert "empty" in t.check({"tpr": 4, "block": 256}, empty)


def test_specialised_csr_adaptive_bakes_the_long_rows_it_knows() -> None:
    A = generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002)  # 12 rows of 2000
    card = matrix_card(A)
    t = get_template("spmv", "csr_adaptive_spec")
    text = t.render({"rpw": 32, "items": 8, "long_len": 1024, "seg": 1024, "block": 256}, card)
    long_rows = sorted(int(r) for r in np.flatnonzero(np.diff(A.indptr) > 1024))
    assert f"__constant__ int c_long_row[{len(long_rows)}]" in text
    assert ", ".join(str(r) for r in long_rows[:4]) in text
    assert f"LAUNCH: grid={2 * len(long_rows)}, block=256, kernel=spmv_long" in text
    assert "a lane per row" in text  # every other row has at most 7 entries
    none = t.render({"rpw": 32, "items": 8, "long_len": 4096, "seg": 1024, "block": 256}, card)
    assert "kernel=spmv_long" not in none and none.count("LAUNCH:") == 1  # the long-row kernel is not launched
    assert "constexpr int LONG_ROWS = 0;" in none and "constexpr int LONG_ROWS = 12;" in text


def test_csr_split_names_every_long_row_and_launches_a_block_for_each() -> None:
    """12 rows of 2000 on a skewed matrix: the template names its long rows (one text), and the harness writes
    exactly those rows for long_len 1024 (sorted) and launches 12 blocks before the other rows' blocks; the checks
    refuse a matrix with no row past long_len, rows too long for one block, and a card that does not list every
    long row. Kills a table built with >= (or from the listed rows of another threshold), a grid without the long
    rows' blocks, a number of the matrix left in the template's text, and a point accepted where its table is
    incomplete."""
    A = generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002)
    card = matrix_card(A)
    t = get_template("spmv", "csr_split_spec")
    p = {"tpr": 4, "unroll": 4, "long_len": 1024, "block": 256}
    assert t.check(p, card) is None
    text = t.render(p, card)
    other = matrix_card(generate("skewed", 7000, seed=2, long_len=3000, long_fraction=0.003))
    assert t.check(p, other) is None and t.render(p, other) == text  # one text: nothing of either matrix in it
    assert "LAUNCH: grid=MATRIX_LONG_ROW_COUNT + ceil_div(m, BLOCK / TPR), block=BLOCK" in text
    got = materialise(text, Op.SPMV, card)
    long_rows = sorted(int(r) for r in np.flatnonzero(np.diff(A.indptr) > 1024))
    assert len(long_rows) == 12 and f"__constant__ int MATRIX_LONG_ROWS[12] = {{{', '.join(map(str, long_rows))}}};" in got
    assert "LAUNCH: grid=12 + ceil_div(m, BLOCK / TPR), block=BLOCK" in got and got.count("LAUNCH:") == 1
    assert "constexpr int MATRIX_LONG_ROW_COUNT = 12;" in got and "atomic" not in split_completion(got, Op.SPMV)[1]
    assert "that is csr_lanes" in t.check(dict(p, long_len=4096), card)  # no row over 4096
    assert "csr_adaptive splits" in t.check(dict(p, block=128), matrix_card(
        generate("skewed", 20000, seed=1, long_len=9000, long_fraction=0.001)))  # 9000 > 64 x 128
    many = matrix_card(generate("random", 4500, seed=1, nnz_per_row=300))  # over 4096 rows of 300: not listed
    assert many.long_rows_min > 257 and "does not list" in t.check(dict(p, long_len=256), many)


def test_spmm_lane_groups_beyond_the_librarys_compile() -> None:
    """The SpMM strategies' lane groups of 4 and 16 (a wider domain than the library's 2, 8, 32)
    render and compile: a mutation to them must not be a compile error the search pays for."""
    card = matrix_card(generate("powerlaw", 6000, seed=1))
    texts = []
    for t in (get_template(Op.SPMM, n) for n in ("csr_rows", "coo_runs", "ell_rows", "sell_lanes", "hyb_ell_coo",
                                                  "dia_rows", "bsr_group")):
        base = t.seeds(card, 64)[0]
        for g in (4, 16):
            p = dict(base, g=g, vec=4)
            assert t.check(p, card, 64) is None, (t.name, p)
            texts.append(split_completion(t.render(p, card), Op.SPMM)[1])
    results = compile_many(texts, OPTIONS)
    assert all(r.ok for r in results), [r.log[-400:] for r in results if not r.ok]
