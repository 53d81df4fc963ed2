#!/usr/bin/env bash
# One call on nvidia-h200-x2 (through `device`) for the ring backward that runs each step's dq kernel
# after sending the step's dK/dV on: the ring's precision against an fp32 one-GPU reference, the ring's
# local routes and fused step kernels on CUDA, then zigzag at 8k and 32k tokens per GPU (causal, d128,
# 16 heads, bf16), twice, the first profiled with its timeline. Lands in $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_x2_ring_dq_after_send.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
timeout 120 torchrun --standalone --nproc-per-node 2 benchmarks/check_ring_precision.py \
  --out "$R/ring_precision.json" 2>&1 | quiet > "$R/ring_precision.log"
echo "ring precision exit ${PIPESTATUS[0]}"; tail -n 4 "$R/ring_precision.log"
cuda_tests 200 - 0 1
tail -n 2 "$R/local_attention_cuda_tests.log" "$R/step_accumulate_cuda_tests.log"
mkdir -p "$R/prof"
for run in 1 2; do
  prof=(); [ "$run" = 1 ] && prof=(--profile "$R/prof" --trace)
  timeout 120 torchrun --standalone --nproc-per-node 2 benchmarks/bench_ring.py --tokens-per-rank 8192 32768 \
    --nheads 16 --modes zigzag --out "$R/ring_zigzag_$run.json" "${prof[@]}" 2>&1 | quiet | grep tok/rank
done
