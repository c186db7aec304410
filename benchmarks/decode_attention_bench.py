"""One decode step's attention, alone: torch's SDPA (as the bucketed engine calls it) against the
split-key Triton kernels of ``sparserl.model.decode_attention`` at several launch settings.

Shapes are one layer of the default model (4 key heads, 2 query heads each, head size 64) at
``--batch`` rows, over a cache of ``--cache`` positions of which the first ``span`` are attended
(a random quarter of them masked, as padding would be). For each span it prints microseconds per
call, the memory-bound time (the span's keys and values read once at ``--hbm-tb-s``), and the
largest error against a float64 reference; JSON with every setting goes to ``--out``.

    python benchmarks/decode_attention_bench.py --out decode_attention.json
    python benchmarks/decode_attention_bench.py --batch 256 --spans 512,1024,2048 --dtype bf16

Needs a GPU and Triton.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from sparserl.model import decode_attention as da  # noqa: E402


def _time_us(fn, iters: int, per_graph: int = 20) -> float:
    """Median over ``iters`` replays of a CUDA graph of ``per_graph`` calls of ``fn``, microseconds
    per call: device time without Python's launch cost, as the engine's captured steps run."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile and warm outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / per_graph)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--cache", type=int, default=2048, help="allocated cache positions")
    ap.add_argument("--spans", default="256,1024,2048", help="attended positions, comma-separated")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--chunks", default="128,256,512")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--hbm-tb-s", type=float, default=4.8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    B, H, G, D, L = args.batch, args.kv_heads, args.group, args.head_dim, args.cache
    k = torch.randn(B, H, L, D, device=dev, dtype=dt, generator=g)
    v = torch.randn(B, H, L, D, device=dev, dtype=dt, generator=g)
    q = torch.randn(B, H, G, D, device=dev, dtype=dt, generator=g)
    scale = D ** -0.5
    rows = []
    for span in (int(s) for s in args.spans.split(",")):
        ok = torch.rand(B, 1, 1, span, device=dev, generator=g) > 0.25
        ok[..., -1] = True  # the newest key, always valid in the engine
        bias = torch.zeros(ok.shape, dtype=dt, device=dev).masked_fill_(~ok, float("-inf"))
        ref = da.reference(q, k, v, bias, span, scale).double()
        bound_us = 2 * B * H * span * D * k.element_size() / (args.hbm_tb_s * 1e12) * 1e6
        sdpa = lambda: F.scaled_dot_product_attention(q, k[:, :, :span], v[:, :, :span], attn_mask=bias,  # noqa: E731
                                                      scale=scale)
        sd_err = (sdpa().double() - ref).abs().max().item()
        sd_us = _time_us(sdpa, args.iters)
        row = {"span": span, "bound_us": bound_us, "sdpa_us": sd_us, "sdpa_err": sd_err, "triton": []}
        for c, w, st in itertools.product(*(list(map(int, x.split(","))) for x in (args.chunks, args.warps,
                                                                                  args.stages))):
            fn = lambda: da.decode_attention(q, k, v, bias, span, scale, chunk=c, num_warps=w, num_stages=st)  # noqa: E731
            err = (fn().double() - ref).abs().max().item()
            row["triton"].append({"chunk": c, "warps": w, "stages": st, "us": _time_us(fn, args.iters), "err": err})
        best = min(row["triton"], key=lambda r: r["us"])
        default = next((r for r in row["triton"] if (r["chunk"], r["warps"], r["stages"])
                        == (da.CHUNK, da.NUM_WARPS, da.NUM_STAGES)), None)
        row["best"] = best
        rows.append(row)
        print(f"span {span:5d}: bound {bound_us:7.1f} us | sdpa {sd_us:7.1f} us (err {sd_err:.1e}) | "
              f"triton default {default['us'] if default else float('nan'):7.1f} us | best {best['us']:7.1f} us "
              f"(chunk {best['chunk']}, warps {best['warps']}, stages {best['stages']}, err {best['err']:.1e}) | "
              f"sdpa/best {sd_us / best['us']:.2f}x", flush=True)
    result = {"device": torch.cuda.get_device_name(), "args": {k_: str(v_) for k_, v_ in vars(args).items()},
              "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
