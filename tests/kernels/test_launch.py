"""LAUNCH expressions: what evaluates, what is refused, and C integer semantics."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sparserl.errors import ContractError
from sparserl.kernels.launch import parse_expr

ENV = {"m": 1000, "n": 700, "nnz": 12345, "k": 32, "width": 9, "num_sms": 132}


@pytest.mark.parametrize(
    "text, value",
    [
        ("ceil_div(m, 8)", 125),
        ("ceil_div(m + 1, 8)", 126),
        ("min(m, n, 5)", 5),
        ("max(nnz / 1024, 1)", 12),
        ("m * width + 3", 9003),
        ("(m + n) % 7", (1000 + 700) % 7),
        ("-m / 3", -333),  # C truncation toward zero, not floor (-334)
        ("-m % 3", -1),  # C remainder has the dividend's sign
        ("m // 3", 333),
        ("2 * num_sms", 264),
        ("+m", 1000),
        ("ceil_div(k, 4) * 4", 32),
    ],
)
def test_evaluates_like_c(text: str, value: int) -> None:
    assert parse_expr(text).evaluate(ENV) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "m ** 2",
        "1.5 * m",
        "'abc'",
        "m.bit_length()",
        "width[0]",
        "m if n else k",
        "lambda: 1",
        "m < n",
        "abs(m)",
        "ceil_div(m)",
        "ceil_div(m, 8, 2)",
        "min(m)",
        "max(*[m, n])",
        "min(a=m, b=n)",
        "m and n",
        "~m",
        "[m, n]",
        "",
        "m +",
        "x" * 300,
        "+".join(["m"] * 80),
        "\uff4d * 2",  # a fullwidth m, which Python's parser would read as m
        "MATRIX_ROW_LEN + \uff2dATRIX_ROW_LEN",
    ],
)
def test_refuses_everything_else(text: str) -> None:
    with pytest.raises(ContractError):
        parse_expr(text)


def test_names_are_reported() -> None:
    assert parse_expr("ceil_div(m, max(width, 1)) + nnz").names == {"m", "width", "nnz"}


@pytest.mark.parametrize("text", ["m / 0", "m % (n - n)", "ceil_div(m, 0)"])
def test_division_by_zero_is_contract_error(text: str) -> None:
    with pytest.raises(ContractError, match="zero"):
        parse_expr(text).evaluate(ENV)


def test_unknown_name_lists_available_ones() -> None:
    with pytest.raises(ContractError, match="unknown name 'rows'.*available: .*nnz"):
        parse_expr("ceil_div(rows, 8)").evaluate(ENV)


def test_huge_values_overflow_cleanly() -> None:
    with pytest.raises(ContractError, match="64 bits"):
        parse_expr("nnz * nnz * nnz * nnz * nnz").evaluate(ENV)


def _c_div(a: int, b: int) -> int:
    return int(a / b) if abs(a) < 2**52 else math.trunc(a / b)


@st.composite
def exprs(draw, depth: int = 0):
    """Random allowed expressions paired with an independent reference value."""
    if depth > 3 or draw(st.booleans()):
        if draw(st.booleans()):
            v = draw(st.integers(0, 10**6))
            return str(v), v
        name = draw(st.sampled_from(sorted(ENV)))
        return name, ENV[name]
    kind = draw(st.sampled_from(["+", "-", "*", "/", "%", "ceil_div", "min", "max", "neg"]))
    a_txt, a = draw(exprs(depth + 1))
    if kind == "neg":
        return f"-({a_txt})", -a
    b_txt, b = draw(exprs(depth + 1))
    if kind in ("/", "%", "ceil_div") and b == 0:
        b_txt, b = f"({b_txt}) + 1", b + 1
    if kind == "+":
        return f"({a_txt}) + ({b_txt})", a + b
    if kind == "-":
        return f"({a_txt}) - ({b_txt})", a - b
    if kind == "*":
        return f"({a_txt}) * ({b_txt})", a * b
    if kind == "/":
        q = abs(a) // abs(b)
        return f"({a_txt}) / ({b_txt})", q if (a >= 0) == (b >= 0) else -q
    if kind == "%":
        q = abs(a) // abs(b)
        q = q if (a >= 0) == (b >= 0) else -q
        return f"({a_txt}) % ({b_txt})", a - b * q
    if kind == "ceil_div":
        if b < 0:
            b_txt, b = f"-({b_txt})", -b
        return f"ceil_div({a_txt}, {b_txt})", math.ceil(Fraction(a, b))  # exact, not the implementation's formula
    fn = min if kind == "min" else max
    return f"{kind}({a_txt}, {b_txt})", fn(a, b)


@given(exprs())
def test_random_expressions_match_reference(pair: tuple[str, int]) -> None:
    text, value = pair
    assume(len(text) <= 256)
    try:
        e = parse_expr(text)
    except ContractError as exc:  # only size limits may refuse a well-formed expression
        assert "complex" in str(exc) or "longer" in str(exc)
        return
    if abs(value) < 2**63:
        assert e.evaluate(ENV) == value


def test_threads_parse_one_at_a_time(monkeypatch) -> None:
    """LAUNCH lines are parsed from several threads (the farm, the search); CPython 3.11's ``ast.parse`` is not safe
    to run twice at once (a spurious SystemError: AST constructor recursion depth mismatch), so parse_expr holds a
    lock around it. A stand-in parse that dwells inside counts how many run at once. Kills the lock removed."""
    import ast
    import threading
    import time

    from sparserl.kernels import launch

    inside, most, guard = 0, 0, threading.Lock()
    real = ast.parse

    def dwelling(*args, **kw):
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.002)
        try:
            return real(*args, **kw)
        finally:
            with guard:
                inside -= 1

    monkeypatch.setattr(launch.ast, "parse", dwelling)
    threads = [threading.Thread(target=lambda: [launch.parse_expr("ceil_div(m, 4 * 32)") for _ in range(20)])
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1
