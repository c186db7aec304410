"""A completion's CUDA text as the compiler's front end sees it: lines spliced, comments gone,
directives checked, macros expanded into one token stream.

The static checks (:mod:`sparserl.harness.static_check`) run on this stream rather than on the raw
text, so a rule cannot be dodged with the preprocessor:

* translation phases 1-2 are applied first: a backslash-newline splices lines (``as\\<newline>m``
  is the token ``asm``); trigraphs, digraphs (``%:include`` is an include), universal character
  names and non-ASCII characters outside comments and literals are refused, since each lets one
  spelling stand for another;
* comments and literals are found as the compiler's lexer finds them: identifiers and
  preprocessing numbers are read whole, and an apostrophe is a digit separator only inside a
  number and before a digit or a letter (``1'//'`` is the number 1 and a character literal, not a
  separator and a comment that would hide the rest of the line);
* directives are allow-listed: ``#include`` of an allowed header written literally, ``#define``
  and ``#undef``, the conditionals, ``#error``/``#warning``, and ``#pragma unroll``/``nounroll``.
  ``#line`` (it fakes file names in diagnostics), ``#include_next``, ``#embed``, line markers,
  other pragmas and unknown directives are refused;
* macros may not paste (``##``) or stringize (``#``) tokens: without those, every identifier the
  compiler sees is written somewhere in the text, so a banned name (``asm``, ``clock64``) cannot
  be assembled from pieces. The expansion here (object- and function-like macros, rescanned,
  a macro never re-expanded inside itself) is then only needed to see the code's structure
  (``#define D __device__`` before a function, ``#define BEGIN {``);
* macros may expand inside one another at most :data:`MAX_MACRO_DEPTH` levels deep, to at most
  :data:`MAX_EXPANDED_TOKENS` tokens, and in at most :data:`MAX_EXPANSION_STEPS` steps (macros that
  expand to nothing, each calling the one before twice, produce no tokens but double the work a
  level);
* ``_Pragma``, ``__has_include`` and raw string literals are refused: each reaches files or
  directives through a string.

Conditional directives are not evaluated: the tokens of every branch are checked, so a banned
construct in a branch that happens to be dead is still refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparserl.kernels.contract import ALLOWED_INCLUDES

_ALLOWED_PRAGMAS = re.compile(r"^(?:unroll(?:\s*\(?\s*\w+\s*\)?)?|nounroll)\s*$")
_CONDITIONALS = {"if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif"}
_FORBIDDEN_IDENTS = {
    "_Pragma": "the _Pragma operator is not allowed",
    "__pragma": "the __pragma operator is not allowed",
    "__has_include": "__has_include is not allowed (it reaches files)",
    "__has_include_next": "__has_include_next is not allowed (it reaches files)",
    "__has_embed": "__has_embed is not allowed (it reaches files)",
    "__TIME__": "__TIME__ is not allowed (a kernel must not depend on when it was built)",
    "__DATE__": "__DATE__ is not allowed (a kernel must not depend on when it was built)",
    "__TIMESTAMP__": "__TIMESTAMP__ is not allowed (a kernel must not depend on when it was built)",
}
MAX_EXPANDED_TOKENS = 200_000
MAX_EXPANSION_STEPS = 1_000_000
"""Tokens the expansion may look at, over all macros and their arguments (about a second; five times
:data:`MAX_EXPANDED_TOKENS`; the library's kernels take a few thousand)."""
MAX_MACRO_DEPTH = 200
"""How deep macros may expand inside one another (a chain ``#define A1 A0``, ``#define A2 A1`` ...,
or calls nested in arguments); deeper is refused. The library nests at most a few levels."""


class SourceError(ValueError):
    """The text breaks a lexical or preprocessor rule (the message is one line)."""


@dataclass(frozen=True)
class Token:
    kind: str  # ident, number, string, char, punct
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class Source:
    """The checked and expanded form of one completion's code."""

    tokens: list[Token]
    """Every code token after macro expansion (directive lines removed)."""
    includes: list[str] = field(default_factory=list)
    """Headers included, in order."""
    macro_tokens: list[Token] = field(default_factory=list)
    """Every token of every macro body (checked like code, whether or not the macro is used)."""


def splice(text: str) -> str:
    """Translation phase 2: delete each backslash-newline (CRLF line ends first become LF)."""
    return text.replace("\r\n", "\n").replace("\\\n", "")


_PUNCT3 = ("<<=", ">>=", "...", "->*", "<=>", "<<<", ">>>")
_PUNCT2 = ("::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=",
           "/=", "%=", "&=", "|=", "^=", ".*", "##")
_DIGRAPHS = ("<%", "%>", "%:", ":>")
_ID_START = re.compile(r"[A-Za-z_]")
_ID = re.compile(r"[A-Za-z_0-9]*")
_DIGITS = frozenset("0123456789")
"""A number starts with one of these, as :data:`_NUMBER` reads it (``str.isdigit`` is also true of ``１``,
``²`` or ``٣``, where the pattern matches nothing; such a character is non-ASCII, refused as such)."""
_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|'[A-Za-z0-9_]|[A-Za-z0-9_.])*")
"""A preprocessing number (C++ [lex.ppnumber]): an apostrophe belongs to it only as a digit separator,
followed by a digit or a letter (``1'000``); in ``1'//'`` the number is ``1`` and a character literal
follows, as the compiler reads it."""


def _string_end(line: str, i: int, quote: str) -> int:
    j = i + 1
    while j < len(line) and line[j] != quote:
        j += 2 if line[j] == "\\" else 1
    if j >= len(line):
        raise SourceError(f"unterminated {'string' if quote == chr(34) else 'character'} literal")
    return j + 1


def tokenize_line(line: str) -> list[Token]:
    """Tokens of one spliced line without comments (see :func:`strip_comments`)."""
    out: list[Token] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t\f\v":
            i += 1
        elif _ID_START.match(c):
            j = i + 1 + _ID.match(line, i + 1).end() - (i + 1)
            word = line[i:j]
            if j < n and line[j] in "\"'" and word in ("L", "u", "U", "u8", "R", "LR", "uR", "UR", "u8R"):
                if "R" in word:
                    raise SourceError("raw string literals are not allowed")
                k = _string_end(line, j, line[j])
                out.append(Token("string" if line[j] == '"' else "char", line[i:k]))
                i = k
                continue
            out.append(Token("ident", word))
            i = j
        elif c in _DIGITS or (c == "." and i + 1 < n and line[i + 1] in _DIGITS):
            m = _NUMBER.match(line, i)
            out.append(Token("number", m.group(0)))
            i = m.end()
        elif c in "\"'":
            k = _string_end(line, i, c)
            out.append(Token("string" if c == '"' else "char", line[i:k]))
            i = k
        elif c == "\\":
            raise SourceError("a backslash outside a literal (universal character names) is not allowed")
        elif line.startswith("??", i) and i + 2 < n and line[i + 2] in "=/'()!<>-":
            raise SourceError("trigraphs are not allowed")
        elif line.startswith(_DIGRAPHS, i) or (line.startswith("<:", i) and not line.startswith("<::", i)):
            raise SourceError(f"digraphs ({line[i:i + 2]}) are not allowed")
        else:
            for p in _PUNCT3 + _PUNCT2:
                if line.startswith(p, i):
                    out.append(Token("punct", p))
                    i += len(p)
                    break
            else:
                out.append(Token("punct", c))
                i += 1
    return out


def strip_comments(text: str) -> str:
    """``text`` (already spliced) with comments replaced by a space; newlines inside block
    comments kept so line structure survives. Literals are left intact."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise SourceError("unterminated /* comment")
            out.append(" " + "\n" * text.count("\n", i, j))
            i = j + 2
        elif _ID_START.match(c):  # a whole identifier: a digit in it starts no number
            j = _ID.match(text, i + 1).end()
            out.append(text[i:j])
            i = j
        elif c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            j = _NUMBER.match(text, i).end()  # a whole preprocessing number, its digit separators in it
            out.append(text[i:j])
            i = j
        elif c in "\"'":
            line_end = text.find("\n", i)
            seg_end = n if line_end < 0 else line_end
            try:
                k = _string_end(text[:seg_end], i, c)
            except SourceError:  # e.g. an apostrophe in '#error don't': the tokenizer judges code lines
                k = i + 1
            out.append(text[i:k])
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass
class _Macro:
    params: list[str] | None  # None: object-like
    body: list[Token]
    variadic: bool = False


def _directive(line: str) -> tuple[str, str] | None:
    s = line.lstrip()
    if not s.startswith("#"):
        return None
    rest = s[1:].lstrip()
    m = re.match(r"[A-Za-z_]\w*|[0-9]+", rest)
    if m is None:
        return ("", rest)
    return (m.group(0), rest[m.end():].strip())


def _check_include(arg: str) -> str:
    m = re.fullmatch(r'<([^<>"]+)>|"([^<>"]+)"', arg.strip())
    if m is None:
        raise SourceError("#include must name an allowed header literally (<name> or \"name\"), not a macro")
    name = m.group(1) or m.group(2)
    if name not in ALLOWED_INCLUDES:
        raise SourceError(f"#include <{name}> is not allowed (allowed: {', '.join(sorted(ALLOWED_INCLUDES))})")
    return name


def _parse_define(arg: str) -> tuple[str, _Macro]:
    m = re.match(r"([A-Za-z_]\w*)(\()?", arg)
    if m is None:
        raise SourceError("#define needs a macro name")
    name = m.group(1)
    params: list[str] | None = None
    variadic = False
    rest = arg[m.end():]
    if m.group(2):  # function-like: '(' right after the name
        close = rest.find(")")
        if close < 0:
            raise SourceError(f"#define {name}: unterminated parameter list")
        params = [p.strip() for p in rest[:close].split(",") if p.strip()]
        if params and params[-1] == "...":
            params, variadic = params[:-1], True
        rest = rest[close + 1:]
    body = tokenize_line(rest)
    if any(t.text in ("#", "##") for t in body):
        raise SourceError(f"#define {name}: token pasting (##) and stringizing (#) are not allowed")
    return name, _Macro(params, body, variadic)


def _step(steps: list[int]) -> None:
    """Count one token looked at by the expansion; past :data:`MAX_EXPANSION_STEPS`, refuse."""
    steps[0] += 1
    if steps[0] > MAX_EXPANSION_STEPS:
        raise SourceError(f"macro expansion takes more than {MAX_EXPANSION_STEPS} steps")


def _args(tokens: list[Token], i: int, steps: list[int]) -> tuple[list[list[Token]], int] | None:
    """Arguments of a function-like macro call whose '(' is at ``tokens[i]``; (args, index after ')').
    Each token looked at counts in ``steps`` (an unclosed call scans to the end of the code)."""
    depth, args, cur = 0, [], []
    for j in range(i, len(tokens)):
        _step(steps)
        t = tokens[j].text
        if t == "(":
            depth += 1
            if depth == 1:
                continue
        elif t == ")":
            depth -= 1
            if depth == 0:
                args.append(cur)
                return ([] if args == [[]] else args), j + 1
        elif t == "," and depth == 1:
            args.append(cur)
            cur = []
            continue
        cur.append(tokens[j])
    return None


def _expand(tokens: list[Token], macros: dict[str, _Macro], hidden: frozenset[str] = frozenset(),
            depth: int = 0, steps: list[int] | None = None) -> list[Token]:
    """``tokens`` with their macros expanded; ``steps`` (one count shared by the whole expansion)
    bounds the work however little it produces."""
    if depth > MAX_MACRO_DEPTH:
        raise SourceError(f"macros expand inside one another more than {MAX_MACRO_DEPTH} levels deep")
    steps = [0] if steps is None else steps
    out: list[Token] = []
    i = 0
    while i < len(tokens):
        _step(steps)
        t = tokens[i]
        mac = macros.get(t.text) if t.kind == "ident" and t.text not in hidden else None
        if mac is None:
            out.append(t)
            i += 1
            continue
        if mac.params is None:
            out += _expand(mac.body, macros, hidden | {t.text}, depth + 1, steps)
            i += 1
        elif i + 1 < len(tokens) and tokens[i + 1].text == "(" and (call := _args(tokens, i + 1, steps)) is not None:
            args, after = call
            args = [_expand(a, macros, hidden, depth + 1, steps) for a in args]
            names = mac.params + (["__VA_ARGS__"] if mac.variadic else [])
            if mac.variadic and len(args) >= len(mac.params):  # none for the dots: __VA_ARGS__ is empty
                va: list[Token] = []
                for k, a in enumerate(args[len(mac.params):]):
                    va += ([Token("punct", ",")] if k else []) + a
                args = args[:len(mac.params)] + [va]
            bound = dict(zip(names, args))
            body = [tok for b in mac.body for tok in (bound.get(b.text, [b]) if b.kind == "ident" else [b])]
            out += _expand(body, macros, hidden | {t.text}, depth + 1, steps)
            i = after
        else:
            out.append(t)
            i += 1
        if len(out) > MAX_EXPANDED_TOKENS:
            raise SourceError(f"macro expansion produces more than {MAX_EXPANDED_TOKENS} tokens")
    return out


def _check_tokens(tokens: list[Token]) -> None:
    for t in tokens:
        if t.kind == "ident" and t.text in _FORBIDDEN_IDENTS:
            raise SourceError(_FORBIDDEN_IDENTS[t.text])


def preprocess(code: str) -> Source:
    """Check ``code``'s lexical and preprocessor rules and expand its macros (see the module docstring).

    Raises :class:`SourceError` with a one-line message on the first rule broken.
    """
    if "\r" in code.replace("\r\n", ""):  # before comments are taken out: they end at a line end
        # nvcc's preprocessor ends a line at a lone CR and NVRTC reads it as a space, where this reader would
        # read on: '//\r asm(...)' a comment here and code to nvcc, ';\r#define' a directive only there
        raise SourceError("a carriage return not followed by a line feed is not allowed (line ends: LF or CRLF)")
    text = strip_comments(splice(code))
    if any(ord(ch) > 126 or (ord(ch) < 32 and ch not in "\n\t\f\v\r") for ch in text):
        raise SourceError("non-ASCII or control characters outside comments are not allowed")
    macros: dict[str, _Macro] = {}
    src = Source(tokens=[])
    code_tokens: list[Token] = []
    for line in text.split("\n"):
        d = _directive(line)
        if d is None:
            code_tokens += tokenize_line(line)
            continue
        name, arg = d
        if name == "" and not arg:
            continue  # the null directive
        if name == "include":
            src.includes.append(_check_include(arg))
        elif name == "define":
            mname, mac = _parse_define(arg)
            _check_tokens(mac.body)
            src.macro_tokens += mac.body
            macros[mname] = mac
        elif name == "undef":
            macros.pop(arg.split()[0] if arg.split() else "", None)
        elif name in _CONDITIONALS:
            _check_tokens(tokenize_line(arg))
        elif name in ("error", "warning"):
            pass  # the candidate's own text, printed by the compiler
        elif name == "pragma":
            if not _ALLOWED_PRAGMAS.match(arg):
                raise SourceError(f"#pragma {arg.split()[0] if arg.split() else ''} is not allowed "
                                  "(only #pragma unroll [N] and #pragma nounroll)")
        elif name.isdigit():
            raise SourceError("line markers (# N \"file\") are not allowed")
        else:
            raise SourceError(f"#{name} is not allowed")
    _check_tokens(code_tokens)
    src.tokens = _expand(code_tokens, macros)
    return src
