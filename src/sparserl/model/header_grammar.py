"""Sampling a completion whose header follows the contract's grammar (opt-in).

A completion begins with its header (docs/contract.md)::

    FORMAT: NAME[ key=INT ...]
    [PARAMS: NAME=INT[, NAME=INT ...]]
    LAUNCH: grid=EXPR, block=EXPR[, smem=EXPR][, kernel=IDENT]
    [LAUNCH: ...]

then the code. A small model writes malformed headers (an unknown format name, a LAUNCH line that swallows
the kernel's signature), and each such sample is lost before the GPU. With a grammar, the sampler draws
every header token only among the tokens that keep the header a prefix of this grammar; from the first
character after the header (a line that does not start a LAUNCH line) every token is allowed, so the code
is sampled as before.

How: :class:`HeaderGrammar` runs a character-level automaton (:func:`step`) over each token's text from
each reachable state, once per tokenizer, and keeps two tables on the device: which tokens each state
allows (``allowed``, (S, V) bool) and where each leads (``trans``, (S, V)). :class:`HeaderConstraint`
holds one state per row; :func:`sparserl.model.sampling.sample_with_logp` masks the logits with the
row's allowed tokens before drawing and moves the state by the drawn token: two gathers, no host
synchronisation, so the decode step stays capturable in a CUDA graph.

What it does not do: names (a LAUNCH expression's names, a kernel name that the code must define) are
checked by the contract's parser after sampling, as before; the grammar is the header's shape only. The
log-probabilities the sampler returns are those of the masked distribution. RL's learner computes
unmasked ones, so RL rollouts never use a grammar (the policy-gradient ratio would be off on header
tokens); it is for evaluation, generation and the search's proposals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sparserl.kernels.contract import FORMATS, MAX_LAUNCHES, MAX_PARAMS

log = logging.getLogger(__name__)

MAX_DEPTH = 4
"""Deepest parentheses in a LAUNCH expression (the library's deepest is 2)."""

DONE = ("done",)
"""The header has ended: every token is allowed from here on."""
START = ("lit", "FORMAT: ", 0, ("fname", ""))

_IDENT0 = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT = _IDENT0 | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_OPS = frozenset("+-*/%<>=!&|^?:~")
_FORMAT_KEYS = {name: tuple(p.name for p in spec.params) for name, spec in FORMATS.items()}

State = tuple


def _lit(text: str, then: State) -> State:
    return ("lit", text, 0, then)


def _line_start(after_format: bool, launches: int) -> State:
    """The start of a header line: PARAMS (only right after FORMAT) or LAUNCH; after a LAUNCH line,
    anything else ends the header."""
    return ("line", after_format, launches)


def _expr(field: str, launches: int, mode: str = "operand", depth: int = 0) -> State:
    return ("expr", field, launches, mode, depth)


def step(state: State, ch: str) -> State | None:
    """The state after ``ch``, or None where the header cannot continue with it. ``DONE`` stays ``DONE``."""
    kind = state[0]
    if kind == "done":
        return state
    if kind == "lit":
        _, text, i, then = state
        if ch != text[i]:
            return None
        return then if i + 1 == len(text) else ("lit", text, i + 1, then)
    if kind == "fname":  # FORMAT: NAME
        name = state[1] + ch
        if any(f.startswith(name) for f in FORMATS):
            return ("fname", name)
        if state[1] in FORMATS:
            if ch == " ":
                return ("fkey", state[1], "")
            if ch == "\n":
                return _line_start(True, 0)
        return None
    if kind == "fkey":  # a FORMAT parameter's key, then '='
        _, fmt, key = state
        if ch == "=" and key in _FORMAT_KEYS[fmt]:
            return ("fval", fmt, "")
        if any(k.startswith(key + ch) for k in _FORMAT_KEYS[fmt]):
            return ("fkey", fmt, key + ch)
        return None
    if kind == "fval":  # its integer value
        _, fmt, val = state
        if ch in _DIGITS or (ch == "-" and val == ""):
            return ("fval", fmt, "-" if ch == "-" else "0")  # "0": a digit was seen (the value is not kept)
        if val == "0" and ch == " ":
            return ("fkey", fmt, "")
        if val == "0" and ch == "\n":
            return _line_start(True, 0)
        return None
    if kind == "line":
        _, after_format, launches = state
        if ch == "P" and after_format:
            return ("lit", "PARAMS: ", 1, ("pname", 0, False))
        if ch == "L" and launches < MAX_LAUNCHES:
            return ("lit", "LAUNCH: ", 1, _lit("grid=", _expr("grid", launches)))
        if launches == 0:
            return None  # a header needs a LAUNCH line
        return DONE  # the first character after the header (this character is the code's)
    if kind == "pname":  # PARAMS: NAME=INT, ... (count: names so far)
        _, count, started = state
        if ch in (_IDENT if started else _IDENT0):
            return ("pname", count, True)
        if ch == "=" and started:
            return ("pval", count + 1, False)
        if ch == " " and not started:
            return state
        return None
    if kind == "pval":
        _, count, seen = state
        if ch in _DIGITS or (ch == "-" and not seen):
            return ("pval", count, ch != "-")
        if seen and ch == "," and count < MAX_PARAMS:
            return ("pname", count, False)
        if seen and ch == "\n":
            return ("lit", "LAUNCH: ", 0, _lit("grid=", _expr("grid", 0)))
        return None
    if kind == "expr":
        return _expr_step(state, ch)
    if kind == "sep":  # after a LAUNCH field's comma: spaces, then the next field's key
        _, done_field, launches = state
        if ch == " ":
            return state
        if done_field == "grid" and ch == "b":
            return ("lit", "block=", 1, _expr("block", launches))
        if done_field == "block" and ch == "s":
            return ("lit", "smem=", 1, _expr("smem", launches))
        if done_field in ("block", "smem") and ch == "k":
            return ("lit", "kernel=", 1, ("kid", launches, False))
        return None
    if kind == "kid":  # kernel=IDENT
        _, launches, started = state
        if ch in (_IDENT if started else _IDENT0):
            return ("kid", launches, True)
        if started and ch == "\n":
            return _line_start(False, launches + 1)
        return None
    raise AssertionError(state)


def _expr_step(state: State, ch: str) -> State | None:
    """A LAUNCH expression: operands (names, integers, calls, parentheses) joined by operators; a
    comma at depth 0 ends the field, a newline at depth 0 the line (after block, smem)."""
    _, field, launches, mode, depth = state
    if mode == "ident" and ch in _IDENT:
        return state
    if mode == "num" and ch in _DIGITS:
        return state
    if mode == "ident" and ch == "(":
        return _expr(field, launches, "operand", depth + 1) if depth < MAX_DEPTH else None
    if mode == "operand":
        if ch == " " or ch in _OPS:
            return state
        if ch in _IDENT0:
            return _expr(field, launches, "ident", depth)
        if ch in _DIGITS:
            return _expr(field, launches, "num", depth)
        if ch == "(":
            return _expr(field, launches, "operand", depth + 1) if depth < MAX_DEPTH else None
        return None
    # after an operand (mode "ident", "num" or "after")
    if ch == " ":
        return _expr(field, launches, "after", depth)
    if ch in _OPS:
        return _expr(field, launches, "operand", depth)
    if ch == ")" and depth > 0:
        return _expr(field, launches, "after", depth - 1)
    if ch == "," and depth > 0:
        return _expr(field, launches, "operand", depth)
    if ch == "," and depth == 0:
        return ("sep", field, launches)
    if ch == "\n" and depth == 0 and field != "grid":
        return _line_start(False, launches + 1)
    return None


def run(state: State | None, text: str) -> State | None:
    """``step`` over every character of ``text`` (None once it cannot continue)."""
    for ch in text:
        if state is None or state == DONE:
            return state
        state = step(state, ch)
    return state


@dataclass
class HeaderGrammar:
    """The header automaton lifted to a tokenizer's tokens: ``allowed`` (S, V) bool and ``trans``
    (S, V) int32, state 0 the start and state ``done`` the end of the header (every token allowed)."""

    allowed: torch.Tensor
    trans: torch.Tensor
    start: int
    done: int
    states: int
    build_seconds: float

    @classmethod
    def build(cls, token_texts: Sequence[str | None], eos_id: int | None = None) -> "HeaderGrammar":
        """From each token id's text (None: a special token, or one that is not whole characters).
        ``eos_id`` may end a completion only after its header."""
        t0 = time.perf_counter()
        by_first: dict[str, list[tuple[int, str]]] = {}
        for tid, text in enumerate(token_texts):
            if text and "\ufffd" not in text:
                by_first.setdefault(text[0], []).append((tid, text))
        index: dict[State, int] = {START: 0}
        order: list[State] = [START]
        edges: list[dict[int, State]] = []
        memo: dict[tuple[State, str], State | None] = {}

        def advance(state: State, ch: str) -> State | None:
            key = (state, ch)
            if key not in memo:
                memo[key] = step(state, ch)
            return memo[key]

        i = 0
        while i < len(order):
            state, out = order[i], {}
            if state != DONE:
                for first, tokens in by_first.items():
                    if advance(state, first) is None:
                        continue
                    for tid, text in tokens:
                        s: State | None = state
                        for ch in text:
                            s = advance(s, ch)
                            if s is None or s == DONE:
                                break
                        if s is not None:
                            out[tid] = s
                            if s not in index:
                                index[s] = len(order)
                                order.append(s)
            edges.append(out)
            i += 1
        if DONE not in index:
            index[DONE] = len(order)
            order.append(DONE)
            edges.append({})
        # states from which no token leads on (a dead end at a token boundary) are pruned, repeatedly
        alive = [bool(e) or s == DONE for s, e in zip(order, edges)]
        changed = True
        while changed:
            changed = False
            for k, e in enumerate(edges):
                if order[k] == DONE or not alive[k]:
                    continue
                if not any(alive[index[s]] for s in e.values()):
                    alive[k], changed = False, True
        V, S = len(token_texts), len(order)
        allowed = torch.zeros(S, V, dtype=torch.bool)
        trans = torch.zeros(S, V, dtype=torch.int32)  # half the memory of long (a 151k vocabulary: 4 bytes x S x V)
        for k, e in enumerate(edges):
            for tid, s in e.items():
                if alive[index[s]]:
                    allowed[k, tid] = True
                    trans[k, tid] = index[s]
        d = index[DONE]
        allowed[d] = True
        trans[d] = d
        if eos_id is not None:  # a completion ends after its header, never inside it
            allowed[:, eos_id] = False
            allowed[d, eos_id] = True
        if not alive[0]:
            raise ValueError("no token sequence spells a header with this tokenizer")
        return cls(allowed, trans, 0, d, S, time.perf_counter() - t0)

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "HeaderGrammar":
        """The grammar for a Hugging Face tokenizer (cached per tokenizer object)."""
        cached = _CACHE.get(id(tokenizer))
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        special = set(tokenizer.all_special_ids)
        V = len(tokenizer)
        texts: list[str | None] = [None if tid in special else tokenizer.decode([tid]) for tid in range(V)]
        g = cls.build(texts, tokenizer.eos_token_id)
        log.info("header grammar: %d states over %d tokens in %.1f s", g.states, V, g.build_seconds)
        _CACHE[id(tokenizer)] = (tokenizer, g)
        return g

    def constraint(self, rows: int, device: torch.device | str) -> "HeaderConstraint":
        """A fresh per-row state for a batch of ``rows`` completions."""
        dev = torch.device(device)
        if self.allowed.device != dev:
            self.allowed, self.trans = self.allowed.to(dev), self.trans.to(dev)
        return HeaderConstraint(self, torch.full((rows,), self.start, dtype=torch.long, device=dev))


_CACHE: dict[int, tuple[object, HeaderGrammar]] = {}


@dataclass
class HeaderConstraint:
    """One batch's header states (global row order; the bucketed engine passes its running rows)."""

    grammar: HeaderGrammar
    state: torch.Tensor

    def mask(self, logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``logits`` (B, V) with the tokens the rows' states forbid at -inf."""
        st = self.state if rows is None else self.state.index_select(0, rows)
        return logits.masked_fill(~self.grammar.allowed.index_select(0, st), float("-inf"))

    def advance(self, tokens: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Move each row's state by its drawn token, in place."""
        if rows is None:
            self.state.copy_(self.grammar.trans[self.state, tokens].long())
        else:
            self.state.index_copy_(0, rows, self.grammar.trans[self.state.index_select(0, rows), tokens].long())

    def finished_header(self) -> torch.Tensor:
        """(B,) bool: which rows have left their header."""
        return self.state == self.grammar.done

    def reset(self) -> None:
        """Every row back at the header's start (an engine that failed after drawing, before another)."""
        self.state.fill_(self.grammar.start)

    def logits_processor(self) -> "_HFProcessor":
        """The same constraint as a ``transformers`` logits processor, for ``model.generate()``
        (its custom processors run with its temperature and top-k/top-p warpers; at top-k 0 and
        top-p 1, the defaults, the distribution is the same as the other engines')."""
        return _HFProcessor(self)


class _HFProcessor:
    """Moves the constraint by the token ``generate()`` appended since the last call, then masks."""

    def __init__(self, constraint: HeaderConstraint):
        self.c, self.last = constraint, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        if self.last is not None and n > self.last:
            self.c.advance(input_ids[:, -1].to(self.c.state.device))
        self.last = n
        return self.c.mask(scores)
