#!/usr/bin/env bash
# One call on a several-GPU machine (through `device`): the data-parallel and sequence-parallel GPU tests
# (NCCL, bf16) beside the ring's bf16 error against ring size for every mask route (dense, packed
# documents, butterfly block-sparse, dropout); then the ring/Ulysses/context-parallel benchmark.
#   source .whl/install.sh && bash benchmarks/run_gpu_multi.sh     (SKIP_TESTS=1: benchmarks and checks only)
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
NGPU=$(nvidia-smi -L | wc -l)
# $OUT brings back 8 files: the tests' log, 4 precision JSONs and their log, 2 benchmark JSONs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvidia-smi topo -m
quiet() { grep -v -e Warning -e warn -e '^W1' -e '\*\*\*\*'; }

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 280 python -m pytest -q -m gpu tests/distributed/test_data_parallel.py -rA > "$OUT/dp_sp_gpu_tests.log" 2>&1 &
fi
for mask in none docs butterfly dropout; do
  # dropout's fp32 reference draws the whole seqlen^2 mask per head through the torch Philox twin: 2k tokens
  seqlen=$([ "$mask" = dropout ] && echo 2048 || echo 8192)
  timeout 75 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/check_ring_precision.py --mask "$mask" \
    --seqlen "$seqlen" --out "$OUT/ring_precision_${mask}_x$NGPU.json" 2>&1 | quiet | tee -a "$OUT/ring_precision.log"
done
wait
[ -f "$OUT/dp_sp_gpu_tests.log" ] && grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$OUT/dp_sp_gpu_tests.log" | tail -8
timeout 150 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --tokens-per-rank 8192 32768 \
  --nheads 16 --out "$OUT/ring_x$NGPU.json" 2>&1 | quiet
timeout 120 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --tokens-per-rank 32768 \
  --nheads 16 --mask docs butterfly dropout --modes zigzag ulysses --out "$OUT/ring_masks_x$NGPU.json" 2>&1 \
  | quiet
