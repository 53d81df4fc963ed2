#!/usr/bin/env bash
# Device calls on one GPU (session 37). Each part is what one call ran; the outputs are in
# benchmarks/results/s37/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s37.sh 1   # the one-loop persistent dK/dV kernel (session 36's part 10, never run):
#       the bitwise check against the grid kernel (bf16, d64 and d128, every case, 1, 3 programs and one per SM),
#       then if it passes the Hopper block-sparse GPU tests, then if they pass fwd+bwd off / on up to 20%
#   bash benchmarks/run_gpu_s37.sh 2   # (part 1, on an H200: all 54 cases bitwise equal; 181 passed, 1 failed: the
#       compiled-launch test counted only the row-tile dK/dV launcher) the block-sparse Hopper GPU tests and the
#       compiled-launch tests again, then the A/B up to 20%
#   bash benchmarks/run_gpu_s37.sh 3   # (part 2, on an H200: 184 passed; on ÷ off from graphs 1.00-1.16x, below
#       1.05x past 8 tiles a program) with the rule (d64 up to 16 tiles, d128 up to 6): the GPU tests of both
#       block-sparse files and the compiled launches, then the A/B up to 50% (its "on" column forces the
#       persistent kernel at every length: the long lists decide d64's limit)
#   bash benchmarks/run_gpu_s37.sh 4   # (part 3, on an H200: 190 passed; d64 on ÷ off 0.95-0.97x at n16k 25-45%, so
#       its 16-tile limit stays) the block-sparse sweep on the final routes, against Flex and the dense anchors:
#       n64k (eager), then n4k (eager and from graphs)
#   bash benchmarks/run_gpu_s37.sh 5   # (part 4, on an H200: see results/s37/call4/) the same at n16k
#   bash benchmarks/run_gpu_s37.sh 6   # (part 5, on an H200: see call5/) the dense Hopper backward and packed QKV
#       GPU tests on this tree (the dK/dV file changed; its grid kernel's SASS did not)
#   (part 6, on an H200: 134 passed)
#   bash benchmarks/run_gpu_s37.sh 7   # host time of one eager block-sparse fwd+bwd at n4k (one block per row), ours
#       and Flex, with cProfile's top functions: where the short calls' 0.55-1.03 ms go
#   (part 7, on an H200: ours 0.49 / 0.67 ms a call at d128 / d64, Flex 0.71 / 0.93)
#   bash benchmarks/run_gpu_s37.sh 8   # after the review mend (shared load/buffer helpers; SASS identical on CPU): the
#       persistent dK/dV check with its rewritten timing (bitwise, then dK/dV alone grid vs persistent), then the
#       Hopper block-sparse GPU tests
#   (part 8, on an H200: all 54 bitwise equal; the dK/dV kernel alone 1.03-1.43x persistent over grid; 182 passed)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  timeout 90 python benchmarks/check_persistent_dkdv.py --skip-speed --dtypes bfloat16 --out "$R/check_dkdv.json" \
    > "$R/check_dkdv.log" 2>&1
  rc=$?
  echo "bitwise equal: $(grep -c '^ok' "$R/check_dkdv.log")"; grep -e "^FAIL" -e "Error" "$R/check_dkdv.log" | head -n 8
  [ $rc = 0 ] || exit 1
  timeout -s INT 170 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py > "$R/gpu_tests.log" 2>&1
  rc=$?
  tail -n 6 "$R/gpu_tests.log"
  [ $rc = 0 ] || exit 1
  timeout 200 python benchmarks/ab_block_sparse.py --variants persistent_dkdv --max-density 0.2 --out "$R/ab_persistent_dkdv.json" 2>&1 \
    | quiet | tail -n 30
  ;;
2)
  timeout -s INT 170 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py::test_gpu_compiled_launches_give_the_jit_launches_results > "$R/gpu_tests.log" 2>&1
  tail -n 6 "$R/gpu_tests.log"
  timeout 300 python benchmarks/ab_block_sparse.py --variants persistent_dkdv --max-density 0.2 \
    --out "$R/ab_persistent_dkdv.json" 2>&1 | quiet | tail -n 40
  ;;
3)
  timeout -s INT 200 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_block_sparse.py \
    tests/kernels/test_flash_bwd_hopper.py::test_gpu_compiled_launches_give_the_jit_launches_results \
    > "$R/gpu_tests.log" 2>&1
  tail -n 6 "$R/gpu_tests.log"
  timeout 330 python benchmarks/ab_block_sparse.py --variants persistent_dkdv --max-density 0.5 \
    --out "$R/ab_persistent_dkdv.json" 2>&1 | quiet | grep "^|"
  ;;
4)
  timeout 230 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 128 64 \
    --out "$R/block_sparse_n64k.json" 2>&1 | quiet | tail -n 16
  timeout 250 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 128 64 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | tail -n 16
  ;;
5)
  timeout 420 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 64 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 16
  ;;
6)
  timeout -s INT 400 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_qkvpacked.py \
    --deselect tests/kernels/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/gpu_tests.log" 2>&1
  tail -n 6 "$R/gpu_tests.log"
  ;;
7)
  for d in 128 64; do
    timeout 120 python benchmarks/bench_host_overhead.py --headdim $d --seqlen 4096 --butterfly 0:0 --no-parts \
      --out "$R/host_bs_d${d}_n4k.json" 2>&1 | quiet | tail -n 75
  done
  ;;
8)
  timeout 200 python benchmarks/check_persistent_dkdv.py --dtypes bfloat16 --out "$R/check_dkdv.json" \
    > "$R/check_dkdv.log" 2>&1
  echo "rc $? bitwise equal: $(grep -c '^ok' "$R/check_dkdv.log")"
  grep -e "^FAIL" -e "Error" -e "^d" "$R/check_dkdv.log" | head -n 20
  timeout -s INT 170 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py > "$R/gpu_tests.log" 2>&1
  tail -n 3 "$R/gpu_tests.log"
  ;;
esac
