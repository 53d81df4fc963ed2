#!/usr/bin/env bash
# Device calls on one GPU (session 40). Each part is what one call ran; the outputs are in
# benchmarks/results/s40/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s40.sh 1   # the issue's attention sweep at d256 (the six impls, 512 to 64k, causal and
#       full), the head dim session 39's sweep did not reach
#   bash benchmarks/run_gpu_s40.sh 2   # the same sweep at d64, full, 16k to 64k (where session 39's stopped)
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
esac
