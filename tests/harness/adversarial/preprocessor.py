"""Reaching banned code or other files through the preprocessor."""

from __future__ import annotations

from tests.harness.adversarial.base import GOOD, HEAD, HONEST, csr


def with_prefix(prefix: str) -> str:
    return GOOD.replace(HEAD, HEAD + prefix + "\n")


DOUBLING = "\n".join(["#define E0"] + [f"#define E{i} E{i - 1} E{i - 1}" for i in range(1, 41)] + ["E40"])
"""Macros that each call the one before twice and expand to nothing: no token, 2^40 expansions."""
UNCLOSED = "#define F(x) x\n" + "F(" * 20_000
"""Calls of a function-like macro that never close: each scans to the end of the code."""


CASES: dict[str, tuple[str, str]] = {
    # a clock and asm built by token pasting, a file named by a macro
    "clock_by_token_pasting": (csr(f"{HONEST} if (CAT(clo, ck64)() == 0) y[row] = 0.f;",
                                   before="#define CAT(a, b) a##b"), "static_check"),
    "asm_by_token_pasting": (csr(f'CAT(as, m)("trap;"); {HONEST}', before="#define CAT(a, b) a##b"), "static_check"),
    "name_by_stringizing": (csr(HONEST, before='#define S(x) #x\nconst char* s = S(globaltimer);'), "static_check"),
    "asm_by_line_splice": (csr(f'as\\\nm volatile("trap;"); {HONEST}'), "static_check"),
    "printf_through_a_macro": (csr(f'P("%d", row); {HONEST}', before="#define P printf"), "static_check"),
    "trap_through_a_macro": (csr(f"if (row == 0) T(); {HONEST}", before="#define T __builtin_trap"), "static_check"),
    "clock_through_a_pointer": (csr(f"long long (*f)() = clock64; {HONEST} if (f() == 0) y[row] = 0.f;"),
                                "static_check"),
    "include_file_named_by_macro": (with_prefix('#define F "/etc/passwd"\n#include F'), "static_check"),
    "include_absolute_path": (with_prefix('#include "/etc/passwd"'), "static_check"),
    "include_path_escape": (with_prefix("#include <../../../../../etc/passwd>"), "static_check"),
    "include_next": (with_prefix("#include_next <cuda_fp16.h>"), "static_check"),
    "embed_a_file": (with_prefix('#embed "/etc/passwd"'), "static_check"),
    "pragma_reaches_a_file": (with_prefix('#pragma GCC dependency "/etc/passwd"'), "static_check"),
    "pragma_operator": (csr(f'_Pragma("GCC dependency \\"/etc/passwd\\"") {HONEST}'), "static_check"),
    "has_include_probe": (with_prefix('#if __has_include("/etc/shadow")\n#endif'), "static_check"),
    "digraph_include": (with_prefix('%:include "/etc/passwd"'), "static_check"),
    "trigraph_include": (with_prefix('??=include "/etc/passwd"'), "static_check"),
    "line_directive_fakes_a_file": (with_prefix('#line 1 "cuda_fp16.h"'), "static_check"),
    "universal_character_name": (csr(f'\\u0061sm("trap;"); {HONEST}'), "static_check"),
    "raw_string": (csr(f'const char* s = R"(x)"; {HONEST}'), "static_check"),
    # lexing as the compiler does: 1'//' is the number 1 and a character literal, so a reader that took the
    # apostrophe for a digit separator saw a comment and missed the rest of the line (the compiled code's
    # check still refused the printf; the _Pragma, a source-only rule, went through)
    # work without output: the expansion counts what it looks at (once a static check of days)
    "macros_doubling_to_nothing": (csr(HONEST, before=DOUBLING), "static_check"),
    "unclosed_macro_calls": (csr(HONEST, before=UNCLOSED), "static_check"),
    "digit_separator_hides_a_call": (csr(f'int h = F(1\'//\'); printf("%d", row); {HONEST}',
                                         before="#define F(a) 0"), "static_check"),
    "digit_separator_hides_a_pragma": (csr(f'int h = F(1\'//\'); _Pragma("GCC dependency \\"/etc/passwd\\"") '
                                           f"{HONEST}", before="#define F(a) 0"), "static_check"),
    "code_right_after_an_empty_comment": (csr(f'/**/printf("%d", row); {HONEST}'), "static_check"),
    "include_after_leading_blanks": (with_prefix(' \t #include "/etc/passwd"'), "static_check"),
    "digraph_include_after_leading_blanks": (with_prefix('  %:include "/etc/passwd"'), "static_check"),
    "printf_after_the_null_directive": (csr(f'printf("%d", row); {HONEST}', before="#"), "static_check"),
    # nesting deep enough to exhaust the checker's own recursion (it was an internal error, left out of
    # every reward, instead of the candidate's refusal)
    "macro_chain_deeper_than_the_checker": (csr(f"int deep = A1199; {HONEST}", before="#define A0 1\n" + "".join(
        f"#define A{i} A{i - 1}\n" for i in range(1, 1200))), "static_check"),
    "namespaces_deeper_than_the_checker": (csr(HONEST, before="namespace a { " * 1000 + "}" * 1000), "static_check"),
    # a lone carriage return: nvcc's preprocessor ends the line there, NVRTC reads a space, and a reader that read
    # on took the rest for the comment it began or a plain line: asm after '//\r' and a '\r#define' that pastes
    # 'asm' went to nvcc (which builds what NVRTC refuses, under 'auto') past every source-only rule
    "asm_after_a_comment_ended_by_a_lone_cr": (csr(f'//\r    asm volatile("trap;");\n{HONEST}'), "static_check"),
    "directive_after_a_lone_cr": (csr(f'int pad = 0;\r#define CAT(a, b) a##b\n    if (row == pad) CAT(as, m) '
                                      f'volatile("trap;"); {HONEST}'), "static_check"),
}
