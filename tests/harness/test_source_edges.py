"""The source check's lexer and preprocessor at their edges: what the compiler's front end would see,
token for token, and every refusal's message word for word.

A mismatch between this reading and the compiler's is a way to hide code from the static checks
(``1'//'`` is the number 1 and a character literal, not a digit separator and a comment), so each
edge is pinned. Mutations killed: a comment's end searched from the wrong place or its newlines
miscounted; a ``//`` comment at the end of the text; literals ending past their line, an escaped
quote skipped too far, an unterminated literal accepted; an apostrophe after a digit read as a
separator when a character literal follows; prefixed and raw literals; a digraph or a directive
after leading blanks; the null directive stopping the scan; macro bodies checked only for the last
macro; ``#undef`` ignored; a function-like macro re-expanded inside itself through its arguments;
``__VA_ARGS__`` left in when no argument fills it; the depth limits removed."""

from __future__ import annotations

import pytest

from sparserl.harness.source import (ALLOWED_INCLUDES, MAX_EXPANDED_TOKENS, MAX_MACRO_DEPTH, SourceError, preprocess,
                                     strip_comments, tokenize_line)
from sparserl.harness.static_check import MAX_SCOPE_DEPTH, static_check
from sparserl.kernels.contract import Op, split_completion
from tests.harness.adversarial.base import HONEST, csr


def words(code: str) -> list[str]:
    return [t.text for t in preprocess(code).tokens]


def refused(code: str, message: str) -> None:
    with pytest.raises(SourceError) as exc:
        preprocess(code)
    assert str(exc.value) == message


def test_comments_become_one_blank_and_keep_their_newlines() -> None:
    assert strip_comments("a /* x\ny */ b // c\nd") == "a  \n b  \nd"
    assert strip_comments("a // b") == "a  "  # a line comment that ends the text
    assert strip_comments("/**/x/* */y") == " x y"
    assert strip_comments("a\n/* x\ny */ b\nc") == "a\n \n b\nc"  # only the comment's own newlines
    assert strip_comments("a /* x */\nb") == "a  \nb"
    assert words("a/**/b /* one */ c /* two */ d") == ["a", "b", "c", "d"]


def test_code_right_after_a_comment_is_read() -> None:
    """``/**/`` ends where it starts; the character after ``*/`` is code."""
    assert words("/**/printf") == ["printf"]
    assert words("/* */asm") == ["asm"]
    assert words("/* a */ printf /* b */") == ["printf"]  # each comment ends at its own */


def test_string_literals_end_where_the_compiler_ends_them() -> None:
    assert words('const char* s = ""; int a;') == ["const", "char", "*", "s", "=", '""', ";", "int", "a", ";"]
    assert words('const char* s = "\\\\"; int b; const char* t = "x";')[5:9] == ['"\\\\"', ";", "int", "b"]
    assert words('const char* s = "//"') == ["const", "char", "*", "s", "=", '"//"']  # at the very end
    refused('const char* s = "abc', "unterminated string literal")
    refused("char c = 'a", "unterminated character literal")


def test_an_apostrophe_in_a_directive_line_does_not_swallow_the_next_lines() -> None:
    assert words("#error don't\nint a; // isn't printf\nint b;") == ["int", "a", ";", "int", "b", ";"]


@pytest.mark.parametrize("code, expected", [
    ("int a = 1'000'000;", ["int", "a", "=", "1'000'000", ";"]),
    ("int a = 0x1'F;", ["int", "a", "=", "0x1'F", ";"]),
    ("F(1'//')", ["F", "(", "1", "'//'", ")"]),  # the number 1, then a character literal: no comment
    ("F(1'/*')", ["F", "(", "1", "'/*'", ")"]),
    ("F(x1'a')", ["F", "(", "x1", "'a'", ")"]),  # an identifier's digit starts no number
    ("float a = .5f + 1e+5 + 0x1p-3;", ["float", "a", "=", ".5f", "+", "1e+5", "+", "0x1p-3", ";"]),
    ("float a = .5", ["float", "a", "=", ".5"]),  # a number that ends the text
    ("int a; a.", ["int", "a", ";", "a", "."]),  # a dot that ends the text
    ("int a = 1'000// it's a comment", ["int", "a", "=", "1'000"]),  # the separator is the number's, then a comment
])
def test_numbers_and_digit_separators(code: str, expected: list[str]) -> None:
    assert words(code) == expected


def test_a_digit_separator_cannot_hide_the_rest_of_a_line() -> None:
    """Read as the compiler reads it, ``F(1'//')`` leaves the printf after it in plain sight."""
    text = csr(f"int h = F(1'//'); printf(\"%d\", row); {HONEST}", before="#define F(a) 0")
    header, code = split_completion(text, Op.SPMV)
    v = static_check(code, header, Op.SPMV)
    assert v is not None and v.message == "printf is not allowed"


@pytest.mark.parametrize("literal", ['u8"a b"', 'L"a b"', 'u"a"', 'U"a"', "L'x'", "u'x'", "U'x'", "u8'x'"])
def test_prefixed_literals_are_one_token(literal: str) -> None:
    assert words(f"auto s = {literal};") == ["auto", "s", "=", literal, ";"]


@pytest.mark.parametrize("prefix", ["R", "LR", "uR", "UR", "u8R"])
def test_every_raw_string_prefix_is_refused(prefix: str) -> None:
    refused(f'auto s = {prefix}"x( ) " printf )x";', "raw string literals are not allowed")


def test_digraphs_anywhere_and_the_one_exception() -> None:
    refused("int a <: 1 :>;", "digraphs (<:) are not allowed")
    refused("int a[2] = <% 1, 2 %>;", "digraphs (<%) are not allowed")
    refused('  %:include "/etc/passwd"', "digraphs (%:) are not allowed")
    assert words("a<::b") == ["a", "<", "::", "b"]  # '<::' is not the digraph '<:' followed by ':'
    assert [t.text for t in tokenize_line("x<::y")] == ["x", "<", "::", "y"]


def test_trigraphs_at_the_end_of_a_line() -> None:
    refused("int a; ??=", "trigraphs are not allowed")
    refused("int a; ??/", "trigraphs are not allowed")
    assert words("int a; ??") == ["int", "a", ";", "?", "?"]


def test_directives_after_leading_blanks_are_directives() -> None:
    refused("  \t#  include <stdio.h>", "#include <stdio.h> is not allowed (allowed: "
            + ", ".join(sorted(ALLOWED_INCLUDES)) + ")")
    assert preprocess("\t#include <cuda_fp16.h>\nint a;").includes == ["cuda_fp16.h"]
    assert words("   #define N 4\nint v = N;") == ["int", "v", "=", "4", ";"]


@pytest.mark.parametrize("code, message", [
    ("#define F <cuda_fp16.h>\n#include F",
     '#include must name an allowed header literally (<name> or "name"), not a macro'),
    ("#define", "#define needs a macro name"),
    ("#define F(a", "#define F: unterminated parameter list"),
    ("#Define X", "#Define is not allowed"),
    ('# "x"', "# is not allowed"),
    ("#pragma once", "#pragma once is not allowed (only #pragma unroll [N] and #pragma nounroll)"),
    ("#pragma", "#pragma  is not allowed (only #pragma unroll [N] and #pragma nounroll)"),
    ('# 3 "x.cu"', 'line markers (# N "file") are not allowed'),
    ("int \\u0061;", "a backslash outside a literal (universal character names) is not allowed"),
    ("/* never closed", "unterminated /* comment"),
    ("int a; \x7f", "non-ASCII or control characters outside comments are not allowed"),
    ("int a; \x01", "non-ASCII or control characters outside comments are not allowed"),
])
def test_messages(code: str, message: str) -> None:
    refused(code, message)


def test_blank_controls_warnings_and_the_null_directive_are_fine() -> None:
    assert words("int\ta;\f\v\r\nint b;") == ["int", "a", ";", "int", "b", ";"]
    assert words("#warning slow\n#error no\nint a;") == ["int", "a", ";"]
    assert words("#\nint a; printf") == ["int", "a", ";", "printf"]  # the null directive; the scan goes on


def test_every_macro_body_is_kept_for_the_checks() -> None:
    src = preprocess("#define A asm\n#define B 1\nint a;")
    assert [t.text for t in src.macro_tokens] == ["asm", "1"]


def test_undef_forgets_a_macro_and_tolerates_what_was_never_defined() -> None:
    assert words("#define N 4\n#undef N\nint N;") == ["int", "N", ";"]
    assert words("#undef NEVER\n#undef\nint a;") == ["int", "a", ";"]


@pytest.mark.parametrize("code, expected", [
    ("#define N 4\nint v = N + N;", "intv=4+4;"),  # object-like macros past the first tokens
    ("#define F() 1\nint v = F();", "intv=1;"),
    ("#define F(a)(a)\nint v = F(2);", "intv=(2);"),
    ("#define CALL(f, g, ...) f(g, __VA_ARGS__)\nint r = CALL(h, 1, 2, 3);", "intr=h(1,2,3);"),
    ("#define CALL(f, ...) f(__VA_ARGS__)\nint r = CALL(g);", "intr=g();"),
    ("#define f(x) f(x) + 1\nint a = f(2);", "inta=f(2)+1;"),
    ("#define h(x) x\n#define g h(g)\nint v = g;", "intv=g;"),  # g is not expanded again inside h's argument
    ("#define F(a) a\nint F; int G = F;", "intF;intG=F;"),  # a function-like name without a call, past the start
])
def test_macro_expansion(code: str, expected: str) -> None:
    assert "".join(words(code)) == expected


def test_macro_nesting_is_bounded_with_a_message() -> None:
    def chain(n: int) -> str:
        return "#define A0 1\n" + "".join(f"#define A{i} A{i - 1}\n" for i in range(1, n)) + f"int v = A{n - 1};"

    assert words(chain(MAX_MACRO_DEPTH)) == ["int", "v", "=", "1", ";"]
    refused(chain(MAX_MACRO_DEPTH + 2), f"macros expand inside one another more than {MAX_MACRO_DEPTH} levels deep")
    def nested(n: int) -> str:
        return "#define F(a) a\nint v = " + "F(" * n + "1" + ")" * n + ";"

    def calls(n: int) -> str:  # function-like macros, each calling the one before
        return "#define F0(a) a\n" + "".join(f"#define F{i}(a) F{i - 1}(a)\n" for i in range(1, n)) + f"int v = F{n - 1}(1);"

    assert words(nested(MAX_MACRO_DEPTH - 1)) == ["int", "v", "=", "1", ";"]
    refused(nested(MAX_MACRO_DEPTH + 1), f"macros expand inside one another more than {MAX_MACRO_DEPTH} levels deep")
    assert words(calls(MAX_MACRO_DEPTH)) == ["int", "v", "=", "1", ";"]
    refused(calls(1100), f"macros expand inside one another more than {MAX_MACRO_DEPTH} levels deep")


def test_the_expansion_s_size_limit_is_inclusive() -> None:
    tens = "#define A x x x x x x x x x x\n" + "".join(
        f"#define {b} {' '.join([a] * 10)}\n" for a, b in zip("ABCD", "BCDE"))  # E: 10^5 tokens
    assert len(words(tens + "E E")) == MAX_EXPANDED_TOKENS  # exactly at the limit
    refused(tens + "x E E", f"macro expansion produces more than {MAX_EXPANDED_TOKENS} tokens")


def test_scope_nesting_is_bounded_with_a_message() -> None:
    def check(before: str):
        header, code = split_completion(csr(HONEST, before=before), Op.SPMV)
        return static_check(code, header, Op.SPMV)

    assert check("namespace a { " * MAX_SCOPE_DEPTH + "}" * MAX_SCOPE_DEPTH) is None
    for before in ("namespace a { " * (MAX_SCOPE_DEPTH + 1) + "}" * (MAX_SCOPE_DEPTH + 1),
                   "struct S { " * (MAX_SCOPE_DEPTH + 1) + "}" * (MAX_SCOPE_DEPTH + 1) + ";"):
        v = check(before)
        assert v is not None and v.message == f"namespaces and classes nest more than {MAX_SCOPE_DEPTH} levels deep"


def test_a_lone_carriage_return_is_refused() -> None:
    """nvcc's preprocessor ends a line at a lone CR (NVRTC reads a space): '//\\r asm(...)' is a comment to a reader
    that reads on and code to nvcc. Kills: the refusal left out (the asm after it is never seen)."""
    with pytest.raises(SourceError, match="carriage return not followed by a line feed"):
        preprocess('int a; //\r asm("trap;");\nint b;')
    with pytest.raises(SourceError, match="carriage return"):
        preprocess("int a;\r#define X 1\nint b;")
    assert words("int a;\r\nint b;\r\n") == ["int", "a", ";", "int", "b", ";"]  # CRLF line ends stay fine


UNICODE_DIGITS = ("\uff11", "\u00b2", "\u0663", "\u2460", "\U0001d7d9", "\u0e53")
"""Characters ``str.isdigit`` takes for digits and the number pattern does not (full-width 1, superscript
2, Arabic-Indic 3, circled 1, mathematical double-struck 1, Thai 3): a model writes the first."""


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_a_unicode_digit_is_refused_as_non_ascii_not_a_crash(digit: str, tmp_path) -> None:
    """A lexer that started a number at any ``isdigit`` character crashed on these (the pattern matched
    nothing): the harness answered ``internal_error``, which is left out of rewards, and the library match
    and the facts fill that read every RL sample and search proposal raised, ending the run. Killed
    mutation: the digit test back to ``str.isdigit`` in either loop."""
    from sparserl.eval.library_match import LibraryMatch, fill_facts, library_match
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.harness.matrix_facts import named_facts
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    for code in (f"int a = {digit};", f"float f = .{digit};", f"int a = 1{digit};"):
        refused(code, "non-ASCII or control characters outside comments are not allowed")
    assert strip_comments(f"a = {digit}; // c") == f"a = {digit};  "
    assert [t.text for t in tokenize_line(f"a = .{digit} + {digit}")] == ["a", "=", ".", digit, "+", digit]
    text = csr(HONEST.replace("y[row] = sum;", f"y[row] = sum * {digit};  // one row a thread"))
    assert digit in text
    code = split_completion(text, Op.SPMV)[1]
    assert named_facts(code) == []
    assert library_match(text, Op.SPMV) is LibraryMatch.NEW
    A = generate("banded", 300, seed=1)
    assert fill_facts(text, Op.SPMV, matrix_card(A)) is None
    with Evaluator(HarnessConfig(compile_only=True, cache_dir=str(tmp_path))) as ev:
        r = ev.evaluate(text, ev.register(A, "banded"), Op.SPMV)
    assert r.error_kind.value == "static_check" and "non-ASCII" in r.message, (r.error_kind, r.message)
