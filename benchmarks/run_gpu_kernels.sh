#!/usr/bin/env bash
# One device call (nvidia-h200): the kernel GPU tests (bf16; pytest-xdist, since the autotuners' compiles
# dominate) and the ring's local-attention routes on CUDA, a per-config scan of the dropout kernels at d128,
# then dropout's cost against SDPA's (d64, d128; 4k and 16k; causal).
#   source .whl/install.sh && bash benchmarks/run_gpu_kernels.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
if [ "${SKIP_KERNEL_TESTS:-0}" != 1 ]; then
  timeout 200 python -m pytest -q -n 4 -m gpu tests/kernels -rf > "$OUT/kernel_gpu_tests.log" 2>&1 &
fi
timeout 200 python -m pytest -q -n 6 tests/distributed/test_local_attention.py -rf > "$OUT/local_attention_cuda_tests.log" 2>&1
wait
tail -3 "$OUT"/*tests.log
timeout 150 python benchmarks/check_kernel_configs.py --batch 2 --seqlen 4096 --nheads 16 --headdim 128 \
  --causal --dropout 0.1 --others fwd=0,dkdv=1,dq=1 --jobs 4 --out "$OUT/dropout_config_scan_d128.json" 2>&1 | tail -21
timeout 200 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 64 128 --causal causal \
  --impls triton triton_dropout sdpa_flash sdpa_flash_dropout --out "$OUT/attention_dropout.json" 2>&1 | tail -12
