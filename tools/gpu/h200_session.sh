#!/usr/bin/env bash
# The course's GPU measurements in one call on a bare H200 (no network), most important
# first, each under its own time limit; everything it stores goes to $OUT/results.tgz
# (stored results and logs of $W), and a short summary is printed last.
#   OUT=/tmp/out bash tools/gpu/h200_session.sh
set -u
OUT=${OUT:-/tmp/convlab_out}
W=/tmp/convlab_session  # results and logs; only results.tgz goes to $OUT
mkdir -p "$OUT" "$W/res" "$W/logs"
. tools/device_env.sh
cp convlab/results/h200_lessons12_13.json "$W/res/" 2>/dev/null || true
T0=$(date +%s)
SUMMARY=""

step() {  # step NAME SECONDS COMMAND...: run it, keep its log, note rc and seconds
  local name=$1 limit=$2; shift 2
  local left=$(( ${BUDGET:-560} - ($(date +%s) - T0) ))
  if [ "$left" -lt 20 ]; then SUMMARY="$SUMMARY\n$name: skipped (budget)"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local s=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@" > "$W/logs/$name.log" 2>&1
  local rc=$?
  SUMMARY="$SUMMARY\n$name: rc=$rc $(( $(date +%s) - s ))s"
  tail -n "${TAIL:-25}" "$W/logs/$name.log"
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import numba, numba_cuda, cupy, torch; print('numba', numba.__version__,
'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__,
'cudnn', torch.backends.cudnn.version())"; git log -1 --format=%H 2>/dev/null; } \
  > "$W/logs/environment.txt" 2>&1
TAIL=70 step bench 290 python3 -m convlab bench --out "$W/res/bench" --repeat 12
step profile 100 python3 -m convlab profile --out "$W/res" --timeout 95
step call_time 60 python3 -m convlab measure call_time --out "$W/res" --prefix h200
step census 70 python3 -m convlab measure lessons12_13 --only census --prefix h200 --out "$W/res"
step grade_speed 100 python3 -m pytest -q -m gpu tests/test_grading_speed.py -k "harness or solution or slow"
step gpu_tests 120 python3 -m pytest -q -m gpu tests/test_profile.py tests/test_census.py \
  tests/test_call_time.py tests/test_bench.py tests/test_kernels_fast.py

tar -czf "$OUT/results.tgz" -C "$W" res logs
echo -e "\n== summary (total $(( $(date +%s) - T0 ))s)$SUMMARY"
