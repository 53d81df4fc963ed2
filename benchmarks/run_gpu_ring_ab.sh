#!/usr/bin/env bash
# One call on nvidia-h200-x2 or -x4 (through `device`): the ring against an earlier checkout of it, in
# alternating runs on the same machine (zigzag, 8k and 32k tokens per GPU, causal, d128, 16 heads, bf16;
# bench_ring times every row isolated and back to back). First the ring's precision against an fp32
# one-GPU reference (this checkout), then: this checkout profiled (timeline at 8k, then at 32k), and
# RUNS (default 2) unprofiled pairs, this checkout then $BEFORE (its flashtrain/ and kernels/, this
# bench_ring.py). Lands in $OUT/results.tgz.
#   source .whl/install.sh && BEFORE=.carry/before bash benchmarks/run_gpu_ring_ab.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
NGPU=$(nvidia-smi -L | wc -l)
BEFORE=$(realpath "${BEFORE:?set BEFORE to the earlier checkout}")
cp benchmarks/bench_ring.py "$BEFORE/benchmarks/"
timeout 240 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/check_ring_precision.py \
  --out "$R/ring_precision.json" 2>&1 | quiet > "$R/ring_precision.log"
echo "ring precision exit ${PIPESTATUS[0]}"; grep "'impl'" "$R/ring_precision.log"
ring() {  # ring NAME DIR TOKENS... [-- extra bench_ring options]
  local name=$1 dir=$2
  shift 2
  echo "== $name $(date -u +%T)" | tee -a "$R/times.txt"
  (cd "$dir" && timeout 150 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --nheads 16 \
    --modes zigzag --out "$R/ring_$name.json" "$@" 2>&1 | quiet | grep tok/rank | tee "$R/ring_$name.log")
}
HERE=$(pwd)
mkdir -p "$R/prof8k" "$R/prof32k"
ring profiled_8k "$HERE" --tokens-per-rank 8192 --profile "$R/prof8k" --trace
ring profiled_32k "$HERE" --tokens-per-rank 32768 --profile "$R/prof32k" --trace
for i in $(seq "${RUNS:-2}"); do
  ring "after_$i" "$HERE" --tokens-per-rank 8192 32768
  ring "before_$i" "$BEFORE" --tokens-per-rank 8192 32768
done
echo "== end $(date -u +%T)" >> "$R/times.txt"
