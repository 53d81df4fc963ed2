#!/usr/bin/env bash
# Device calls on one GPU (session 39). Each part is what one call ran; the outputs are in
# benchmarks/results/s39/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s39.sh 1   # PERSISTENT_FORWARD[128] = 20 (the row-tile forward's 128-key tiles on long
#       d128 lists): the GPU tests of the Hopper backward, block-sparse, packed QKV and dense kernel files (the dense
#       backward ones not yet run on session 38's forward)
#   bash benchmarks/run_gpu_s39.sh 2   # the block-sparse sweep at d128 on that route: n16k, n64k, n4k
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  hopper_backward_tests
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" "$R/gpu_tests_slow_portable.log" | head -n 20
  ;;
2)
  timeout 230 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 10
  timeout 160 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 128 \
    --out "$R/block_sparse_n64k.json" 2>&1 | quiet | tail -n 10
  timeout 150 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 128 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | tail -n 10
  ;;
esac
