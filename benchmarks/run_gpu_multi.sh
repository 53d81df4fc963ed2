#!/usr/bin/env bash
# One call on a several-GPU machine (through `device`): data-parallel strategies under NCCL + bf16 against
# one GPU, ring attention's bf16 error against ring size, the ring/Ulysses benchmark, and scaling.
#   source .whl/install.sh && bash benchmarks/run_gpu_multi.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
NGPU=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvidia-smi topo -m; } | tee "$OUT/gpu.txt"
run() { timeout "$1" "${@:2}" 2>&1 | grep -v -e Warning -e warn; }

run 240 python -m pytest -q -m gpu tests/distributed/test_data_parallel.py | tail -20 | tee "$OUT/dp_gpu_tests.log"
run 120 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/check_ring_precision.py \
    --out "$OUT/ring_precision_x$NGPU.json" | tee "$OUT/ring_precision.log"
run 180 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --tokens-per-rank 8192 32768 \
    --nheads 16 --out "$OUT/ring_x$NGPU.json" | tee "$OUT/bench_ring.log"
run 150 python benchmarks/bench_scaling.py --gpus 1 "$NGPU" --strategies ddp fsdp --fit-models --steps 5 \
    --out "$OUT/scaling.json" | tee "$OUT/bench_scaling.log"
