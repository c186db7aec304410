"""The reference library's strategies as templates: each strategy's tunables become a product space.

A library strategy (``csr_vector``, ``sell_lanes`` ...) renders any choice of its tunables, but the
library enumerates only a few points of it. Here each strategy becomes a :class:`Template` whose
domain per parameter is every value the library uses for it, so a search can walk between and
around the library's points; the library's own points are the seeds. Generic constraints keep a
point renderable: a lane group (``g``, ``tpr``) fits in a warp and divides the block, and SELL's
sigma is 1 or a multiple of C (the contract's rule).

A few strategies get domains wider than the library's points (:data:`WIDER`): merge-path CSR
tile sizes (block x items per thread, limited by the 48 KiB of static shared memory its tile
takes), the segmented COO kernel's batches, SELL's slice height and sorting window, the COO
SpMM's nonzeros per lane group (up to 2048: on the 1M-node GCN graph, 8.9M nonzeros at k = 128,
fewer and longer groups walk faster, 1139 us at 2048 against 1156 at 256, until too few groups fill
the GPU, 1531 at 4096) and block size (at the 32-lane kernel's 70 registers a thread, blocks of 128
fit 28 warps on an SM where blocks of 256 fit 24), and every power of two up to a warp for the SpMM
strategies' lanes per row (the library has 2, 8 and 32, and 16 for COO runs, where 16 lanes of 4
columns cover k = 64 in one pass). Mutations reach them; the seeds stay the library's.
"""

from __future__ import annotations

from collections import defaultdict

from sparserl.errors import ContractError
from sparserl.kernels.contract import Op, format_spec
from sparserl.kernels.library import all_variants
from sparserl.kernels.library.common import Variant, make
from sparserl.kernels.templates.base import Param, Params, Template
from sparserl.matrices.card import MatrixCard

WIDER: dict[tuple[Op, str], dict[str, tuple[int, ...]]] = {
    (Op.SPMV, "csr_merge"): {"block": (64, 128, 256, 512), "ipt": (1, 2, 3, 4, 5, 7, 9, 11, 13, 15)},
    (Op.SPMV, "coo_segmented"): {"batches": (1, 2, 4, 8, 16, 32), "block": (128, 256, 512)},
    (Op.SPMV, "sell_lanes"): {"C": (8, 16, 32, 64, 128), "sigma": (1, 64, 128, 256, 512, 1024, 4096)},
    **{(Op.SPMM, s): {"g": (2, 4, 8, 16, 32), "nzpg": (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048),
                      "block": (128, 256, 512)} for s in ("coo_runs", "coo_runs_stored")},
    **{(Op.SPMM, s): {"g": (2, 4, 8, 16, 32)} for s in ("csr_rows", "ell_rows", "sell_lanes",
                                                          "dia_rows", "hyb_ell_coo", "bsr_group")},
}
"""Extra values per parameter, beyond the library's own, for a few strategies."""

STATIC_SMEM_BYTES = 48 * 1024
"""Static shared memory one block may declare."""


def _strategy_check(strategy: str, params: Params) -> str | None:
    if strategy == "csr_merge":  # tile of block*ipt row ends and products in shared memory
        tile = params["block"] * params["ipt"]
        if 8 * tile + 24 > STATIC_SMEM_BYTES:
            return f"a merge tile of {tile} items needs {8 * tile + 24} bytes of shared memory (at most {STATIC_SMEM_BYTES})"
    if strategy == "bsr_group" and params["g"] < params["C"]:  # each lane covers whole block columns
        return f"g={params['g']} lanes per block row must be at least the block width C={params['C']}"
    return None


def _generic_check(params: Params, card: MatrixCard | None, k: int | None, fmt: str) -> str | None:
    block = params.get("block")
    for lanes in ("g", "tpr"):
        if lanes in params and block is not None and (params[lanes] > 32 or block % params[lanes]):
            return f"{lanes}={params[lanes]} must be at most 32 and divide block={block}"
    fp = {k2: v for k2, v in params.items() if k2 in {p.name for p in format_spec(fmt).params}}
    if fp:
        try:
            format_spec(fmt).resolve_params(fp)
        except ContractError as exc:
            return str(exc)
    return None


FIXED_FORMAT_PARAMS = frozenset({"zero_y"})
"""FORMAT parameters a strategy fixes rather than chooses (COO's output policy): rendered on every
point, never a dimension of the space (nor a cost-model column)."""


def variant_point(v: Variant) -> tuple[str, dict[str, int]]:
    """A library variant as a point of its template: the template's name and the parameters it takes
    (the FORMAT parameters its strategy fixes are left out: the template renders them itself)."""
    return v.strategy, {key: val for key, val in v.format_params + v.tunables if key not in FIXED_FORMAT_PARAMS}


def _template(group: list[Variant]) -> Template:
    first = group[0]
    fixed = {k: v for k, v in first.format_params if k in FIXED_FORMAT_PARAMS}
    assert all(dict(v.format_params).items() >= fixed.items() for v in group), first.strategy
    fkeys = [k for k, _ in first.format_params if k not in fixed]
    tkeys = [k for k, _ in first.tunables]
    wider = WIDER.get((first.op, first.strategy), {})
    space = tuple(
        Param(key, tuple(sorted({dict(v.format_params + v.tunables)[key] for v in group} | set(wider.get(key, ())))),
              format_param=key in fkeys)
        for key in fkeys + tkeys
    )

    def render(params: Params, card: MatrixCard | None) -> str:
        v = make(first.op, first.format, first.strategy, first.body,
                 {key: params[key] for key in tkeys},
                 {key: fixed[key] if key in fixed else params[key] for key, _ in first.format_params},
                 k_multiple=params.get("vec", 1), atomic=first.atomic, doc=first.doc)
        return v.render()

    seeds = [variant_point(v)[1] for v in group]
    return Template(
        name=first.strategy, op=first.op, format=first.format, space=space, renderer=render,
        checker=lambda p, c, k: _generic_check(p, c, k, first.format) or _strategy_check(first.strategy, p),
        seed_points=lambda card, k: [dict(s) for s in seeds],
        atomic=first.atomic, doc=first.doc,
    )


def library_templates() -> list[Template]:
    """One template per (op, format, strategy) of the reference library."""
    groups: dict[tuple, list[Variant]] = defaultdict(list)
    for v in all_variants():
        groups[(v.op, v.format, v.strategy)].append(v)
    return [_template(g) for g in groups.values()]
