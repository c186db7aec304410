#!/usr/bin/env bash
# The policy in one resumable sitting on one GPU: a base model pre-trained on the packed CUDA corpus,
# teacher data at scale (library variants near the fastest, then budgeted searches whose verified
# kernels fill a best-known store, exported with refinement rows), SFT of the base model on both,
# `improve` rounds from the SFT model (kept only when validation gains at 90% correct, or at the SFT
# model's correct share or more where that is lower), and
# the held-out table (the data's test split and the families at 1M rows: the SFT model and the
# improved one when a round was kept, cuSPARSE and the library oracle side by side; new-body shares
# in each eval.md), then the final model guiding the search against the search without it on
# held-out test matrices (benchmarks/guided_search.py, OUT/guided.json).
#
#   sparserl corpus build --out CORPUS && sparserl corpus pack --corpus CORPUS --out PACK   # CPU, once
#   bash scripts/policy_at_scale.sh OUT PACK [small|full]      # GPU; full is the default
#   BASE_MODEL=DIR bash scripts/policy_at_scale.sh OUT - small # a base model made before: no pre-training
#   BASE_MODEL=DIR bash scripts/policy_at_scale.sh OUT - smoke # CPU: every stage compile-only (the tests)
#
# At the end, benchmarks/policy_targets.py reads the folder: the policy's targets beside what the run measured
# (OUT/targets.json). Presets (GPU wall clock, one H200; OUT/stages.tsv records each stage's seconds):
#   small  pre-training 3 min, 4 matrices per family at 10k-1M rows (one each for validation and
#          test), searches of 16 candidates on the 2 train matrices,
#          SFT 200 steps (no validation of its own: the test split is evaluated after it), one improve
#          round (4 matrices searched with 16 candidates, 30 fine-tune steps at 3e-5 with 3x replay),
#          8 samples per held-out matrix, the guided search on 2 test matrices: the table's shape.
#          Measured with each held-out set in a process of its own, 32 completions generated at a
#          time: 924 s (pre-training 204, data 96, search 42, SFT 140, improve 139, evaluations
#          76 + 111, guided search 115; results of 2026-12-04). The sets now run in one process
#          (benchmarks/heldout_eval.py: the policies opened once) and generate 128 at a time: 804 s
#          (pre-training 212, data 103, search 47, SFT 127, improve 110, evaluations 142, guided
#          search 61; results of 2026-12-04, policy-length-limit).
#          With 4 minutes of pre-training the held-out perplexity was 5.82 instead of 8.59;
#   full   the whole table of the targets in what one H200 sitting holds: the small preset's data and
#          searches, with pre-training 4 min, 8 further matrices per family searched for the teacher
#          (TEACHER_PER_FAMILY) drawn stratified over 100k-2M rows (TEACHER_ROWS, TEACHER_SIZES), SFT 400
#          steps, 16 samples (the targets are best of 16), held-out headers sampled within the contract's
#          grammar (HEADER_GRAMMAR), the guided search on 4 test matrices with a search of 192 beside it
#          (GUIDED_HEADROOM), and the SuiteSparse split (SUITESPARSE=DIR; a full run without it is noted as changed, its table has no real set). The
#          target is 40 minutes; with the teacher then drawn over 10k-1M rows it took 20.0 (1202 s of stages
#          on one H200, results of 2026-12-05, policy-full-preset); the larger teacher's search took 290 s
#          on an H100 against 134 on that H200 (teacher-sizes-stratified: 1093 s to the end of SFT). With it, on
#          an H100 and without improve: 1338 s, 22.3 minutes (results of 2026-12-06, policy-full-preset-t0.7).
#          Each setting is one a small run measured (results of 2026-12-04: policy-teacher-at-scale,
#          policy-length-limit, header-grammar-cover); the earlier full preset (12 minutes of pre-training,
#          10 matrices per family to 2M rows, 30 further ones, 800 steps, two improve rounds) never ran:
#          40 minutes of one GPU do not fit a sitting of 30.
# TEMPERATURE=T samples the final policy at T in the held-out sets and the guided search (default 0.7, the
# policy's temperature: sparserl/model/config.py POLICY_TEMPERATURE); IMPROVE_TEMPERATURE=T samples improve's
# rollouts and validation at T (default 1.0: learning explores);
# TEMPERATURES=T1,T2,... first evaluates the final policy on 8 validation matrices at each and takes the
# one with the highest best of N over the oracle, and among those within 1% of it the highest correct
# share, for the held-out sets and the guided search (OUT/temperature/temperature.json; a stage of its
# own, about a minute on the small preset; improve, before it, samples at IMPROVE_TEMPERATURE).
# HEADER_GRAMMAR=1 samples each header within the contract's grammar in the temperature choice and the held-out
# sets (`heldout_eval.py --header-grammar`: sparserl/model/header_grammar.py); improve and the guided search sample
# as before (small 0, full 1; HEADER_GRAMMAR=0 turns it off).
# MAX_TARGET_CHARS=N teaches only kernels of at most N characters without comments (`data build
# --max-target-chars`, `best export --max-chars`): the next fastest within it takes a longer one's place.
# The default, 6300, leaves out csr_adaptive's kernels (6.4k-8.8k characters) alone: the policy's held-out
# samples of them were correct once in 32, and from one pre-trained base the small preset with the limit
# reached 92.6% correct on the test split against 76.5% without it (results of 2026-12-04,
# policy-length-limit). MAX_TARGET_CHARS=none teaches every kernel; improve's teacher gets the same limit.
# TEACHER_PER_FAMILY=N searches N further generated matrices per family (seed 1; made on the CPU while
# pre-training runs, OUT/teacher-matrices) in the search stage beside the train split, so the store the teacher
# is exported from covers more sizes and structures than the data set (small 0, full 8): about 1.4 s a matrix at
# 16 candidates on one H200. TEACHER_ROWS="MIN MAX" draws those matrices' rows in [MIN, MAX] (small: the data's
# 10k-1M; full 100k-2M), and TEACHER_SIZES=stratified draws a family's i-th one in the i-th of N equal parts of
# the range on a log scale (`data build --size-draw`; random draws each over the whole range; small random, full
# stratified). The full preset's first run drew its teacher at random over 10k-1M: five of stencil3d_27's eight
# fell below 100k rows, where CSR is the fastest, and its policy wrote CSR for the 1M-row 3D stencils (0.43 and
# 0.53 of the oracle; the families' best of 16 0.886). Drawn stratified over 100k-2M, the policy wrote DIA there
# (0.96 and 1.01) and the families reached 1.002, with the correct share at 0.856 against 0.933 (results of
# 2026-12-05, policy-full-preset and teacher-sizes-stratified). TEACHER_PARAMS=drawn draws each of those matrices'
# structural parameters (bands, row lengths, blocks per block row: `data build --vary-params`) instead of the
# families' defaults (default: default), so that the specialised kernels' facts in the teacher differ from matrix
# to matrix: with the defaults 105 specialised SFT rows held 7 distinct facts blocks, and the policy wrote facts
# from memory, never from the card (results of 2026-12-05, spec-facts-copy). Drawn, the small preset's teacher held
# 15 distinct blocks in 83 rows and the policy still wrote only blocks it was taught, 0.817 correct against 0.832
# (results of 2026-12-06, teacher-params-drawn), so the default stays.
# SIBLINGS=N teaches each specialised teacher row again on up to N new matrices of its family, within 15% of its
# size, parameters drawn (`sparserl data siblings`, CPU, OUT/siblings; default 0, none): the same template at the
# row's numbers for each new card, kept where the facts block is new, never a held-out structure (the data set's,
# the families set's at 1M rows, nor their facts blocks), not timed. On that run's teacher, N=4 took the distinct
# blocks from 15 to 53 (dia_window_spec 3 -> 19) in 38 rows, 5 minutes on 2 cores (teacher-params-drawn,
# siblings-summary.json). Trained on (SIBLINGS=4, 63 rows, 402 s on the GPU host), the policy still wrote only
# blocks the teacher's own rows had, 0.774 correct against 0.832 (results of 2026-12-06, siblings): the default
# stays 0. The DIA, BSR, lane and split templates now name their facts (the harness defines them from the card), so
# siblings apply only to csr_adaptive_spec.
# SFT_SNAPSHOTS="N ..." keeps the policy after N of the SFT's steps too (sft --snapshot) and evaluates it beside
# the final one as sft_stepN, on the same held-out matrices in the same run: does a shorter SFT (its loss reached
# 0.002-0.005 by step 200 on the small preset: the teacher's rows learnt by heart) generalise better? The learning rate
# still decays over SFT_STEPS, so a snapshot is not a run of N steps. Measured: no; at step 100 of 200 the families
# read 0.596 correct against 0.822, 0.834 of the oracle against 1.011 (2026-12-06, temperature-snapshot).
# SECOND_TEMPERATURE=T samples the final policy at T too in the held-out sets, as NAME_tT beside it (one opening,
# the same matrices and baselines' timings): on 8 validation matrices 0.7 read 93.8% correct against 85.9% at 1.0,
# and 0.967 of the oracle against 0.977 (results of 2026-12-04, policy-small-temperature); on the families at 1M
# rows 97.6% against 82.2%, 1.007 of the oracle against 1.011 (2026-12-06, temperature-snapshot: 0.7 became the
# default TEMPERATURE; SECOND_TEMPERATURE=1.0 now shows the policy as it was trained beside it).
# SFT_STEPS=N trains SFT for N steps (small 200, full 400): with more teacher rows, more steps. SAMPLES=N
# samples N kernels per held-out matrix (small 8, full 16: the targets are best of 16). GUIDED_MATRICES=N runs the guided search on N test matrices (small 2, full 4; about 30 s
# each on the small preset). GUIDED_TEXT_ARM=1 adds to it the model's search with the policy's kernels read as
# free text (guided_search.py --text-arm: what reading them as template points gives, side by side; a fourth arm's
# time). GUIDED_HEADROOM=N adds the search without a model at N candidates (guided_search.py --headroom-budget:
# what a longer search finds past the budget, the room any guidance has at that budget; full 192, small and smoke 0;
# like the text arm, an arm beside the three, not a change of what they measure).
# IMPROVE=0 leaves the improve stage out: the SFT model is the final policy (its
# round was not kept on the small preset at 10k-1M rows, results of 2026-12-04). OUT/settings.json names what any
# invocation changed of its preset; a run that changed something is not the preset's sitting, and
# benchmarks/policy_targets.py says so.
# EVAL_SETS=S1,S2 evaluates only those of the preset's held-out sets (test, families, and real with SUITESPARSE),
# in that order: a sitting short of device time measures the set it is after first (noted as a change). Another
# list than the preset's is a stage of its own (evals-S1-S2): run again without it, the preset's evals stage
# evaluates the rest, the finished sets kept (heldout_eval.py --resume). Every held-out set ends with a second
# look (evaluate --retime 3): each matrix's picks, the oracle's and each policy's best sample, timed again side
# by side, so the targets read a best of N over the oracle without either's luck of the draw.
# SUITESPARSE=DIR adds a folder of real matrices (.mtx/.mtx.gz/.npz; the SuiteSparse ones) to the data set, split
# like a family's (`data build --real-dir DIR --real-split mixed`: a quarter each to validation and test): the
# teacher searches its train split beside the generated one, and the held-out table gains the
# set `real`, the test split's real matrices (OUT/eval-real), while `test` keeps the generated ones. The guided
# search stays on generated test matrices, and the teacher's searches order their candidates without the packaged
# cost model (`farm --cost-model none`): that model was fitted on the SuiteSparse matrices' measurements, the
# test split's too, so no learned part sees a real test matrix (the model moved SuiteSparse searches at budget 64
# from 1.071 to 1.073 of the oracle, an earlier fit; results of 2026-12-02), and neither do improve's searches.
# A run that gave SUITESPARSE and one that did not need different OUT folders (the data sets
# differ), and too few real matrices leave the test split without one (its fraction, rounded down): both stop
# after the data stage with one line.
# The improve settings (replay 3, 30 steps at 3e-5) are the ones that kept a round's correct share at
# 97% where the defaults (replay 1, 60 steps at 1e-4) fell to 75% (benchmarks/results/2026-12-04/improve-knobs).
# The smoke preset has no improve stage: improve needs a GPU.
# The teacher data's matrices are generated on the CPU while pre-training runs (OUT/matrices.log).
# With two GPUs or more (CUDA_VISIBLE_DEVICES's, else every one nvidia-smi lists; GPUS=N says N), pre-training runs
# on the first (OUT/pretrain.log) while the data, search, export and merge stages run on the others, which the
# teacher's timings then have to themselves; SFT waits for the base model and uses every GPU again. On one H200 the
# small preset's pre-training (212 s) and its teacher's stages (about 150-210 s) took turns.
# Each stage writes OUT/stages/NAME.done when it ends; run the same command again after a crash or a
# time limit and the finished stages are skipped (pre-training, the searches and SFT resume inside).
# Pre-training runs for its minutes (the step cap is out of the way; the learning rate decays over them).
# PRETRAIN_STEPS=N trains N steps instead, whatever they take: the same base model on a slower card (the full
# preset's 4 minutes were 887 steps on an H200 and 758 on an H100).
# A run carried to another machine without its matrices (they are large; the stages' files are not) makes them
# again, the same, while pre-training runs or before the next stage: the finished stages are kept.
# The teacher never sees a held-out matrix: searches run on the train split only, and the families
# held out from every learned component (circuit, kkt, fem_mixed, road) are not generated.
set -euo pipefail
export SPARSERL_LOG_TIME=${SPARSERL_LOG_TIME:-1}  # each log line begins with its time: where the minutes went
out=${1:?usage: scripts/policy_at_scale.sh OUT PACK [small|full|smoke]}
pack=${2:?usage: scripts/policy_at_scale.sh OUT PACK [small|full|smoke]  (PACK: a corpus pack, or - for the default corpus)}
preset=${3:-full}
families=diagonal,banded,stencil2d,stencil3d_7,stencil3d_27,block,random,powerlaw,skewed,empty_rows,rectangular,dense_lines,rmat,lp,kronecker,cartesian,arrow
device=(); compile=(); gen=(); eval_sets=(test families); improve=(); evalgen=(--retime 3); headroom_n=0
teacher_rows=""; teacher_draw_default=random  # the teacher's further matrices: the data's sizes, drawn at random
grammar=0; real_wanted=0  # the preset's HEADER_GRAMMAR, and whether its table has the SuiteSparse set
case $preset in
  small) pretrain=(--preset base --minutes 3 --steps 1000000 --eval-every 1000000 --seq-len 2048 --batch-size 16)
         per_family=4; sizes=(--min-rows 10000 --max-rows 1000000); extra=0
         data=(--variants-per-matrix 16 --val-fraction 0.25 --test-fraction 0.25)
         search=(--budget 16 --seconds 10); sft_steps=200; sft=(--batch-size 16 --eval-samples 0); samples=8
         evalgen=(--gen-batch 128 --retime 3)
         improve=(--rounds 1 --matrices-per-round 4 --search-budget 16 --search-seconds 20 --val-matrices 4)
         guided_n=2; guided=(--budget 64 --samples 16 --search 16) ;;
  full)  pretrain=(--preset base --minutes 4 --steps 1000000 --eval-every 1000000 --seq-len 2048 --batch-size 16)
         per_family=4; sizes=(--min-rows 10000 --max-rows 1000000); extra=8
         data=(--variants-per-matrix 16 --val-fraction 0.25 --test-fraction 0.25)
         search=(--budget 16 --seconds 10); sft_steps=400; sft=(--batch-size 16 --eval-samples 0); samples=16
         evalgen=(--gen-batch 128 --retime 3); grammar=1; real_wanted=1
         teacher_rows="100000 2000000"; teacher_draw_default=stratified
         improve=(--rounds 1 --matrices-per-round 4 --search-budget 16 --search-seconds 20 --val-matrices 4)
         guided_n=4; guided=(--budget 64 --samples 16 --search 16); headroom_n=192 ;;
  smoke) families=stencil2d,powerlaw,lp
         pretrain=(--preset default --steps 2 --seq-len 64 --batch-size 2)
         per_family=3; sizes=(--min-rows 300 --max-rows 600); extra=0
         data=(--variants-per-matrix 2 --val-fraction 0.34 --test-fraction 0.34)
         search=(--budget 2); sft_steps=2; sft=(--batch-size 2 --eval-every 2 --eval-samples 1); samples=1
         guided_n=1; guided=(--budget 2 --samples 1 --search 1)
         device=(--device cpu); compile=(--compile-only); gen=(--max-new-tokens 48); eval_sets=(test) ;;
  *) echo "error: the preset is small, full or smoke (got '$preset')" >&2; exit 2 ;;
esac
policy_t=0.7  # TEMPERATURE's default: the policy's temperature (sparserl.model.config.POLICY_TEMPERATURE)
positive='import sys; assert 0 < float(sys.argv[1]) < 100'
for t in TEMPERATURE IMPROVE_TEMPERATURE; do
  case "${!t:-}" in
    *,*) echo "error: $t is one number (to choose among several on the validation split: TEMPERATURES)" >&2
         exit 2 ;;
  esac
done
for t in TEMPERATURE IMPROVE_TEMPERATURE SECOND_TEMPERATURE; do
  if [ -n "${!t:-}" ] && ! "${PYTHON:-python}" -c "$positive" "${!t}" 2> /dev/null; then
    echo "error: $t is a positive number (got '${!t}')" >&2; exit 2
  fi
done
case "${HEADER_GRAMMAR:-$grammar}" in
  1) evalgen+=(--header-grammar) ;;
  0) ;;
  *) echo "error: HEADER_GRAMMAR is 1 (sample headers within the contract's grammar) or 0 (got '$HEADER_GRAMMAR')" >&2
     exit 2 ;;
esac
count() {  # count NAME VALUE MIN [OR]: VALUE when it is a whole number of at least MIN, else one line and stop
  local why="error: $1 is a whole number of at least $3${4:+, or $4} (got '$2')"
  case "$2" in
    ""|*[!0-9]*) echo "$why" >&2; exit 2 ;;
  esac
  if [ "$2" -lt "$3" ]; then echo "$why" >&2; exit 2; fi
  echo "$2"
}
changed=()  # what this run changes of the preset (OUT/settings.json: its sitting is then not the preset's)
knob() {  # knob NAME VALUE DEFAULT: note VALUE when it is not the preset's
  if [ "$2" != "$3" ]; then changed+=("$1=$2"); fi
}
override() {  # override VAR NAME MIN: VAR (the preset's count) from the environment's NAME, checked and noted
  local now
  now=$(count "$2" "${!2:-${!1}}" "$3") || exit 2
  knob "$2" "$now" "${!1}"
  printf -v "$1" %s "$now"
}
override extra TEACHER_PER_FAMILY 0; override sft_steps SFT_STEPS 1; override samples SAMPLES 1
override guided_n GUIDED_MATRICES 1
text_arm=()
case "${GUIDED_TEXT_ARM:-0}" in
  0) ;;
  1) text_arm=(--text-arm) ;;  # not a change of the preset: an arm of its own beside the three (guided.json says so)
  *) echo "error: GUIDED_TEXT_ARM is 1 (the text arm beside the guided search's three) or 0 (got '$GUIDED_TEXT_ARM')" >&2; exit 2 ;;
esac
headroom=()  # GUIDED_HEADROOM=N: the search without a model at N candidates too (guided_search.py --headroom-budget)
headroom_n=${GUIDED_HEADROOM:-$headroom_n}
case "$headroom_n" in
  0) ;;
  *) headroom=(--headroom-budget "$(count GUIDED_HEADROOM "$headroom_n" $((guided[1] + 1)) "0 for none")") ;;  # above the budget
esac
sft+=(--steps "$sft_steps")
snapshots=(); snapshot_args=()  # SFT_SNAPSHOTS="N ...": the policy after N steps too, evaluated as sft_stepN
for n in ${SFT_SNAPSHOTS:-}; do
  n=$(count SFT_SNAPSHOTS "$n" 1) || exit 2; n=$((10#$n))  # 050 is step 50, as sft reads it
  if [ "$n" -ge "$sft_steps" ]; then
    echo "error: SFT_SNAPSHOTS has $n, not below the SFT's $sft_steps steps" >&2; exit 2
  fi
  snapshots+=("$n"); snapshot_args+=(--snapshot "$n")
done
knob SFT_SNAPSHOTS "${snapshots[*]}" ""
second_t=${SECOND_TEMPERATURE:-}  # the final policy sampled at this temperature too, beside itself, held out
same='import sys; assert float(sys.argv[1]) != float(sys.argv[2])'
if [ -n "$second_t" ] && [ -z "${TEMPERATURES:-}" ] \
   && ! "${PYTHON:-python}" -c "$same" "$second_t" "${TEMPERATURE:-$policy_t}" 2> /dev/null; then
  echo "error: SECOND_TEMPERATURE=$second_t is the held-out sets' temperature already" \
    "(TEMPERATURE, default $policy_t): give another (1.0: the policy as trained)" >&2; exit 2
fi
knob SECOND_TEMPERATURE "$second_t" ""
knob MAX_TARGET_CHARS "${MAX_TARGET_CHARS:-6300}" 6300; knob TEMPERATURE "${TEMPERATURE:-$policy_t}" "$policy_t"
knob TEMPERATURES "${TEMPERATURES:-}" ""; knob IMPROVE_TEMPERATURE "${IMPROVE_TEMPERATURE:-1.0}" 1.0
knob HEADER_GRAMMAR "${HEADER_GRAMMAR:-$grammar}" "$grammar"
knob BASE_MODEL "${BASE_MODEL:-}" ""
if [ -n "${PRETRAIN_STEPS:-}" ]; then  # N steps (the learning rate decaying over them) instead of the preset's minutes
  n=$(count PRETRAIN_STEPS "$PRETRAIN_STEPS" 1) || exit 2
  kept=(); i=0
  while [ $i -lt ${#pretrain[@]} ]; do
    case "${pretrain[$i]}" in
      --minutes|--steps) i=$((i + 2)) ;;
      *) kept+=("${pretrain[$i]}"); i=$((i + 1)) ;;
    esac
  done
  pretrain=("${kept[@]}" --steps "$n"); knob PRETRAIN_STEPS "$n" ""
fi
teacher_sizes=("${sizes[@]}")  # the teacher's further matrices: the preset's range, or TEACHER_ROWS="MIN MAX"
rows_wanted=${TEACHER_ROWS:-$teacher_rows}
if [ -n "$rows_wanted" ]; then
  read -r t_min t_max t_more <<< "$rows_wanted"
  if [ -z "${t_max:-}" ] || [ -n "${t_more:-}" ]; then
    echo "error: TEACHER_ROWS is two whole numbers, the fewest and the most rows (got '$rows_wanted')" >&2; exit 2
  fi
  t_min=$(count "TEACHER_ROWS's fewest" "$t_min" 1) || exit 2
  t_max=$(count "TEACHER_ROWS's most" "$t_max" "$t_min") || exit 2
  teacher_sizes=(--min-rows "$t_min" --max-rows "$t_max")
  knob TEACHER_ROWS "$t_min $t_max" "${teacher_rows:-${sizes[1]} ${sizes[3]}}"  # the preset's: its own, or the data's
fi
teacher_draw=${TEACHER_SIZES:-$teacher_draw_default}
case "$teacher_draw" in
  random|stratified) knob TEACHER_SIZES "$teacher_draw" "$teacher_draw_default" ;;
  *) echo "error: TEACHER_SIZES is random or stratified (got '$teacher_draw')" >&2; exit 2 ;;
esac
teacher_params=()  # the teacher's further matrices: their families' default parameters, or TEACHER_PARAMS=drawn
case "${TEACHER_PARAMS:-default}" in
  default) knob TEACHER_PARAMS default default ;;
  drawn) teacher_params=(--vary-params); knob TEACHER_PARAMS drawn default ;;
  *) echo "error: TEACHER_PARAMS is default or drawn (got '$TEACHER_PARAMS')" >&2; exit 2 ;;
esac
siblings=$(count SIBLINGS "${SIBLINGS:-0}" 0) || exit 2; knob SIBLINGS "$siblings" 0
gpu_ids=()  # the GPUs this run may use: CUDA_VISIBLE_DEVICES's, else every one nvidia-smi lists (GPUS=N: 0..N-1)
if [ -n "${GPUS:-}" ]; then
  n=$(count GPUS "$GPUS" 0) || exit 2
  if [ "$n" -gt 0 ]; then mapfile -t gpu_ids < <(seq 0 $((n - 1))); fi
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -ra gpu_ids <<< "$CUDA_VISIBLE_DEVICES"
else
  mapfile -t gpu_ids < <(nvidia-smi --query-gpu=index --format=csv,noheader 2> /dev/null || true)
fi
case "${IMPROVE:-1}" in  # 0: no improve stage (the SFT model is the final policy)
  1) ;;
  0) knob IMPROVE 0 1; improve=() ;;
  *) echo "error: IMPROVE is 1 (the preset's improve rounds) or 0 (none) (got '$IMPROVE')" >&2; exit 2 ;;
esac
taught_data=(); taught_export=()
if [ "${MAX_TARGET_CHARS:-6300}" != none ]; then  # characters without comments; none: no limit
  limit=$(count MAX_TARGET_CHARS "${MAX_TARGET_CHARS:-6300}" 1 none) || exit 2
  taught_data=(--max-target-chars "$limit"); taught_export=(--max-chars "$limit")
  if [ ${#improve[@]} -gt 0 ]; then improve+=(--max-target-chars "$limit"); fi
fi
real=()  # SUITESPARSE=DIR: real matrices split like a family's, and their held-out set
if [ -n "${SUITESPARSE:-}" ]; then
  if [ ! -d "$SUITESPARSE" ]; then
    echo "error: SUITESPARSE is a folder of real matrices, .mtx/.mtx.gz/.npz (got '$SUITESPARSE')" >&2; exit 2
  fi
  real=(--real-dir "$SUITESPARSE" --real-split mixed); eval_sets+=(real)
  if [ "$real_wanted" = 0 ]; then knob SUITESPARSE "$SUITESPARSE" ""; fi
  search+=(--cost-model none)  # the packaged model saw every SuiteSparse matrix, test ones included
  if [ ${#improve[@]} -gt 0 ]; then improve+=(--search-cost-model none); fi
elif [ "$real_wanted" = 1 ]; then
  knob SUITESPARSE none ""; echo "note: no SUITESPARSE: the held-out table has no real set (the $preset preset's has)"
fi
evals_stage=evals  # the held-out stage's name: the preset's sets, or evals-S1-S2 for EVAL_SETS's
if [ -n "${EVAL_SETS:-}" ]; then  # only these held-out sets, in this order (of the preset's)
  why="error: EVAL_SETS is a comma-separated list of $(IFS=,; echo "${eval_sets[*]}"), each once (got '$EVAL_SETS')"
  case ",$EVAL_SETS," in *,,*|*[[:space:]]*) echo "$why" >&2; exit 2 ;; esac
  IFS=, read -ra wanted <<< "$EVAL_SETS"
  for i in "${!wanted[@]}"; do
    known=0
    for s in "${eval_sets[@]}"; do [ "$s" = "${wanted[$i]}" ] && known=1; done
    for s in "${wanted[@]:0:$i}"; do [ "$s" = "${wanted[$i]}" ] && known=0; done  # named twice
    if [ "$known" = 0 ]; then echo "$why" >&2; exit 2; fi
  done
  preset_sets=$(IFS=,; echo "${eval_sets[*]}")
  knob EVAL_SETS "$EVAL_SETS" "$preset_sets"
  if [ "$EVAL_SETS" != "$preset_sets" ]; then evals_stage="evals-$(IFS=-; echo "${wanted[*]}")"; fi
  eval_sets=("${wanted[@]}")
fi
corpus=(); [ "$pack" != "-" ] && corpus=(--corpus "$pack")
if [ "$pack" != "-" ] && [ ! -e "$pack" ]; then
  echo "error: no corpus pack at $pack (make one: sparserl corpus build, then sparserl corpus pack; or give -)" >&2
  exit 2
fi
mkdir -p "$out/stages"
"${PYTHON:-python}" -c "import json, os, sys
path, preset, now = sys.argv[1], sys.argv[2], sys.argv[3:]
before = json.load(open(path))['changed'] if os.path.exists(path) else []
json.dump({'preset': preset, 'changed': before + [c for c in now if c not in before]}, open(path, 'w'))" \
  "$out/settings.json" "$preset" ${changed[@]+"${changed[@]}"}  # every invocation's changes (policy_targets.py)
if command -v sparserl > /dev/null; then sparserl() { command sparserl "$@"; }; else sparserl() { "${PYTHON:-python}" -m sparserl.cli "$@"; }; fi

stage() {  # stage NAME COMMAND...: run it unless it finished before; record its seconds
  local name=$1; shift
  if [ -e "$out/stages/$name.done" ]; then echo "== $name: done before, skipped"; return; fi
  echo "== $name: $*"
  local t0=$SECONDS
  "$@"
  printf '%s\t%s\n' "$name" $((SECONDS - t0)) >> "$out/stages.tsv"
  touch "$out/stages/$name.done"
}
again() { [ -e "$1" ] && echo --resume || true; }  # --resume when a run left its state behind

teacher_dir="$out/teacher-matrices"  # the matrices searched for the teacher beyond the data's train split
lacks_matrices() {  # lacks_matrices DATA: a generated matrix DATA's splits name (by its file) is not there
  "${PYTHON:-python}" -c "import json, sys
from pathlib import Path
data = Path(sys.argv[1])
files = {json.loads(line)['matrix'] for s in ('train', 'val', 'test') if (data / f'{s}.jsonl').exists()
         for line in open(data / f'{s}.jsonl') if line.strip() and json.loads(line).get('family') != 'real'}
sys.exit(0 if any(not Path(f).exists() for f in files) else 1)" "$1"
}
pending() {  # pending STAGE...: one of them has not finished
  local name
  for name in "$@"; do [ -e "$out/stages/$name.done" ] || return 0; done
  return 1
}
# The matrices still needed: the data set's (seed 0) and the teacher's further ones (seed 1). Made again, the
# same, when their stage finished but they are not here and a stage still reads them (a run carried to
# another machine without them: the searches, improve, the held-out sets and the guided search read the data
# set's; the search and the held-out sets' check that no held-out matrix was taught read the teacher's).
data_matrices=0
readers=(search "$evals_stage" guided); if [ ${#improve[@]} -gt 0 ]; then readers+=(improve); fi
if [ ! -e "$out/stages/data.done" ] || { pending "${readers[@]}" && lacks_matrices "$out/data"; }; then
  data_matrices=1
fi
teacher_matrices=0
if [ "$extra" -gt 0 ] && { pending search || { pending "$evals_stage" && [ ! -d "$teacher_dir/matrices" ]; }; }; then
  teacher_matrices=1
fi
make_matrices() {
  if [ "$data_matrices" = 1 ]; then
    sparserl data build --out "$out/data" --families "$families" --per-family "$per_family" "${sizes[@]}" \
      "${data[@]}" --seed 0 --matrices-only ${real[@]+"${real[@]}"} || return 1
  fi
  if [ "$teacher_matrices" = 1 ]; then  # none repeats a structure of the data set's (a held-out one included);
    # all of them are searched, so no split (the same matrices as with the default fractions, without their warnings)
    sparserl data build --out "$teacher_dir" --families "$families" --per-family "$extra" "${teacher_sizes[@]}" \
      --size-draw "$teacher_draw" ${teacher_params[@]+"${teacher_params[@]}"} --seed 1 --matrices-only \
      --distinct-from "$out/data" --val-fraction 0 --test-fraction 0 || return 1
  fi
}
gen_pid=""  # the matrices are CPU work: generated while pre-training holds the GPU
pretrain_pid=""  # with two GPUs or more: pre-training on the first while the teacher's stages use the others
stop_background() {
  local p
  for p in $gen_pid $pretrain_pid; do pkill -P "$p" 2> /dev/null; kill "$p" 2> /dev/null; done
  true
}
trap stop_background EXIT
if [ "$data_matrices" = 1 ] || [ "$teacher_matrices" = 1 ]; then
  make_matrices > "$out/matrices.log" 2>&1 &
  gen_pid=$!
fi
model="$out/pretrain/model"
pretrain_stage() {
  stage pretrain sparserl pretrain --out "$out/pretrain" "${corpus[@]}" "${pretrain[@]}" "${device[@]}" \
    $(again "$out/pretrain/state.pt")
}
if [ -n "${BASE_MODEL:-}" ]; then  # a base model made before (any local HF checkpoint): no pre-training here
  model=$BASE_MODEL; echo "== pretrain: skipped, the base model is $model"
elif [ ${#gpu_ids[@]} -ge 2 ] && [ ! -e "$out/stages/pretrain.done" ]; then
  teacher_gpus=$(IFS=,; echo "${gpu_ids[*]:1}")
  echo "== pretrain: on GPU ${gpu_ids[0]} while the teacher's stages run on GPUs $teacher_gpus ($out/pretrain.log)"
  (export CUDA_VISIBLE_DEVICES=${gpu_ids[0]}; pretrain_stage) > "$out/pretrain.log" 2>&1 &
  pretrain_pid=$!
  all_gpus=${CUDA_VISIBLE_DEVICES-unset}
  export CUDA_VISIBLE_DEVICES=$teacher_gpus
else
  pretrain_stage
fi
if [ -n "$gen_pid" ]; then
  wait "$gen_pid" || { echo "error: generating the matrices failed: see $out/matrices.log" >&2; exit 1; }
  gen_pid=""; cat "$out/matrices.log"
  if [ -e "$out/stages/data.done" ] && lacks_matrices "$out/data"; then  # made again, but not the ones named
    echo "error: the matrices made again are not the ones $out/data's splits name: run with the settings the" \
      "run was made with ($out/settings.json lists its changes of the preset)" >&2
    exit 2
  fi
fi
stage data sparserl data build --out "$out/data" --families "$families" --per-family "$per_family" "${sizes[@]}" \
  "${data[@]}" --target near_fastest \
  --targets-per-matrix 6 --seed 0 --force "${compile[@]}" "${taught_data[@]}" ${real[@]+"${real[@]}"}
if [ -n "${SUITESPARSE:-}" ]; then  # the data set is the one made with these real matrices, with some held out
  "${PYTHON:-python}" -c "import json, sys
from pathlib import Path
data, real = Path(sys.argv[1]), sys.argv[2]
made = json.load(open(data / 'summary.json'))['config'].get('real_dir')
if made is None or Path(made).resolve() != Path(real).resolve():
    sys.exit(f'error: {data} was made with real matrices from {made}, not SUITESPARSE={real}: give a new OUT')
if not any(json.loads(line).get('family') == 'real' for line in open(data / 'test.jsonl') if line.strip()):
    sys.exit(f'error: no real matrix of SUITESPARSE={real} is in the test split of {data} (its fraction of them, '
             'rounded down, with a correct kernel): give more matrices')" "$out/data" "$SUITESPARSE" || exit 2
fi
split_matrices() {  # split_matrices SPLIT [N [generated]]: the split's matrices in file order, or N of them evenly
  # spaced; generated: none of the real ones (SUITESPARSE)
  "${PYTHON:-python}" -c "import json, sys
seen = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get('matrix') and not (sys.argv[3] == 'generated' and r.get('family') == 'real'):
        seen.setdefault(r['matrix'], None)
names, n = list(seen), int(sys.argv[2])
if 0 < n < len(names):
    names = [names[i * len(names) // n] for i in range(n)]
if not names:
    sys.exit('error: no matrix in ' + sys.argv[1])
print('\n'.join(names))" "$out/data/$1.jsonl" "${2:-0}" "${3:-all}"
}
matrices_of() {  # matrices_of SPLIT [N [generated]] into the array files, or stop with the reason
  local listed
  listed=$(split_matrices "$@") || exit 1
  mapfile -t files <<< "$listed"
}
search_train() {  # the train split's matrices, and the teacher's further ones (never a held-out matrix)
  matrices_of train
  if [ "$extra" -gt 0 ]; then files+=("$teacher_dir/matrices"); fi
  sparserl farm "${files[@]}" --store "$out/teacher.sqlite" --out "$out/farm" "${search[@]}" "${compile[@]}" \
    $(again "$out/farm/summary.json")
}
stage search search_train
export_teacher() {
  if [ ${#compile[@]} -gt 0 ]; then  # compile-only: nothing was timed, so the store holds no verified kernel
    : > "$out/teacher.jsonl"; echo "compile-only: no store rows"; return
  fi
  sparserl best export "$out/teacher.jsonl" --store "$out/teacher.sqlite" --per-matrix 3 --within 0.05 --refinements \
    "${taught_export[@]}"
}
stage export export_teacher
teach_siblings() {  # the teacher's specialised kernels on new matrices of their families, none held out
  sparserl data siblings "$out/teacher.jsonl" --out "$out/siblings" --per-row "$siblings" --distinct-from "$out/data" \
    --family-rows 1000000 --force
}
sibling_rows=()
if [ "$siblings" -gt 0 ]; then
  if [ -e "$out/stages/merge.done" ] && [ ! -e "$out/stages/siblings.done" ]; then  # its SFT set has none
    echo "error: SIBLINGS=$siblings for a run whose SFT set was merged without siblings: give another OUT" >&2; exit 2
  fi
  stage siblings teach_siblings; sibling_rows=("$out/siblings/siblings.jsonl")
fi
merge() {  # the SFT set: the library teacher's train rows, the store's and their siblings; validation and test as built
  mkdir -p "$out/sft-data"
  cat "$out/data/train.jsonl" "$out/teacher.jsonl" ${sibling_rows[@]+"${sibling_rows[@]}"} > "$out/sft-data/train.jsonl"
  cp "$out/data/val.jsonl" "$out/data/test.jsonl" "$out/sft-data/"
  local more=""; if [ ${#sibling_rows[@]} -gt 0 ]; then more=", $(cat "${sibling_rows[@]}" | wc -l) siblings"; fi
  echo "SFT rows: $(wc -l < "$out/data/train.jsonl") from the library, $(wc -l < "$out/teacher.jsonl") from the store$more"
}
stage merge merge
if [ -n "$pretrain_pid" ]; then  # the teacher is ready: SFT needs the base model, and every GPU again
  wait "$pretrain_pid" || { echo "error: pre-training failed: see $out/pretrain.log" >&2; exit 1; }
  pretrain_pid=""; cat "$out/pretrain.log"
  if [ "$all_gpus" = unset ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=$all_gpus; fi
fi
stage sft sparserl sft --data "$out/sft-data" --model "$model" --out "$out/sft" "${sft[@]}" \
  --save-every 100 ${snapshot_args[@]+"${snapshot_args[@]}"} "${device[@]}" "${compile[@]}" "${gen[@]}" \
  $(again "$out/sft/state.pt")
for n in ${snapshots[@]+"${snapshots[@]}"}; do  # a run whose SFT ended before SFT_SNAPSHOTS was given has none
  if [ ! -e "$out/sft/checkpoint-step$n/policy.json" ]; then
    echo "error: SFT_SNAPSHOTS=$n but $out/sft has no checkpoint-step$n (its SFT ran without it): give another OUT" >&2
    exit 2
  fi
done
if [ ${#improve[@]} -gt 0 ]; then  # the teacher knobs as measured; a kept round reaches 90% correct, or its start's share if lower
  stage improve sparserl improve --data "$out/data" --model "$out/sft/checkpoint" --out "$out/improve" \
    --store "$out/teacher.sqlite" "${improve[@]}" --sft-steps 30 --sft-lr 3e-5 --replay 3 --sft-batch-size 16 \
    --min-correct 0.9 --test-samples 0 --temperature "${IMPROVE_TEMPERATURE:-1.0}" "${gen[@]}" \
    $(again "$out/improve/state.json")
fi
policies=(-c base_sft="$out/sft/checkpoint"); final="$out/sft/checkpoint"
for n in ${snapshots[@]+"${snapshots[@]}"}; do policies+=(-c "sft_step$n=$out/sft/checkpoint-step$n"); done
if [ -d "$out/improve/best" ]; then  # a kept round: evaluated beside its SFT start, and it guides the search
  policies+=(-c improved="$out/improve/best"); final="$out/improve/best"
fi
temperature=${TEMPERATURE:-$policy_t}  # the policy's sampling temperature in the held-out sets and the guided search
case "${TEMPERATURES:-}" in
  "") ;;
  *,*)  # several: one is chosen for the final policy on 8 matrices of the validation split first
    choose_temperature() {
      "${PYTHON:-python}" "$(dirname "$0")/../benchmarks/heldout_eval.py" "$out/temperature" --data "$out/data" \
        --sets val --limit 8 --temperature "$TEMPERATURES" --samples "$samples" -c final="$final" \
        --baselines oracle "${evalgen[@]}" "${compile[@]}" "${gen[@]}" --resume
    }
    tstage=temperature; [ "$final" = "$out/improve/best" ] && tstage=temperature-improved  # chosen again for it
    stage "$tstage" choose_temperature
    chosen=$("${PYTHON:-python}" -c "import json, sys; c = json.load(open(sys.argv[1]))['chosen']; print('' if c is None else c)" \
      "$out/temperature/temperature.json")
    if [ -n "$chosen" ]; then temperature=$chosen; fi
    echo "== sampling temperature: $temperature (chosen on the validation split: $out/temperature/temperature.json)" ;;
  *) temperature=$TEMPERATURES ;;  # one: nothing to choose
esac
also=()  # SECOND_TEMPERATURE: the final policy again under NAME_tT, sampled at T on the same matrices
if [ -n "$second_t" ]; then
  final_name=base_sft; [ "$final" = "$out/improve/best" ] && final_name=improved
  policies+=(-c "${final_name}_t$second_t=$final"); also=(--system-temperature "${final_name}_t$second_t=$second_t")
fi
held_out() {  # every held-out set in one process: the policies opened once, one harness (OUT/eval-SET each)
  local sets; sets=$(IFS=,; echo "${eval_sets[*]}")
  local trained=(--distinct-from "$out/data")  # the families set shares no structure with a training matrix
  if [ -d "$teacher_dir/matrices" ]; then trained+=(--distinct-from "$teacher_dir"); fi
  if [ -d "$out/siblings/matrices" ]; then trained+=(--distinct-from "$out/siblings"); fi
  "${PYTHON:-python}" "$(dirname "$0")/../benchmarks/heldout_eval.py" "$out" --data "$out/data" --sets "$sets" \
    --family-rows 1000000 --samples "$samples" "${policies[@]}" --baselines cusparse,oracle "${evalgen[@]}" \
    --temperature "$temperature" ${also[@]+"${also[@]}"} "${compile[@]}" "${gen[@]}" "${trained[@]}" --resume
}
stage "$evals_stage" held_out  # another list of sets is a stage of its own (finished sets are kept)
guided_search() {  # the model guiding the search, against the search without it, on held-out test matrices
  matrices_of test "$guided_n" generated
  "${PYTHON:-python}" "$(dirname "$0")/../benchmarks/guided_search.py" "${files[@]}" --model "$final" \
    "${guided[@]}" ${text_arm[@]+"${text_arm[@]}"} ${headroom[@]+"${headroom[@]}"} --temperature "$temperature" "${device[@]}" "${compile[@]}" "${gen[@]}" \
    --out "$out/guided.json"
}
stage guided guided_search
echo "== stages (seconds):"; cat "$out/stages.tsv"
for set in "${eval_sets[@]}"; do echo "== held out: $set ($out/eval-$set/eval.md)"; head -80 "$out/eval-$set/eval.md"; done
echo "== the policy's targets ($out/targets.json)"
"${PYTHON:-python}" "$(dirname "$0")/../benchmarks/policy_targets.py" "$out" --preset "$preset" --out "$out/targets.json"
