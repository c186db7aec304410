"""The static checks rule by rule: every banned name and call, every refusal's message word for word (a
refinement prompt shows it to the policy), and the declarations each rule must let through.

Mutations killed: a banned call refused without its parenthesis or only with it, the vendor and runtime-API
prefixes, ``std::thread``/``std::chrono``, the extern "C" requirement dropped, the length limit off by one,
a source error's message lost, static locals judged by the wrong tokens, ``__constant__`` tables with one
declarator uninitialised, host functions, prototypes and variables, extern variables, static data members,
attributes and templates before a class or function, default arguments, unbalanced braces; brackets not counted
as nesting (a writable array sized with a parenthesis passed as a prototype), the alignment attribute looked for
after the parenthesis, parentheses not counted when cutting declarators."""

from __future__ import annotations

import pytest

from sparserl.harness.static_check import L2_POLICY_MESSAGE, MAX_CODE_CHARS, MAX_SCOPE_DEPTH, static_check
from sparserl.kernels.contract import Op, split_completion
from tests.harness.adversarial.base import GOOD, HEAD, HONEST, SIG, csr


def verdict(text: str):
    header, code = split_completion(text, Op.SPMV)
    return static_check(code, header, Op.SPMV)


def refused(text: str, message: str, kind: str = "static_check") -> None:
    v = verdict(text)
    assert v is not None and (v.kind, v.message) == (kind, message), v


@pytest.mark.parametrize("name, message", [
    ("asm", "inline assembly (asm) is not allowed"), ("__asm__", "inline assembly (asm) is not allowed"),
    ("__trap", "traps and breakpoints are not allowed"), ("__brkpt", "traps and breakpoints are not allowed"),
    ("__builtin_trap", "traps and breakpoints are not allowed"),
    ("clock64", "reading clocks or sleeping is not allowed"), ("__nanosleep", "reading clocks or sleeping is not allowed"),
    ("globaltimer", "reading clocks or sleeping is not allowed"),
    ("printf", "printf is not allowed"), ("vprintf", "printf is not allowed"), ("puts", "printf is not allowed"),
    ("new", "heap allocation is not allowed"), ("delete", "heap allocation is not allowed"),
    ("__builtin_malloc", "heap allocation is not allowed"),
    ("__managed__", "managed (__managed__) variables are not allowed"),
    ("system", "host facilities are not allowed"), ("getenv", "host facilities are not allowed"),
    ("__nv_associate_access_property", L2_POLICY_MESSAGE), ("__nv_associate_access_property_impl", L2_POLICY_MESSAGE),
])
def test_banned_names_anywhere(name: str, message: str) -> None:
    refused(csr(f"{HONEST} if (sum != sum) {{ (void)sizeof({name}); }}"), message)


@pytest.mark.parametrize("call, message", [
    ("clock", "reading clocks or sleeping is not allowed"), ("trap", "traps and breakpoints are not allowed"),
    ("malloc", "heap allocation is not allowed"), ("free", "heap allocation is not allowed"),
    ("realloc", "heap allocation is not allowed"), ("calloc", "heap allocation is not allowed"),
])
def test_banned_calls_only_as_calls(call: str, message: str) -> None:
    refused(csr(f"{HONEST} if (sum != sum) {call}(0);"), message)
    assert verdict(csr(f"int {call} = 1; {HONEST} y[row] += 0.f * {call};")) is None  # a local of that name


def test_vendor_libraries_and_the_runtime_api() -> None:
    refused(csr(f"{HONEST} cusparseCreate(0);"), "calling vendor libraries (cuSPARSE, cuBLAS) is not allowed")
    refused(csr(f"{HONEST} int CUBLAS_OK = 0;"), "calling vendor libraries (cuSPARSE, cuBLAS) is not allowed")
    refused(csr(f"{HONEST} cudaDeviceSynchronize();"), "CUDA runtime API calls are not allowed in device code")
    ok = csr(f"int cudaLike = 1; {HONEST} y[row] += 0.f * cudaLike + 0.f * cuda() + 0.f * cudab();",
             before="__device__ int cuda() { return 0; }\n__device__ int cudab() { return 0; }")
    assert verdict(ok) is None  # not a call, the bare prefix, a lower-case fifth letter


def test_host_facilities_through_std() -> None:
    refused(csr(f"{HONEST} auto t = std::chrono::steady_clock::now();"), "host facilities are not allowed")
    refused(csr(f"{HONEST} std::thread w;"), "host facilities are not allowed")
    assert verdict(csr(f"{HONEST} y[row] = std::min(sum, 1.f);")) is None
    assert verdict(csr(f"{HONEST} int thread = 0; y[row] += 0.f * thread;")) is None


def test_device_launches() -> None:
    refused(csr(f"{HONEST} spmv_kernel<<<1, 1>>>(m, n, nnz, row_ptr, col_idx, val, x, y);"),
            "device-side kernel launches (<<<) are not allowed")


def test_the_kernel_must_have_c_linkage_in_either_spelling() -> None:
    plain = GOOD.replace('extern "C" ', "")
    refused(plain, "kernel 'spmv_kernel' must be declared extern \"C\"", "contract_error")
    block = HEAD + 'extern "C" {\n' + SIG.replace('extern "C" ', "") + "\n{\n    const int row = blockIdx.x * " \
        "blockDim.x + threadIdx.x;\n    " + HONEST + "\n}\n}\n"
    assert verdict(block) is None


def test_the_length_limit() -> None:
    header, code = split_completion(GOOD, Op.SPMV)
    pad = MAX_CODE_CHARS - len(code)
    assert static_check(code + " " * pad, header, Op.SPMV) is None  # exactly at the limit
    v = static_check(code + " " * (pad + 1), header, Op.SPMV)
    assert v is not None and (v.kind, v.message) == ("static_check", f"code longer than {MAX_CODE_CHARS} characters")


def test_a_source_error_is_a_static_check_with_its_message() -> None:
    refused(csr(HONEST, before="#pragma once"),
            "#pragma once is not allowed (only #pragma unroll [N] and #pragma nounroll)")


@pytest.mark.parametrize("local, ok", [
    ("static float cache[4];", False), ("static int calls = 0;", False), ("static int calls{0};", False),
    ("static const float t[2] = {1.f, 2.f};", True), ("static constexpr int K = 4;", True),
    ("static __shared__ float tile[32];", True),
])
def test_static_locals(local: str, ok: bool) -> None:
    text = csr(f"{local} {HONEST}")
    if ok:
        assert verdict(text) is None
    else:
        name = "cache" if "cache" in local else "calls"
        refused(text, f"static local '{name}' would keep state between launches")


_WRITABLE = ("module-scope variable '{}' is writable device state that would survive a launch: use __constant__ for "
             "tables, registers or shared memory for the rest")


@pytest.mark.parametrize("before, message", [
    ("float helper(float a) { return a; }",
     "host function 'helper' is not allowed (device code only): mark it __device__"),
    ("template <int N> float h() { return N; }", "host function 'h' is not allowed (device code only): mark it __device__"),
    ("float helper(float);", "host function or variable 'helper' is not allowed (device code only): mark it __device__"),
    ("int counter;", "host variable 'counter' is not allowed (device code only): use constexpr or __constant__"),
    ("int* table = 0;", "host variable 'table' is not allowed (device code only): use constexpr or __constant__"),
    ("__device__ int a = 1, b;", _WRITABLE.format("a")),
    ("extern __device__ int e;", "extern variable 'e' is not allowed (device code only)"),
    ("__constant__ float t[2] = {1.f, 2.f}, u[2];", "__constant__ table 't' has no initialiser: constant tables are "
                                                    "filled in the source (nothing else writes them)"),
    ("struct S { static int n; };", "static data member 'n' would keep state between launches"),
    ("struct S { float a; }; __device__ S state;", _WRITABLE.format("state")),
    ("namespace a { int hidden; }", "host variable 'hidden' is not allowed (device code only): use constexpr or "
                                    "__constant__"),
    # a parenthesis inside the array's size or an alignment is not a parameter list: a writable array, not a prototype
    ("__device__ float stash[sizeof(float) * (1024)];", _WRITABLE.format("stash")),
    ("__device__ float stash[(((1024)))][(2)];", _WRITABLE.format("stash")),
    ("__device__ __align__(16) float stash[1024];", _WRITABLE.format("stash")),
    ("__device__ alignas(16) float stash[1024];", _WRITABLE.format("stash")),
    ("static __device__ int calls;", _WRITABLE.format("calls")),
    ("struct S { public: static int n; };", "static data member 'n' would keep state between launches"),
    ("__device__ const float* cursor;", _WRITABLE.format("cursor")),  # a pointer to const data is itself writable
])
def test_module_scope_refusals(before: str, message: str) -> None:
    refused(csr(HONEST, before=before), message)


@pytest.mark.parametrize("before", [
    "extern __shared__ float dyn[];",
    "struct S { static const int n = 3; static constexpr int m = 4; };",
    "struct __align__(16) V { float a, b, c, d; };",
    "struct alignas(16) W { float a; };",
    "__device__ float f(float a = float{1}) { return a; }",
    "typedef struct { int a; } P;\nusing Q = P;\nstatic_assert(sizeof(P) == 4, \"size\");\nenum class E { A, B };",
    "struct S { __device__ S() = default; __device__ S(const S&) = delete; int v; };",
    "template <int N> struct Wide { float v[N]; };\ntemplate <typename T> __device__ T id(T a) { return a; }",
    "__constant__ float t[2] = {1.f, 2.f}, u[2] = {3.f, 4.f};",
    "__device__ const int A = 1, B[2] = {2, 3};",
    "struct Fwd;",
    # a comma inside an initialiser's parentheses does not start a second, uninitialised declarator
    "__constant__ int lim = (1, 2), w[(1, 2)] = {3, 4};",
    "__device__ float f(float a, float b[(2)]);",
])
def test_declarations_that_pass(before: str) -> None:
    assert verdict(csr(HONEST, before=before)) is None, before


_STATIC_LOCAL = "__device__ float acc_next() { static float acc = 0.f; acc += 1.f; return acc; }"


@pytest.mark.parametrize("params", [
    "int N = 1", "typename T = Box<Box<int>>", "typename T = Box<Box<int> >", "typename T = Box<Box<Box<int>>>",
    "bool B = (3 > 2)", "int N = sizeof(int[2 > 1 ? 1 : 2])",
])
def test_a_template_default_argument_is_not_an_initialiser(params: str) -> None:
    """A default argument's '=' (and the angle brackets and parentheses around it) must not turn a template
    function or class into an initialised variable, whose body the scan skips: a writable static local, a static
    data member or a host function would pass unseen. After the kernel, nothing else gives it away.
    Kills: the '=' looked for before the template lists are stripped; '>>' or '>>>' closing too few lists;
    a '>' inside parentheses closing the list."""
    box = "template <typename T> struct Box { T v; };\n"
    for tail, message in (
            (_STATIC_LOCAL, "static local 'acc' would keep state between launches"),
            ("struct S { static int hits; };", "static data member 'hits' would keep state between launches"),
            ("float h() { return 1.f; }", "host function 'h' is not allowed (device code only): mark it __device__"),
            ("__device__ float g(float a) { return a; }", None)):
        code = f"template <{params}> {tail}"
        for text in (csr(HONEST, before=box + code), csr(HONEST, before=box) + code + "\n"):
            if message is None:
                assert verdict(text) is None, text
            else:
                refused(text, message)


def test_delete_as_an_operator_is_refused_and_a_deleted_function_is_not() -> None:
    refused(csr(f"{HONEST} float* p = nullptr; delete p;"), "heap allocation is not allowed")
    refused(csr(f"{HONEST} float* p = nullptr; delete[] p;"), "heap allocation is not allowed")


def test_unbalanced_braces() -> None:
    refused(csr(HONEST, before="}"), "unbalanced '}'")
    refused(GOOD.rstrip().rstrip("}"), "unbalanced '{'")


@pytest.mark.parametrize("attribute", ["__launch_bounds__(256)", "__launch_bounds__(256, 2)", "__maxnreg__(32)"])
def test_kernel_attributes_before_the_name(attribute: str) -> None:
    """The attribute's parentheses are skipped to find the kernel's name and parameters: a mutant that stops
    skipping one of them loses the kernel ("not defined as a __global__ function")."""
    sig = SIG.replace("void spmv_kernel", f"void {attribute} spmv_kernel")
    assert verdict(csr(HONEST, sig=sig)) is None
    wrong = sig.replace("int m, int n", "int m, long n")
    refused(csr(HONEST, sig=wrong), "kernel 'spmv_kernel' takes (int, long, int, int*, int*, float*, float*, float*) but "
                                    "the contract for spmv CSR is (int, int, int, int*, int*, float*, float*, float*)",
            kind="contract_error")


@pytest.mark.parametrize("before, message", [
    ('extern "C++" { __device__ int counter; }', _WRITABLE.format("counter")),
    ("inline namespace v1 { __device__ int counter; }", _WRITABLE.format("counter")),
    ("union U { static int n; float f; };", "static data member 'n' would keep state between launches"),
    ("class C { public: static int n; };", "static data member 'n' would keep state between launches"),
    ("struct S { S(const S&) = delete; };\n__device__ void f() { printf(\"x\"); }", "printf is not allowed"),
])
def test_scopes_that_are_still_read(before: str, message: str) -> None:
    """A linkage block, an inline namespace, a union and a class are scopes whose contents are checked; a
    deleted function does not end the search for banned names. Mutations killed: "C++" or inline or union
    or class not recognised (their bodies skipped as initialisers), the banned-name scan stopped at `= delete`."""
    refused(csr(HONEST, before=before), message)


def test_a_static_local_as_a_body_s_first_statement() -> None:
    """Mutation killed: the body's scan starting one token late."""
    text = f"{HEAD}\n{SIG}\n{{\n    static int calls; const int row = blockIdx.x * blockDim.x + threadIdx.x; {HONEST}\n}}\n"
    refused(text, "static local 'calls' would keep state between launches")


def test_classes_nest_to_the_limit() -> None:
    """Mutation killed: a class counted as two levels."""
    assert verdict(csr(HONEST, before="struct S { " * MAX_SCOPE_DEPTH + "}" * MAX_SCOPE_DEPTH + ";")) is None


@pytest.mark.parametrize("before", ["", ";", "; ;", "; ; ;"])
@pytest.mark.parametrize("local", ["static int calls = (const int)0;", "static int calls{(const int)0};",
                                   "static int calls;"])
def test_a_static_local_anywhere_in_the_body_and_a_const_only_in_its_initialiser(before: str, local: str) -> None:
    """A writable static local after zero to three empty statements (every offset from the body's start, odd and
    even) is refused, and so is one whose initialiser, not its type, says ``const``. Kills the body's scan
    stepping two tokens at a time, and the declaration's type read past its ``=`` or ``{``."""
    refused(csr(f"{before} {local} {HONEST}"), "static local 'calls' would keep state between launches")
