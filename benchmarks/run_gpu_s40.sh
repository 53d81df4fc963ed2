#!/usr/bin/env bash
# Device calls on one GPU (session 40). Each part is what one call ran; the outputs are in
# benchmarks/results/s40/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s40.sh 1   # the issue's attention sweep at d256 (the six impls, 512 to 64k, causal and
#       full), the head dim session 39's sweep did not reach
#   (part 1, on an H200: call1/, 337 s)
#   bash benchmarks/run_gpu_s40.sh 2   # the same sweep at d64, full, 16k to 64k (where session 39's stopped)
#   (part 2, on an H200: call2/, 81 s)
#   bash benchmarks/run_gpu_s40.sh 3   # below 1k queries, the Gluon kernels against the portable ones that the
#       rules give those calls (ab_short_dense.py: 512 and 256 tokens; d128, d64, d256)
#   (part 3, on an H200: call3/; an earlier try with 128 tokens too stopped at a failed graph capture)
#   bash benchmarks/run_gpu_s40.sh 4   # the Gluon kernels from 256 queries (d64's dK/dV from 1k): the GPU tests of the
#       dense Hopper forward and backward, packed QKV and dense kernel files (the slow portable-autotune test beside)
#   (part 4, on an H200: call4/, 272 passed and the slow test passed)
#   bash benchmarks/run_gpu_s40.sh 5   # the sweep's 512-token rows on that rule (six impls, d128, d64, d256)
#   (part 5, on an H200: call5/; run as the same command typed into the call)
source "$(dirname "$0")/gpu_call.sh"
machine_info
sweep() {  # sweep SECONDS NAME bench_attention ARGS...: the six impls, rows written as they come
  local secs=$1 name=$2
  shift 2
  timeout "$secs" python benchmarks/bench_attention.py "$@" \
    --impls eager sdpa_flash sdpa_cudnn sdpa_mem_eff flex triton --out "$R/$name.json" 2>&1 | quiet \
    | grep "^|" | tail -n 40
}
case "$1" in
1)
  sweep 570 attention_sweep_d256 --headdims 256
  ;;
2)
  sweep 400 attention_sweep_d64_full --headdims 64 --causal full --seqlens 16384 32768 65536
  ;;
3)
  timeout 480 python benchmarks/ab_short_dense.py --seqlens 512 256 --out "$R/ab_short_dense.json" 2>&1 | quiet | tail -n 30
  ;;
4)
  T=tests/kernels
  gpu_tests_beside_slow 470 470 6 $T/test_flash_fwd_hopper.py $T/test_flash_bwd_hopper.py $T/test_qkvpacked.py \
    $T/test_flash_attention.py
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" "$R/gpu_tests_slow_portable.log" | head -n 20
  ;;
5)
  sweep 280 attention_sweep_512 --seqlens 512 --headdims 128 64 256
  ;;
esac
