#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): the long-context demo, GPT-2 small trained at 256k and
# 1M tokens of context with the sequence split over 4 GPUs (ring, zigzag), step time and peak memory;
# then, side by side on separate GPUs, the longest context 1 GPU (GPU 0) and 2 GPUs (GPUs 2, 3) train
# in what time is left. One warm-up step (autotuning) and STEPS timed steps per run. Everything lands in
# $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_long_context.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
STEPS=${STEPS:-2}
long() { python benchmarks/bench_long_context.py --steps "$STEPS" --warmup 1 "$@" 2>&1 | quiet; }

long --gpus 4 --contexts ${CONTEXTS_X4:-262144 1048576} --timeout "${TIMEOUT_X4:-330}" \
  --out "$R/long_context_x4.json" | tee "$R/long_context_x4.log"
left=$(( ${BUDGET_S:-570} - SECONDS - 10 ))
if [ "$left" -gt 60 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout "$left" bash -c "$(declare -f long quiet); STEPS=$STEPS long --gpus 1 \
    --contexts 131072 262144 524288 --timeout $left --run-root /tmp/long1 --out $R/long_context_x1.json" \
    > "$R/long_context_x1.log" &
  CUDA_VISIBLE_DEVICES=2,3 timeout "$left" bash -c "$(declare -f long quiet); STEPS=$STEPS long --gpus 2 \
    --contexts 262144 524288 1048576 --timeout $left --run-root /tmp/long2 --out $R/long_context_x2.json" \
    > "$R/long_context_x2.log" &
  wait
fi
tail -n 12 "$R"/long_context_x*.log
