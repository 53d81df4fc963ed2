#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): the largest GPT each data-parallel strategy trains on
# 4 GPUs at 4k context, one sequence per GPU, bf16 (bench_scaling.py --fit-only: ascending sizes from
# GPT-2 medium to GPT-3 13B, one warm-up and one timed step each, stopping at the first that fails).
# FSDP and DeepSpeed ZeRO-3 shard the optimizer state, so they go furthest; they run first.
#   source .whl/install.sh && bash benchmarks/run_gpu_x4_fit.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
fit() {  # $1: name, then extra bench_scaling arguments
  local name=$1
  shift
  timeout "${EACH_S:-170}" python benchmarks/bench_scaling.py --gpus 4 --fit-only --timeout 150 \
    --out "$R/fit_$name.json" "$@" 2>&1 | quiet | tee "$R/fit_$name.log"
}
fit fsdp --strategies fsdp
fit zero3 --strategies deepspeed --zero-stage 3
fit ddp --strategies ddp
tail -n 2 "$R"/fit_*.log
