"""CSR templates for irregular matrices: ``csr_adaptive`` and ``csr_lanes``, generic and specialised.

The CUDA lives in :mod:`sparserl.kernels.library.csr_irregular` (the library carries a few generic
points of both); here each becomes a template with a wider space, and each has a specialised twin
that bakes the matrix card's row-length facts into the code:

* ``csr_adaptive_spec``: the row-length bins decide which code is compiled (one body; its block of
  facts, ``SHORT_MAX``, ``LONG_ROWS``, ``LONG_PIECES`` and the long-row tables, selects the code with
  ``if constexpr``). No row longer than ``long_len``: no long-row launch and no long-row tests. Every other row at most
  :data:`~sparserl.kernels.library.csr_irregular.THREAD_MAX` long: a lane per row, loop unrolled.
  Long rows that the card lists in full (at most :data:`MAX_TABLE_ROWS` of them, and tables of at
  most :data:`MAX_TABLE_CHARS` characters): their rows and split points become constant tables,
  one block per piece.
* ``csr_lanes_spec``: every row has the same length ``L`` (random and rectangular matrices):
  no ``row_ptr`` reads, fixed trip counts, 16-byte chunks when ``L`` is a multiple of 4.
* ``csr_split_spec`` (no generic form: finding the long rows at run time would cost a search or a
  second launch, which is what it saves): a block for each row longer than ``long_len`` (the rows
  the card lists, named ``MATRIX_LONG_ROWS`` and counted ``MATRIX_LONG_ROW_COUNT`` in the code and the
  LAUNCH line: the harness writes them from the matrix, so the kernel is one text at each point),
  ``tpr`` lanes for every other row, one launch; no atomics, so y is not zeroed. For small skewed graphs.
"""

from __future__ import annotations

from sparserl.kernels.contract import Op
from sparserl.kernels.library.csr_irregular import (
    ADAPTIVE_DOC,
    LANES_DOC,
    SPLIT_DOC,
    THREAD_MAX,
    AdaptivePlan,
    render_adaptive,
    render_lanes,
    render_split,
)
from sparserl.kernels.templates.base import Param, Params, Template
from sparserl.matrices.card import MatrixCard

MAX_TABLE_ROWS = 2048
"""Most long rows baked into a constant table; with more the long-row kernel searches."""
MAX_TABLE_CHARS = 30_000
"""Most characters of constant tables in one kernel (the harness caps a completion's code length)."""


def _pow2_near(v: float, lo: int, hi: int) -> int:
    out = lo
    while out * 2 <= hi and out * 2 <= v:
        out *= 2
    return out


# ---------------------------------------------------------------------------------------------
# csr_adaptive


ADAPTIVE_SPACE = (
    Param("rpw", (32, 64, 128), "rows per warp (a power of two)"),
    Param("items", (4, 8), "consecutive entries per lane per chunk (16-byte loads)"),
    Param("long_len", (256, 1024, 4096, 16384), "rows longer than this are split over blocks"),
    Param("seg", (1024, 4096, 16384), "entries per block of the long-row kernel (at most long_len when it searches)"),
    Param("block", (128, 256), "threads per block of the row kernel"),
)


def adaptive_plan(params: Params, card: MatrixCard) -> AdaptivePlan:
    """What ``csr_adaptive_spec`` bakes in for ``card`` (see the module docstring)."""
    long_len, seg = params["long_len"], params["seg"]
    has_long = card.row_len_max > long_len
    if not has_long:
        short_max = card.row_len_max
    else:  # the longest row of at most long_len entries: exact among the listed long rows, else the bins' bound
        listed = max((n for _, n in card.long_rows if n <= long_len), default=0)
        unlisted = min(card.long_rows_min - 1, long_len,
                       max((b.hi for b in card.bins if b.lo < card.long_rows_min), default=0))
        short_max = max(listed, unlisted)
    table = None
    notes = []
    if has_long:
        rows = card.rows_longer_than(long_len)
        table_chars = sum(len(str(r)) + len(str(n)) + 4 for r, n in rows) if rows is not None else 0
        if rows is not None and len(rows) <= MAX_TABLE_ROWS and table_chars <= MAX_TABLE_CHARS:
            table = tuple(sorted(rows))
            pieces = sum(-(-n // seg) for _, n in table)
            notes.append(f"{len(table)} rows longer than {long_len} ({pieces} pieces) in a constant table")
        else:
            notes.append(f"rows longer than {long_len} exist (more than the card lists: found by search)")
    else:
        notes.append(f"no row is longer than {long_len} (longest {card.row_len_max}): no long-row kernel")
    if short_max <= THREAD_MAX:
        notes.append(f"every other row has at most {short_max} entries: a lane per row")
    return AdaptivePlan(has_long, short_max, table, "; ".join(notes) + ".")


def _adaptive_check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    if p["seg"] > p["long_len"]:
        return f"seg={p['seg']} must be at most long_len={p['long_len']} (the long-row kernel searches)"
    return None


def _adaptive_spec_check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    assert card is not None
    plan = adaptive_plan(p, card)
    if plan.has_long and plan.long_rows is None:
        return _adaptive_check(p, card, k)
    if not plan.has_long and p["seg"] != ADAPTIVE_SPACE[3].values[0]:
        return "no row is longer than long_len, so seg is unused: only its first value is a distinct point"
    return None


def _table_unseen(table: tuple | None, long_len: int, card: MatrixCard) -> str | None:
    """A table of the rows longer than ``long_len`` is seen when the prompt's card proves it complete:
    every row-length bin that may hold such rows has all its rows among the listed longest rows
    (else the policy cannot tell which unlisted rows the table needs)."""
    if not table:
        return None
    shown = card.prompt_longest_rows()
    for b in card.bins:
        listed = sum(1 for _, n in shown if b.lo <= n <= b.hi)
        if b.hi > long_len and listed != b.rows:
            return (f"its table of the {len(table)} rows longer than {long_len} needs rows the prompt's card "
                    f"does not list ({b.rows} rows of length {b.lo}-{b.hi}, {listed} listed)")
    return None


def _adaptive_unseen(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    """csr_adaptive_spec's long-row table, when it has one (:func:`_table_unseen`)."""
    assert card is not None
    return _table_unseen(adaptive_plan(p, card).long_rows, p["long_len"], card)


def _adaptive_seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    seeds = [{"rpw": 32, "items": 8, "long_len": 16384, "seg": 16384, "block": 256},
             {"rpw": 64, "items": 4, "long_len": 4096, "seg": 4096, "block": 256}]
    if card is not None:
        rpw = _pow2_near(256 / max(card.row_len_mean, 1e-9), 32, 128)
        for long_len in (1024, 16384):
            for seg in (1024, 4096):  # seg > long_len: only the specialised form (a table, no search)
                seeds.append({"rpw": rpw, "items": 8, "long_len": long_len, "seg": seg, "block": 256})
    out: list[Params] = []
    for s in seeds:
        if s not in out:
            out.append(s)
    return out


def _adaptive_templates() -> list[Template]:
    def generic(p: Params, card: MatrixCard | None) -> str:
        return render_adaptive(p["rpw"], p["items"], p["long_len"], p["seg"], p["block"])

    def spec(p: Params, card: MatrixCard | None) -> str:
        assert card is not None
        return render_adaptive(p["rpw"], p["items"], p["long_len"], p["seg"], p["block"], adaptive_plan(p, card))

    common = {"op": Op.SPMV, "format": "CSR", "space": ADAPTIVE_SPACE, "seed_points": _adaptive_seeds, "atomic": True}
    return [
        Template(name="csr_adaptive", renderer=generic, checker=_adaptive_check, doc=ADAPTIVE_DOC, **common),
        Template(name="csr_adaptive_spec", renderer=spec, checker=_adaptive_spec_check, specialised=True,
                 unseen=_adaptive_unseen,
                 generic="csr_adaptive",
                 doc=ADAPTIVE_DOC + "; bins, long rows and split points baked in", **common),
    ]


# ---------------------------------------------------------------------------------------------
# csr_lanes


LANES_SPACE = (
    Param("tpr", (1, 2, 4, 8, 16, 32), "lanes per row"),
    Param("unroll", (1, 2, 4, 8), "entries per lane in flight"),
    Param("block", (128, 256), "threads per block"),
)
LANES_SPEC_SPACE = (LANES_SPACE[0], LANES_SPACE[2])
MAX_LANE_LOADS = 16
"""Most 16-byte chunks (or 32 single entries) one lane of csr_lanes_spec holds in registers."""


def uniform_row_length(card: MatrixCard) -> int | None:
    """The length every row has, or None when rows differ."""
    return card.row_len_max if card.row_len_min == card.row_len_max else None


def _lanes_spec_check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    assert card is not None
    L = uniform_row_length(card)
    if L is None:
        return f"rows differ in length ({card.row_len_min} to {card.row_len_max}): nothing to specialise"
    if L == 0:
        return "every row is empty: nothing to specialise"
    per_lane = -(-L // 4 // p["tpr"]) if L % 4 == 0 else -(-L // p["tpr"])
    limit = MAX_LANE_LOADS if L % 4 == 0 else 2 * MAX_LANE_LOADS
    if per_lane > limit:
        return f"rows of {L} entries need {per_lane} loads per lane with tpr={p['tpr']}; use more lanes"
    return None


def _lanes_seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    seeds = [{"tpr": 4, "unroll": 4, "block": 256}, {"tpr": 8, "unroll": 2, "block": 256}]
    if card is not None:
        seeds.append({"tpr": _pow2_near(card.row_len_mean / 4, 1, 32), "unroll": 4, "block": 256})
    out: list[Params] = []
    for s in seeds:
        if s not in out:
            out.append(s)
    return out


def _lanes_spec_seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    out: list[Params] = []
    for s in _lanes_seeds(card, k):
        q = {"tpr": s["tpr"], "block": s["block"]}
        if q not in out:
            out.append(q)
    if card is not None and (L := uniform_row_length(card)) is not None:
        q = {"tpr": _pow2_near(max(L // 16, 1), 1, 32), "block": 256}  # four 16-byte chunks per lane
        if q not in out:
            out.append(q)
    return out


def _lanes_templates() -> list[Template]:
    def generic(p: Params, card: MatrixCard | None) -> str:
        return render_lanes(p["tpr"], p["unroll"], p["block"])

    def spec(p: Params, card: MatrixCard | None) -> str:
        assert card is not None
        return render_lanes(p["tpr"], 1, p["block"], uniform_row_length(card))

    return [
        Template(name="csr_lanes", op=Op.SPMV, format="CSR", space=LANES_SPACE, renderer=generic,
                 seed_points=_lanes_seeds, doc=LANES_DOC),
        Template(name="csr_lanes_spec", op=Op.SPMV, format="CSR", space=LANES_SPEC_SPACE, renderer=spec,
                 checker=_lanes_spec_check, seed_points=_lanes_spec_seeds, specialised=True, generic="csr_lanes",
                 doc=LANES_DOC + "; a uniform row length baked in (no row_ptr reads)"),
    ]


# ---------------------------------------------------------------------------------------------
# csr_split


SPLIT_SPACE = (
    Param("tpr", (1, 2, 4, 8, 16, 32), "lanes per row that is not long"),
    Param("unroll", (1, 2, 4, 8), "entries per lane (or per thread of a long row's block) in flight"),
    Param("long_len", (256, 512, 1024, 4096), "rows longer than this get a block of their own"),
    Param("block", (128, 256), "threads per block"),
)
SPLIT_MAX_PER_THREAD = 64
"""Most entries of the longest row per thread of its block (longer rows: csr_adaptive splits them)."""


def split_rows(p: Params, card: MatrixCard) -> tuple[int, ...] | None:
    """The rows csr_split_spec gives a block each (every row longer than long_len), or None when
    the card does not list them all."""
    listed = card.rows_longer_than(p["long_len"])
    return None if listed is None else tuple(sorted(r for r, _ in listed))


def _split_check(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    assert card is not None
    rows = split_rows(p, card)
    if rows is None:
        return f"the card does not list every row longer than {p['long_len']}"
    if not rows:
        return f"no row is longer than {p['long_len']} (longest {card.row_len_max}): that is csr_lanes"
    if len(rows) > MAX_TABLE_ROWS or sum(len(str(r)) + 2 for r in rows) > MAX_TABLE_CHARS:
        return f"{len(rows)} rows longer than {p['long_len']}: a table too large for the code"
    if card.row_len_max > SPLIT_MAX_PER_THREAD * p["block"]:
        return (f"the longest row ({card.row_len_max} entries) would leave each of a block's {p['block']} threads "
                f"over {SPLIT_MAX_PER_THREAD}: csr_adaptive splits such rows")
    return None


def _split_unseen(p: Params, card: MatrixCard | None, k: int | None) -> str | None:
    assert card is not None
    return _table_unseen(split_rows(p, card), p["long_len"], card)


def _split_seeds(card: MatrixCard | None, k: int | None) -> list[Params]:
    out: list[Params] = []
    tprs = [4, 32] if card is None else [_pow2_near(card.row_len_mean / 4, 1, 32), 32]
    for tpr in tprs:
        for long_len in (256, 1024):
            q = {"tpr": tpr, "unroll": 4, "long_len": long_len, "block": 256}
            if q not in out:
                out.append(q)
    return out


def _split_templates() -> list[Template]:
    def spec(p: Params, card: MatrixCard | None) -> str:
        assert card is not None and split_rows(p, card), "render a checked point"
        return render_split(p["tpr"], p["unroll"], p["long_len"], p["block"])

    return [Template(name="csr_split_spec", op=Op.SPMV, format="CSR", space=SPLIT_SPACE, renderer=spec,
                     checker=_split_check, seed_points=_split_seeds, specialised=True, unseen=_split_unseen,
                     doc=SPLIT_DOC)]


def csr_templates() -> list[Template]:
    return _adaptive_templates() + _lanes_templates() + _split_templates()
