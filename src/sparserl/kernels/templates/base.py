"""Kernel templates: a strategy with an explicit parameter space, rendered as a contract completion.

A :class:`Template` is what a search walks and what a model is taught to write: one strategy
(``csr_vector``, ``dia_stream``, a row-binned CSR ...) with

* ``space``: its parameters, each with an explicit, ordered, finite domain (:class:`Param`);
* ``check(params, card, k)``: why a point is invalid for this matrix and k (``None`` when valid);
* ``render(params, card)``: the completion text, deterministic and readable: the parameters on a
  ``PARAMS:`` line (and the FORMAT line), then one body shared by every point. A *specialised*
  template bakes structure facts from the :class:`~sparserl.matrices.card.MatrixCard` into one
  block of ``constexpr`` values and initialised tables at the top of the code (diagonal offsets,
  long rows and their split points, blocks per block row ...), which the body reads by name;
  values are always read from ``val``;
* ``seeds(card, k)``: the library's best guesses in this space;
* ``neighbours(params, card, k)``: the points one step away along one parameter (what a local
  search mutates).

A point of a template is a :class:`Candidate`; its ``id`` is stable and, for the library's own
points, equal to the library variant's id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from sparserl.kernels.contract import Op
from sparserl.matrices.card import MatrixCard

Params = dict[str, int]


@dataclass(frozen=True)
class Param:
    """One template parameter and its ordered domain."""

    name: str
    values: tuple[int, ...]
    doc: str = ""
    format_param: bool = False
    """Written on the FORMAT line (SELL's C, BSR's R and C ...) rather than a code-generation choice."""

    def __post_init__(self) -> None:
        if not self.values or len(set(self.values)) != len(self.values):
            raise ValueError(f"parameter {self.name}: values must be distinct and non-empty")


@dataclass(frozen=True)
class Candidate:
    """One point of one template, for one (op, k)."""

    template: str
    op: Op
    params: tuple[tuple[str, int], ...]
    format_keys: tuple[str, ...] = ()
    """Which of ``params`` are FORMAT parameters (they come first in the id)."""
    specialised: bool = False

    @property
    def id(self) -> str:
        fp = ",".join(f"{k}={v}" for k, v in self.params if k in self.format_keys) or "-"
        tu = ",".join(f"{k}={v}" for k, v in self.params if k not in self.format_keys) or "-"
        return f"{self.op.value}/{self.template}/{fp}/{tu}" + ("/spec" if self.specialised else "")

    @property
    def param_dict(self) -> Params:
        return dict(self.params)


Renderer = Callable[[Params, MatrixCard | None], str]
Checker = Callable[[Params, MatrixCard | None, int | None], str | None]


@dataclass(frozen=True)
class Template:
    """A strategy with an explicit parameter space (see the module docstring)."""

    name: str
    op: Op
    format: str
    space: tuple[Param, ...]
    renderer: Renderer = field(repr=False, compare=False)
    checker: Checker | None = field(default=None, repr=False, compare=False)
    seed_points: Callable[[MatrixCard | None, int | None], list[Params]] | None = field(
        default=None, repr=False, compare=False)
    specialised: bool = False
    """True when ``render`` bakes card facts into the code (needs a card)."""
    atomic: bool = False
    doc: str = ""
    generic: str | None = None
    """For a specialised template: the name of its generic form (the same strategy and parameters
    with nothing baked in), so that the gain of specialisation can be measured matrix by matrix."""
    unseen: Checker | None = field(default=None, repr=False, compare=False)
    """For a specialised template: which facts it bakes in for (params, card) that the policy's
    prompt card does not show (None: every one is shown). A teacher for the policy must not ask
    it to write constants it cannot see (:func:`unseen_facts`)."""

    def param(self, name: str) -> Param:
        return next(p for p in self.space if p.name == name)

    def point_error(self, params: Mapping[str, int]) -> str | None:
        """Why ``params`` is not a point of this template's space (a name missing or unknown, a value
        outside its domain), whatever the matrix; None when it is one."""
        names = {p.name for p in self.space}
        if set(params) != names:
            return f"{self.name} takes parameters {sorted(names)}, got {sorted(params)}"
        for p in self.space:
            if params[p.name] not in p.values:
                return f"{self.name}: {p.name}={params[p.name]} is not one of {p.values}"
        return None

    def check(self, params: Mapping[str, int], card: MatrixCard | None = None, k: int | None = None) -> str | None:
        """Why ``params`` is not a valid point for this matrix and k, or None."""
        why = self.point_error(params)
        if why:
            return why
        if self.specialised and card is None:
            return f"{self.name} is specialised to a matrix and needs its card"
        if self.op is Op.SPMM and (k is None or k % params.get("vec", 1)):
            return f"{self.name}: k={k} is not a multiple of vec={params.get('vec', 1)}"
        return self.checker(dict(params), card, k) if self.checker is not None else None

    def unseen_facts(self, params: Mapping[str, int], card: MatrixCard, k: int | None = None) -> str | None:
        """What this point bakes in that the prompt's card leaves out (None: nothing)."""
        return self.unseen(dict(params), card, k) if self.unseen is not None else None

    def candidate(self, params: Mapping[str, int]) -> Candidate:
        ordered = tuple((p.name, int(params[p.name])) for p in self.space)
        return Candidate(self.name, self.op, ordered, tuple(p.name for p in self.space if p.format_param),
                         self.specialised)

    def render(self, params: Mapping[str, int], card: MatrixCard | None = None) -> str:
        """The completion text for ``params`` (call :meth:`check` first)."""
        return self.renderer(dict(params), card).strip("\n") + "\n"

    def seeds(self, card: MatrixCard | None = None, k: int | None = None) -> list[Params]:
        """Valid starting points: the template's own guesses, else the middle of every domain."""
        pts = self.seed_points(card, k) if self.seed_points is not None else [
            {p.name: p.values[len(p.values) // 2] for p in self.space}]
        return [p for p in pts if self.check(p, card, k) is None]

    def neighbours(self, params: Mapping[str, int], card: MatrixCard | None = None,
                   k: int | None = None) -> list[Params]:
        """Valid points that differ from ``params`` by one step of one parameter."""
        out = []
        for p in self.space:
            i = p.values.index(params[p.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(p.values):
                    q = dict(params) | {p.name: p.values[j]}
                    if self.check(q, card, k) is None:
                        out.append(q)
        return out

    def random_point(self, rng: np.random.Generator, card: MatrixCard | None = None, k: int | None = None,
                     tries: int = 64) -> Params | None:
        """A uniformly drawn valid point (None when ``tries`` draws found none)."""
        for _ in range(tries):
            q = {p.name: p.values[int(rng.integers(len(p.values)))] for p in self.space}
            if self.check(q, card, k) is None:
                return q
        return None
