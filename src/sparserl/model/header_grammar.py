"""Sampling a completion whose header follows the contract's grammar (opt-in).

A completion begins with its header (docs/contract.md)::

    FORMAT: NAME[ key=INT ...]
    [PARAMS: NAME=INT[, NAME=INT ...]]
    LAUNCH: grid=EXPR, block=EXPR[, smem=EXPR][, kernel=IDENT]
    [LAUNCH: ...]

then the code. A small model writes malformed headers (an unknown format name, a LAUNCH line that swallows
the kernel's signature), and each such sample is lost before the GPU. With a grammar, the sampler draws
every header token only among the tokens that keep the header a prefix of this grammar; from the first
character after the header (a line that does not start a LAUNCH line) the code is sampled as before but for
two rules that no kernel the project writes breaks, nor any correct sample seen (1002 of them): printable ASCII
and whitespace only, the static check's rule (it refuses other characters outside comments, and accepts them in
comments, which the project's kernels never need; a byte-level tokenizer's fragments of a character that is not
ASCII decode to U+FFFD, which policies wrote), and no
run of more than :data:`MAX_DIGIT_RUN` digits (a policy wrote a DIA offsets block with a number of 180 digits,
and on until its token budget ran out; a 64-bit integer has at most 19 digits, a float literal may have more).

How: :class:`HeaderGrammar` runs a character-level automaton (:func:`step`) over each token's text from
each reachable state, once per tokenizer, and keeps two tables on the device: which tokens each state
allows (``allowed``, (S, V) bool) and where each leads (``trans``, (S, V)). :class:`HeaderConstraint`
holds one state per row; :func:`sparserl.model.sampling.sample_with_logp` masks the logits with the
row's allowed tokens before drawing and moves the state by the drawn token: two gathers, no host
synchronisation, so the decode step stays capturable in a CUDA graph.

FORMAT values: SELL's ``C`` and ``sigma`` are held to the contract's rule (sigma 1 or a multiple of C), within
a table of powers of two (:func:`_sell_table`): policies wrote ``C=128 sigma=1028``
and ``C=8 sigma=2``, each a sample lost before the GPU. Every other FORMAT value is held to its range's count of
digits (``BSR ... C=1024`` is refused, ``C=99`` left to the parser), and no FORMAT value is negative.

What it does not do: names (a LAUNCH expression's names, a kernel name that the code must define) are checked
by the contract's parser after sampling, as before; the grammar is the header's shape and SELL's values, and a
little looser than the parser (which still judges every sample): it does not count LAUNCH lines (at most four),
a tuple's dimensions (at most three, for grid and block only), a call's arguments, or check PARAMS names
against C++ keywords and values against a C int, nor FORMAT values other than SELL's beyond their digits (BSR's
R*C at most 1024). It is also a little stricter in spelling: the fields of a LAUNCH line in the library's
order (grid, block, smem, kernel), one space after each ``FORMAT:``, ``PARAMS:`` and ``LAUNCH:`` and none
around ``=``, upper-case format names, SELL's keys in the order C, sigma and nothing after sigma's value but the
line's end, SELL's C a power of two (:data:`SELL_C`) and sigma at most :data:`SELL_SIGMA_MAX` and C times a
power of two, and code after the header never starting with ``L`` on the line right after a LAUNCH line (it
would be read as another LAUNCH line). The log-probabilities the sampler returns are those of the masked
distribution. RL's learner computes unmasked ones, so RL rollouts never use a grammar (the
policy-gradient ratio would be off on header tokens); it is for evaluation, generation and the search's
proposals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from sparserl.kernels.contract import FORMATS, MAX_PARAMS

log = logging.getLogger(__name__)

MAX_DEPTH = 4
"""Deepest parentheses in a LAUNCH expression (the library's deepest is 2)."""

DONE = ("done",)
"""The header has ended: the code's state with no digit just written (``("code", d)``: d digits in a row)."""
MAX_DIGIT_RUN = 20
"""The most digits in a row the code may have (a 64-bit integer's 19, and one to spare)."""
START = ("lit", "FORMAT: ", 0, ("fname", ""))

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_IDENT0 = _LETTERS | {"_"}
_IDENT = _IDENT0 | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_BINARY = frozenset("+-*/%")
"""The operators a LAUNCH expression may use (``sparserl.kernels.launch``): binary ``+ - * / %`` (and ``//``),
unary ``-`` and ``+``."""
_UNARY = frozenset("+-")
_CALLS = ("ceil_div", "min", "max")
"""The functions a LAUNCH expression may call."""
_FORMAT_KEYS = {name: tuple(p.name for p in spec.params) for name, spec in FORMATS.items()}

State = tuple


def _lit(text: str, then: State) -> State:
    return ("lit", text, 0, then)


def _line_start(after_format: bool, has_launch: bool) -> State:
    """The start of a header line: PARAMS (only right after FORMAT) or LAUNCH; after a LAUNCH line,
    anything else ends the header. Only whether a LAUNCH line was written is kept (not how many: the
    parser's limit of four is left to it, which keeps the automaton a quarter of the size)."""
    return ("line", after_format, has_launch)


def _expr(field: str, mode: str | tuple = "operand", depth: int = 0) -> State:
    return ("expr", field, mode, depth)


def in_code(state: State | None) -> bool:
    """Whether ``state`` is past the header (``DONE`` or a run of digits in the code)."""
    return state is not None and state[0] in ("done", "code")


def _ends_header(state: State, ch: str) -> bool:
    """Whether ``ch`` at the start of a line (a ``line`` state) is the code's first character: after a LAUNCH
    line, anything but another LAUNCH line (or PARAMS, right after FORMAT)."""
    _, after_format, has_launch = state
    return has_launch and ch != "L" and not (ch == "P" and after_format)


def _code_char(ch: str) -> bool:
    """A character the code may hold: printable ASCII or whitespace (``harness.source``'s rule outside comments)."""
    return 32 <= ord(ch) <= 126 or ch in "\n\t\f\v\r"


def _code_step(state: State, ch: str) -> State | None:
    """The code after the header: :func:`_code_char` only, and no more than :data:`MAX_DIGIT_RUN` digits in a
    row."""
    if not _code_char(ch):
        return None
    if ch in _DIGITS:
        run_ = (state[1] if state[0] == "code" else 0) + 1
        return ("code", run_) if run_ <= MAX_DIGIT_RUN else None
    return DONE


def step(state: State, ch: str) -> State | None:
    """The state after ``ch``, or None where the completion cannot continue with it (the header's grammar, then
    the code's two rules: :func:`_code_step`)."""
    kind = state[0]
    if kind in ("done", "code"):
        return _code_step(state, ch)
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
                return ("fkey", state[1], "", ())
            if ch == "\n":
                return _line_start(True, False)
        return None
    if kind == "fkey":  # a FORMAT parameter's key, then '='
        _, fmt, key, seen = state
        if ch == " " and key == "":
            return state
        if ch == "=" and key in _FORMAT_KEYS[fmt] and _may_follow(fmt, key, seen):
            return ("fval", fmt, key, "", seen)
        if any(k.startswith(key + ch) and _may_follow(fmt, k, seen) for k in _FORMAT_KEYS[fmt]):
            return ("fkey", fmt, key + ch, seen)
        return None
    if kind == "fval":  # its integer value (see _format_value), then spaces or a comma before the next key, or the end
        _, fmt, key, digits, seen = state
        if ch in _DIGITS:
            nxt = _format_digits(fmt, key, digits, ch, seen)
            return None if nxt is None else ("fval", fmt, key, nxt, seen)
        if not digits or not _format_value(fmt, key, digits, seen):
            return None
        seen = _seen(fmt, seen, key, digits)
        if ch in " ," and not (fmt in _TABLES and key == _FORMAT_KEYS[fmt][-1]):  # a table format's last key ends it
            return ("fsep", fmt, ch == ",", seen)
        if ch == "\n":
            return _line_start(True, False)  # keys left out keep their defaults: in the table
        return None
    if kind == "fsep":  # after a value: spaces, or one comma, then the next key; or the line's end
        _, fmt, comma, seen = state
        if ch == " ":
            return state
        if ch == "," and not comma:
            return ("fsep", fmt, True, seen)
        if ch == "\n" and not comma:
            return _line_start(True, False)  # keys left out keep their defaults: in the table
        if ch in _IDENT0:
            return step(("fkey", fmt, "", seen), ch)
        return None
    if kind == "line":
        if _ends_header(state, ch):
            return _code_step(DONE, ch)  # the first character after the header (this character is the code's)
        if ch == "P" and state[1]:
            return ("lit", "PARAMS: ", 1, ("pname", 0, False))
        if ch == "L":
            return ("lit", "LAUNCH: ", 1, _lit("grid=", _expr("grid")))
        return None  # a header needs a LAUNCH line
    if kind == "pname":  # PARAMS: NAME=INT, ... (count: names so far; a name never starts with '_')
        _, count, started = state
        if ch in (_IDENT if started else _LETTERS):
            return ("pname", count, True)
        if ch == "=" and started:
            return ("pval", count + 1, "start")
        if ch == " " and not started:
            return state
        return None
    if kind == "pval":
        _, count, val = state
        nxt = _integer(val, ch)
        if nxt is not None:
            return ("pval", count, nxt)
        if val in ("zero", "digits") and ch == "," and count < MAX_PARAMS:
            return ("pname", count, False)
        if val in ("zero", "digits") and ch == "\n":
            return ("lit", "LAUNCH: ", 0, _lit("grid=", _expr("grid")))
        return None
    if kind == "expr":
        return _expr_step(state, ch)
    if kind == "sep":  # after a LAUNCH field's comma: spaces, then the next field's key
        _, done_field = state
        if ch == " ":
            return state
        if done_field == "grid" and ch == "b":
            return ("lit", "block=", 1, _expr("block"))
        if done_field == "block" and ch == "s":
            return ("lit", "smem=", 1, _expr("smem"))
        if done_field in ("block", "smem") and ch == "k":
            return ("lit", "kernel=", 1, ("kid", False))
        return None
    if kind == "kid":  # kernel=IDENT
        _, started = state
        if ch in (_IDENT if started else _IDENT0):
            return ("kid", True)
        if started and ch == "\n":
            return _line_start(False, True)
        return None
    raise AssertionError(state)


def _integer(val: str, ch: str) -> str | None:
    """An integer as the contract writes one, ``-?(0|[1-9][0-9]*)``: the next of the states "start",
    "sign", "zero", "digits" after ``ch``, or None where ``ch`` does not continue the number."""
    if val == "start" and ch == "-":
        return "sign"
    if val in ("start", "sign"):
        return "zero" if ch == "0" else "digits" if ch in _DIGITS else None
    if val == "digits" and ch in _DIGITS:
        return "digits"
    return None


SELL_C = tuple(1 << i for i in range(11))  # 1, 2, 4, ..., 1024: every power of two of the contract's range
SELL_SIGMA_MAX = 8192


def _sell_table() -> frozenset[tuple[tuple[str, int], ...]]:
    """SELL's (C, sigma) in the grammar: C one of :data:`SELL_C`, sigma 1 or C times a power of two up to
    :data:`SELL_SIGMA_MAX` (the contract allows any C up to 1024 and sigma 1 or any multiple of C up to 2^20; the
    library and the search use powers of two, sigma at most 4096, and a policy's correct ``C=2`` is in). A
    finite table, so that sigma's rule can be held in the state, and a small one, so that the automaton stays
    small (sigma up to 2^20 would take it from about 880 states to about 1260)."""
    return frozenset((("C", c), ("sigma", s)) for c in SELL_C
                     for s in (1,) + tuple(c << j for j in range(14) if c << j <= SELL_SIGMA_MAX))


_TABLES: dict[str, frozenset[tuple[tuple[str, int], ...]]] = {"SELL": _sell_table()}
"""Formats whose parameters are held jointly: every allowed assignment, all keys given. The state carries the
values written so far (``seen``); the other formats' values are held only to their count of digits."""

assert all(p.lo >= 0 for spec in FORMATS.values() for p in spec.params), "a FORMAT value may be negative"
assert all(any(dict(b) == {p.name: dict(a)[p.name] if j < i else p.default for j, p in enumerate(FORMATS[f].params)}
               for b in t) for f, t in _TABLES.items() for a in t for i in range(len(FORMATS[f].params) + 1)), \
    "a table format's line may end after any key (the rest keep their defaults): each such assignment is in its table"


def _may_follow(fmt: str, key: str, seen: tuple) -> bool:
    """Whether ``key`` may be written after ``seen``: a table format's keys in the contract's order (SELL: C,
    then sigma), each at most once; the others' in any order (a key twice is the parser's to refuse)."""
    if fmt not in _TABLES:
        return True
    keys = _FORMAT_KEYS[fmt]
    return all(keys.index(k) < keys.index(key) for k, _ in seen)


@lru_cache(maxsize=None)
def _candidates(fmt: str, key: str, seen: tuple) -> frozenset[int] | None:
    """The values ``key`` may take after ``seen`` (a table format; a key before it that was left out has its
    default), or None (not a table format)."""
    table = _TABLES.get(fmt)
    if table is None:
        return None
    given = dict(seen)
    keys = _FORMAT_KEYS[fmt]
    for p in FORMATS[fmt].params[:keys.index(key)]:  # a key left out before this one keeps its default
        if p.name not in given and p.default is not None:
            given[p.name] = p.default
    return frozenset(dict(a)[key] for a in table if all(dict(a)[k] == v for k, v in given.items()))


def _format_digits(fmt: str, key: str, digits: str, ch: str, seen: tuple) -> str | None:
    """The value's digits after ``ch``, or None where no allowed value starts so: no leading zeros, and some
    candidate of a table format's key begins with them. Any other format's value is held only to the count of
    digits of its range's bound (BSR's R and C to two, HYB's width to five): the state keeps the smallest
    number of that many digits, not the digits, so that the automaton stays small (held value by value, BSR
    alone would add 130 states, each of which the lift walks every token from); the parser checks the range."""
    if digits == "0":
        return None
    d = digits + ch
    spec = FORMATS[fmt].param(key)
    cands = _candidates(fmt, key, seen)
    if cands is not None:
        return d if any(str(v).startswith(d) for v in cands) else None
    if d == "0":
        return d if spec.lo <= 0 else None
    return "1" + "0" * (len(d) - 1) if len(d) <= len(str(spec.hi)) else None  # the smallest number that long


def _format_value(fmt: str, key: str, digits: str, seen: tuple) -> bool:
    """Whether the value written (``digits``, as :func:`_format_digits` keeps them) is allowed."""
    spec = FORMATS[fmt].param(key)
    cands = _candidates(fmt, key, seen)
    return int(digits) in cands if cands is not None else spec.lo <= int(digits) <= spec.hi


def _seen(fmt: str, seen: tuple, key: str, digits: str) -> tuple:
    """``seen`` with ``key`` given (kept only for a table format)."""
    return tuple(sorted(seen + ((key, int(digits)),))) if fmt in _TABLES else ()


def _expr_step(state: State, ch: str) -> State | None:
    """A LAUNCH expression (``sparserl.kernels.launch``): operands (names, integers without leading
    zeros, calls of ceil_div, min and max, parentheses) joined by ``+ - * / % //``; a comma at depth 0
    ends the field, a newline at depth 0 the line (after block, smem). Mode "ident" carries the name
    so far while it may still be a function's (a tuple: ("ident", prefix)), "name" any other name."""
    _, field, mode, depth = state
    if isinstance(mode, tuple):  # ("ident", prefix): a name that may still become a callable one
        name = mode[1] + ch
        if ch in _IDENT:
            return _expr(field, ("ident", name) if any(f.startswith(name) for f in _CALLS) else "name",
                         depth)
        if ch == "(" and mode[1] in _CALLS:
            return _expr(field, "operand", depth + 1) if depth < MAX_DEPTH else None
        mode = "after"
    if mode == "name":
        if ch in _IDENT:
            return state
        mode = "after"
    if mode == "digits":
        if ch in _DIGITS:
            return state
        mode = "after"
    if mode == "zero":
        if ch in _DIGITS:
            return None  # a leading zero: not a decimal literal
        mode = "after"
    if mode in ("operand", "unary"):
        if ch == " " or (ch in _UNARY and mode == "operand"):
            return _expr(field, mode if ch == " " else "unary", depth)
        if ch in _IDENT0:
            return _expr(field, ("ident", ch) if any(f.startswith(ch) for f in _CALLS) else "name", depth)
        if ch in _DIGITS:
            return _expr(field, "zero" if ch == "0" else "digits", depth)
        if ch == "(":
            return _expr(field, "operand", depth + 1) if depth < MAX_DEPTH else None
        return None
    if mode == "slash":  # after '/': a second one is floor division
        if ch == "/":
            return _expr(field, "operand", depth)
        return _expr_step(_expr(field, "operand", depth), ch)
    # after an operand
    if ch == " ":
        return _expr(field, "after", depth)
    if ch == "/":
        return _expr(field, "slash", depth)
    if ch in _BINARY:
        return _expr(field, "operand", depth)
    if ch == ")" and depth > 0:
        return _expr(field, "after", depth - 1)
    if ch == "," and depth > 0:
        return _expr(field, "operand", depth)
    if ch == "," and depth == 0:
        return ("sep", field)
    if ch == "\n" and depth == 0 and field != "grid":
        return _line_start(False, True)
    return None


def run(state: State | None, text: str, code: bool = False) -> State | None:
    """``step`` over every character of ``text`` (None once it cannot continue). By default the header only:
    ``DONE`` as soon as it ends; with ``code`` the code's rules too, to the text's end (its state in the code)."""
    for ch in text:
        if state is None:
            return None
        if not code and (in_code(state) or (state[0] == "line" and _ends_header(state, ch))):
            return DONE  # the header has ended (at this character, whatever the code's rules say of it)
        state = step(state, ch)
    return DONE if in_code(state) and not code else state


def _code_shapes(token_texts: Sequence[str | None]) -> tuple[torch.Tensor, ...]:
    """Per token id, what the code's rules need of its text: (every character allowed (:func:`_code_char`), all
    digits, leading digits, longest digit run, trailing digits, length). A token without text (special, or past
    the tokenizer) is allowed, with no digit."""
    rows = []
    for text in token_texts:
        if text is None:
            rows.append((1, 0, 0, 0, 0, 0))
            continue
        runs = [len(r) for r in "".join(c if c in _DIGITS else " " for c in text).split(" ")]
        rows.append((int(all(map(_code_char, text))), int(all(c in _DIGITS for c in text)), runs[0], max(runs),
                     runs[-1], len(text)))  # an empty text is all digits, none of them: the run goes on unchanged
    return torch.tensor(rows, dtype=torch.long).unbind(1) if rows else (torch.zeros(0, dtype=torch.long),) * 6


MAX_STATES = 20_000
"""A bound on the lifted automaton (the contract's header and the code's digit runs need about 900): a grammar that
grows past it is a bug. Below 2^15, so that ``trans`` holds states as int16 (a 151k vocabulary: 2 bytes x S x V,
272 MB at 896 states)."""


@dataclass
class HeaderGrammar:
    """The header automaton lifted to a tokenizer's tokens: ``allowed`` (S, V) bool and ``trans``
    (S, V) int16, state 0 the start and state ``done`` the end of the header, followed by the code's states
    (``("code", d)``, d digits in a row): there every token is allowed but one with a character the code may not
    hold (:func:`_code_char`) or that would make a run of more than :data:`MAX_DIGIT_RUN` digits. V may exceed
    the tokenizer's size (a model's padded vocabulary): the extra ids have no text, so they are never drawn inside
    a header and are free after it, as without the grammar."""

    allowed: torch.Tensor
    trans: torch.Tensor
    start: int
    done: int
    states: int
    build_seconds: float
    code_rows: tuple[int, ...] = ()
    """The code's states' rows by the digits just written in a row (0: ``done``, to :data:`MAX_DIGIT_RUN`)."""

    def __post_init__(self) -> None:
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {self.allowed.device: (self.allowed, self.trans)}

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
            if not in_code(state):  # the code's states: from the tokens' shapes, below
                for first, tokens in by_first.items():
                    if advance(state, first) is None:
                        continue
                    for tid, text in tokens:
                        s: State | None = state
                        for ch in text:  # a token that ends the header goes on under the code's rules
                            s = advance(s, ch)
                            if s is None:
                                break
                        if s is not None:
                            out[tid] = s
                            if s not in index:
                                index[s] = len(order)
                                order.append(s)
                if len(order) > MAX_STATES:
                    raise ValueError(f"the header grammar grew past {MAX_STATES} states: an unbounded state")
            edges.append(out)
            i += 1
        code = [DONE] + [("code", d) for d in range(1, MAX_DIGIT_RUN + 1)]  # by the digits in a row
        for state in code:
            if state not in index:
                index[state] = len(order)
                order.append(state)
                edges.append({})
        # states from which no token leads on (a dead end at a token boundary) are pruned, repeatedly
        alive = [bool(e) or in_code(s) for s, e in zip(order, edges)]
        changed = True
        while changed:
            changed = False
            for k, e in enumerate(edges):
                if in_code(order[k]) or not alive[k]:
                    continue
                if not any(alive[index[s]] for s in e.values()):
                    alive[k], changed = False, True
        if not alive[0]:
            raise ValueError("no token sequence spells a header with this tokenizer")
        V, S = len(token_texts), len(order)
        rows, cols, dest = [], [], []
        for k, e in enumerate(edges):
            for tid, s in e.items():
                if alive[index[s]]:
                    rows.append(k), cols.append(tid), dest.append(index[s])
        allowed = torch.zeros(S, V, dtype=torch.bool)
        trans = torch.zeros(S, V, dtype=torch.int16)  # a quarter of long's memory (S < 2^15: MAX_STATES)
        if rows:
            r, c = torch.tensor(rows), torch.tensor(cols)
            allowed[r, c] = True
            trans[r, c] = torch.tensor(dest, dtype=torch.int16)
        fit, digits, lead, longest, trail, length = _code_shapes(token_texts)
        to_code = torch.tensor([index[c] for c in code], dtype=torch.int16)  # digits in a row -> its state
        for run_, state in enumerate(code):  # a token after `run_` digits: the run it ends with, if every run fits
            grown = torch.where(digits.bool(), run_ + length, trail)
            ok = fit.bool() & (run_ + lead <= MAX_DIGIT_RUN) & (longest <= MAX_DIGIT_RUN) & (grown <= MAX_DIGIT_RUN)
            allowed[index[state]] = ok
            trans[index[state]] = torch.where(ok, to_code[grown.clamp(max=MAX_DIGIT_RUN)], 0)
        d = index[DONE]
        if eos_id is not None and eos_id < V:  # a completion ends after its header, never inside it
            allowed[:, eos_id] = False
            allowed[[index[c] for c in code], eos_id] = True
        return cls(allowed, trans, 0, d, S, time.perf_counter() - t0, tuple(index[c] for c in code))

    @classmethod
    def for_tokenizer(cls, tokenizer, width: int | None = None) -> "HeaderGrammar":
        """The grammar for a Hugging Face tokenizer over ``width`` token ids (the model's logits; None: the
        tokenizer's size), cached per tokenizer object and width."""
        V = max(len(tokenizer), width or 0)
        cached = _CACHE.get((id(tokenizer), V))
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        special = set(tokenizer.all_special_ids)
        texts: list[str | None] = [None if tid in special or tid >= len(tokenizer) else tokenizer.decode([tid])
                                   for tid in range(V)]
        g = cls.build(texts, tokenizer.eos_token_id)
        log.info("header grammar: %d states over %d token ids in %.1f s", g.states, V, g.build_seconds)
        _CACHE[(id(tokenizer), V)] = (tokenizer, g)
        return g

    def tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """(allowed, trans) on ``device``: one copy per device, so constraints on several GPUs share none."""
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev not in self._on:
            self._on[dev] = (self.allowed.to(dev), self.trans.to(dev))
        return self._on[dev]

    def constraint(self, rows: int, device: torch.device | str) -> "HeaderConstraint":
        """A fresh per-row state for a batch of ``rows`` completions, with the tables on ``device``."""
        allowed, trans = self.tables(device)
        return HeaderConstraint(self, torch.full((rows,), self.start, dtype=torch.long, device=allowed.device),
                                allowed, trans)


_CACHE: dict[tuple[int, int], tuple[object, HeaderGrammar]] = {}


@dataclass
class HeaderConstraint:
    """One batch's header states (global row order; the bucketed engine passes its running rows), with
    the grammar's tables on the batch's device."""

    grammar: HeaderGrammar
    state: torch.Tensor
    allowed: torch.Tensor
    trans: torch.Tensor

    def mask(self, logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``logits`` (B, V) with the tokens the rows' states forbid at -inf."""
        if logits.shape[-1] != self.allowed.shape[1]:
            raise ValueError(f"the header grammar covers {self.allowed.shape[1]} token ids, the logits "
                             f"{logits.shape[-1]}: build it for the model's width (HeaderGrammar.for_tokenizer(tok, width))")
        st = self.state if rows is None else self.state.index_select(0, rows)
        return logits.masked_fill(~self.allowed.index_select(0, st), float("-inf"))

    def advance(self, tokens: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Move each row's state by its drawn token, in place."""
        if rows is None:
            self.state.copy_(self.trans[self.state, tokens].long())
        else:
            self.state.index_copy_(0, rows, self.trans[self.state.index_select(0, rows), tokens].long())

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
