#!/usr/bin/env bash
# Device calls on one GPU (session 36). Each part is what one call ran; the outputs are in
# benchmarks/results/s36/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s36.sh 1   # the persistent dq kernel for block-sparse (FLASHTRAIN_PERSISTENT_DQ=1): the
#       GPU tests of the block-sparse files with it on; fwd+bwd with it off and on, alternating in one process,
#       beside Flex (ab_block_sparse.py), n4k and n16k, d64 and d128, densities up to 11%
#   bash benchmarks/run_gpu_s36.sh 2   # (part 1, on an H200: 178 passed; from graphs d128 1.09x at its two points,
#       d64 1.00-1.08x) per-kernel device time of block-sparse fwd+bwd at the lowest densities, ours (persistent
#       dq on) and Flex on the same masks: d64 n16k 0.8% and 2.3%, d128 and d64 n4k 3% and 6%
#   bash benchmarks/run_gpu_s36.sh 3   # (part 2, on an H200: d64 n16k 0.8% takes the portable backward and the
#       row-tile forward, kernels 0.269 ms against Flex's 0.303; d128 n4k 3% dK/dV 38 us of 95) a trial tree with the
#       d64 block-sparse forward persistent and the d64 backward on the Gluon kernels at any list length: the
#       block-sparse GPU tests; both changes off and on (ab_block_sparse.py) at d64, n4k and n16k
#   bash benchmarks/run_gpu_s36.sh 4   # (part 3, on an H200: 178 passed; from graphs the Gluon backward at one tile
#       1.14x / 1.09x at n16k 0.8% / n4k 3%, level above; the persistent forward 1.02-1.13x up to 10%) with both
#       kept and the backward's tile floor removed: the Hopper block-sparse GPU tests; the d64 persistent
#       forward off and on at n16k and n64k up to 50% density
# Parts 5-8 ran a persistent dK/dV kernel (commit d962a76) and its check (benchmarks/check_persistent_dkdv.py, last at
# 2c47c4e); both were taken off main after part 8 (see benchmarks/NOTES_attention.md, session 36).
#   bash benchmarks/run_gpu_s36.sh 5   # (part 4, on an H200: 172 passed; the d64 persistent forward 1.02-1.13x up to
#       n16k 10%, 0.94-1.02x on longer lists: n16k 25-45%, n64k 2-44%; kept up to 16 tiles a program,
#       `PERSISTENT_FORWARD`) the persistent dK/dV kernel (`_attn_bwd_dkdv_hopper_persistent`, trial: on at
#       every list length): the Hopper block-sparse GPU tests (bitwise equality with the grid kernel, one program
#       per SM and 3 programs); fwd+bwd with it off and on at n4k and n16k, d64 and d128, up to 50% density
#   bash benchmarks/run_gpu_s36.sh 6   # (part 5, on an H200: 176 of the 182 tests failed, the first on dk of d64 n1000
#       causal with a key block no query sees, the rest on an illegal address after it; fwd+bwd timings taken
#       anyway, not valid until the kernel is) the persistent dK/dV kernel against the grid one bitwise, case
#       by case with CUDA_LAUNCH_BLOCKING=1 (check_persistent_dkdv.py); compute-sanitizer on the first failing
#       case if the image has it
#   bash benchmarks/run_gpu_s36.sh 7   # (part 6, on an H200: the first persistent launch, d64 n4k diagonal, raised an
#       illegal address; compute-sanitizer: out-of-range shared or local address in the step's dP^T product) the
#       check in one process per (case, grid size), d64 bf16, and d128 on a small case
#   bash benchmarks/run_gpu_s36.sh 8   # (part 7: every run raised, its filter dropped the messages) the check with
#       delta laid out like lse (the kernel reads it with lse's strides), full messages; producer registers 24 and 32
#   bash benchmarks/run_gpu_s36.sh 9   # (part 8, on an H200: non-causal cases still raise an illegal address at both
#       producer register counts, the causal GQA case is bitwise equal to the grid kernel; the kernel left main)
#       the Hopper block-sparse GPU tests of the tree as it stands (persistent forward and dq kernels also with
#       a grid of 3 programs)
#   (part 9, on an H200: 184 passed.) Part 10, the one-loop persistent dK/dV kernel's check, was prepared but
#       not run here (no device time left); it ran in session 37 as `run_gpu_s37.sh 1`.
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
2)
  python benchmarks/profile_attention.py --shape 1,16384,16,64 --impls bs:0:0 flexbs:0:0 bs:0:1 flexbs:0:1 \
    --out "$R/profile_d64_n16k_low.json" 2>&1 | quiet | tail -n 40
  python benchmarks/profile_attention.py --shape 1,4096,16,128 --shape 1,4096,16,64 --impls bs:0:0 flexbs:0:0 \
    bs:1:0 flexbs:1:0 --out "$R/profile_n4k_low.json" 2>&1 | quiet | tail -n 80
  ;;
3)
  timeout -s INT 300 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_block_sparse.py > "$R/gpu_tests.log" 2>&1
  tail -n 4 "$R/gpu_tests.log"
  timeout 250 python benchmarks/ab_block_sparse.py --variants d64_short_backward d64_persistent_forward --headdims 64 \
    --out "$R/ab_d64.json" 2>&1 | quiet | tail -n 30
  ;;
4)
  timeout -s INT 200 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py > "$R/gpu_tests.log" 2>&1
  tail -n 4 "$R/gpu_tests.log"
  timeout 350 python benchmarks/ab_block_sparse.py --variants d64_persistent_forward --headdims 64 --seqlens 16384 65536 \
    --max-density 0.5 --out "$R/ab_d64_forward.json" 2>&1 | quiet | tail -n 20
  ;;
5)
  timeout -s INT 240 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py > "$R/gpu_tests.log" 2>&1
  tail -n 6 "$R/gpu_tests.log"
  timeout 330 python benchmarks/ab_block_sparse.py --variants persistent_dkdv --max-density 0.5 \
    --out "$R/ab_persistent_dkdv.json" 2>&1 | quiet | tail -n 30
  ;;
6)
  CUDA_LAUNCH_BLOCKING=1 timeout 200 python benchmarks/check_persistent_dkdv.py --skip-speed --out "$R/check_dkdv.json" \
    2>&1 | quiet | tee "$R/check_dkdv.log" | tail -n 60
  if command -v compute-sanitizer >/dev/null; then
    timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python benchmarks/check_persistent_dkdv.py --skip-speed \
      --cases 5 --headdims 64 --out "$R/sanitizer.json" > "$R/sanitizer.log" 2>&1
    grep -v Warning "$R/sanitizer.log" | head -n 60
  else
    ls /usr/local/cuda*/bin 2>/dev/null | head; echo "no compute-sanitizer"
  fi
  ;;
7)
  for c in 2 3 0 5; do
    for p in 16 8 1 0; do
      echo "== d64 case $c programs $p"
      timeout 60 python benchmarks/check_persistent_dkdv.py --skip-speed --cases $c --headdims 64 --dtypes bfloat16 \
        --programs $p --out "$R/c${c}_p${p}.json" 2>&1 | quiet | grep -v "^ " | tail -n 3
    done
  done
  for p in 16 1 0; do
    echo "== d128 case 2 programs $p"
    timeout 60 python benchmarks/check_persistent_dkdv.py --skip-speed --cases 2 --headdims 128 --dtypes bfloat16 \
      --programs $p --out "$R/d128_c2_p${p}.json" 2>&1 | quiet | grep -v "^ " | tail -n 3
  done
  ;;
8)
  for regs in 24 32; do
    for c in 2 0 4; do
      for p in 16 0; do
        echo "== d64 case $c programs $p producer regs $regs"
        timeout 60 python benchmarks/check_persistent_dkdv.py --skip-speed --cases $c --headdims 64 --dtypes bfloat16 \
          --programs $p --producer-regs $regs --out "$R/c${c}_p${p}_r${regs}.json" > "$R/c${c}_p${p}_r${regs}.log" 2>&1
        grep -e "^ok" -e "^FAIL" -e "Error" "$R/c${c}_p${p}_r${regs}.log" | head -n 4
      done
    done
  done
  ;;
9)
  timeout -s INT 240 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_block_sparse.py > "$R/gpu_tests.log" 2>&1
  tail -n 6 "$R/gpu_tests.log"
  ;;
esac
