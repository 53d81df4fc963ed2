#!/usr/bin/env bash
# One call on nvidia-h200-x2 or -x4 (through `device`): zigzag ring attention at 8k and 32k tokens per
# GPU (causal, d128, 16 heads, bf16) under the communication options of bench_ring.py, in one call so
# they compare on one machine: one communicator on default streams (twice: the first run also warms the
# machine), NCCL on high-priority streams (bench_ring's default on CUDA since 2026-11-23), and that plus
# the backward's dK/dV on a second communicator. Lands in
# $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_ring_streams.sh
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
ring one_group --modes zigzag torch_cp --no-high-priority
ring high_priority --high-priority
ring high_priority_grad_group --high-priority --grad-group
ring one_group_again --no-high-priority
