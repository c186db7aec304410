#!/bin/bash
# The GPU measurements of this folder, runs 1 and 2. usage: bash run.sh RUN DEADLINE_S   (RUN = 1 or 2)
# env for a CPU dry run: DRY=1 (adds --compile-only, tiny sizes)
set -u
export PYTHONPATH=src:. PYTHONUNBUFFERED=1
CALL=$1; D=$2
left() { echo $(( D - SECONDS )); }
SIX=diagonal_4M,banded9_4M,stencil2d_4M,stencil3d7_4M,block8_1M,rectangular_1Mx2M
S27=stencil3d27_4M
TS_X=""; SB_X=""
if [ "${DRY:-0}" = 1 ]; then
  SIX=diagonal_40k,banded9_40k,stencil2d_40k,stencil3d7_40k,block8_10k,rectangular_10kx20k; S27=stencil3d27_40k
  TS_X="--rows 20000 --compile-only"; SB_X="--rows 20000 --compile-only"
fi
echo "run $CALL start, deadline ${D}s"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
s27() {
  if [ "$(left)" -lt 60 ]; then echo "skip $S27 (left $(left)s)"; return; fi
  echo "== templates_speed $S27 at ${SECONDS}s"
  timeout -s INT -k 15 $(( $(left) - 5 )) python benchmarks/templates_speed.py --only $S27 $TS_X --out $OUT/templates_speed_s3d27.json > $OUT/templates_speed_s3d27.log 2>&1
  echo "rc=$? at ${SECONDS}s"
}
sb() {
  if [ "$(left)" -lt 30 ]; then echo "skip search_bench (left $(left)s)"; return; fi
  echo "== search_bench families at ${SECONDS}s"
  [ -f runs/search_bench.json ] && cp runs/search_bench.json $OUT/search_bench.json
  timeout -s INT -k 10 $(( $(left) - 3 )) python benchmarks/search_bench.py --budget 64 --seconds 40 --resume $SB_X --out $OUT/search_bench.json > $OUT/search_bench_call$CALL.log 2>&1
  echo "rc=$? at ${SECONDS}s"
}
if [ "$CALL" = 1 ]; then
  echo "== pytest at ${SECONDS}s"
  if [ "${DRY:-0}" = 1 ]; then PT="--collect-only"; else PT=""; fi
  timeout -s INT -k 10 300 python -m pytest -m gpu tests -q -p no:cacheprovider -x $PT > /tmp/pytest.log 2>&1
  echo "pytest rc=$? at ${SECONDS}s"; tail -60 /tmp/pytest.log > $OUT/gpu_tests.log
  echo "== templates_speed six at ${SECONDS}s"
  timeout -s INT -k 15 $(( $(left) - 5 )) python benchmarks/templates_speed.py --only $SIX $TS_X --out $OUT/templates_speed.json > $OUT/templates_speed.log 2>&1
  echo "rc=$? at ${SECONDS}s"
  if [ "$(left)" -ge 260 ]; then s27; fi
  sb
else
  [ -f runs/templates_speed_s3d27.json ] && grep -q '"cusparse_us"' runs/templates_speed_s3d27.json || s27
  sb
fi
echo "run $CALL end at ${SECONDS}s"; ls -la $OUT
