#!/usr/bin/env bash
# One device call (nvidia-h200): the kernel GPU tests and the ring's local-attention routes on CUDA (bf16,
# pytest-xdist: the autotuners' compiles dominate and run in parallel), a per-config scan of the dropout
# shape that faulted ("misaligned address") inside an autotune sweep, then dropout's cost against SDPA's.
#   source .whl/install.sh && bash benchmarks/run_gpu_kernels.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
timeout 330 python -m pytest -q -n 6 -m gpu tests/kernels -rA > "$OUT/kernel_gpu_tests.log" 2>&1 &
tests=$!
timeout 240 python benchmarks/check_kernel_configs.py --batch 4 --seqlen 4096 --nheads 32 --headdim 64 \
  --causal --dropout 0.1 --jobs 6 --out "$OUT/dropout_config_scan.json" 2>&1 | tee "$OUT/dropout_config_scan.log"
timeout 100 python -m pytest -q -n 4 tests/distributed/test_local_attention.py -rf 2>&1 | tail -6 \
  | tee "$OUT/local_attention_cuda_tests.log"
wait $tests
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/kernel_gpu_tests.log" | tail -30
timeout 150 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 64 128 \
  --causal causal --impls triton_dropout sdpa_flash_dropout --out "$OUT/attention_dropout.json" 2>&1 | tail -12
