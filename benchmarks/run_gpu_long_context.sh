#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): the long-context demo, GPT-2 small trained a few steps at
# 256k, 512k and 1M tokens of context with the sequence split over 4 GPUs (ring, zigzag), step time and
# peak memory per context; then the longest context on 1 and 2 GPUs if time is left.
#   source .whl/install.sh && bash benchmarks/run_gpu_long_context.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
timeout 400 python benchmarks/bench_long_context.py --gpus 4 --contexts 262144 524288 1048576 --steps 2 \
    --out "$OUT/long_context_x4.json" 2>&1 | grep -v -e Warning -e warn | tee "$OUT/long_context_x4.log"
timeout 180 python benchmarks/bench_long_context.py --gpus 1 2 --contexts 65536 131072 262144 524288 --steps 2 \
    --timeout 120 --out "$OUT/long_context_x1_x2.json" 2>&1 | grep -v -e Warning -e warn \
    | tee "$OUT/long_context_x1_x2.log"
