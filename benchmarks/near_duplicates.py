"""Time the corpus build's near-copy check (``sparserl.corpus.near.near_copies``) on a synthetic corpus the
size of the built one: 4300 training files and 90 held-out files of CUDA-like text (13.6 KB each on average,
about 58 MB and 1.2 MB), of which 10 held-out files are training files with another copyright year and
CRLF line ends (planted near-copies, which it must find).

    python benchmarks/near_duplicates.py                  # prints the seconds and what it found
    python benchmarks/near_duplicates.py --repeat 3       # the check three times: every time, the median
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def _function(rng: random.Random, words: list[str]) -> str:
    name, a, b, c = rng.sample(words, 4)
    return (f"template <int {a.upper()}>\n"
            f"__global__ void {name}(const float* __restrict__ {a}, float* {b}, int {c}) {{\n"
            f"  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < {c}) {{\n"
            f"    float s = {rng.random():.5f}f;\n"
            f"    for (int j = 0; j < {rng.randint(1, 64)}; ++j) s += {a}[i * {rng.randint(2, 99)} + j];\n"
            f"    {b}[i] = s * {rng.randint(1, 99999)};\n  }}\n}}\n\n")


def _file(rng: random.Random, words: list[str], mean_bytes: int) -> str:
    size = int(rng.expovariate(1 / mean_bytes))
    out, n = ["// SPDX-License-Identifier: MIT\n// Copyright (c) 2024 its authors\n#pragma once\n"], 0
    while n < size:
        out.append(_function(rng, words))
        n += len(out[-1])
    return "".join(out)


def synthetic(train: int, heldout: int, planted: int, mean_bytes: int, seed: int) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts); the first ``planted`` held-out texts are near-copies of training
    texts 0, 1, ... (another year, CRLF line ends)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz_"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 12))) for _ in range(20000)]
    tr = [_file(rng, words, mean_bytes) for _ in range(train)]
    held = [tr[i].replace("2024", "2025").replace("\n", "\r\n") for i in range(planted)]
    held += [_file(rng, words, mean_bytes) for _ in range(heldout - planted)]
    return tr, held


def main(argv: list[str] | None = None) -> int:
    from sparserl.corpus.near import near_copies

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=4300, help="training files")
    ap.add_argument("--heldout", type=int, default=90, help="held-out files")
    ap.add_argument("--planted", type=int, default=10, help="held-out files that are near-copies of training files")
    ap.add_argument("--mean-bytes", type=int, default=13_600, help="mean file size")
    ap.add_argument("--threshold", type=float, default=0.8, help="similarity at which a held-out file is a near-copy")
    ap.add_argument("--repeat", type=int, default=1, help="times the check is run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    train, held = synthetic(args.train, args.heldout, args.planted, args.mean_bytes, args.seed)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        matches = near_copies(held, train)
        times.append(time.perf_counter() - t0)
    found = [i for i, m in enumerate(matches) if m.similarity >= args.threshold]
    other = max((m.similarity for m in matches[args.planted:]), default=0.0)
    print(f"{len(train)} training files ({sum(map(len, train)) / 1e6:.1f} MB), {len(held)} held-out "
          f"({sum(map(len, held)) / 1e6:.2f} MB): near-copy check {statistics.median(times):.2f} s "
          f"(each run: {', '.join(f'{t:.2f}' for t in times)})")
    print(f"near-copies found: {len(found)} (planted {args.planted}: {found == list(range(args.planted))}); "
          f"largest similarity of another held-out file: {other:.3f}")
    return 0 if found == list(range(args.planted)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
