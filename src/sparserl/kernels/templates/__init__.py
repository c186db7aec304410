"""Kernel templates: strategies with explicit parameter spaces (see :mod:`.base`).

    from sparserl.kernels.templates import templates, get_template
    t = get_template("spmv", "csr_vector")
    params = t.seeds(card)[0]
    text = t.render(params, card)

The registry holds the reference library's strategies (:mod:`.library`) and the templates of
:mod:`.csr`, :mod:`.dia`, :mod:`.bsr` and :mod:`.hyb`: strategies for irregular matrices, and
specialised templates (``*_spec``, ``Template.specialised``) that bake a matrix's structure into
the code, each beside its generic form (``Template.generic``) so that the gain of specialising
can be measured. Where a template has the name of a library strategy (``csr_adaptive``,
``csr_lanes``), it replaces the library's narrower one; its space holds every library point,
and renders each exactly as the library does.
"""

from __future__ import annotations

from functools import lru_cache

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.kernels.templates.base import Candidate, Param, Params, Template
from sparserl.kernels.templates.bsr import bsr_templates
from sparserl.kernels.templates.csr import csr_templates
from sparserl.kernels.templates.dia import dia_templates
from sparserl.kernels.templates.hyb import hyb_templates
from sparserl.kernels.templates.library import library_templates

__all__ = ["Candidate", "Param", "Params", "Template", "get_template", "templates"]


@lru_cache(maxsize=1)
def _all() -> tuple[Template, ...]:
    new = csr_templates() + dia_templates() + bsr_templates() + hyb_templates()
    replaced = {(t.op, t.name) for t in new}
    out = [t for t in library_templates() if (t.op, t.name) not in replaced] + new
    keys = [(t.op, t.name) for t in out]
    if len(set(keys)) != len(keys):
        raise AssertionError("duplicate template names for one op")
    return tuple(out)


def templates(op: Op | str | None = None) -> list[Template]:
    """Every template, or those of one op."""
    op = Op(op) if op is not None else None
    return [t for t in _all() if op is None or t.op is op]


def get_template(op: Op | str, name: str) -> Template:
    """The template ``name`` for ``op``; a one-line error names the known ones."""
    op = Op(op)
    for t in _all():
        if t.op is op and t.name == name:
            return t
    known = ", ".join(sorted(t.name for t in _all() if t.op is op))
    raise SparseRLError(f"unknown {op.value} template {name!r}; templates are: {known}")
