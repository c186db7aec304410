#!/usr/bin/env bash
# The self-improvement measurements on one GPU machine, after `scripts/improve_round.sh RUN ROUNDS` (which this
# runs first, resuming it): the starting SFT model and improve's best model, best of 16, beside
# cuSPARSE and the library oracle,
#   1. on the generated families at 1M rows (`evaluate --matrices families`),
#   2. the card ablation on the run's own data and pre-trained model (benchmarks/card_ablation.py),
#   3. on a folder of SuiteSparse matrices, when one is given.
# Each stage writes RUN/eval/NAME.log and is skipped once RUN/eval/NAME.done exists, so the script
# can be run again after a kill; stage start and end times go to RUN/eval/times.txt.
#
#   bash scripts/improve_eval.sh runs/imp 3 [SUITESPARSE_DIR]
#
# Measured on one H200 (benchmarks/results/2026-12-01/improve-3-rounds/, 3 rounds): improve_round.sh 555 s
# from nothing, the families 666 s, the card ablation 219 s; the SuiteSparse stage did not finish there.
set -uo pipefail
run=${1:?usage: scripts/improve_eval.sh RUN ROUNDS [SUITESPARSE_DIR]}
rounds=${2:?usage: scripts/improve_eval.sh RUN ROUNDS [SUITESPARSE_DIR]}
ss=${3:-}
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
ev=$run/eval
mkdir -p "$ev"
stage() {  # NAME COMMAND...: run once; its log in $ev/NAME.log
  local name=$1; shift
  [ -f "$ev/$name.done" ] && return 0
  echo "$(date -u +%FT%TZ) start $name" >> "$ev/times.txt"
  "$@" > "$ev/$name.log" 2>&1
  local rc=$?
  echo "$(date -u +%FT%TZ) end $name rc=$rc" >> "$ev/times.txt"
  [ $rc -eq 0 ] && touch "$ev/$name.done"
  return $rc
}
both=(-c "sft=$run/sft/checkpoint" -c "improved=$run/improve/best" --samples 16 --gen-batch 256
      --baselines cusparse,oracle --no-plots --force)
stage improve bash scripts/improve_round.sh "$run" "$rounds" --search-seconds 30 --test-samples 16 || exit
stage families python -m sparserl.cli evaluate --matrices families --family-rows 1000000 "${both[@]}" \
  --out "$ev/families" || exit
stage card_ablation python benchmarks/card_ablation.py --data "$run/data" --model "$run/pretrain/model" \
  --out "$run/card_ablation" --steps 500 --batch-size 16 --samples 16 --gen-batch 256 --split test || exit
if [ -n "$ss" ]; then
  stage suitesparse python -m sparserl.cli evaluate --matrices "$ss" "${both[@]}" --out "$ev/suitesparse" || exit
fi
cat "$ev/times.txt"
