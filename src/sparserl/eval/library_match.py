"""How a sampled kernel relates to the reference library (pure functions).

A library strategy is one body shared by all its variants; a variant is that body under its
header (``FORMAT:``, ``PARAMS:``, ``LAUNCH:``). A policy taught on the library writes, for each
sample, one of four things:

* ``library``: one of the library's variants exactly (body and header);
* ``params``: a library body under the header of one of its variants with other numbers: other
  PARAMS values or FORMAT parameters, the same names and the same LAUNCH lines. Since the LAUNCH
  lines and the code read the numbers by name, such a kernel is consistent by construction; it
  is a choice of numbers the library did not make;
* ``mismatch``: a library body under any other header (other LAUNCH lines, other or missing PARAMS
  names, another format): the two can disagree on what the body bakes in;
* ``new``: a body the library does not have: a specialised or mutated kernel, or a garbled one.

Counting a system's samples by class, with the correct share of each, tells whether its
incorrect samples are library parts put together wrongly or new code. A completion is read as the
harness reads it (:func:`sparserl.harness.extract.extract`: fences, chatter and markdown dropped,
the header parsed and rendered back with its format parameters' defaults filled in); bodies (the
code as written, without the PARAMS prelude) are compared without their comments and with their
whitespace collapsed. A
completion the harness cannot extract is ``new``. Nothing is compiled or run.

A ``new`` body may still be a search template's body (:func:`template_body`): the body every point
of that template shares, after the block of facts a specialised template bakes in at the top
(``constexpr`` values and initialised tables: diagonal offsets, long-row lists), whatever those
facts say. The table counts these per template, so a policy's specialised kernels, copied with
wrong facts or not, are told apart from code of its own. Given the sample's matrix card, it also
counts those whose facts are the card's (:func:`facts_as_card`): the block the template bakes in
for that card at the sample's own numbers, so a failure of copying the card is told apart from a
failure of the body.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import lru_cache

from sparserl.data.targets import without_comments
from sparserl.harness.extract import Extracted, extract
from sparserl.kernels.contract import Header, Op
from sparserl.kernels.library import variants
from sparserl.kernels.templates import Template, get_template, templates
from sparserl.matrices.card import MatrixCard


class LibraryMatch(str, Enum):
    """What a completion is, against the library (see the module docstring)."""

    LIBRARY = "library"
    PARAMS = "params"
    MISMATCH = "mismatch"
    NEW = "new"


DESCRIPTION = {
    LibraryMatch.LIBRARY: "a library variant exactly",
    LibraryMatch.PARAMS: "a library body with other PARAMS or FORMAT numbers",
    LibraryMatch.MISMATCH: "a library body under a header none of its variants has",
    LibraryMatch.NEW: "a body the library does not have",
}


def _shape(header: Header) -> tuple:
    """A header without its numbers: the format, the names of its FORMAT parameters and PARAMS,
    and its LAUNCH lines (which read the numbers by name)."""
    return (header.format, tuple(header.params), tuple(header.constants), tuple(l.render() for l in header.launches))


def _parts(text: str, op: Op) -> tuple[Header, str] | None:
    """(the parsed header, the body as written without its comments and with its whitespace collapsed),
    or None when the harness would find no completion in ``text``. Comments do not count: the policy is
    taught the kernels without them (:mod:`sparserl.data.targets`)."""
    got = extract(text, op)
    if not isinstance(got, Extracted):
        return None
    return got.header, re.sub(r"\s+", " ", without_comments(got.body)).strip()


@dataclass(frozen=True)
class _Headers:
    exact: frozenset[str]
    """Rendered headers of the variants with this body."""
    shapes: frozenset[tuple]
    """Their :func:`_shape`."""


@lru_cache(maxsize=4)
def _library(op: Op) -> dict[str, _Headers]:
    """Library bodies of ``op`` -> the headers they come with."""
    exact: dict[str, set[str]] = defaultdict(set)
    shapes: dict[str, set[tuple]] = defaultdict(set)
    for v in variants(op):
        head, body = _parts(v.render(), op)
        exact[body].add(head.render())
        shapes[body].add(_shape(head))
    return {b: _Headers(frozenset(exact[b]), frozenset(shapes[b])) for b in exact}


def library_match(text: str, op: Op | str) -> LibraryMatch:
    """The class of one completion (see the module docstring)."""
    op = Op(op)
    return _match(_parts(text, op), op)


def _match(parts: tuple[Header, str] | None, op: Op) -> LibraryMatch:
    """:func:`library_match` of a completion already read (:func:`_parts`)."""
    heads = _library(op).get(parts[1]) if parts else None
    if heads is None:
        return LibraryMatch.NEW
    if parts[0].render() in heads.exact:
        return LibraryMatch.LIBRARY
    return LibraryMatch.PARAMS if _shape(parts[0]) in heads.shapes else LibraryMatch.MISMATCH


_FACT = re.compile(r"(?:__device__ )?(?:static )?(?:constexpr|__constant__) [^;{]*(?:\{[^}]*\})?[^;{]*; ?")


def _without_facts(body: str) -> str:
    """A collapsed body without the declarations at its top (``constexpr`` values, ``__constant__``
    and ``__device__ constexpr`` tables): what every point of a template shares."""
    while m := _FACT.match(body):
        body = body[m.end():]
    return body


TEMPLATE_CARDS = (("banded", 4003, {"bands": 9}), ("stencil2d", 4900, {}), ("block", 4000, {"block": 8, "blocks_per_row": 4}),
                  ("skewed", 6000, {"long_len": 2000, "long_fraction": 0.002}), ("powerlaw", 6000, {}),
                  ("random", 3001, {"nnz_per_row": 16}))
"""The generated matrices (family, rows, parameters; seed 1) whose cards the templates are rendered on to learn
their bodies: every specialised template applies to one of them."""


@lru_cache(maxsize=4)
def _template_bodies(op: Op) -> dict[str, str]:
    """Each template body of ``op`` (facts aside) -> the template's name, from its seed points on
    :data:`TEMPLATE_CARDS` (the library's own bodies left out: they are ``library`` or ``params``)."""
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    k = 32 if op is Op.SPMM else None
    out: dict[str, str] = {}
    for family, rows, params in TEMPLATE_CARDS:
        card = matrix_card(generate(family, rows, seed=1, **params))
        for t in templates(op):
            for p in t.seeds(card, k):
                parts = _parts(t.render(p, card), op)
                if parts is not None and parts[1] not in _library(op):
                    out.setdefault(_without_facts(parts[1]), t.name)
    return out


def _facts(body: str) -> str:
    """The block of facts at the top of a collapsed body (what :func:`_without_facts` takes away)."""
    return body[:len(body) - len(_without_facts(body))].strip()


def _point(template: Template, header: Header) -> dict[str, int] | None:
    """The template's parameters as a header names them (PARAMS and FORMAT numbers, matched by name
    whatever the case), or None when the header does not name a point of the template's space."""
    numbers = {k.lower(): v for k, v in {**header.params, **header.constants}.items()}
    point = {p.name: numbers.get(p.name.lower()) for p in template.space}
    if None in point.values() or template.point_error(point) is not None:
        return None
    return point


def _code_lines(code: str) -> tuple[str, ...]:
    """Code as its first compilation phases read it, to tell two texts apart: continued lines joined, comments
    dropped, each line's whitespace collapsed, blank lines dropped. Line breaks are kept: they end a
    preprocessor line (``#pragma unroll`` applies to the next statement, not to one written on its line)."""
    code = without_comments(code.replace("\\\r\n", "").replace("\\\n", ""))
    return tuple(" ".join(line.split()) for line in code.split("\n") if line.strip())


def template_point(text: str, op: Op | str, tmpls: Iterable[Template], card: MatrixCard | None,
                   k: int | None = None) -> tuple[Template, dict[str, int]] | None:
    """(template, point) of the first of ``tmpls`` whose kernel for ``card`` ``text`` is: the template's
    format is the text's, the text's header names a point of its space (PARAMS and FORMAT numbers, matched
    by name whatever the case) that its check accepts for ``card`` and ``k``, and the template rendered at
    that point reads as ``text`` reads (the header rendered; the code line by line without comments, its
    whitespace collapsed, continued lines joined, a specialised template's block of facts included, so a
    kernel with other facts is no point). None when no template's is. What a search needs to move from a
    policy's kernel as from its own points; it says which point the text is, it does not replace the text
    (the harness judges what was written). Pure."""
    op = Op(op)
    got = extract(text, op)
    if not isinstance(got, Extracted):
        return None
    head, code = got.header.render(), _code_lines(got.body)
    for t in tmpls:
        if t.op is not op or t.format != got.header.format:
            continue
        point = _point(t, got.header)
        if point is None or t.check(point, card, k) is not None:
            continue
        try:
            rendered = extract(t.render(point, card), op)
        except Exception:  # a template that cannot render a point it accepts: not this one (the search logs it)
            continue
        if isinstance(rendered, Extracted) and rendered.header.render() == head and _code_lines(rendered.body) == code:
            return t, point
    return None


def _specialised(name: str | None, op: Op) -> Template | None:
    """The template ``name`` (a :func:`_template_of` answer) when it is a specialised one, else None."""
    t = get_template(op, name) if name is not None else None
    return t if t is not None and t.specialised else None


def baked_facts(template: Template, point: dict[str, int], card: MatrixCard) -> str | None:
    """The block of facts a specialised ``template`` bakes in for ``card`` at ``point`` (a point the
    template's check accepts for the card), collapsed as :func:`specialised_facts` gives a sample's;
    None when the rendered kernel cannot be read."""
    rendered = _parts(template.render(point, card), template.op)
    return None if rendered is None else _facts(rendered[1])


def _card_point(parts: tuple[Header, str] | None, op: Op, card: MatrixCard | None,
                template: str | None) -> tuple[Template, dict[str, int]] | None:
    """(the specialised template, the point its header names) of a completion already read (:func:`_parts`)
    whose body is ``template``'s (:func:`_template_of`), when that point is one the template's check accepts
    for ``card``; None otherwise (no card, no specialised template, no such point)."""
    t = _specialised(template, op)
    if card is None or t is None:
        return None
    point = _point(t, parts[0])
    if point is None or t.check(point, card, 32 if op is Op.SPMM else None) is not None:  # SpMM: a k every vec divides
        return None
    return t, point


def _facts_as_card(parts: tuple[Header, str] | None, op: Op, card: MatrixCard | None,
                   template: str | None) -> bool | None:
    """:func:`facts_as_card` of a completion already read (:func:`_parts`) whose body is ``template``'s
    (:func:`_template_of`)."""
    found = _card_point(parts, op, card, template)
    if found is None:
        return None
    baked = baked_facts(*found, card)
    return baked is not None and _facts(parts[1]) == baked


def facts_as_card(text: str, op: Op | str, card: MatrixCard | None) -> bool | None:
    """For a completion whose body (facts aside) is a specialised template's: True when its block of
    facts is the one that template bakes in for ``card`` at the completion's own numbers (its PARAMS and
    FORMAT line read as the template's parameters), False when it is another (copied from elsewhere,
    miscounted, garbled). None when there is no card, the body is no specialised template's, or its
    numbers are not a valid point of the template for this card. Compared as :func:`_parts` reads code
    (comments dropped, whitespace collapsed); nothing is compiled or run."""
    op = Op(op)
    parts = _parts(text, op)
    return _facts_as_card(parts, op, card, _template_of(parts, op))


def fill_facts(text: str, op: Op | str, card: MatrixCard | None) -> str | None:
    """A completion that is a specialised template's kernel at its own numbers but for its block of facts,
    with the card's facts instead: the template rendered at the completion's numbers (its PARAMS and FORMAT
    line) for ``card``. None when there is nothing to fill: no card, the body is no specialised template's,
    its numbers are not a point the template's check accepts for the card, its header (LAUNCH lines
    included) is not the one the template writes at that point, or its facts are the card's already.
    Comments and spacing are the template's, which the harness does not read; nothing else differs
    (compared as :func:`_parts` reads code). The filled kernel is judged like any other: this chooses
    no numbers and skips no check, it only writes what the card already says."""
    op = Op(op)
    parts = _parts(text, op)
    found = _card_point(parts, op, card, _template_of(parts, op))
    if found is None:
        return None
    t, point = found
    filled = t.render(point, card)
    got = _parts(filled, op)
    if (got is None or got[0].render() != parts[0].render() or _without_facts(got[1]) != _without_facts(parts[1])
            or _facts(got[1]) == _facts(parts[1])):
        return None
    return filled


def specialised_facts(text: str, op: Op | str) -> tuple[str, str] | None:
    """(template name, its block of facts as written, collapsed) when ``text``'s body, facts aside, is a
    specialised template's body; else None. Two samples or teacher rows with the same block taught or
    wrote the same facts."""
    op = Op(op)
    parts = _parts(text, op)
    t = _specialised(_template_of(parts, op), op)
    return None if t is None else (t.name, _facts(parts[1]))


def template_body(text: str, op: Op | str) -> str | None:
    """The template whose body (facts aside) ``text``'s is, or None (see the module docstring)."""
    op = Op(op)
    return _template_of(_parts(text, op), op)


def _template_of(parts: tuple[Header, str] | None, op: Op) -> str | None:
    """:func:`template_body` of a completion already read (:func:`_parts`)."""
    return None if parts is None else _template_bodies(op).get(_without_facts(parts[1]))


def _first_line(message: str) -> str:
    return (message or "").strip().split("\n", 1)[0]


def message_shape(message: str) -> str:
    """A harness message with what varies from kernel to kernel taken out (quoted names, numbers),
    so that failures of one cause count together: its first line, quoted text as '…', numbers as N."""
    first = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'…'", _first_line(message))
    return re.sub(r"\d+(\.\d+)?", "N", first)[:160]


@dataclass
class _TemplateTally:
    """The samples of one system and class whose body is one template's: how many, how many correct, and, for a
    specialised template's samples given their card (:func:`facts_as_card`), how many had their facts compared,
    how many had the card's, and how many of those were correct."""

    samples: int = 0
    correct: int = 0
    facts_compared: int = 0
    facts_as_card: int = 0
    facts_as_card_correct: int = 0

    def add(self, correct: bool, facts_right: bool | None) -> None:
        self.samples += 1
        self.correct += bool(correct)
        self.facts_compared += facts_right is not None
        self.facts_as_card += facts_right is True
        self.facts_as_card_correct += facts_right is True and bool(correct)


@dataclass
class _Tally:
    """One system's samples of one class."""

    samples: int = 0
    correct: int = 0
    failures: Counter = field(default_factory=Counter)
    """Verdict kind -> samples not correct with it."""
    shapes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    """Verdict kind -> :func:`message_shape` -> samples."""
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    """(kind, shape) -> the first message of that shape, its first line."""
    template_bodies: dict[str, _TemplateTally] = field(default_factory=dict)
    """Template name -> the counts of the samples whose body is that template's (``new`` only)."""

    def add(self, correct: bool, verdict: str | None, message: str | None, template: str | None = None,
            facts_right: bool | None = None) -> None:
        self.samples += 1
        self.correct += bool(correct)
        if template is not None:
            self.template_bodies.setdefault(template, _TemplateTally()).add(correct, facts_right)
        if correct or not verdict:
            return
        self.failures[verdict] += 1
        if message:
            shape = message_shape(message)
            self.shapes[verdict][shape] += 1
            self.examples.setdefault((verdict, shape), _first_line(message)[:240])

    def as_dict(self, top: int) -> dict:
        return {"samples": self.samples, "correct": self.correct, "failures": dict(self.failures.most_common()),
                "template_bodies": {t: asdict(got) for t, got in sorted(self.template_bodies.items())},
                "messages": {kind: [{"shape": shape, "count": n, "example": self.examples[kind, shape]}
                                    for shape, n in shapes.most_common(top)] for kind, shapes in self.shapes.items()}}


def library_match_table(samples: Iterable[tuple], op: Op | str, top_messages: int = 2) -> dict[str, dict[str, dict]]:
    """Per system, per class: how many samples, how many of them correct, and the samples that were
    not correct by the harness's verdict (``failures``: kind -> count, most common first; ``messages``:
    kind -> its ``top_messages`` most common :func:`message_shape` s with a count and one example).

    ``samples`` are (system, completion, correct) triples, (system, completion, correct, verdict)
    with the harness's verdict (an ``ErrorKind`` value), (..., verdict, message) with its message, or
    (..., message, card) with the sample's matrix card, which counts the specialised templates' bodies
    whose facts are the card's (:func:`facts_as_card`); every class appears for every system (zeros
    included), so tables of different runs line up."""
    tallies: dict[str, dict[LibraryMatch, _Tally]] = defaultdict(lambda: {c: _Tally() for c in LibraryMatch})
    op = Op(op)
    for system, text, correct, *rest in samples:
        verdict = rest[0] if rest else None
        message = rest[1] if len(rest) > 1 else None
        card = rest[2] if len(rest) > 2 else None
        parts = _parts(text, op)  # read once: the class, the template of a new body, its facts
        kind = _match(parts, op)
        template = _template_of(parts, op) if kind is LibraryMatch.NEW else None
        facts = _facts_as_card(parts, op, card, template)
        tallies[system][kind].add(correct, verdict, message, template, facts)
    return {s: {c.value: t.as_dict(top_messages) for c, t in by.items()} for s, by in tallies.items()}


def markdown(table: dict[str, dict[str, dict]]) -> list[str]:
    """The table as markdown lines: samples and correct share of each class, per system."""
    if not table:
        return []
    cols = [c for c in LibraryMatch]
    lines = ["## Samples against the library", "",
             "Each sample is " + "; ".join(f"*{c.value}*: {DESCRIPTION[c]}" for c in cols)
             + ". Cells: samples (share of the system's samples), correct share among them.", "",
             "| system | " + " | ".join(c.value for c in cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for system, by in table.items():
        total = sum(v["samples"] for v in by.values()) or 1
        cells = []
        for c in cols:
            n, k = by[c.value]["samples"], by[c.value]["correct"]
            cells.append(f"{n} ({100 * n / total:.0f}%), {100 * k / n:.0f}% correct" if n else "0")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    for system, by in table.items():  # the new bodies that are a template's
        bodies = by.get(LibraryMatch.NEW.value, {}).get("template_bodies") or {}
        if bodies:
            n_new = by[LibraryMatch.NEW.value]["samples"]
            told = ", ".join(f"{t} {v['samples']} ({v['correct']} correct" + _facts_told(v) + ")" for t, v in bodies.items())
            rest = n_new - sum(v["samples"] for v in bodies.values())
            lines += ["", f"New bodies that are a search template's body, its facts aside ({system}): {told}; "
                      f"the other {rest} are no template's body exactly (code of the policy's own, or a body altered)."]
    for system, by in table.items():  # why the samples that were not correct failed, class by class
        parts = [f"{c.value}: " + ", ".join(f"{kind} {n}" for kind, n in by[c.value]["failures"].items())
                 for c in cols if by[c.value].get("failures")]
        if parts:
            lines += ["", f"Not correct, by the harness's verdict ({system}): " + "; ".join(parts) + "."]
        said = [f"- {c.value}, {kind}: {m['count']} x `{m['example']}`"
                for c in cols for kind, ms in by[c.value].get("messages", {}).items() for m in ms]
        if said:
            lines += ["", f"The most common messages ({system}; each counts the messages of its shape, numbers and "
                      "quoted names aside):", ""] + said
    return lines


def _facts_told(v: dict) -> str:
    """'; facts as the card's in F of N, C of them correct' for a template whose samples' facts were
    compared with their cards ('' when none was)."""
    n = v.get("facts_compared")
    return (f"; facts as the card's in {v['facts_as_card']} of {n}, {v['facts_as_card_correct']} of them correct"
            if n else "")


def shares(by_class: dict[str, dict] | None) -> dict[str, float]:
    """``{CLASS}_share`` of one system's samples (from :func:`library_match_table`); {} when it drew none."""
    total = sum(v["samples"] for v in (by_class or {}).values())
    if not total:
        return {}
    return {f"{c.value}_share": by_class.get(c.value, {"samples": 0})["samples"] / total for c in LibraryMatch}
