"""The folder a verified kernel is handed over in: ``kernel.cu``, ``launch.json`` (format,
launch lines and the launches they give for this matrix, kernel arguments), ``report.json`` and
``report.md`` (verdict, times against cuSPARSE, roofline fraction, conversion cost, runners-up).
Written by ``sparserl generate`` and ``sparserl search`` alike."""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.harness.extract import Extracted, extract
from sparserl.kernels.contract import Op, evaluate_launches, kernel_params


def launch_info(text: str, op: Op, A, k: int | None) -> dict:
    from sparserl.formats import convert

    ex = extract(text, op)
    assert isinstance(ex, Extracted)
    fd = convert(A, ex.header.format, ex.header.params)
    cfgs = evaluate_launches(ex.header, op, fd.launch_env(op, k, 132))
    return {
        "op": op.value, "k": k, "format": fd.format, "format_params": fd.params,
        "launch_lines": [l.render() for l in ex.header.launches],
        "kernel_args": [f"{p.ctype} {p.name}" for p in kernel_params(fd.format, op)],
        "sizes": fd.sizes, "zero_fill_y": fd.zero_fill_y,
        "launches_for_this_matrix": [{"kernel": c.kernel, "grid": c.grid, "block": c.block, "smem": c.smem}
                                     for c in cfgs],
        "geometry_note": "grid/block evaluated with num_sms = 132 (H100/H200); LAUNCH lines hold the formulas",
    }


def report_markdown(rep: dict) -> str:
    b = rep["best"]
    lines = [f"# SparseRL kernel for {rep['matrix']}", "",
             f"- matrix: {rep['shape'][0]} x {rep['shape'][1]}, {rep['nnz']} nonzeros; op {rep['op']}"
             + (f", k = {rep['k']}" if rep["k"] else ""),
             f"- verdict: **{rep['verdict']}**", f"- source: {rep['source']}",
             f"- {rep['samples'].get('label', 'samples')}: {rep['samples']['n']} "
             f"{rep['samples'].get('verb', 'drawn')}, {rep['samples']['compiled']} compiled"
             + ("" if not rep["verified"] else f", {rep['samples']['correct']} correct")]
    lines += [f"- note: {n}" for n in rep.get("notes", [])]
    if b.get("speedup") is not None:
        t = b["timings"].get(b["regime"], {})
        base = b["baseline"].get(b["regime"], {})
        lines += [f"- time ({b['regime']} L2): kernel {t.get('median_us', 0):.2f} us, cuSPARSE "
                  f"{base.get('median_us', 0):.2f} us ({b.get('baseline_alg')}): **{b['speedup']:.2f}x**",
                  f"- roofline fraction: {b['roofline']:.2f}",
                  f"- format {b['format']}: conversion {b['conversion_seconds'] * 1e3:.1f} ms on the host; "
                  + (f"pays off after {b['break_even_calls']:.0f} calls" if b.get("break_even_calls") is not None
                     else "not faster than cuSPARSE, so it never pays off")]
    if rep["runners_up"]:
        timed = rep["verified"]  # compile-only: nothing was timed, so no speedup column
        lines += ["", "## Runners-up (distinct kernels)", "",
                  "| source | format | verdict |" + (" speedup |" if timed else ""),
                  "| --- | --- | --- |" + (" --- |" if timed else "")]
        for r in rep["runners_up"]:
            sp = f" {r['speedup']:.2f}x |" if r.get("speedup") else " - |"
            lines.append(f"| {r['source']} | {r.get('format') or '-'} | {r['verdict']} |" + (sp if timed else ""))
    lines += ["", "Use it: `sparserl.load_kernel(folder)` returns a callable; see launch.json for the contract."]
    return "\n".join(lines) + "\n"


def write_kernel_report(out: Path, text: str, op: Op, A, k: int | None, rep: dict, extra_md: str = "") -> None:
    """kernel.cu, launch.json, report.json and report.md (``extra_md`` appended) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.cu").write_text(text)
    (out / "launch.json").write_text(json.dumps(launch_info(text, op, A, k), indent=1))
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str))
    (out / "report.md").write_text(report_markdown(rep) + extra_md)
