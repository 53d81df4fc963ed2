#!/usr/bin/env bash
# One device call (nvidia-h200): the kernel GPU tests (TMA descriptor path and pointer path, bf16) and a
# per-config scan of the dropout shape that faulted ("misaligned address") in the autotuner's sweep,
# side by side; then TMA descriptors against pointer loads and the SDPA anchors, d128.
#   source .whl/install.sh && bash benchmarks/run_gpu_tma.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
timeout 300 python -m pytest -q -m gpu tests/kernels -rf > "$OUT/kernel_gpu_tests.log" 2>&1 &
tests=$!
timeout 280 python benchmarks/check_kernel_configs.py --batch 4 --seqlen 4096 --nheads 32 --headdim 64 \
  --causal --dropout 0.1 --pointers --jobs 6 --out "$OUT/dropout_config_scan.json" 2>&1 | tee "$OUT/dropout_config_scan.log"
wait $tests
tail -25 "$OUT/kernel_gpu_tests.log"
timeout 240 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 128 --causal both \
  --impls triton triton_pointers sdpa_cudnn sdpa_flash --out "$OUT/attention_tma.json" 2>&1 | tail -14
