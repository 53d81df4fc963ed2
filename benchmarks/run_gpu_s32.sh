#!/usr/bin/env bash
# Device calls on one GPU (session 32). Each part is what one call ran; the outputs are in
# benchmarks/results/s32/callN/ (each call's machine.txt names its GPU). A/B parts run the tree before the
# session (decb9c9: kernels, benchmarks/*.py, flashtrain) from .carry/old, carried with the call.
#   bash benchmarks/run_gpu_s32.sh 1   # the dK/dV kernel with each stage's lse and delta staged in shared memory by
#       the producer: its correctness (check_hopper_dkdv, d128 and d256) and backward TFLOP/s at d128, new and old;
#       per-kernel device time of block-sparse d128 n16k (6.25%, 25%, 45%) and dense d128, new and old, twice
#   bash benchmarks/run_gpu_s32.sh 2   # (part 1, on an H200: correct on the edge shapes at d128 and d256, bf16 and
#       fp16; dK/dV kernel 5-9% faster, dense n16k fwd+bwd 14.52-14.60 against 15.03-15.09 ms full; the old tree's
#       check needed tests/, not carried) the Hopper backward and block-sparse GPU tests; block-sparse d128 n16k
#       against Flex
#   bash benchmarks/run_gpu_s32.sh 3   # (part 2, on an H200: tests stopped by their time limit at 267 of 277 passed,
#       none failed; block-sparse d128 n16k ours / Flex from graphs 1.22-1.38x, 1.26-1.29x at 6-45%) the same tests on
#       the warm machine; dense d128 at 4k and 16k against cuDNN, Flex and SDPA flash
#   bash benchmarks/run_gpu_s32.sh 4   # (part 3, on a fresh H200: again 267 of 277 passed when the time limit came,
#       none failed, so some tests hang; dense d128 fwd+bwd ours / cuDNN 0.93-0.95, / Flex 1.20-1.30) the same tests
#       verbose, with a traceback from any test past 90 s, to name the hanging ones
#   bash benchmarks/run_gpu_s32.sh 5   # (part 4, on an H200: no hang; one worker spent the call compiling the portable
#       kernels' autotune configs for test_gpu_other_backwards_keep_the_portable_kernels, and the 9 tests xdist had
#       queued behind it never started) those 10 tests, the slow one in a process of its own
source benchmarks/gpu_call.sh
machine_info
OLD=.carry/old
# per-kernel device ms of fwd+bwd at (1, 16384, 16, 128): dense full and block-sparse butterflies, from tree $1
profile_tree() {  # profile_tree TREE TAG
  timeout 150 python "$1/benchmarks/profile_attention.py" --shape 1,16384,16,128 --shape 1,16384,16,128,causal \
    --impls triton bs:7:0 bs:6:16 bs:7:32 --iters 20 --out "$R/profile_d128_n16k_$2.json" 2>&1 | quiet \
    | tee "$R/profile_$2.log" | grep -E "ms in|dkdv|_dq"
}
case "${1:?part 1}" in
1)
  head -n 2 "$R/machine.txt"
  HANG_S=230 timeout 240 python benchmarks/check_hopper_dkdv.py --quick --headdims 128 256 \
    --speed 128:causal 128:full --out "$R/check_dkdv_new.json" 2>&1 | quiet | tee "$R/check_dkdv_new.log" | tail -n 12
  HANG_S=110 timeout 120 python $OLD/benchmarks/check_hopper_dkdv.py --quick --headdims 128 \
    --speed 128:causal 128:full --out "$R/check_dkdv_old.json" 2>&1 | quiet | tee "$R/check_dkdv_old.log" | tail -n 8
  for run in 1 2; do
    profile_tree . "new_run$run"
    profile_tree $OLD "old_run$run"
  done
  ;;
2)
  timeout -s INT 300 python -m pytest -q -n 4 -m gpu tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -rf > "$R/gpu_tests_hopper_bwd.log" 2>&1
  tail -n 3 "$R/gpu_tests_hopper_bwd.log"
  timeout 270 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 \
    --out "$R/block_sparse_d128_n16k.json" 2>&1 | quiet | tail -n 14
  ;;
3)
  timeout -s INT 240 python -m pytest -q -n 4 -m gpu tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -rf > "$R/gpu_tests_hopper_bwd.log" 2>&1
  tail -n 3 "$R/gpu_tests_hopper_bwd.log"
  timeout 300 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 128 --graphs \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d128.json" 2>&1 | quiet | grep "^|" | tail -n 20
  ;;
4)
  timeout -s INT 290 python -m pytest -v -n 4 -m gpu tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -rf -o faulthandler_timeout=90 > "$R/gpu_tests_hopper_bwd.log" 2>&1
  grep -v "PASSED" "$R/gpu_tests_hopper_bwd.log" | grep -v "^\s*$" | head -n 80
  ;;
5)
  T=tests/kernels
  timeout -s INT 420 python -m pytest -q -m gpu -rf \
    "$T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels" \
    > "$R/gpu_tests_slow_portable.log" 2>&1 &
  timeout -s INT 420 python -m pytest -q -n 3 -m gpu -rf "$T/test_flash_bwd_hopper.py::test_gpu_loss_on_lse_keeps_the_portable_dq_only" \
    "$T/test_block_sparse_hopper.py::test_gpu_hopper_path_matches_reference" -k "loss_on_lse or 64-1000-1000-bf16" \
    > "$R/gpu_tests_rest.log" 2>&1
  wait
  tail -n 2 "$R/gpu_tests_rest.log" "$R/gpu_tests_slow_portable.log"
  ;;
esac
