"""The CPU work behind a policy's prompts, one thread against several: what the GPU waited on.

Every sampled prompt needs its matrix's card, structure features and encoder input. ``evaluate``
used to make them one matrix at a time as its first generation batch asked for them, and SFT as
its first steps drew each matrix's rows; the GPU waited meanwhile. This times that work on the
held-out set of 13 families (``evaluate --matrices families``: generation, then cards and inputs)
and, with ``--data``, on an SFT data folder's training matrices (loading, cards and inputs), once
with one thread and once with ``--workers`` threads, and checks that both give the same prompts (the cards and the encoder inputs).

    PYTHONPATH=src python benchmarks/prompt_prep.py --rows 1000000 --out prompt_prep.json
    PYTHONPATH=src python benchmarks/prompt_prep.py --rows 1000000 --data DATA --workers 8 --out prompt_prep.json

CPU only. On 2 cores the families at 1M rows take about a minute in all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def prompt(card: str | None, inp) -> tuple:
    """What a sample's prompt is made of, comparable: the card and the encoder input's arrays."""
    return card, inp.shape, inp.rows.tobytes(), inp.cols.tobytes(), inp.summary.tobytes()


def families(rows: int, workers: int) -> tuple[dict, list[tuple]]:
    """Seconds to generate the 13 families at ``rows`` and make their cards and inputs, and the prompts."""
    from sparserl.kernels.contract import Op
    from sparserl.matrices import family_names, generate_many
    from sparserl.model.policy import PolicyConfig
    from sparserl.request.context import MatrixContext
    from sparserl.request.warm import warm_contexts

    fams = family_names()
    t0 = time.perf_counter()
    made = generate_many(fams, rows, seed=7, workers=workers)
    t1 = time.perf_counter()
    ctxs = [MatrixContext(A, f"{f}_{rows}", Op.SPMV) for A, f in zip(made, fams)]
    config = PolicyConfig()
    warm_contexts(ctxs, [config], workers)
    t2 = time.perf_counter()
    return ({"generate": t1 - t0, "cards": t2 - t1, "total": t2 - t0},
            [prompt(c.prompt_card, c.encoder_input(config.encoding)) for c in ctxs])


def data(folder: str, workers: int) -> tuple[dict, list[tuple]]:
    """Seconds to load an SFT folder's training matrices and make their samples, and the prompts."""
    from sparserl.data.rows import read_nonempty
    from sparserl.model.policy import PolicyConfig
    from sparserl.train.dataset import SFTDataset

    rows = read_nonempty(Path(folder) / "train.jsonl")
    ds = SFTDataset(rows, PolicyConfig())
    seconds = ds.warm(workers)
    samples = [ds.sample(r) for r in rows]
    return {"total": seconds, "matrices": len(ds.matrices_made())}, [prompt(x.card, x.matrix) for x in samples]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of each family's matrix (default 1M)")
    ap.add_argument("--data", help="an SFT data folder (train.jsonl and its matrices) to time as well")
    ap.add_argument("--workers", type=int, default=None,
                    help="threads of the parallel pass (default: the cores, at most sparserl.parallel.MAX_WORKERS)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    a = ap.parse_args(argv)
    from sparserl.parallel import MAX_WORKERS, workers_for

    if a.workers is None:  # the threads the project's own map takes by default
        a.workers = workers_for(MAX_WORKERS)
    out: dict = {"rows": a.rows, "workers": a.workers, "cpus": os.cpu_count()}
    cases = [("families", lambda w: families(a.rows, w))]
    if a.data:
        cases.append(("data", lambda w: data(a.data, w)))
    print(f"| set | 1 thread (s) | {a.workers} threads (s) | ratio |\n| --- | ---: | ---: | ---: |")
    for name, fn in cases:
        one, prompts_one = fn(1)
        many, prompts_many = fn(a.workers)
        if prompts_one != prompts_many:
            print(f"error: {name}: the threads' prompts differ from one thread's", file=sys.stderr)
            return 1
        out[name] = {"one_thread": one, "threads": many, "ratio": one["total"] / many["total"]}
        print(f"| {name} | {one['total']:.1f} | {many['total']:.1f} | {one['total'] / many['total']:.2f}x |")
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
