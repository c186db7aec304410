"""What the policy is taught to write: kernels without their comments (``sparserl.data.targets``).

Mutations killed: comments kept, code on a commented line dropped with its comment, a "//" inside a
string literal taken for a comment, blank lines of the code removed, the header lines touched, text with
an unterminated block comment rewritten, the library's kernels changed in meaning (each still compiles to
the same PTX without its comments)."""

from __future__ import annotations

import subprocess

import pytest

from sparserl.data.targets import without_comments
from sparserl.harness.compile import find_nvcc
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import get_variant


def test_comments_go_and_the_code_stays() -> None:
    code = ("FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256), block=256\n\n"
            "// a whole-line comment\n"
            "__global__ void k(int m) {  // the kernel\n"
            "    const char* s = \"not // a comment\";\n"
            "\n"
            "    /* a block\n       comment */ int a = 1;\n"
            "}\n")
    got = without_comments(code)
    assert got == ("FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256), block=256\n\n"
                   "__global__ void k(int m) {\n"
                   "    const char* s = \"not // a comment\";\n"
                   "\n"
                   " int a = 1;\n"  # the block comment's lines go; its last line keeps the code after it
                   "}\n")
    assert without_comments("int a; /* never closed") == "int a; /* never closed"
    assert without_comments(got) == got  # nothing left to remove


def test_a_library_kernel_loses_a_fifth_of_its_text_and_none_of_its_code(tmp_path) -> None:
    text = get_variant("spmv/csr_adaptive/-/rpw=32,items=8,long_len=16384,seg=16384,block=256").render()
    bare = without_comments(text)
    assert "//" not in bare and len(bare) < 0.85 * len(text)
    assert bare.split("\n")[:4] == text.split("\n")[:4]  # FORMAT, PARAMS and the LAUNCH lines as they were
    if find_nvcc() is None:
        pytest.skip("nvcc not found: the PTX comparison needs it")
    ptx = []
    for name, t in (("a", text), ("b", bare)):
        src = tmp_path / f"{name}.cu"
        src.write_text(split_completion(t, Op.SPMV)[1])
        out = tmp_path / f"{name}.ptx"
        r = subprocess.run([find_nvcc(), "-arch=sm_90", "--ptx", "-o", str(out), str(src)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-1500:]
        ptx.append("\n".join(l for l in out.read_text().splitlines() if not l.startswith(("//", ".file", ".loc"))))
    assert ptx[0] == ptx[1]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_every_library_variant_compiles_without_its_comments() -> None:
    """Kills: code lost with a comment anywhere in the library (a ``//`` inside an expression, a comment
    between a macro and its line), which the one kernel compared above would not show."""
    from sparserl.harness.compile import CompileOptions, compile_many
    from sparserl.kernels.library import all_variants

    vs = all_variants()
    bare = [without_comments(v.render()) for v in vs]
    assert all("//" not in b for b in bare)
    results = compile_many([split_completion(b, v.op)[1] for b, v in zip(bare, vs)],
                           CompileOptions(arch="sm_90", backend="nvcc"))
    failed = [(v.id, r.log[-300:]) for v, r in zip(vs, results) if not r.ok]
    assert not failed, failed


def test_taught_rows_strip_each_distinct_code_once(monkeypatch) -> None:
    """SFT's rows as it trains on them, made once at set-up. Kills: a row left with its comments, another field
    changed, the stripping repeated for rows that share a kernel."""
    import dataclasses

    import sparserl.data.targets as targets

    @dataclasses.dataclass(frozen=True)
    class Row:
        code: str
        rows: list

    calls = []
    real = targets.without_comments
    monkeypatch.setattr(targets, "without_comments", lambda code: calls.append(code) or real(code))
    a, b = "int a; // one\n", "int b; // two\n"
    got = targets.taught_rows([Row(a, [1]), Row(b, [2]), Row(a, [3])])
    assert [(r.code, r.rows) for r in got] == [("int a;\n", [1]), ("int b;\n", [2]), ("int a;\n", [3])]
    assert calls == [a, b]
