#!/usr/bin/env bash
# The GPU part of "done" for a harness change, in one command on the GPU machine: the gpu-marked
# tests (the adversarial suite through the real worker pool among them), every reference-library
# variant through the harness's verification (benchmarks/library_check.py), and the timing floor
# with the cost of checked timed runs (benchmarks/timing_floor.py). Logs and JSON go to OUT_DIR.
#
#   bash scripts/gpu_checks.sh OUT_DIR [SUITESPARSE_DIR]
set -uo pipefail
out=${1:?usage: scripts/gpu_checks.sh OUT_DIR [SUITESPARSE_DIR]}
ss=${2:-}
mkdir -p "$out"
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
status=0
python -m pytest -m gpu tests -q -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" || status=1
python benchmarks/library_check.py --out "$out/library_check.json" ${ss:+--suitesparse "$ss"} 2>&1 \
    | grep -v " done$" | tee "$out/library_check.log" || status=1
python benchmarks/timing_floor.py --out "$out/timing_floor.json" 2>&1 | tee "$out/timing_floor.log" || status=1
exit $status
