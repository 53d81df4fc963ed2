#!/usr/bin/env bash
# Device calls on one GPU (session 36). Each part is what one call ran; the outputs are in
# benchmarks/results/s36/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s36.sh 1   # the persistent dq kernel for block-sparse (FLASHTRAIN_PERSISTENT_DQ=1): the
#       GPU tests of the block-sparse files with it on; fwd+bwd with it off and on, alternating in one process,
#       beside Flex (ab_block_sparse.py), n4k and n16k, d64 and d128, densities up to 11%
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  FLASHTRAIN_PERSISTENT_DQ=1 timeout -s INT 300 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_block_sparse.py > "$R/gpu_tests_persistent_dq.log" 2>&1
  tail -n 4 "$R/gpu_tests_persistent_dq.log"
  timeout 250 python benchmarks/ab_block_sparse.py --switch PERSISTENT_DQ_ENABLED --out "$R/ab_persistent_dq.json" 2>&1 \
    | quiet | tail -n 30
  ;;
esac
