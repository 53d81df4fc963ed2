#!/usr/bin/env bash
# Session 76's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s76.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s76/callN/.
#   1: the d128 forward is 0.90-0.97x cuDNN's at 1k-2k queries, where it runs the persistent variant on 64-key
#      tiles in one K/V ring (the row-tile kernel's 128-key tiles in K and V rings of their own were never built
#      persistent). That variant, with and without turns: its GPU tests, then the forward's configs against
#      cuDNN's at 512-4k (full) and 512-8k (causal), five alternating rounds
#   2: call 1: the 128-key persistent variant 0.956-1.054x cuDNN's forward at 512-8k (the kernels in use 0.916-1.042x),
#      turns no help; it now takes d128 below 8k queries (`PERSISTENT_BELOW_128`). The forward's GPU tests on that
#      rule (and the block-sparse forward's, whose launch now passes V_STAGES), then it against the row-tile kernel
#      at full 8k-32k and causal 8k-16k (does it pay past 8k?)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  timeout -s KILL 220 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_fwd_hopper.py \
    -k "split_kv_rings or walks_many" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  fwd_ab 160 d128_full --headdim 128 --seqlens 512 1024 2048 4096
  fwd_ab 180 d128_causal --headdim 128 --causal --seqlens 512 1024 2048 4096 8192
  ;;
2)
  timeout -s KILL 230 python -m pytest -q -n 6 -rf -m gpu tests/kernels/test_flash_fwd_hopper.py tests/kernels/test_launch.py \
    tests/kernels/test_block_sparse_hopper.py -k "not backward and not bwd and not grad and not hopper_path_matches" \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  fwd_ab 150 d128_full_long --headdim 128 --seqlens 8192 16384 32768 --only persistent_128key_rings2 rows_128key_rings2
  fwd_ab 110 d128_causal_long --headdim 128 --causal --seqlens 8192 16384 --only persistent_128key_rings2 rows_128key_rings2
  ;;
esac
