"""Safe integer expressions for ``LAUNCH:`` lines.

A launch expression is a small integer formula over named sizes, for example
``ceil_div(m, 8)`` or ``min(max(nnz / 1024, 1), 4 * num_sms)``. It is parsed with
:mod:`ast` and checked against an allow-list; it is never passed to :func:`eval`.

Allowed:

* non-negative integer literals;
* names from the caller's environment (``m, n, nnz, k``, the format's sizes and
  parameters, ``num_sms``);
* binary ``+ - * / %`` (``/`` is integer division; both ``/`` and ``%`` follow C
  semantics, truncating toward zero) and unary ``-`` / ``+``;
* calls ``ceil_div(a, b)``, ``min(a, b, ...)``, ``max(a, b, ...)``;
* parentheses.

Anything else (floats, strings, attributes, subscripts, ``**``, comparisons,
other calls, a character that is not ASCII) is a :class:`~sparserl.errors.ContractError`
that names the offending piece. Evaluation errors (unknown name, division by zero, a value beyond 64 bits)
are :class:`ContractError` too.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from sparserl.errors import ContractError

MAX_EXPR_CHARS = 256
MAX_AST_NODES = 128
_INT64_MAX = 2**63 - 1

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "/", ast.Mod: "%"}
_FUNCS = {"ceil_div": 2, "min": -2, "max": -2}  # arity; negative = at least that many


def _c_div(a: int, b: int) -> int:
    if b == 0:
        raise ContractError("division by zero in LAUNCH expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_div(a, b)


def _ceil_div(a: int, b: int) -> int:
    if b == 0:
        raise ContractError("ceil_div by zero in LAUNCH expression")
    return -((-a) // b) if b > 0 else _c_div(a, b)


@dataclass(frozen=True)
class Expr:
    """A validated launch expression. Evaluate with :meth:`evaluate`."""

    text: str
    _tree: ast.expr = field(compare=False, repr=False)

    @property
    def names(self) -> frozenset[str]:
        """Variable names the expression reads."""
        return frozenset(
            n.id
            for n in ast.walk(self._tree)
            if isinstance(n, ast.Name) and not _is_func_name(n, self._tree)
        )

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The expression's integer value with names bound from ``env``."""
        return _eval(self._tree, env, self.text)

    def __str__(self) -> str:
        return self.text


_PARSE_LOCK = threading.Lock()
"""One ``ast.parse`` at a time: CPython 3.11 keeps the AST constructor's recursion depth in state shared by
threads, and two parses at once (the farm's and the search's threads read LAUNCH lines) can fail with a spurious
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905)."""


def _is_func_name(node: ast.Name, tree: ast.expr) -> bool:
    return any(isinstance(c, ast.Call) and c.func is node for c in ast.walk(tree))


def parse_expr(text: str) -> Expr:
    """Parse and validate ``text``; raise :class:`ContractError` if it is not allowed."""
    text = text.strip()
    if not text:
        raise ContractError("empty LAUNCH expression")
    if len(text) > MAX_EXPR_CHARS:
        raise ContractError(f"LAUNCH expression longer than {MAX_EXPR_CHARS} characters")
    if not text.isascii():  # Python folds look-alike letters into names (NFKC): the name read is not the one written
        raise ContractError(f"LAUNCH expression {text!r} has a character that is not ASCII")
    try:
        with _PARSE_LOCK:
            tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ContractError(f"cannot parse LAUNCH expression {text!r}: {exc.msg}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_AST_NODES:
        raise ContractError(f"LAUNCH expression {text!r} is too complex")
    _validate(tree, text)
    return Expr(text, tree)


def _validate(node: ast.AST, text: str) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int or node.value < 0:
            raise ContractError(f"only non-negative integer literals are allowed in {text!r}, got {node.value!r}")
        return
    if isinstance(node, ast.Name):
        if not node.id.isidentifier():
            raise ContractError(f"bad name {node.id!r} in {text!r}")
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise ContractError(f"operator {type(node.op).__name__} is not allowed in {text!r} (use + - * / %)")
        _validate(node.left, text)
        _validate(node.right, text)
        return
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise ContractError(f"unary operator {type(node.op).__name__} is not allowed in {text!r}")
        _validate(node.operand, text)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            raise ContractError(
                f"only the functions {', '.join(sorted(_FUNCS))} may be called in {text!r}"
            )
        if node.keywords:
            raise ContractError(f"keyword arguments are not allowed in {text!r}")
        arity = _FUNCS[node.func.id]
        nargs = len(node.args)
        if (arity >= 0 and nargs != arity) or (arity < 0 and nargs < -arity):
            want = arity if arity >= 0 else f"at least {-arity}"
            raise ContractError(f"{node.func.id} takes {want} arguments in {text!r}, got {nargs}")
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise ContractError(f"starred arguments are not allowed in {text!r}")
            _validate(a, text)
        return
    raise ContractError(f"{type(node).__name__} is not allowed in LAUNCH expression {text!r}")


def _eval(node: ast.expr, env: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ContractError(
                f"unknown name {node.id!r} in LAUNCH expression {text!r}; available: {', '.join(sorted(env))}"
            )
        return int(env[node.id])
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, text)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a = _eval(node.left, env, text)
        b = _eval(node.right, env, text)
        op = type(node.op)
        if op is ast.Add:
            r = a + b
        elif op is ast.Sub:
            r = a - b
        elif op is ast.Mult:
            r = a * b
        elif op in (ast.Div, ast.FloorDiv):
            r = _c_div(a, b)
        else:
            if b == 0:
                raise ContractError(f"modulo by zero in LAUNCH expression {text!r}")
            r = _c_mod(a, b)
        if abs(r) > _INT64_MAX:
            raise ContractError(f"LAUNCH expression {text!r} overflows 64 bits")
        return r
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        args = [_eval(a, env, text) for a in node.args]
        if node.func.id == "ceil_div":
            return _ceil_div(args[0], args[1])
        return min(args) if node.func.id == "min" else max(args)
    raise ContractError(f"cannot evaluate {text!r}")  # unreachable after _validate
