"""Static checks on a completion's CUDA code, before anything is compiled: the fast early rejects.

They run on the code as the compiler's front end sees it (:mod:`sparserl.harness.source`: lines
spliced, comments gone, directives allow-listed, no token pasting or stringizing, macros
expanded), so a rule cannot be dodged with the preprocessor. The same rules are enforced again on
what was compiled (:mod:`sparserl.harness.ptx_check`), which is the ground truth; these catch the
common cases before paying for a compile and give the clearest message.

What a completion must not do, and why (each is a way to fool timing or verification, or to harm
the worker):

* **Host code** (device code only): every function, at namespace or class scope, is
  ``__device__`` or ``__global__``; no host variables (namespace-scope data is ``__constant__``,
  ``__shared__``, ``constexpr`` or ``const``); no ``__host__``, ``main``, runtime API calls
  (``cuda*()``), device-side launches (``<<<``), host facilities.
* **State that survives a launch**: no writable variable at namespace scope in any namespace or
  storage class (``__device__ int x;``), no writable ``static`` data member, no writable
  ``static`` local. Initialised constant tables (``__constant__``, ``static const``) are fine: a
  matrix-specialised kernel needs them. A ``__constant__`` table must be initialised in the
  source: nothing else fills it (device code cannot write it; the compiled-code check refuses the
  trap a write through a cast compiles to).
* **Clocks and timers** (``clock64``, ``%globaltimer``, ``__nanosleep``), **inline assembly**
  (``asm``), **traps and breakpoints**, **printf**, **heap use**, **vendor libraries**.
* **Files**: ``#include`` only of allow-listed headers written literally (the rest of the
  preprocessor rules are in :mod:`sparserl.harness.source`).

Also checked here: every kernel a ``LAUNCH:`` line names is defined as an ``extern "C"
__global__`` function whose parameter types match the contract.
Namespaces and classes may nest at most :data:`MAX_SCOPE_DEPTH` levels deep (the walk recurses).

What this does not protect against: wrong answers, out-of-bounds accesses, hangs and crashes
(verification, the guards and the isolated worker pool handle those).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparserl.harness.source import SourceError, Token, preprocess
from sparserl.kernels.contract import Header, Op, kernel_params

MAX_CODE_CHARS = 48_000
MAX_SCOPE_DEPTH = 100
"""How deep namespaces and classes may nest inside one another; deeper is refused."""

_BANNED_IDENTS: dict[str, str] = {}
for _names, _msg in (
    (("asm", "__asm__", "__asm"), "inline assembly (asm) is not allowed"),
    (("__trap", "__brkpt", "__builtin_trap"), "traps and breakpoints are not allowed"),
    (("clock64", "__clock64", "globaltimer", "__globaltimer", "__nanosleep"), "reading clocks or sleeping is not allowed"),
    (("printf", "vprintf", "puts"), "printf is not allowed"),
    (("new", "delete", "__builtin_malloc"), "heap allocation is not allowed"),
    (("__host__",), "host code is not allowed (device code only)"),
    (("__managed__",), "managed (__managed__) variables are not allowed"),
    (("main",), "host code is not allowed (main)"),
    (("system", "fopen", "popen", "fread", "fwrite", "getenv"), "host facilities are not allowed"),
):
    for _n in _names:
        _BANNED_IDENTS[_n] = _msg
_BANNED_CALLS = {
    "clock": "reading clocks or sleeping is not allowed",
    "trap": "traps and breakpoints are not allowed",
    "malloc": "heap allocation is not allowed", "free": "heap allocation is not allowed",
    "realloc": "heap allocation is not allowed", "calloc": "heap allocation is not allowed",
}
L2_POLICY_MESSAGE = ("L2 residency hints (__nv_associate_access_property) are not allowed: lines kept in L2 would "
                     "outlive the launch and the cold timing's flush")
_VENDOR = ("cusparse", "cublas", "cusolver", "cufft", "curand")
_EXEC_SPACES = {"__global__", "__device__"}
_CONST_DATA = {"__constant__", "__shared__", "constexpr"}
_QUALIFIERS = {"const", "__restrict__", "__restrict", "restrict", "volatile"}


@dataclass(frozen=True)
class StaticViolation:
    kind: str  # "static_check" or "contract_error"
    message: str


class _Refused(Exception):
    pass


def _banned(tokens: list[Token]) -> str | None:
    for i, t in enumerate(tokens):
        nxt = tokens[i + 1].text if i + 1 < len(tokens) else ""
        if t.text == "<<<":
            return "device-side kernel launches (<<<) are not allowed"
        if t.kind != "ident":
            continue
        if t.text == "delete" and i and tokens[i - 1].text == "=" and nxt == ";":
            continue  # a deleted function (S(const S&) = delete;), not the operator
        if t.text in _BANNED_IDENTS:
            return _BANNED_IDENTS[t.text]
        if nxt == "(" and t.text in _BANNED_CALLS:
            return _BANNED_CALLS[t.text]
        if t.text.lower().startswith(_VENDOR):
            return "calling vendor libraries (cuSPARSE, cuBLAS) is not allowed"
        if nxt == "(" and len(t.text) > 4 and t.text.startswith("cuda") and t.text[4].isupper():
            return "CUDA runtime API calls are not allowed in device code"
        if t.text == "std" and nxt == "::" and i + 2 < len(tokens) and tokens[i + 2].text in ("thread", "chrono"):
            return "host facilities are not allowed"
        if t.text.startswith("__nv_associate_access_property"):
            return L2_POLICY_MESSAGE
    return None


def _match(words: list[str], i: int, open_: str = "(", close: str = ")") -> int:
    """Index of the bracket closing the one at ``words[i]``."""
    depth = 0
    for j in range(i, len(words)):
        if words[j] == open_:
            depth += 1
        elif words[j] == close:
            depth -= 1
            if depth == 0:
                return j
    raise _Refused(f"unbalanced '{open_}'")


def _after_templates(decl: list[str]) -> int:
    """Index of the first token after ``decl``'s leading template parameter lists (``len(decl)`` when
    one is not closed). Angle brackets inside parentheses are comparisons (``template <bool B = (3 > 2)>``),
    and ``>>``/``>>>`` close two or three lists at once (``template <class T = A<B<int>>>``)."""
    i = 0
    while i + 1 < len(decl) and decl[i] == "template" and decl[i + 1] == "<":
        depth = parens = 0
        for j in range(i + 1, len(decl)):
            if decl[j] in ("(", "["):
                parens += 1
            elif decl[j] in (")", "]"):
                parens -= 1
            elif parens == 0:
                depth += {"<": 1, ">": -1, ">>": -2, ">>>": -3}.get(decl[j], 0)
            if depth <= 0 and parens == 0:
                i = j + 1
                break
        else:
            return len(decl)
    return i


def _strip_template(decl: list[str]) -> list[str]:
    """``decl`` without its template parameter lists and leading storage words."""
    decl = decl[_after_templates(decl):]
    while decl and decl[0] in ("typedef", "inline", "static", "extern", "public", "private", "protected", ":"):
        decl = decl[1:]
    return decl


def _depth0(decl: list[str], tok: str) -> int:
    """Index of the first ``tok`` outside parentheses and brackets, or -1."""
    depth = 0
    for j, t in enumerate(decl):
        if t == tok and depth == 0:
            return j
        if t in ("(", "["):
            depth += 1
        elif t in (")", "]"):
            depth -= 1
    return -1


def _name_before(decl: list[str], j: int) -> str:
    for t in reversed(decl[:j]):
        if t[:1].isalpha() or t[:1] == "_":
            return t
    return "?"


def _declarators(decl: list[str]) -> list[list[str]]:
    """A declaration's tokens cut at its top-level commas (``int a = 1, b[2];`` -> two declarators;
    brace initialisers are already one ``{}`` token)."""
    out, depth, cur = [], 0, []
    for t in decl:
        if t in ("(", "["):
            depth += 1
        elif t in (")", "]"):
            depth -= 1
        if t == "," and depth == 0:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out + [cur]


def _declarator_name(decl: list[str]) -> str:
    for stop in ("=", "[", "{", "("):
        j = _depth0(decl, stop)
        if j > 0:
            return _name_before(decl, j)
    return _name_before(decl, len(decl))


class _Scanner:
    """Walks the expanded tokens once, scope by scope, and records kernel definitions."""

    def __init__(self, tokens: list[Token]):
        self.toks = [t.text for t in tokens]
        self.kernels: dict[str, tuple[bool, list[str]]] = {}  # name -> (extern "C", parameter tokens)

    def run(self) -> None:
        self._scope(0, len(self.toks), "ns", extern_c=False)

    def _scope(self, i: int, end: int, kind: str, extern_c: bool, depth: int = 0) -> None:
        if depth > MAX_SCOPE_DEPTH:
            raise _Refused(f"namespaces and classes nest more than {MAX_SCOPE_DEPTH} levels deep")
        decl: list[str] = []
        while i < end:
            t = self.toks[i]
            if t == "{":
                close = _match(self.toks, i, "{", "}")
                opened = self._classify(decl)
                if _depth0(decl, "(") >= 0 and decl.count("(") > decl.count(")"):
                    opened = "skip"  # a brace inside parentheses (default argument)
                if opened == "ns":
                    self._scope(i + 1, close, "ns", extern_c or decl[:2] == ["extern", '"C"'], depth + 1)
                    decl = []
                elif opened == "class":
                    self._scope(i + 1, close, "class", False, depth + 1)
                    decl.append("{}")
                elif opened == "fn":
                    self._function(decl, kind, extern_c)
                    self._body(i + 1, close)
                    decl = []
                else:  # enum body or brace initialiser: part of the declaration
                    decl.append("{}")
                i = close + 1
                continue
            if t == ";":
                self._declaration(decl, kind, extern_c)
                decl = []
            elif t == "}":
                raise _Refused("unbalanced '}'")
            else:
                decl.append(t)
            i += 1
        # tokens left without a ';' are not a declaration the compiler would accept: it says so

    @staticmethod
    def _classify(words: list[str]) -> str:
        if words[:1] in (["namespace"], ["inline"]) and "namespace" in words[:2]:
            return "ns"
        if words in (["extern", '"C"'], ["extern", '"C++"']):
            return "ns"
        core = _strip_template(words)  # a template's default argument is not an initialiser
        if _depth0(core, "=") >= 0:
            return "init"
        if core and core[0] == "enum":
            return "enum"
        paren = _depth0(core, "(")
        for key in ("struct", "class", "union"):
            if key in core and (paren < 0 or core.index(key) < paren and
                                _name_before(core, paren) in ("__align__", "alignas", "__declspec", key)):
                return "class"
        return "fn" if paren >= 0 else "init"

    def _function(self, words: list[str], kind: str, extern_c: bool) -> None:
        words = words[_after_templates(words):]  # a template's default argument may hold parentheses
        paren = _depth0(words, "(")
        while paren >= 0 and words[paren - 1] in ("__launch_bounds__", "__align__", "alignas", "__maxnreg__"):
            close = _match(words, paren)  # skip the attribute's argument list
            nxt = _depth0(words[close + 1:], "(")
            paren = close + 1 + nxt if nxt >= 0 else -1
        if paren < 0:
            raise _Refused("a function definition without a parameter list")
        name = _name_before(words, paren)
        head = words[:paren]
        if not _EXEC_SPACES & set(head):
            raise _Refused(f"host function '{name}' is not allowed (device code only): mark it __device__")
        if "__global__" in head:
            close = _match(words, paren)
            c_linkage = extern_c or ("extern" in head and '"C"' in head)
            self.kernels[name] = (c_linkage, words[paren + 1:close])

    def _declaration(self, words: list[str], kind: str, extern_c: bool) -> None:
        core = _strip_template(words)
        if not core or core[0] in ("typedef", "using", "static_assert", "friend", "namespace") or words[0] in (
                "typedef", "using"):
            return
        if core[0] in ("struct", "class", "union", "enum") and (len(core) <= 3 or core[-1] == "{}"):
            return  # a forward declaration or a type definition with no declarator
        if core[-2:] in (["=", "default"], ["=", "delete"]):
            return
        paren = _depth0(core, "(")
        is_function = paren > 0 and _depth0(core[:paren], "=") < 0 and core[paren - 1] not in ("__align__", "alignas")
        if is_function:
            if not _EXEC_SPACES & set(core[:paren]):
                raise _Refused(f"host function or variable '{_name_before(core, paren)}' is not allowed "
                               "(device code only): mark it __device__")
            return
        name = _declarator_name(core)
        if kind == "class":
            if "static" in words and not {"const", "constexpr"} & set(words):
                raise _Refused(f"static data member '{name}' would keep state between launches")
            return
        if "extern" in words and "__shared__" not in words:
            raise _Refused(f"extern variable '{name}' is not allowed (device code only)")
        if "__constant__" in words and not all({"=", "{}"} & set(d) for d in _declarators(core)):
            raise _Refused(f"__constant__ table '{name}' has no initialiser: constant tables are filled "
                           "in the source (nothing else writes them)")
        if _CONST_DATA & set(words):
            return
        if "const" in words and not {"*", "&", "&&", "mutable"} & set(words):
            return
        if "__device__" in words:
            raise _Refused(f"module-scope variable '{name}' is writable device state that would survive a "
                           "launch: use __constant__ for tables, registers or shared memory for the rest")
        raise _Refused(f"host variable '{name}' is not allowed (device code only): use constexpr or __constant__")

    def _body(self, i: int, end: int) -> None:
        """Inside a function body: refuse writable static locals."""
        while i < end:
            if self.toks[i] == "static":
                j = i
                while j < end and self.toks[j] not in (";", "{", "="):
                    j += 1
                if not {"const", "constexpr", "__shared__"} & set(self.toks[i:j]):
                    raise _Refused(f"static local '{_name_before(self.toks[i:j], j - i)}' "
                                   "would keep state between launches")
            i += 1


def _param_types(params: list[str]) -> list[str]:
    out, cur = [], []
    for t in params + [","]:
        if t == ",":
            if cur:
                kept = [w for w in cur if w not in _QUALIFIERS]
                out.append("".join(kept[:-1]))  # drop the parameter's name
            cur = []
        else:
            cur.append(t)
    return out


def signature_problem(kernels: dict[str, tuple[bool, list[str]]], header: Header, op: Op) -> str | None:
    """A message if a launched kernel is missing or its parameters break the contract."""
    expected = [p.base for p in kernel_params(header.format, op)]
    for name in dict.fromkeys(header.kernel_names(op)):
        if name not in kernels:
            other = "spmv_kernel" if op is Op.SPMM else "spmm_kernel"
            hint = (f" (a LAUNCH line without kernel= launches {op.value}_kernel; the code defines {other}: an "
                    f"{other[:4]} kernel checked as {op.value}?)" if name == f"{op.value}_kernel" and other in kernels
                    else "")
            return f"kernel '{name}' named by LAUNCH is not defined as a __global__ function{hint}"
        c_linkage, params = kernels[name]
        if not c_linkage:
            return f"kernel '{name}' must be declared extern \"C\""
        got = _param_types(params)
        if got != expected:
            return (f"kernel '{name}' takes ({', '.join(got)}) but the contract for {op.value} "
                    f"{header.format} is ({', '.join(expected)})")
    return None


def static_check(code: str, header: Header, op: Op) -> StaticViolation | None:
    """The first violation in ``code``, or None when it may be compiled."""
    if len(code) > MAX_CODE_CHARS:
        return StaticViolation("static_check", f"code longer than {MAX_CODE_CHARS} characters")
    try:
        src = preprocess(code)
    except SourceError as exc:
        return StaticViolation("static_check", str(exc))
    if (msg := _banned(src.macro_tokens) or _banned(src.tokens)) is not None:
        return StaticViolation("static_check", msg)
    scanner = _Scanner(src.tokens)
    try:
        scanner.run()
    except _Refused as exc:
        return StaticViolation("static_check", str(exc))
    if (sig := signature_problem(scanner.kernels, header, op)) is not None:
        return StaticViolation("contract_error", sig)
    return None
