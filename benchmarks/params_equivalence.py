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
  comments dropped). Each case is ``same_ptx``, ``same_sass`` or ``different``; the report lists
  the different ones with the first differing line.

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
        card = MatrixCard.from_dict(self.card) if self.card is not None else None
        return get_template(self.op, self.template).render(dict(self.params), card)


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


def normalise_ptx(ptx: str) -> list[str]:
    """PTX lines without comments, debug and version lines, with registers, labels and kernel
    parameters renumbered in order of first appearance within each function (two builds of the
    same code that differ only in those numberings give the same lines)."""
    ptx = re.sub(r"/\*.*?\*/", " ", ptx, flags=re.DOTALL)
    out: list[str] = []
    regs: dict[str, str] = {}
    labels: dict[str, str] = {}
    for raw in ptx.splitlines():
        line = re.sub(r"//.*", "", raw).strip()
        if not line or line.startswith((".loc", ".file", ".version", ".target", ".address_size", "@@")):
            continue
        if line.startswith((".visible .entry", ".entry", ".func", ".visible .func", ".weak .func")):
            regs, labels = {}, {}
        line = _REG.sub(lambda m: regs.setdefault(m.group(0), f"%v{len(regs)}"), line)
        line = _LABEL.sub(lambda m: labels.setdefault(m.group(0), f"$L{len(labels)}"), line)
        line = _PARAM.sub(lambda m: f"{m.group(1)}_param_{m.group(2)}", line)
        out.append(" ".join(line.split()))
    return out


def _sass(cubin: bytes) -> list[str] | None:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "k.cubin"
        p.write_bytes(cubin)
        r = subprocess.run([tool, "-sass", str(p)], capture_output=True, text=True)
    if r.returncode:
        return None
    out = []
    for line in r.stdout.splitlines():
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # instruction addresses
        line = re.sub(r"/\*.*?\*/", "", line).strip().rstrip(";").strip()
        if line and not line.startswith(("code for", "Fatbin", "Function", ".", "arch", "host", "compile_size",
                                        "identifier", "-", "ptxasOptions")):
            out.append(" ".join(line.split()))
    return out


@dataclass(frozen=True)
class Built:
    ok: bool
    ptx: list[str]
    cubin: bytes | None
    log: str


def build(source: str) -> Built:
    """Compile ``source`` (the text the compiler sees) with NVRTC for sm_90."""
    from sparserl.harness.compile import CompileOptions, find_cuda_include
    from sparserl.harness.nvrtc import load_nvrtc, nvrtc_options

    lib = load_nvrtc()
    if lib is None:
        raise SystemExit("error: NVRTC is not available (install the nvidia-cuda-nvrtc wheel)")
    opts = nvrtc_options(ARCH, CompileOptions().flags, find_cuda_include())
    out = lib.compile(source, opts, 120.0)
    return Built(out.status == "ok", normalise_ptx(out.ptx) if out.status == "ok" else [], out.cubin, out.log)


def source_of(text: str, op: str) -> str:
    """The source the harness compiles for a completion (PARAMS expanded, when the contract has them)."""
    from sparserl.harness.extract import Extracted, extract
    from sparserl.kernels.contract import Op

    ex = extract(text, Op(op))
    if not isinstance(ex, Extracted):
        raise ValueError(f"does not extract: {ex.message}")
    return ex.code


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i}: {x!r} -> {y!r}"
    return f"lengths {len(a)} -> {len(b)}"


def compare_case(case: Case, old_text: str) -> dict:
    """``verdict``: same_ptx, same_sass, different or error, with the first differing line."""
    new_text = case.render()
    row = {"key": case.key, "old_chars": len(old_text), "new_chars": len(new_text)}
    try:
        old, new = build(source_of(old_text, case.op)), build(source_of(new_text, case.op))
    except ValueError as exc:
        return row | {"verdict": "error", "detail": str(exc)}
    if not (old.ok and new.ok):
        return row | {"verdict": "error", "detail": (old.log if not old.ok else new.log)[-400:]}
    if old.ptx == new.ptx:
        return row | {"verdict": "same_ptx"}
    sa, sb = _sass(old.cubin), _sass(new.cubin)
    if sa is not None and sa == sb:
        return row | {"verdict": "same_sass", "detail": _first_difference(old.ptx, new.ptx)}
    detail = _first_difference(old.ptx, new.ptx)
    if sa is not None and sb is not None:
        detail += f"; SASS {len(sa)} -> {len(sb)} instructions, {_first_difference(sa, sb)}"
    return row | {"verdict": "different", "detail": detail}


def compare(fixture: Path, sample: int | None = None, jobs: int = 2, seed: int = 0) -> list[dict]:
    pairs = load_fixture(fixture)
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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "freeze":
        print(f"{freeze(args.out)} cases written to {args.out}")
        return 0
    t0 = time.perf_counter()
    rows = compare(args.fixture, args.sample, args.jobs)
    counts = Counter(r["verdict"] for r in rows)
    old_chars = sum(r["old_chars"] for r in rows)
    new_chars = sum(r["new_chars"] for r in rows)
    summary = {"cases": len(rows), "verdicts": dict(counts), "old_chars": old_chars, "new_chars": new_chars,
               "seconds": round(time.perf_counter() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "cases": rows}, indent=1))
    print(json.dumps(summary))
    for r in rows:
        if r["verdict"] in ("different", "error"):
            print(f"{r['verdict']:10s} {r['key']}: {r.get('detail', '')[:300]}")
    return 0 if counts.get("different", 0) + counts.get("error", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
