#!/usr/bin/env bash
# One call on nvidia-h200-x2 or -x4 (through `device`) after a change to the ring's schedules: the ring's
# precision against an fp32 one-GPU reference (exits non-zero past the one-GPU kernel's error; 240 s: in
# a cold call it once produced nothing inside 120 s), then
# zigzag at 8k and 32k tokens per GPU (causal, d128, 16 heads, bf16), twice, the first profiled with its
# timeline. Lands in $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_ring_steps.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
NGPU=$(nvidia-smi -L | wc -l)
timeout 240 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/check_ring_precision.py \
  --out "$R/ring_precision.json" 2>&1 | quiet > "$R/ring_precision.log"
echo "ring precision exit ${PIPESTATUS[0]}"; grep "'impl'" "$R/ring_precision.log"
mkdir -p "$R/prof"
for run in 1 2; do
  prof=(); [ "$run" = 1 ] && prof=(--profile "$R/prof" --trace)
  timeout 120 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --tokens-per-rank 8192 32768 \
    --nheads 16 --modes zigzag --out "$R/ring_zigzag_$run.json" "${prof[@]}" 2>&1 | quiet | grep tok/rank
done
