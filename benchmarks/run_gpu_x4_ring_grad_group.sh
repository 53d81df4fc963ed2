#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): zigzag ring attention at 8k and 32k tokens per GPU
# (causal, d128, 16 heads, bf16), with the backward's dK/dV on the K/V communicator and on a second one
# (bench_ring.py --grad-group), in one call so the two compare on one machine. Lands in $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_x4_ring_grad_group.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
NGPU=$(nvidia-smi -L | wc -l)
ring() {  # $1: name, then extra bench_ring arguments
  local name=$1
  shift
  timeout "${EACH_S:-150}" torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py \
    --tokens-per-rank 8192 32768 --nheads 16 --modes zigzag --out "$R/ring_$name.json" "$@" 2>&1 | quiet \
    | tee "$R/ring_$name.log"
}
ring one_group
ring grad_group --grad-group
ring one_group_again  # the first of three runs also warms the machine: a repeat shows the spread
