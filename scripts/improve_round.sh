#!/usr/bin/env bash
# `sparserl improve` on one H200 from nothing: a demo-sized SFT data set (44 generated matrices of
# 5k-100k rows, near-fastest library targets), the default model pre-trained and fine-tuned, then
# ROUNDS rounds of expert iteration at the default round size. Every step is skipped when its
# output is there and resumed when it was cut short, so the script can be run again and again
# under a time limit until it finishes (SIGTERM leaves each stage resumable):
#
#   timeout -s TERM 570 bash scripts/improve_round.sh runs/imp 1; cat runs/imp/improve/rounds.md
#   bash scripts/improve_round.sh runs/imp 2 --search-seconds 30   # options after ROUNDS go to 'sparserl improve'
#   bash scripts/improve_round.sh runs/imp 0                        # data, pre-training and SFT only
#
# Measured on one H200 (benchmarks/results/2026-12-01/improve-3-rounds/): data 80 s, pre-training 67 s, SFT 68 s,
# round 0's validation 43 s, then 54-58 s per round with --search-seconds 30, the held-out test 57 s.
set -euo pipefail
out=${1:-runs/imp}
rounds=${2:-1}
shift $(( $# < 2 ? $# : 2 ))
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
sparserl() { python -m sparserl.cli "$@"; }
resume_if() { [ -e "$1" ] && echo --resume || true; }

[ -f "$out/data/summary.json" ] || sparserl data build --out "$out/data" --per-family 4 --min-rows 5000 \
  --max-rows 100000 --target near_fastest --targets-per-matrix 6 --variants-per-matrix 20 \
  --val-fraction 0.25 --test-fraction 0.25 --seed 0 --force
[ -f "$out/pretrain/result.json" ] || sparserl pretrain --out "$out/pretrain" --steps 1000 \
  --batch-size 64 $(resume_if "$out/pretrain/state.pt")
[ -f "$out/sft/result.json" ] || sparserl sft --data "$out/data" --model "$out/pretrain/model" --out "$out/sft" \
  --steps 500 --batch-size 16 --lr 3e-4 --eval-every 500 --save-every 100 $(resume_if "$out/sft/state.pt")
[ "$rounds" -gt 0 ] || exit 0  # ROUNDS 0: data, pre-training and SFT only (e.g. before an RL run)
sparserl improve --data "$out/data" --model "$out/sft/checkpoint" --out "$out/improve" \
  --store "$out/best_known.sqlite" --rounds "$rounds" $(resume_if "$out/improve/state.json") "$@"
