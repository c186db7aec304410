"""The source as the compiler's front end sees it: splicing, comments, directives, macro expansion."""

from __future__ import annotations

import pytest

from sparserl.harness.source import ALLOWED_INCLUDES, SourceError, preprocess, splice, strip_comments


def words(code: str) -> list[str]:
    return [t.text for t in preprocess(code).tokens]


def test_splice_and_comments_keep_lines() -> None:
    assert splice("as\\\nm") == "asm" and splice("a\r\nb") == "a\nb"
    code = 'a /* x\ny */ b // c\n"str // not comment" d'
    out = strip_comments(code)
    assert out.count("\n") == code.count("\n") and "x" not in out and '"str // not comment"' in out


def test_literals_digit_separators_and_error_text() -> None:
    assert words("int a = 1'000'000;") == ["int", "a", "=", "1'000'000", ";"]
    assert words("#error don't do this\nint a;") == ["int", "a", ";"]
    assert words("char c = 'x'; const char* s = \"a\\\"b\";")[3] == "'x'"


def test_object_and_function_macros_expand_and_rescan() -> None:
    code = "#define N 4\n#define SQ(a) ((a) * (a))\n#define TWICE(f, x) f(f(x))\nint v = TWICE(SQ, N);"
    assert "".join(words(code)) == "intv=((((4)*(4)))*(((4)*(4))));"


def test_macros_do_not_expand_inside_themselves_and_variadics_work() -> None:
    assert words("#define foo foo + 1\nint a = foo;") == ["int", "a", "=", "foo", "+", "1", ";"]
    code = "#define CALL(f, ...) f(__VA_ARGS__)\nint r = CALL(g, 1, 2);"
    assert "".join(words(code)) == "intr=g(1,2);"
    assert words("#define F(x) x\n#undef F\nint F;") == ["int", "F", ";"]


def test_includes_are_recorded_and_checked() -> None:
    src = preprocess("#include <cuda_fp16.h>\n#  include \"cooperative_groups.h\"\nint a;")
    assert src.includes == ["cuda_fp16.h", "cooperative_groups.h"]
    assert "cuda_fp16.h" in ALLOWED_INCLUDES and "stdint.h" not in ALLOWED_INCLUDES
    with pytest.raises(SourceError, match="not allowed"):
        preprocess("#include <stdio.h>")


@pytest.mark.parametrize("code, fragment", [
    ("#define CAT(a, b) a##b", "token pasting"),
    ("#define STR(a) #a", "stringizing"),
    ("#define F <cuda_fp16.h>\n#include F", "literally"),
    ("#line 3 \"x.cu\"", "#line"),
    ("# 3 \"x.cu\"", "line markers"),
    ("#pragma once", "#pragma once"),
    ("#pragma unroll 4\n#pragma unroll\n#pragma nounroll\n#pragma GCC poison x", "#pragma GCC"),
    ("#import <x>", "#import"),
    ("#if __has_include(<x>)\n#endif", "__has_include"),
    ("int t = __TIME__;", "__TIME__"),
    ("int a; é", "non-ASCII"),
    ("<%", "digraphs"),
    ("a ?""?= b", "trigraphs"),
    ("const char* s = u8R\"(x)\";", "raw string"),
    ("int \\u0061;", "backslash"),
    ("/* never closed", "unterminated"),
])
def test_rules(code: str, fragment: str) -> None:
    with pytest.raises(SourceError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        preprocess(code)


def test_expansion_is_bounded() -> None:
    code = "#define A x x x x x x x x\n#define B A A A A A A A A\n#define C B B B B B B B B\n" \
           "#define D C C C C C C C C\n#define E D D D D D D D D\n#define F E E E E E E E E\nint v = F F F F;"
    with pytest.raises(SourceError, match="more than"):
        preprocess(code)


def test_expansion_that_produces_nothing_is_bounded_too() -> None:
    """Macros each calling the one before twice, all expanding to nothing: no token is ever produced,
    so the token cap never trips, and the work doubles a level (at 40 levels, 1242 characters, the
    static check ran for days in the compile thread, with no limit). The work is counted instead.
    22 levels (4 million expansions) are refused; without the count they finish in seconds with no
    error, so the test fails rather than hangs. Kills: the step count removed, or counted per call
    rather than over the whole expansion (each call's loop is short)."""
    for n, call in ((22, "E{i}"), (22, "E{i}(a)")):
        head = "#define E0" + ("(a)" if "(a)" in call else "")
        lines = [head] + [f"#define {call.format(i=i)} {call.format(i=i - 1)} {call.format(i=i - 1)}"
                          for i in range(1, n + 1)]
        with pytest.raises(SourceError, match="steps"):
            preprocess("\n".join(lines + [call.format(i=n).replace("(a)", "(x)"), ""]))


def test_unclosed_macro_calls_count_their_scan() -> None:
    """24,000 unclosed calls ``F(F(F(...`` of a function-like macro: each scans to the end of the code
    for its ')', quadratic (62 s in the static check, no limit). The scan counts in the same steps.
    Kills: the argument scan left out of the count (the code is read in a minute, with no error)."""
    with pytest.raises(SourceError, match="steps"):
        preprocess("#define F(x) x\n" + "F(" * 24_000 + "\n")
