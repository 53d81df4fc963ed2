#!/usr/bin/env bash
# Device calls on one GPU (session 68). Each part is what one call ran; the outputs are in
# benchmarks/results/s68/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s68.sh 1   # decode's split kernel with each warp on its own slice of a key tile
#       (`SPLIT_SLICES`, no barrier a tile) against the kept kernel and cuDNN; block_sparse_attention's inference
#       calls without the autograd Function: the GPU tests of both, ab_host_trims.py --trims s68.
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
case "$1" in
1)
  timeout -s KILL 150 python -m pytest -q -rf $T/test_decode.py > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_decode.log"
  timeout -s KILL 100 python -m pytest -q -rf $T/test_block_sparse.py -k "inference or gpu_bf16_realistic" \
    > "$R/gpu_tests_block_sparse.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_block_sparse.log"
  timeout -s KILL 320 python benchmarks/ab_decode_launch.py --rounds 5 --heads d64_mha16 d128_gqa32_8 d128_mha32 \
    --batches 1 8 --cache-lens 4096 16384 65536 --impls slices_4 slices_4_d128_regs168 cudnn \
    --out "$R/ab_decode_launch.json" 2>&1 | quiet | ab_rows
  timeout -s KILL 100 python benchmarks/ab_host_trims.py --trims s68 --paths block_sparse_inference --seqlen 4096 \
    --out "$R/host_trims_s68.json" 2>&1 | quiet | grep s68
  ;;
esac
