"""Checks on what was compiled: the PTX that NVRTC or nvcc produced from a completion.

The source checks (:mod:`sparserl.harness.static_check`) are fast early rejects; this is the
ground truth, since whatever the preprocessor or the C++ front end did, the PTX is what runs.
It refuses:

* **clocks, timers, SM and warp ids, launch ids, performance counters**: the special registers
  ``%clock``, ``%clock_hi``, ``%clock64``, ``%globaltimer*``, ``%smid``, ``%nsmid``, ``%warpid``,
  ``%nwarpid``, ``%gridid``, ``%pm*``, ``%envreg*`` and ``%current_graph_exec`` (which tells a
  kernel that it runs inside a CUDA graph, that is, that it is being timed);
* **traps and breakpoints**: ``trap``, ``brkpt``, ``pmevent``;
* **L2 eviction policies**: ``createpolicy``, any access with ``.L2::cache_hint`` and any
  ``evict_last`` qualifier. A line loaded with the evict-last priority stays in L2 while lines of
  normal priority are evicted around it, so the matrix would survive the cold timing's flush (which
  reads a clean buffer at normal priority) and the next launch, this kernel's or another's, would
  time warm;
* **reduced-precision arithmetic**: any instruction typed half, bfloat16, TF32 or FP8 (``cvt.rn.f16.f32``,
  ``fma.rn.f16x2``, ``mma ... .tf32``, ``cvt.rna.tf32.f32`` ...), and the quantised integer products
  (``dp4a``, ``dp2a``, and ``mma``/``wmma``/``wgmma`` on 8-, 4- or 1-bit integers). The operator is
  fp32, and the tolerance cannot refuse rounded products on long rows: their errors have random signs,
  so they grow like the square root of the row's length while the bound grows like its length times
  |A| |x|'s typical term (half-precision products pass rows of 4096 entries); tensor cores would make
  such an SpMM faster and less accurate than an fp32 one. A type written after ``::`` (``tcgen05.mma
  ...kind::f16``) counts too;
* **calls that leave the module**: any ``.extern .func`` (``vprintf``, ``malloc``, ``free``,
  ``__assertfail`` ...) and any ``.extern`` data;
* **state that survives a launch**: a write to module-scope data. Every ``.global`` and ``.const``
  symbol's address is followed through the registers it flows into (``mov``, ``cvta``, ``add``,
  anything computed from it, across loops, a block's barrier reduction of it too: the count of the threads
  below each of its bytes rebuilds it) and through control (what a branch on a predicate
  computed from it skips or repeats, what an instruction guarded by one defines: an address
  rebuilt bit by bit under branches is still followed); a store, atomic, reduction, async copy,
  ``discard``, tensor-map write, ``mbarrier`` operation or any other instruction with a memory operand that is not
  a known read, whose address comes from one, is refused, and so is letting such
  an address escape (storing it to memory, an ``mbarrier``'s count among such stores, passing it to a call,
  storing anything under such a branch, handing it or such a branch to a warp's or a block's collective, calling
  a function under such a branch), since the flow could then not be followed.
  Reads are fine: initialised tables (``__constant__``, ``static const``) and the constants CUDA's
  own headers declare (libcu++'s ``numeric_limits`` ...) stay allowed. An initialiser that holds
  an address is refused (a pointer to a table could be loaded back and written through).

It also reports whether the code uses atomics (``atom``/``red``), which decides how the
determinism re-run is judged: bit for bit without atomics, within tolerance with them.

What it cannot see: stores through addresses computed from the kernel's own arguments (``y +
offset``); those are the guards' and the damage checks' business at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RULES_VERSION = 12
"""Bump when a rule changes: part of the compile cache's key, since each build caches its verdict.
2: addresses followed through control (branches and guards on predicates computed from them).
3: L2 eviction policies refused. 4: an indirect branch or call chosen by an address rules the function.
5: a load at an address computed from an address's bits gives it back (a table lookup launders it); module data
declared inside a function refused. 6: a vector move ({%r1, %r2}), a conversion narrower than 32 bits and the carry
flag (add.cc, addc) take an address's bits; registers inline PTX declares without a '%' are followed.
7: reduced-precision arithmetic (half, bfloat16, TF32, FP8; quantised integer products) refused. 8: a barrier's
reduction into a register (bar.red: __syncthreads_count, _and, _or) takes its operands' bits (a block's count of the
threads below each byte rebuilt an address). 9: an mbarrier's count is a value written to memory (init's or an
arrival's count of an address's byte came back through the arrivals that completed the phase). 10: any instruction
with a memory operand that is not a known read counts as a write (a surface store, whatever a later PTX adds).
11: a collective (vote, shuffle, match, warp reduction, election, active mask, barrier reduction) given the address
or run under a branch on it, and a call under such a branch, are refused (other threads, or the callee, received the
bits at instructions the check does not connect). 12: a block entered only from ruled instructions (a jump inside a
ruled region to a block placed out of line) is ruled."""

_BANNED_SREGS = [
    (r"%clock(?:_hi|64)?\b", "reads a clock (%clock)"),
    (r"%globaltimer(?:_lo|_hi)?\b", "reads a timer (%globaltimer)"),
    (r"%n?smid\b", "reads the SM id (%smid)"),
    (r"%n?warpid\b", "reads the warp id (%warpid)"),
    (r"%gridid\b", "reads the launch id (%gridid)"),
    (r"%pm\d+(?:_64)?\b", "reads a performance counter (%pm)"),
    (r"%envreg\d+\b", "reads an environment register (%envreg)"),
    (r"%current_graph_exec\b", "reads whether it runs inside a CUDA graph (%current_graph_exec)"),
]
_BANNED_OPS = {"trap": "traps (trap)", "brkpt": "a breakpoint (brkpt)", "pmevent": "a performance event (pmevent)"}
_L2_POLICY = re.compile(r"^\s*(?:@!?%\w+\s+)?(createpolicy|[\w.:]*?(?:L2::cache_hint|evict_last)\b)", re.MULTILINE)
"""An instruction that creates or applies an L2 eviction policy (its opcode and modifiers, group 1)."""
_WRITE_OPS = ("st", "stmatrix", "red", "atom", "cp", "discard", "tensormap", "multimem", "prefetch.tensormap",
              "mbarrier")
"""Instructions that write memory: an address derived from module data may not be theirs, nor a value they write
(an ``mbarrier``'s count is kept in shared memory, and comes back through arrivals or ``pending_count``)."""
_READ_OPS = ("ld", "ldu", "tex", "tld4", "suld", "ldmatrix", "prefetch", "prefetchu", "applypriority")
"""Instructions with a memory operand that only read (or hint): any other instruction with one counts as a write,
whatever its opcode, so an instruction this list and :data:`_WRITE_OPS` do not know is judged as a store."""
_NO_DEST_OPS = ("st", "red", "bar", "barrier", "bra", "ret", "exit", "call", "membar", "fence", "prefetch",
                "prefetchu", "discard", "cp", "mbarrier.init", "setmaxnreg", "griddepcontrol", "trap", "brkpt")
_REDUCING = re.compile(r"^(?:bar|barrier)(?:\.cta)?\.red\b")
"""Barriers that an opcode prefix of :data:`_NO_DEST_OPS` would pass over but that write a register: a block's
reduction (``bar.red.popc.u32 %r, 0, %p``: ``__syncthreads_count``/``_and``/``_or``). The count of the threads below
a byte of an address is that byte. (A warp's ``redux.sync`` of a derived value is refused outright: its opcode
begins as ``red``'s, a write.)"""
_COLLECTIVE = re.compile(r"^(?:vote|shfl|match|redux|elect|activemask)\b|" + _REDUCING.pattern)
"""Instructions whose result carries what other threads gave, at whatever instruction they gave it: a warp's vote,
shuffle, match, reduction or election, a block's barrier reduction (and the warp's active mask, which tells which
lanes a branch took)."""
_REG = re.compile(r"%[A-Za-z_$][\w$]*")
_IDENT = re.compile(r"(?<![%\w$.])[A-Za-z_$][\w$]*")
"""An identifier that is not a register (%rd1) or a modifier (.b8)."""
_DECL = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(global|const)\s+(.*)$")
_EXTERN_FUNC = re.compile(r"^\s*\.extern\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", re.MULTILINE)
_INNER_DECL = re.compile(r"(?:^|[;{}])\s*(?:\.(?:visible|weak|extern)\s+)*\.(global|const)\s")
"""A .global or .const declaration inside a function body: data that outlives the launch, unseen by the module's
symbol list."""
_EXTERN_DATA = re.compile(r"^\s*\.extern\s+\.(global|const)\b", re.MULTILINE)
_REDUCED_FLOAT = re.compile(r"(?:\.|::)(?:f16|bf16|tf32|e4m3|e5m2|e2m1|e2m3|e3m2|ue8m0|ue4m3|f8f6f4|mxf8f6f4|mxf4|mxf4nvf4)"
                            r"(?:x2|x4)?(?=\.|$)")
"""A type modifier of a floating-point type narrower than fp32 (half, bfloat16, TF32, FP8, FP6, FP4)."""
_NARROW_INT = re.compile(r"(?:\.|::)(?:s8|u8|s4|u4|b1|i8)(?=\.|$)")
"""An 8-, 4- or 1-bit integer type modifier: quantised operands when a matrix product takes them."""


@dataclass(frozen=True)
class PtxReport:
    """What the compiled code does that the harness cares about."""

    violation: str | None
    """One line on the first rule broken, or None."""
    uses_atomics: bool
    """Any ``atom``/``red`` instruction (global, shared or generic)."""


def _strip(ptx: str) -> str:
    ptx = re.sub(r"/\*.*?\*/", " ", ptx, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", ptx)


def _data_symbols(lines: list[str]) -> tuple[dict[str, str], str | None]:
    """Module-scope .global/.const symbols (name -> space) and an initialiser problem, if any."""
    syms: dict[str, str] = {}
    problem = None
    for line in lines:
        m = _DECL.match(line)
        if m is None or line.lstrip().startswith(".extern"):
            continue
        head, _, init = m.group(2).partition("=")
        names = _IDENT.findall(re.sub(r"\[[^\]]*\]", " ", head))
        if not names:
            continue
        syms[names[-1]] = m.group(1)
        literals = re.sub(r"0[fFdD][0-9a-fA-F]+|0[xX][0-9a-fA-F]+|\d+[uU]?", " ", init)
        if init and ("generic(" in init or _IDENT.search(literals)):
            problem = problem or f"module data '{names[-1]}' is initialised with an address"
    return syms, problem


def _instructions(body: str) -> list[tuple[list[str], str | None, str, list[str]]]:
    """Each instruction of a function body as (the labels in front of it, its guard predicate or None,
    opcode with modifiers, operands); directives (``.reg``, ``.pragma``) are left out, their labels kept
    for the next instruction."""
    out, labels = [], []
    for raw in body.split(";"):
        s = raw.strip("{} \t\n")
        while True:  # labels ("$L__BB0_2:") and block braces in front of an instruction
            m = re.match(r"^(?:([$\w]+):|[{}])\s*", s)
            if m is None:
                break
            if m.group(1):
                labels.append(m.group(1))
            s = s[m.end():]
        if s and not s.startswith("."):
            guard = re.match(r"^@!?(%?[A-Za-z_$][\w$]*)\s+", s)
            out.append((labels, guard.group(1) if guard else None, *_split(s)))
            labels = []
    return out


def _split(stmt: str) -> tuple[str, list[str]]:
    """(opcode with modifiers, operands) of one instruction; a guard predicate is dropped."""
    stmt = re.sub(r"^@!?%?[A-Za-z_$][\w$]*\s+", "", stmt)
    parts = stmt.split(None, 1)
    op = parts[0]
    ops, depth, cur = [], 0, []
    for ch in parts[1] if len(parts) > 1 else "":
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            ops.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        ops.append("".join(cur).strip())
    return op, ops


def _functions(ptx: str) -> list[str]:
    """The bodies of every .entry and .func, as text."""
    bodies = []
    for m in re.finditer(r"\.(?:entry|func)\b[^{;]*\{", ptx):
        depth, j = 0, m.end() - 1
        for j in range(m.end() - 1, len(ptx)):
            if ptx[j] == "{":
                depth += 1
            elif ptx[j] == "}":
                depth -= 1
                if depth == 0:
                    break
        bodies.append(ptx[m.end():j])
    return bodies


def readable(symbol: str) -> str:
    """A mangled C++ name's innermost component (``_ZZ11spmv_kernelE1t`` -> ``t``); others unchanged."""
    if not symbol.startswith("_Z"):
        return symbol
    names, i = [], 0
    while i < len(symbol):
        m = re.match(r"\d+", symbol[i:])
        if m is None:
            i += 1
            continue
        length, start = int(m.group(0)), i + m.end()
        if length and start + length <= len(symbol):
            names.append(symbol[start:start + length])
        i = start + length
    return names[-1] if names else symbol


def _mentions(text: str, tainted: set[str], syms: dict[str, str], plain: frozenset[str] = frozenset()
              ) -> str | None:
    for tok in _regs(text, plain):
        if tok in tainted:
            return tok
    for tok in _IDENT.findall(text):
        if tok in syms:
            return tok
    return None


def _regs(text: str, plain: frozenset[str] = frozenset()) -> list[str]:
    """The registers ``text`` names: ``%``-names, and the names in ``plain`` (registers inline PTX declares
    without a ``%``, ``.reg .f16 low, high;`` in a block, as cuda_fp16's ``__low2half`` does)."""
    found = _REG.findall(text)
    if plain:
        found += [t for t in _IDENT.findall(text) if t in plain]
    return found


_PLAIN_REG_DECL = re.compile(r"\.reg\s+(?:\.\w+\s+)+([^;]+);")


def _plain_registers(body: str) -> frozenset[str]:
    """The names a function body declares as registers without a ``%`` (``.reg .b32 low, high;``)."""
    names = set()
    for decl in _PLAIN_REG_DECL.findall(body):
        for name in decl.split(","):
            name = re.sub(r"<\d+>", "", name).strip()
            if name and not name.startswith("%") and re.fullmatch(r"[A-Za-z_$][\w$]*", name):
                names.add(name)
    return frozenset(names)


_CARRY = "%__carry"
"""The carry flag as a register: ``add.cc`` and its kin write it, ``addc``/``subc``/``madc`` read it (a carry out of
an address plus itself is a bit of the address)."""
_CARRY_READERS = ("addc", "subc", "madc")


_LOAD_OPS = ("ld", "ldu", "atom", "call", "tex", "tld4", "suld", "ldmatrix")
"""Instructions whose result is read from memory (or returned by a call): data, not the address they read at."""
_ADDRESS_OPS = ("mov", "cvta", "add", "sub", "mad", "selp")
"""What the compiler computes a table's element address with: the symbol's address only ever an addend."""


def _address_arithmetic(op: str) -> bool:
    """Whether ``op`` keeps an address an address (base plus an offset), not its bits taken apart: moves,
    additions and widening conversions (a narrowing ``cvt`` keeps only the low bits)."""
    base = op.split(".")[0]
    if base == "cvt":
        widths = [int(w) for w in re.findall(r"\.[usb](\d+)\b", op)]
        return len(widths) == 2 and widths[0] >= widths[1] >= 32
    if base == "mad":
        return ".hi" not in op and ".cc" not in op  # the high half of a product is its bits
    if base in ("add", "sub") and ".cc" in op:
        return False  # its carry out is a bit
    return base in _ADDRESS_OPS


def _state_writes(body: str, ins: list, syms: dict[str, str]) -> str | None:
    """A message if an address derived from module data is written through or escapes (``ins``: the body's
    :func:`_instructions`).

    An address is followed through every register computed from it, and through control: whatever a
    branch on a predicate computed from it decides (the instructions it skips or repeats, up to its
    target) and whatever an instruction guarded by such a predicate defines counts as derived too, so
    the address cannot be rebuilt bit by bit under branches (``if (a >> i & 1) b |= 1 << i``). An
    indirect branch (``brx.idx``, a jump table) or call whose index or target is derived from it rules
    the whole function. A store under such control is an escape (a flag in memory per bit would
    rebuild it)."""
    plain = _plain_registers(body)
    label_at = {lab: i for i, (labs, *_) in enumerate(ins) for lab in labs}
    tainted: set[str] = set()
    bits: set[str] = set()  # tainted by more than address arithmetic: the address's own bits as a number
    ruled: set[int] = set()  # instructions that run or not by a tainted predicate
    # each labelled block (its first and past-its-last instruction), the jumps to it, and whether the instruction
    # before it falls through into it: what the rule on blocks entered only from ruled instructions reads
    starts = sorted(set(label_at.values()))
    jumps_to: dict[int, list[int]] = {}
    for j, (_, _, op, ops) in enumerate(ins):
        if op.split(".")[0] == "bra" and ops and (target := label_at.get(ops[0].strip())) is not None:
            jumps_to.setdefault(target, []).append(j)
    def falls_into(start: int) -> bool:  # the instruction before is not an unguarded jump, return or exit
        _, guard, op, _ = ins[start - 1] if start > 0 else (None, None, "bra", None)
        return not (guard is None and op.split(".")[0] in ("bra", "ret", "exit"))

    blocks = [(start, end, jumps_to[start], falls_into(start))
              for start, end in zip(starts, starts[1:] + [len(ins)]) if start in jumps_to]
    changed = True
    while changed:  # to a fixpoint: loops carry addresses back to earlier instructions
        changed = False
        for i, (_, guard, op, ops) in enumerate(ins):
            base = op.split(".")[0]
            ruled_here = i in ruled or guard in tainted
            # an indirect branch or call whose index or target comes from the address: where it goes is not
            # followed, so the whole function counts as chosen by the address
            chosen = base in ("brx", "call") and any(r in tainted for o in ops for r in _regs(o, plain))
            if (base in ("bra", "brx") and ruled_here) or chosen:
                target = label_at.get(ops[0].strip()) if base == "bra" and ops else None
                region = (range(len(ins)) if target is None else
                          range(i + 1, target) if target > i else range(target, i))
                if not set(region) <= ruled:
                    ruled |= set(region)
                    changed = True
                continue
            if (op.startswith(_NO_DEST_OPS) and not _REDUCING.match(op)) or not ops or ops[0].startswith("["):
                continue  # no register written (a memory operand first: a store, whatever its opcode)
            dests = _regs(ops[0], plain) + ([_CARRY] if ".cc" in op else [])
            sources = ops[1:] + ([_CARRY] if base in _CARRY_READERS else [])
            loads = base in _LOAD_OPS
            derived = ruled_here or (not loads and any(_mentions(o, tainted, syms, plain) for o in sources))
            # a load's result is data (a table read at an address derived from the table), unless control chose
            # it or its address was computed from the address's bits: an identity table indexed by each byte of
            # it gives the address back, laundered through memory. A vector move ({%r1, %r2}) takes an address
            # apart (or puts pieces together): its pieces are bits
            as_number = ruled_here or any(r in bits for o in sources for r in _regs(o, plain)) or (
                derived and (not _address_arithmetic(op) or any("{" in o for o in ops)))
            if loads and as_number:
                derived = True
            if derived and not set(dests) <= tainted:
                tainted |= set(dests)
                changed = True
            if as_number and derived and not set(dests) <= bits:
                bits |= set(dests)
                changed = True
        # a block entered only from ruled instructions (a jump inside a ruled region to a block placed out of line,
        # which no fall-through enters) runs or not by the address too: its instructions up to the next label
        for start, end, entries, falls in blocks:
            if start not in ruled and all(j in ruled for j in entries) and (not falls or start - 1 in ruled):
                ruled |= set(range(start, end))
                changed = True
    for i, (_, guard, op, ops) in enumerate(ins):
        base = op.split(".")[0]
        ruled_here = i in ruled or guard in tainted
        # what one thread hands others through a collective reaches them at another instruction (a ballot's lane
        # 0 at its own call site), and what a call does under the address's control is not followed into the callee
        if _COLLECTIVE.match(op) and (ruled_here or any(_mentions(o, tainted, syms, plain) for o in ops[1:])):
            return ("hands the address of module-scope data, or a branch on it, to other threads (a warp's or a "
                    "block's collective: where it goes could not be followed)")
        if base == "call" and ruled_here:
            return ("calls a function under a branch on the address of module-scope data (what it does could not be "
                    "followed)")
        addrs = [o for o in ops if o.startswith("[")]
        if base in _WRITE_OPS or op.startswith(_WRITE_OPS) or (addrs and base not in _READ_OPS):
            if addrs and (hit := _mentions(addrs[0], tainted, syms, plain)) is not None:
                what = readable(hit) if hit in syms else "module data"
                return f"writes to module-scope data ('{what}'): state would survive a launch"
            values = [o for o in ops[1:] if not o.startswith("[")]
            if any(_mentions(v, tainted, syms, plain) for v in values):
                if op.startswith("st.param"):
                    return "passes the address of module-scope data to a call (its writes could not be followed)"
                return "stores the address of module-scope data to memory (its writes could not be followed)"
            if ruled_here:
                return ("stores to memory under a branch on the address of module-scope data (its writes could "
                        "not be followed)")
    return None


def _reduced_precision(op: str) -> bool:
    """Whether an instruction (its opcode with modifiers) computes in a precision below fp32."""
    base = op.split(".", 1)[0]
    return bool(_REDUCED_FLOAT.search(op)) or base in ("dp4a", "dp2a") or (
        base in ("mma", "wmma", "wgmma", "tcgen05") and bool(_NARROW_INT.search(op)))


def check_ptx(ptx: str) -> PtxReport:
    """Inspect compiled PTX (see the module docstring)."""
    text = _strip(ptx)
    atomics = bool(re.search(r"^\s*(?:@!?%\w+\s+)?(?:atom|red)\.", text, re.MULTILINE))
    for rx, what in _BANNED_SREGS:
        if re.search(rx, text):
            return PtxReport(f"compiled code {what}: not allowed", atomics)
    for m in re.finditer(r"^\s*(?:@!?%\w+\s+)?(trap|brkpt|pmevent)\b", text, re.MULTILINE):
        return PtxReport(f"compiled code contains {_BANNED_OPS[m.group(1)]}: not allowed", atomics)
    if m := _L2_POLICY.search(text):
        return PtxReport(f"compiled code sets an L2 eviction policy ({m.group(1)}): not allowed (lines kept in L2 "
                         "would outlive the launch and the cold timing's flush)", atomics)
    if m := _EXTERN_FUNC.search(text):
        return PtxReport(f"compiled code calls '{m.group(1)}' outside the module (printf, malloc, assert ...): "
                         "not allowed", atomics)
    if _EXTERN_DATA.search(text):
        return PtxReport("compiled code refers to data outside the module: not allowed", atomics)
    lines = [l for l in text.splitlines() if not l.startswith((" ", "\t"))]
    syms, problem = _data_symbols(lines)
    if problem:
        return PtxReport(f"{problem}: not allowed", atomics)
    bodies = _functions(text)
    for body in bodies:  # the compilers put module data at module scope; inline PTX can declare it in a block
        if m := _INNER_DECL.search(body):
            return PtxReport(f"compiled code declares .{m.group(1)} data inside a function (inline PTX): not allowed",
                             atomics)
    parsed = [(body, _instructions(body)) for body in bodies]
    for _, ins in parsed:
        for _, _, op, _ in ins:
            if _reduced_precision(op):
                return PtxReport(f"compiled code computes in reduced precision ({op}): not allowed (the operator is "
                                 "fp32; half, bfloat16, TF32, FP8 and quantised integer products are refused)", atomics)
    if syms:
        for body, ins in parsed:
            if (msg := _state_writes(body, ins, syms)) is not None:
                return PtxReport(f"compiled code {msg}", atomics)
    return PtxReport(None, atomics)
