"""Kernels name their parameters once: every library strategy and every template is one body shared
by all its variants, which differ only in their FORMAT and PARAMS lines (and, for a specialised
template that spells its facts, in the block of facts at the top of the code; one that names them,
``MATRIX_DIA_RUNS`` and the like, is one text for every matrix and the harness writes the facts)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from sparserl.harness.matrix_facts import materialise
from sparserl.kernels.contract import Op
from sparserl.kernels.library import all_variants
from sparserl.kernels.templates import templates
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card


SPELT, NAMED = "// Specialised to this matrix", "// Specialised to the matrix"
"""How the facts block of a template that spells its facts begins, and of one that names them."""


def _parts(text: str) -> list[str]:
    """Header, [facts,] body: the blank-line separated parts a rendering is made of."""
    second = text.split("\n\n", 2)[1]
    return text.split("\n\n", 2) if second.startswith((SPELT, NAMED)) else text.split("\n\n", 1)


def test_every_library_strategy_is_one_body_and_one_set_of_launch_lines() -> None:
    """Kills: a strategy that formats a tunable into its code or its LAUNCH lines again."""
    bodies, launches = defaultdict(set), defaultdict(set)
    for v in all_variants():
        head, body = v.render().split("\n\n", 1)
        bodies[(v.op, v.strategy)].add(body)
        launches[(v.op, v.strategy)].add(tuple(l for l in head.splitlines() if l.startswith("LAUNCH:")))
        lines = head.splitlines()
        assert lines[1] == "PARAMS: " + ", ".join(f"{k.upper()}={val}" for k, val in v.tunables), v.id
    assert {k: len(b) for k, b in bodies.items() if len(b) != 1} == {}
    assert {k: len(b) for k, b in launches.items() if len(b) != 1} == {}
    assert len(bodies) == 22  # 14 SpMV and 8 SpMM strategies


@pytest.fixture(scope="module")
def cards() -> dict:
    mats = {
        "stencil2d": generate("stencil2d", 4900, seed=1),
        "banded_odd": generate("banded", 4003, seed=1, bands=9),
        "block8": generate("block", 4000, seed=1, block=8, blocks_per_row=4),
        "block2_cut": generate("block", 2002, cols=1501, seed=1, block=2, blocks_per_row=5),
        "powerlaw": generate("powerlaw", 6000, seed=1),
        "skewed": generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002),
        "random": generate("random", 3001, seed=1, nnz_per_row=16),
        "rectangular": generate("rectangular", 1000, seed=1, nnz_per_row=6),
    }
    return {name: matrix_card(A) for name, A in mats.items()}


def test_every_template_is_one_body_over_its_points_and_matrices(cards) -> None:
    """Kills: a template whose code changes with a parameter or a matrix outside its facts block, and a template
    that names its facts whose text still changes with the matrix (or whose facts, as the harness writes them,
    do not)."""
    named = set()
    for t in templates():
        k = 8 if t.op is Op.SPMM else None
        bodies, facts, judged = set(), set(), set()
        for card in cards.values():
            for p in t.seeds(card, k)[:4]:
                text = t.render(p, card)
                parts = _parts(text)
                bodies.add(parts[-1])
                if t.specialised:
                    assert len(parts) == 3 and parts[1].startswith((SPELT, NAMED)), t.name
                    facts.add(parts[1])
                    mark = SPELT if parts[1].startswith(SPELT) else NAMED
                    judged.add(materialise(text, t.op, card).split(mark)[0][len(text.split(mark)[0]):])  # definitions
                    if parts[1].startswith(NAMED):
                        named.add(t.name)
        assert len(bodies) == 1, (t.op.value, t.name, len(bodies))
        if t.name in named:  # one text; the definitions the harness writes above it change with the matrix
            assert len({f.split("\n")[-1] for f in facts}) == 1 and len(judged) > 1, t.name
        else:
            assert not t.specialised or len(facts) > 1, t.name  # the facts do change with the matrix
    assert named == {"dia_window_spec", "bsr_stream_spec", "csr_lanes_spec", "csr_split_spec"}


def test_facts_blocks_hold_only_constants_and_initialised_constant_tables(cards) -> None:
    decl = re.compile(r"^(// .*|constexpr (int|bool) \w+( = [^;]+)?(, \w+ = [^;]+)*;.*"
                      r"|(__constant__|__device__ constexpr) int \w+\[\w*\] = \{[-0-9, ]*(\};.*)?|[-0-9, ]+,?|\};.*)$")
    seen = 0
    for t in templates():
        if not t.specialised:
            continue
        for card in cards.values():
            for p in t.seeds(card)[:2]:
                block = _parts(t.render(p, card))[1]
                bad = [l for l in block.splitlines() if not decl.match(l.strip())]
                assert bad == [], (t.name, bad)
                seen += 1
    assert seen >= 8
