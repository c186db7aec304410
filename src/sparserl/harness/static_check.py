"""Static checks on a completion's CUDA code, before anything is compiled or run.

What this protects against (each is a way a policy could fool timing or verification,
or harm the worker), and the rule that stops it:

* host code or device-side launches that move work out of the timed region
  (``int main``, ``__host__``, ``<<<``, any ``cuda*()`` runtime call, streams);
* reading clocks or timers to behave differently when timed (``clock``, ``clock64``,
  ``%globaltimer``, ``__nanosleep``);
* inline PTX / SASS (``asm``), traps and breakpoints (``__trap``, ``__brkpt``);
* calling a vendor library instead of writing the kernel (``cusparse*``, ``cublas*``);
* state that survives between calls, which lets a kernel cache its output
  (namespace-scope ``__device__`` / ``__managed__`` variables, ``static`` locals);
* output floods and heap use (``printf``, ``malloc``/``free``, ``new``/``delete``);
* ``#include`` outside a short allow-list of device headers.

Checks run on the code with comments and string literals removed, so a comment that
mentions ``printf`` is fine and a banned call hidden in a string is not needed to be.
What it does not protect against: wrong answers, out-of-bounds accesses, hangs and
crashes (verification and the isolated worker pool handle those), and ``#define`` tricks
that assemble a banned identifier from pieces (the compile step still rejects host
code in a device-only build, and the verifier still checks every answer).

Also checked here: every kernel a ``LAUNCH:`` line names is defined as an
``extern "C" __global__`` function whose parameter types match the contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparserl.kernels.contract import Header, Op, kernel_params

ALLOWED_INCLUDES = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cooperative_groups.h", "cooperative_groups/reduce.h",
    "math_constants.h", "stdint.h", "cstdint", "cuda/std/cstdint", "cuda_pipeline.h", "cuda/barrier",
})

_BANNED: list[tuple[str, str]] = [
    (r"\b(?:asm|__asm__|__asm)\b", "inline assembly (asm) is not allowed"),
    (r"\b__trap\b|\b__brkpt\b|\btrap\s*\(|\b__builtin_trap\b", "traps and breakpoints are not allowed"),
    (r"\bclock(?:64)?\s*\(|\bglobaltimer\b|\b__nanosleep\b", "reading clocks or sleeping is not allowed"),
    (r"\bprintf\s*\(", "printf is not allowed"),
    (r"\b(?:malloc|free|realloc|calloc)\s*\(|\bnew\b|\bdelete\b", "heap allocation is not allowed"),
    (r"\bcusparse\w*|\bcublas\w*|\bcusolver\w*", "calling vendor libraries (cuSPARSE, cuBLAS) is not allowed"),
    (r"<<<", "device-side kernel launches (<<<) are not allowed"),
    (r"\bcuda[A-Z]\w*\s*\(", "CUDA runtime API calls are not allowed in device code"),
    (r"\b__host__\b", "host code is not allowed (device code only)"),
    (r"\bint\s+main\s*\(", "host code is not allowed (main)"),
    (r"\b__managed__\b", "managed (__managed__) variables are not allowed"),
    (r"\bstd::(?:thread|chrono)\b|\bsystem\s*\(|\bfopen\s*\(", "host facilities are not allowed"),
]
_BANNED_RE = [(re.compile(p), msg) for p, msg in _BANNED]
_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", re.MULTILINE)
_KERNEL_DEF = re.compile(
    r'(extern\s+"C?"\s+)?__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(([^)]*)\)'
)
MAX_CODE_CHARS = 48_000


@dataclass(frozen=True)
class StaticViolation:
    kind: str  # "static_check" or "contract_error"
    message: str


def strip_comments_and_strings(code: str) -> str:
    """The code with // and /* */ comments and string/char literals blanked (lines kept)."""
    out = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            seg = code[i: n if j < 0 else j + 2]
            out.append("\n" * seg.count("\n"))
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and code[j] != c and code[j] != "\n":
                j += 2 if code[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _namespace_scope_state(code: str) -> str | None:
    """A message if the code declares variables that outlive a call."""
    depth = 0
    stmt: list[str] = []
    for ch in code:
        if ch == "{":
            if depth == 0:
                stmt = []
            depth += 1
        elif ch == "}":
            depth -= 1
            stmt = []
        elif depth == 0:
            if ch == ";":
                decl = "".join(stmt)
                if re.search(r"\b__device__\b", decl) and "(" not in decl and not re.search(r"\b__constant__\b", decl):
                    return f"global device variable '{decl.strip()[:60]}' would keep state between calls"
                stmt = []
            else:
                stmt.append(ch)
    if re.search(r"\bstatic\s+(?!__device__\s+__forceinline__|__device__\s+inline|__forceinline__|inline|__device__)"
                 r"(?:const\s+)?(?:volatile\s+)?(?:unsigned\s+)?\w+\s+\w+\s*(?:\[|=|;)", code):
        return "static variables would keep state between calls"
    return None


def signature_problem(code: str, header: Header, op: Op) -> str | None:
    """A message if a launched kernel is missing or its parameters break the contract."""
    defs = {m.group(2): m for m in _KERNEL_DEF.finditer(code)}
    expected = [p.base for p in kernel_params(header.format, op)]
    for name in dict.fromkeys(header.kernel_names(op)):
        m = defs.get(name)
        if m is None:
            return f"kernel '{name}' named by LAUNCH is not defined as a __global__ function"
        if not m.group(1):
            return f"kernel '{name}' must be declared extern \"C\""
        params = [p.strip() for p in m.group(3).split(",") if p.strip()]
        got = []
        for p in params:
            p = re.sub(r"\b(?:const|__restrict__|__restrict|restrict|volatile)\b", " ", p)
            toks = p.replace("*", " * ").split()
            got.append("".join(toks[:-1]))  # drop the parameter's name
        if got != expected:
            return (f"kernel '{name}' takes ({', '.join(got)}) but the contract for {op.value} "
                    f"{header.format} is ({', '.join(expected)})")
    return None


def static_check(code: str, header: Header, op: Op) -> StaticViolation | None:
    """The first violation in ``code``, or None when it may be compiled."""
    if len(code) > MAX_CODE_CHARS:
        return StaticViolation("static_check", f"code longer than {MAX_CODE_CHARS} characters")
    for inc in _INCLUDE.findall(code):
        if inc not in ALLOWED_INCLUDES:
            return StaticViolation("static_check", f"#include <{inc}> is not allowed (allowed: {', '.join(sorted(ALLOWED_INCLUDES))})")
    bare = strip_comments_and_strings(code)
    for rx, msg in _BANNED_RE:
        if rx.search(bare):
            return StaticViolation("static_check", msg)
    if (state := _namespace_scope_state(bare)) is not None:
        return StaticViolation("static_check", state)
    if (sig := signature_problem(bare, header, op)) is not None:
        return StaticViolation("contract_error", sig)
    return None
