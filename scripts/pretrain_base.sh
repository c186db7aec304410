#!/usr/bin/env bash
# Pre-training on the CUDA corpus, on one GPU: the base preset (about 210M parameters) and the default
# model (about 29M), each for MINUTES of wall clock on the same packed corpus in 2048-token windows,
# then OUT/pretrain_summary.json (tokens/s, MFU, held-out perplexity per package, both models).
# One H200: each model MINUTES plus under a minute of start-up, evaluation and checkpoint
# (16 windows of 2048 tokens per step: about 45 GB for the base model).
#
#   sparserl corpus build --out CORPUS                    # CPU: fetch the packages (pip), filter, split
#   sparserl corpus pack --corpus CORPUS --out PACK       # CPU: tokenise once (a few MiB)
#   bash scripts/pretrain_base.sh PACK OUT [MINUTES] [MODELS]   # GPU; default: 3 minutes, base,default
#
# MODELS may be one of them, so the two runs can be two commands; the second completes the summary.
set -euo pipefail
pack=${1:?usage: scripts/pretrain_base.sh PACK OUT [MINUTES] [MODELS]}
out=${2:?usage: scripts/pretrain_base.sh PACK OUT [MINUTES] [MODELS]}
minutes=${3:-3}
models=${4:-base,default}
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
mkdir -p "$out"
python benchmarks/pretrain_base.py --pack "$pack" --out "$out" --minutes "$minutes" --models "$models" \
  --seq-len 2048 --batch-size 16 2>&1 | tee -a "$out/pretrain_base.log"
