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

run 240 python -m pytest -q -m gpu tests/distributed/test_data_parallel.py | tail -40 | tee "$OUT/dp_gpu_tests.log"
if [ "${SKIP_RING:-0}" != 1 ]; then
  run 120 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/check_ring_precision.py \
      --out "$OUT/ring_precision_x$NGPU.json" | tee "$OUT/ring_precision.log"
  run 180 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --tokens-per-rank 8192 32768 \
      --nheads 16 --out "$OUT/ring_x$NGPU.json" | tee "$OUT/bench_ring.log"
  # the masks whose ring steps run through the varlen / block-sparse kernels or kernel dropout
  run 150 torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py --tokens-per-rank 32768 \
      --nheads 16 --mask docs butterfly dropout --modes zigzag ulysses --out "$OUT/ring_masks_x$NGPU.json" \
      | tee "$OUT/bench_ring_masks.log"
fi
run 150 python benchmarks/bench_scaling.py --gpus 1 "$NGPU" --strategies ddp fsdp --fit-models --steps 5 \
    --out "$OUT/scaling.json" | tee "$OUT/bench_scaling.log"

# Which kernels SDPA's cuDNN backend request really runs, compiled and eager (one GPU).
run 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls sdpa_cudnn,sdpa_flash \
    --steps 5 --out "$OUT/train_cudnn_check_compiled.json" | tail -4 | tee "$OUT/cudnn_check.log"
run 100 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls sdpa_cudnn --no-compile \
    --steps 5 --out "$OUT/train_cudnn_check_eager.json" | tail -3 | tee -a "$OUT/cudnn_check.log"
