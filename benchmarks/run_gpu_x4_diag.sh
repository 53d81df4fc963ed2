#!/usr/bin/env bash
# One call on nvidia-h200-x4 that checks the fix of the sequence-parallel checkpointing bug and trains
# long contexts. Phase 1, side by side: GPUs 0,1: the gradients of one sp=2 step (ring, GPT-2 small,
# rotary, activation checkpointing, chunked loss)
# at 64k tokens
# against one GPU (`check_sp_gradients.py`), then sp=2 training at 64k-262k tokens; GPU 2: the fused ring-step kernel
# tests; GPU 3: the ring's local-attention routes on CUDA. Phase 2: sp=4 training at 524k and 1M tokens.
# Results in $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_x4_diag.sh
source "$(dirname "$0")/gpu_call.sh"
P1=${PHASE1_S:-230}
P2=${PHASE2_S:-300}
machine_info
grads() {  # grads CONTEXT OUT
  timeout 100 torchrun --standalone --nproc-per-node 2 benchmarks/check_sp_gradients.py --context "$1" --out "$2" \
    --variants sp,sp_no_ac 2>&1 | quiet
}
long() { python benchmarks/bench_long_context.py --steps 1 --warmup 1 "$@" 2>&1 | quiet; }
(
  export CUDA_VISIBLE_DEVICES=0,1
  grads 65536 "$R/sp_gradients_64k.json" > "$R/sp_gradients_64k.log"
  long --gpus 2 --contexts 65536 131072 262144 --timeout 75 --run-root /tmp/l2 --out "$R/long_context_sp2.json" \
    > "$R/long_context_sp2.log"
) &
P1_PID=$!
cuda_tests "$P1" - 3 2 &
TESTS=$!
( sleep "$P1"; kill -- -$P1_PID 2>/dev/null; pkill -f bench_long_context ) &
wait $P1_PID $TESTS
long --gpus 4 --contexts 524288 1048576 --timeout $((P2 - 60)) --run-root /tmp/l4 --out "$R/long_context_sp4.json" \
  > "$R/long_context_sp4.log"
cut -c1-600 "$R"/sp_gradients_*.log | grep variant; tail -n 6 "$R"/long_context_sp*.log
tail -n 4 "$R"/*cuda_tests.log
