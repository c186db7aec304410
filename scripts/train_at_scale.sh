#!/usr/bin/env bash
# The SFT model behind the "held out at scale" results (docs/results.md): SFT data on
# generated matrices of 5k to 1.5M rows whose targets are the near-fastest verified library
# variants, the default model pre-trained from scratch, then SFT. One H200: data about 11 min,
# pre-training 1.5 min (run it beside the data on a second GPU), SFT 3 min.
#
#   bash scripts/train_at_scale.sh [OUT]        # default OUT: runs/scale
#   sparserl evaluate --matrices families --family-rows 1000000 --samples 16 -c sft=OUT/sft/checkpoint
#   sparserl generate A.mtx --model OUT/sft/checkpoint --samples 16
set -euo pipefail
out=${1:-runs/scale}
sparserl data build --out "$out/data" --per-family 16 --min-rows 5000 --max-rows 1500000 \
  --target near_fastest --targets-per-matrix 6 --variants-per-matrix 30 \
  --val-fraction 0.125 --test-fraction 0.125 --seed 0
sparserl pretrain --out "$out/pretrain" --steps 1000 --batch-size 64
sparserl sft --data "$out/data" --model "$out/pretrain/model" --out "$out/sft" --steps 600 \
  --batch-size 16 --lr 3e-4 --eval-every 600 --save-every 200
