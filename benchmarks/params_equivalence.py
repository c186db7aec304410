"""Whether two renderings of the kernel library and the templates compile to the same code.

The library and the templates were rewritten so that a strategy is one body plus a ``PARAMS:``
line (and, for a specialised template, a block of facts at the top). That rewrite must change no
kernel's meaning. This script holds the evidence:

* ``freeze OUT.json.gz`` renders every library variant and a fixed set of template points
  (every template's seeds and a few seeded random points, on the matrices of :data:`MATRICES`,
  their cards stored with them) and writes the texts. The committed fixture
  ``tests/kernels/fixtures/renders_before_params.json.gz`` was frozen from the rendering before
  the rewrite.
* ``compare FIXTURE --out OUT.json`` renders the same cases with the current code, compiles the
  old and the new text with NVRTC (sm_90, the harness's flags) and compares the PTX after
  :func:`normalise_ptx` (comments, debug lines, register, label and parameter numbering); where
  the PTX differs it compares the SASS (``cuobjdump -sass`` of the cubins, addresses and
  comments dropped), then the PTX instructions with registers erased. Only the kernels the header
  launches count (with what they call and the module data they name). Each case gets a verdict
  (:func:`compare_case`); the report lists the ``different`` ones with the instructions only one
  side has.

    PYTHONPATH=src python benchmarks/params_equivalence.py freeze tests/kernels/fixtures/renders_before_params.json.gz
    PYTHONPATH=src python benchmarks/params_equivalence.py compare tests/kernels/fixtures/renders_before_params.json.gz \
        --out /tmp/params_equivalence.json [--sample 40] [--jobs 2]

No GPU is needed (NVRTC compiles for sm_90 anywhere).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("params_equivalence")

MATRICES = [
    # (name, family, rows, generator parameters): every specialised template applies to some of them,
    # and csr_adaptive_spec meets every plan (no long rows, a lane per row, uniform and uneven
    # long-row tables, long rows found by search).
    ("banded_m_odd", "banded", 4003, {"bands": 9}),
    ("stencil2d", "stencil2d", 4900, {}),
    ("stencil3d_27", "stencil3d_27", 1000, {}),
    ("block8", "block", 4000, {"block": 8, "blocks_per_row": 4}),
    ("block4_cut", "block", 4002, {"cols": 3001, "block": 4, "blocks_per_row": 3}),
    ("block2", "block", 2000, {"block": 2, "blocks_per_row": 5}),
    ("powerlaw", "powerlaw", 6000, {}),
    ("skewed", "skewed", 6000, {"long_len": 2000, "long_fraction": 0.002}),
    ("random", "random", 3001, {"nnz_per_row": 16}),
    ("rectangular", "rectangular", 1000, {"nnz_per_row": 6}),
    ("empty_rows", "empty_rows", 3000, {}),
    ("dense_lines", "dense_lines", 3000, {}),
    ("rmat", "rmat", 4096, {}),
    ("one_row", "random", 1, {"cols": 50, "nnz_per_row": 7}),
]
RANDOM_POINTS = 3
"""Seeded random valid points per (template, matrix), beside the template's seeds."""
ARCH = "sm_90"


@dataclass(frozen=True)
class Case:
    """One rendering: a library variant (``template`` None) or a template point on a matrix's card."""

    key: str
    op: str
    variant: str | None = None
    template: str | None = None
    params: tuple[tuple[str, int], ...] = ()
    card: dict | None = None

    def render(self) -> str:
        from sparserl.kernels.library import get_variant
        from sparserl.kernels.templates import get_template
        from sparserl.matrices.card import MatrixCard

        if self.variant is not None:
            return get_variant(self.variant).render()
        from sparserl.harness.matrix_facts import materialise

        card = MatrixCard.from_dict(self.card) if self.card is not None else None
        text = get_template(self.op, self.template).render(dict(self.params), card)
        return materialise(text, self.op, card)  # the facts the code names, defined as the harness defines them


def cases() -> list[Case]:
    """Every library variant, then every template's seeds and a few random points per matrix."""
    from sparserl.kernels.contract import Op
    from sparserl.kernels.library import all_variants
    from sparserl.kernels.templates import templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    out = [Case(v.id, v.op.value, variant=v.id) for v in all_variants()]
    cards = {name: matrix_card(generate(fam, rows, seed=1, **kw)) for name, fam, rows, kw in MATRICES}
    seen: set[str] = set()
    for t in templates():
        k = 8 if t.op is Op.SPMM else None
        for name, card in cards.items():
            rng = np.random.default_rng(len(out))
            points = t.seeds(card, k) + [p for _ in range(RANDOM_POINTS)
                                         if (p := t.random_point(rng, card, k)) is not None]
            for p in points:
                cid = t.candidate(p).id
                key = f"{cid}@{name}" if t.specialised else cid
                if key in seen:
                    continue
                seen.add(key)
                out.append(Case(key, t.op.value, template=t.name, params=tuple(sorted(p.items())),
                                card=card.to_dict() if t.specialised else None))
    return out


def freeze(path: Path) -> int:
    rows = []
    for c in cases():
        rows.append({"key": c.key, "op": c.op, "variant": c.variant, "template": c.template,
                     "params": [list(p) for p in c.params], "card": c.card, "text": c.render()})
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(rows, f, separators=(",", ":"))
    return len(rows)


def load_fixture(path: Path) -> list[tuple[Case, str]]:
    with gzip.open(path, "rt") as f:
        rows = json.load(f)
    return [(Case(r["key"], r["op"], r["variant"], r["template"], tuple((k, v) for k, v in r["params"]), r["card"]),
             r["text"]) for r in rows]


# ---------------------------------------------------------------------------------------------
# Compiling and comparing

_REG = re.compile(r"%(?:[a-z]+\d+|r[dsbh]?\d+|f[d]?\d+|p\d+)\b")
_LABEL = re.compile(r"\$L__\w+")
_PARAM = re.compile(r"\b(\w+)_param_(\d+)\b")
_FUNC = re.compile(r"^(?:\.visible\s+|\.weak\s+)?\.(entry|func)\b[^{;]*?([A-Za-z_$][\w$]*)\s*\(", re.MULTILINE)
_DATA = re.compile(r"^(?:\.visible\s+|\.weak\s+)?\.(?:global|const|shared)\s[^;{]*?([A-Za-z_$][\w$]*)\s*(?:\[[^\]]*\])*\s*(?:=[^;]*)?;",
                   re.MULTILINE)


def _items(ptx: str) -> tuple[dict[str, str], dict[str, str]]:
    """(functions: name -> text from its header to its closing brace, data: name -> declaration)."""
    funcs: dict[str, str] = {}
    for m in _FUNC.finditer(ptx):
        open_ = ptx.find("{", m.end())
        if open_ < 0 or ptx.find(";", m.end(), open_) >= 0 and m.group(1) == "func" and "(" not in ptx[m.end():open_]:
            continue
        depth = 0
        for j in range(open_, len(ptx)):
            depth += {"{": 1, "}": -1}.get(ptx[j], 0)
            if depth == 0:
                funcs[m.group(2)] = ptx[m.start():j + 1]
                break
    data = {m.group(1): m.group(0) for m in _DATA.finditer(ptx)}
    return funcs, data


def _normalise(text: str) -> list[str]:
    out: list[str] = []
    regs: dict[str, str] = {}
    labels: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((".loc", ".file", "@@")):
            continue
        line = _REG.sub(lambda m: regs.setdefault(m.group(0), f"%v{len(regs)}"), line)
        line = _LABEL.sub(lambda m: labels.setdefault(m.group(0), f"$L{len(labels)}"), line)
        line = _PARAM.sub(lambda m: f"{m.group(1)}_param_{m.group(2)}", line)
        out.append(" ".join(line.split()))
    return out


def normalise_ptx(ptx: str, kernels: tuple[str, ...]) -> list[str]:
    """What ``kernels`` are in ``ptx``: for each, its entry's lines, then the functions it calls and the
    module data it names (declarations with their initialisers), followed transitively. Comments and
    debug lines are dropped, and registers, labels and parameters are renumbered in order of first
    appearance within each function, so two builds of the same code that differ only in those
    numberings give the same lines.

    Kernels the header does not launch, and data no launched kernel names, are left out: NVRTC
    declares every namespace-scope ``constexpr int`` (each PARAMS name) as a ``.global`` that nothing
    reads, and a specialised body defines kernels and tables its facts leave unused."""
    ptx = re.sub(r"/\*.*?\*/", " ", ptx, flags=re.DOTALL)
    ptx = re.sub(r"//[^\n]*", "", ptx)
    funcs, data = _items(ptx)
    out: list[str] = []
    todo, done = list(kernels), set()
    while todo:
        name = todo.pop(0)
        if name in done:
            continue
        done.add(name)
        if name in funcs:
            text = funcs[name]
            out += _normalise(text)
            body_names = set(re.findall(r"[A-Za-z_$][\w$]*", text))
            todo += sorted((body_names & (set(funcs) | set(data))) - done)
        elif name in data:
            out.append(" ".join(data[name].split()))
        else:
            out.append(f"<missing {name}>")
    return out


def cuobjdump_path() -> str | None:
    """cuobjdump from the PATH, else the copy Triton's NVIDIA backend ships."""
    if found := shutil.which("cuobjdump"):
        return found
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return None
    tool = Path(nv.__file__).parent / "bin" / "cuobjdump"
    return str(tool) if tool.exists() else None


def sass_of(cubin: bytes, kernels: tuple[str, ...]) -> list[str] | None:
    """The SASS of ``kernels`` (instruction addresses and encodings dropped), or None without cuobjdump."""
    tool = cuobjdump_path()
    if tool is None or cubin is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "k.cubin"
        p.write_bytes(cubin)
        r = subprocess.run([tool, "-sass", str(p)], capture_output=True, text=True)
    if r.returncode:
        return None
    by_func: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in r.stdout.splitlines():
        if m := re.match(r"\s*Function\s*:\s*(\S+)", line):
            cur = by_func.setdefault(m.group(1), [])
            continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # instruction addresses
        line = re.sub(r"/\*.*?\*/", "", line).strip().rstrip(";").strip()
        if cur is not None and line and not line.startswith((".", "-")):
            cur.append(" ".join(line.split()))
    return [l for k in kernels for l in [f"<{k}>"] + by_func.get(k, ["<missing>"])]


@dataclass(frozen=True)
class Built:
    ok: bool
    ptx: list[str]
    cubin: bytes | None
    log: str
    kernels: tuple[str, ...] = ()


def build(source: str, kernels: tuple[str, ...]) -> Built:
    """Compile ``source`` (the text the compiler sees) with NVRTC for sm_90; keep what ``kernels`` use."""
    from sparserl.harness.compile import CompileOptions, find_cuda_include
    from sparserl.harness.nvrtc import load_nvrtc, nvrtc_options

    lib = load_nvrtc()
    if lib is None:
        raise SystemExit("error: NVRTC is not available (install the nvidia-cuda-nvrtc wheel)")
    opts = nvrtc_options(ARCH, CompileOptions().flags, find_cuda_include())
    out = lib.compile(source, opts, 120.0)
    ok = out.status == "ok"
    return Built(ok, normalise_ptx(out.ptx, kernels) if ok else [], out.cubin, out.log, kernels)


def source_of(text: str, op: str) -> tuple[str, tuple[str, ...]]:
    """The source the harness compiles for a completion (its PARAMS prelude, then the code) and the
    kernels its header launches."""
    from sparserl.harness.extract import Extracted, extract
    from sparserl.kernels.contract import Op

    ex = extract(text, Op(op))
    if not isinstance(ex, Extracted):
        raise ValueError(f"does not extract: {ex.message}")
    return ex.code, tuple(dict.fromkeys(ex.header.kernel_names(Op(op))))


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i}: {x!r} -> {y!r}"
    return f"lengths {len(a)} -> {len(b)}"


def _erase_registers(lines: list[str]) -> list[str]:
    """The instructions as a sorted list, registers erased (and register declarations dropped)."""
    return sorted(re.sub(r"%v\d+", "%v", l) for l in lines if not l.startswith(".reg "))


def compare_case(case: Case, old_text: str) -> dict:
    """``verdict``: ``same_ptx`` (the launched kernels' PTX is the same up to numbering),
    ``same_sass``, ``same_instructions`` (the same PTX instructions, registers erased, in another
    order or with the registers permuted; ptxas may then schedule them otherwise),
    ``fewer_instructions`` (the new PTX is the old one less some instructions), ``different`` or
    ``error``; with the first differing line, where the SASS differs its lengths, and the
    instructions only one side has."""
    new_text = case.render()
    row = {"key": case.key, "old_chars": len(old_text), "new_chars": len(new_text)}
    try:
        (old_src, old_k), (new_src, new_k) = source_of(old_text, case.op), source_of(new_text, case.op)
    except ValueError as exc:
        return row | {"verdict": "error", "detail": str(exc)}
    if old_k != new_k:
        return row | {"verdict": "different", "detail": f"launches {old_k} -> {new_k}"}
    old, new = build(old_src, old_k), build(new_src, new_k)
    if not (old.ok and new.ok):
        return row | {"verdict": "error", "detail": (old.log if not old.ok else new.log)[-400:]}
    if old.ptx == new.ptx:
        return row | {"verdict": "same_ptx"}
    detail = _first_difference(old.ptx, new.ptx)
    sa, sb = sass_of(old.cubin, old_k), sass_of(new.cubin, new_k)
    if sa is not None and sa == sb:
        return row | {"verdict": "same_sass", "detail": detail}
    if sa is not None and sb is not None:
        row["sass_lines"] = [len(sa), len(sb)]
        detail += f"; SASS {len(sa)} -> {len(sb)} lines, {_first_difference(sa, sb)}"
    ea, eb = Counter(_erase_registers(old.ptx)), Counter(_erase_registers(new.ptx))
    if ea == eb:
        return row | {"verdict": "same_instructions", "detail": detail}
    row |= {"old_only": _few(ea - eb), "new_only": _few(eb - ea)}
    if not eb - ea:
        return row | {"verdict": "fewer_instructions", "detail": detail}
    return row | {"verdict": "different", "detail": detail}


def _few(c: Counter, n: int = 12) -> dict[str, int]:
    return dict(c.most_common(n))


def compare(fixture: Path, sample: int | None = None, jobs: int = 2, seed: int = 0,
            only: str | None = None) -> list[dict]:
    pairs = load_fixture(fixture)
    if only:
        pairs = [(c, t) for c, t in pairs if re.search(only, c.key)]
    if sample is not None and sample < len(pairs):
        idx = sorted(np.random.default_rng(seed).choice(len(pairs), sample, replace=False))
        pairs = [pairs[i] for i in idx]
    try:
        from rich.progress import track
    except ImportError:  # pragma: no cover - rich is a dependency
        track = lambda it, **_: it  # noqa: E731
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compare_case, c, t) for c, t in pairs]
        return [f.result() for f in track(futures, description="compiling old and new", total=len(futures))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("freeze", help="render every case with the current code into a fixture")
    f.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="compile a fixture's texts and the current renderings and compare")
    c.add_argument("fixture", type=Path)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--sample", type=int, default=None, help="compare this many cases drawn at random")
    c.add_argument("--jobs", type=int, default=2)
    c.add_argument("--only", default=None, help="compare only the cases whose key matches this regular expression")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "freeze":
        print(f"{freeze(args.out)} cases written to {args.out}")
        return 0
    t0 = time.perf_counter()
    rows = compare(args.fixture, args.sample, args.jobs, only=args.only)
    counts = Counter(r["verdict"] for r in rows)
    old_chars = sum(r["old_chars"] for r in rows)
    new_chars = sum(r["new_chars"] for r in rows)
    by_strategy: dict[str, Counter] = {}
    for r in rows:
        op, strategy = r["key"].split("/")[:2]
        by_strategy.setdefault(f"{op}/{strategy}", Counter())[r["verdict"]] += 1
    summary = {"cases": len(rows), "verdicts": dict(counts), "old_chars": old_chars, "new_chars": new_chars,
               "by_strategy": {k: dict(v) for k, v in sorted(by_strategy.items())},
               "seconds": round(time.perf_counter() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "cases": rows}, indent=1))
    print(json.dumps(summary))
    for r in rows:
        if r["verdict"] in ("different", "fewer_instructions", "error"):
            print(f"{r['verdict']:10s} {r['key']}: {r.get('detail', '')[:200]}; only before: "
                  f"{r.get('old_only', {})}; only after: {r.get('new_only', {})}"[:600])
    return 0 if counts.get("error", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
