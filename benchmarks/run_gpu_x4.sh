#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): data-parallel scaling on 1, 2 and 4 GPUs (DDP, FSDP2,
# DeepSpeed ZeRO-2) and the ring/Ulysses/hybrid/context-parallel benchmark on 4 GPUs, each with profile
# tables of where a step's time goes. Everything lands in $OUT/results.tgz (one file: $OUT brings back few).
#   source .whl/install.sh && bash benchmarks/run_gpu_x4.sh
source "$(dirname "$0")/gpu_call.sh"
NGPU=$(nvidia-smi -L | wc -l)
machine_info

if [ "${SKIP_SCALING:-0}" != 1 ]; then
  timeout "${SCALING_S:-330}" python benchmarks/bench_scaling.py --gpus 1 2 "$NGPU" --fit-models --timeout 150 \
    --profile "$R" --out "$R/scaling_h200.json" 2>&1 | quiet | tee "$R/scaling.log"
fi
if [ "${SKIP_RING:-0}" != 1 ]; then
  timeout "${RING_S:-200}" torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py \
    --tokens-per-rank 8192 32768 --nheads 16 --profile "$R" --profile-modes zigzag contiguous \
    --out "$R/ring_h200_x$NGPU.json" 2>&1 | quiet | tee "$R/ring.log"
fi
