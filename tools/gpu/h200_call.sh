#!/usr/bin/env bash
# One GPU call of several named steps, each under its own time limit, most important first;
# results and logs go to $OUT/results.tgz and a summary is printed last.
#   STEPS="bench lessons04_06 tests" BUDGET=560 COMMIT=<tree> bash tools/gpu/h200_call.sh
#   REQUIRE=H200 ...: stop at once (exit 3) on a card whose name lacks it
# Steps: bench (ladder + GEMM ladder + batch sweep, Triton beside), lessons04_06 (measure),
# profile (ncu), call_time, census (ResNet-18, into the stored lessons12_13 file),
# tests (GPU-marked tests of the kernels, Triton, speed grading), calibrate (grade --gpu of
# the speed-task solutions), notebooks (04-07, 13 on the GPU), resnet50 (every distinct
# ResNet-50 layer at batch 32, 1, 128, for what remains of the budget), tensor_cores (the
# mma.sync / wgmma ladder of lesson 12, about 2 minutes), resnet50_cuda (every layer with the
# CUDA C kernels: implicit GEMM, im2col + GEMM, Winograd; about 170 s), wide_loads (the
# Numba GEMM ladder with gemm05_wide_loads' tiles beside cuBLAS, about 150 s), memory_bound
# (the filter and both depthwise layers against the copy, up to 4 minutes with the window
# kernels' compiles), memory_tests (the GPU tests of those kernels), depthwise_block
# (lesson 11's MobileNet block, inputs rotating past the L2, and lesson 10's copy/kernel
# overlap with the pageable copy alone, into the stored lessons10_11 file),
# precisions (lesson 12's library tables at each precision, launches queued, and the 12x check),
# flat_tests (the launchers on device arrays whose unit axes have stride 0).
set -u
# the commit every stored result names: the caller's (the machine's git copy can be stale)
: "${COMMIT:?set COMMIT to the commit of the tree this call runs (git rev-parse --short HEAD)}"
export COMMIT
OUT=${OUT:-/tmp/convlab_out}
W=/tmp/convlab_session
mkdir -p "$OUT" "$W/res" "$W/logs"
# REQUIRE=H200: a call that only an H200 can settle stops here on any other card (seconds,
# not the steps' minutes of device time)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n1)
if [ -n "${REQUIRE:-}" ] && ! echo "$card" | grep -q "$REQUIRE"; then
  echo "not a $REQUIRE: $card; no step run"; exit 3
fi
. tools/device_env.sh
# results are named after the card that measured them (h200_*, h100_*): a run on an H100
# must not land in a file the lessons read as the H200's, nor join one
P=$(CARD="$card" python3 -c 'import os; from convlab.measure.harness import card_prefix
print(card_prefix(os.environ["CARD"]))') || { echo "no results prefix for: $card"; exit 2; }
T0=$(date +%s)
SUMMARY=""
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local l=$(left)
  if [ "$l" -lt 20 ]; then SUMMARY="$SUMMARY\n$name: skipped (budget)"; return; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local s=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@" > "$W/logs/$name.log" 2>&1
  local rc=$?
  SUMMARY="$SUMMARY\n$name: rc=$rc $(( $(date +%s) - s ))s"
  tail -n "${TAIL:-25}" "$W/logs/$name.log"
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import numba, numba_cuda, cupy, torch, triton; print('numba', numba.__version__,
'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__,
'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"; } \
  > "$W/logs/environment.txt" 2>&1
cat "$W/logs/environment.txt"
for s in ${STEPS:-bench lessons04_06 tests}; do
  case $s in
    bench) TAIL=80 step bench 330 python3 -m convlab bench --out "$W/res/bench" --repeat 12 ;;
    lessons04_06) step lessons04_06 150 python3 -m convlab measure lessons04_06 --prefix $P \
                    --out "$W/res" --budget 100 ;;
    profile) step profile 100 python3 -m convlab profile --out "$W/res" --timeout 95 ;;
    call_time) step call_time 60 python3 -m convlab measure call_time --out "$W/res" --prefix $P ;;
    census) cp convlab/results/${P}_lessons12_13.json "$W/res/" 2>/dev/null  # the census joins it
            step census 70 python3 -m convlab measure lessons12_13 --only census --prefix $P \
              --out "$W/res" ;;
    triton_tests) TAIL=8 step triton_tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider \
                    tests/test_triton.py ;;
    tests) TAIL=30 step tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton.py \
             tests/test_grading_speed.py tests/test_kernels_fast.py tests/test_bench.py \
             tests/test_wmma.py tests/test_winograd_cuda.py tests/test_im2col_cuda.py ;;
    calibrate) for n in 06_shared_memory_tiling 07_register_blocking 08_implicit_gemm 09_last_mile; do
                 TAIL=14 step "grade_$n" 150 python3 -m convlab grade "solutions/$n.ipynb" \
                   --instructor "solutions/$n.ipynb" --gpu --out "$W/res/grade_$n.json"; done ;;
    notebooks) TAIL=12 step notebooks 560 python3 -m convlab measure notebooks \
                 notebooks/04_*.ipynb notebooks/05_*.ipynb notebooks/06_*.ipynb \
                 notebooks/07_*.ipynb notebooks/13_*.ipynb --out "$W/res/nb" --timeout 240 ;;
    resnet50) TAIL=40 step resnet50 560 python3 -m convlab bench --layers resnet50 \
                --out "$W/res/r50" --repeat 8 --budget $(( $(left) - 60 )) ;;
    tensor_cores) TAIL=20 step tensor_cores 200 python3 -m convlab measure tensor_cores \
                    --prefix $P --out "$W/res" ;;
    resnet50_cuda) TAIL=20 step resnet50_cuda 300 env OUT="$W/res" python3 \
                     tools/gpu/resnet50_kernels.py 32,1,128 \
                     implicit_gemm_cuda,im2col_cuda,im2col_fused_cuda,winograd_f2_cuda,winograd_f4_cuda ;;
    wide_loads) TAIL=30 step wide_loads 240 env OUT="$W/res" ROUNDS=2 python3 \
                  tools/gpu/sgemm_wide_loads.py 4096 ;;
    memory_bound) TAIL=70 step memory_bound 240 env OUT="$W/res" python3 \
                    tools/gpu/memory_bound.py ;;
    precisions) cp convlab/results/${P}_lessons12_13.json "$W/res/" 2>/dev/null  # joins it
                TAIL=20 step precisions 240 python3 -m convlab measure lessons12_13 \
                  --only wmma_gemm,wmma_conv,throughput_ratio --prefix $P --out "$W/res" ;;
    depthwise_block) cp convlab/results/${P}_lessons10_11.json "$W/res/" 2>/dev/null  # joins it
                     TAIL=10 step depthwise_block 90 python3 -m convlab measure lessons10_11 \
                       --only l11_depthwise_block,l10_streams --prefix $P --out "$W/res" ;;
    memory_tests) TAIL=8 step memory_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
                    tests/test_depthwise_window_cuda.py tests/test_depthwise_window.py \
                    tests/test_depthwise_cuda.py \
                    tests/test_depthwise_strips_cuda.py tests/test_filter_cuda.py ;;
    flat_tests) TAIL=8 step flat_tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider \
                  tests/test_kernels_fast.py -k "flat or zero_stride" ;;
  esac
done
tar -czf "$OUT/results.tgz" -C "$W" res logs
echo -e "\n== summary (total $(( $(date +%s) - T0 ))s)$SUMMARY"
