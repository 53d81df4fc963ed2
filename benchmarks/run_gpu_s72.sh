#!/usr/bin/env bash
# Session 72's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s72.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s72/callN/.
#   1: after the WIDE builds (64-bit row and head offsets in the portable forward, backward and block-sparse
#      kernels; the entry points' refusal gone): check_large_offsets.py on one sequence past 2**31 elements
#      (1.11M tokens x 16 heads x 128): windowed forward and backward, varlen, the causal forward and (over one
#      head of such tensors) backward on the Hopper kernels, block-sparse forward and backward, decode; beside it
#      the GPU tests of the extent, dense, block-sparse, decode and Hopper backward files
#   2: check_large_offsets.py's wide_cost (the WIDE builds forced at 128k tokens against the usual ones), and the
#      new cases with --narrow (the usual 32-bit builds: do the cases catch them?); the extent tests on CUDA (in
#      call 1 they ran past 120 s: each builds and tunes its kernels twice, WIDE and usual, dropout among them)
#   3: the extent tests on CUDA again (compared within rounding there), the Hopper backward files' GPU tests
#   4: the six kernel-calling extent tests again, verbose (part 3 cut one of them at its time-out; a cold machine
#      builds and tunes every kernel twice, WIDE and usual)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  T=tests/kernels
  # (the extent tests alone first: each holds 9-18 GB of views)
  timeout -s INT 120 python -m pytest -q -rf $T/test_sequence_extent.py > "$R/cuda_extent_tests.log" 2>&1
  echo "extent tests exit $?"; tail -n 2 "$R/cuda_extent_tests.log"
  timeout -s INT 440 python -m pytest -q -rf -n 6 -m "gpu or not gpu" $T/test_flash_attention.py $T/test_block_sparse.py $T/test_decode.py $T/test_flash_bwd_hopper.py \
    $T/test_block_sparse_hopper.py --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/cuda_tests.log" 2>&1 &
  timeout -s KILL 420 python benchmarks/check_large_offsets.py --cases window window_bwd varlen_window causal \
    causal_bwd block_sparse block_sparse_bwd decode --out "$R/large_offsets_wide.json" 2>&1 | quiet | cut -c1-500
  wait
  echo "tests:"; tail -n 4 "$R/cuda_tests.log"
  ;;
2)
  timeout -s KILL 150 python benchmarks/check_large_offsets.py --cases wide_cost --out "$R/wide_cost.json" 2>&1 \
    | quiet | cut -c1-500
  timeout -s KILL 130 python benchmarks/check_large_offsets.py --narrow --cases varlen_window block_sparse_bwd \
    causal_bwd --out "$R/large_offsets_narrow.json" 2>&1 | quiet | cut -c1-500
  timeout -s INT 300 python -m pytest -q -rf -n 4 tests/kernels/test_sequence_extent.py > "$R/cuda_extent_tests.log" 2>&1
  echo "extent tests exit $?"; tail -n 2 "$R/cuda_extent_tests.log"
  ;;
3)
  # after the extent tests compare within rounding on a GPU (call 2: bitwise failed, the WIDE build tuning its
  # own tiles): those tests, and the Hopper backward files' GPU tests (call 1's pool was cut at ~97%)
  timeout -s INT 200 python -m pytest -q -rf -n 4 tests/kernels/test_sequence_extent.py > "$R/cuda_extent_tests.log" 2>&1
  echo "extent tests exit $?"; tail -n 2 "$R/cuda_extent_tests.log"
  T=tests/kernels
  timeout -s INT 300 python -m pytest -q -rf -n 6 -m gpu $T/test_flash_bwd_hopper.py $T/test_block_sparse_hopper.py \
    --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels > "$R/hopper_tests.log" 2>&1
  echo "hopper tests exit $?"; tail -n 2 "$R/hopper_tests.log"
  ;;
4)
  timeout -s INT 170 python -m pytest -v -rf -n 3 tests/kernels/test_sequence_extent.py \
    -k "forward_and_backward or launchers or qkv or varlen" 2>&1 | grep -e PASSED -e FAILED -e passed -e failed \
    | tee "$R/cuda_extent_tests_rerun.log" | cut -c1-200
  ;;
esac
