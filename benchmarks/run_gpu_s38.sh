#!/usr/bin/env bash
# Device calls on one GPU (session 38). Each part is what one call ran; the outputs are in
# benchmarks/results/s38/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s38.sh 1   # ping-pong between the two consumer warpgroups (`turn_barriers`): the
#       forward's configs with and without it at d128 and d64 (correctness on the edge shapes, then time round-robin
#       twice), then the dK/dV kernel's at d128 (turns at S^T/dP^T, or at whole steps)
#   (part 1, on an H200: every config correct where checked, but the forward's check ran out of time before its
#       timings; dK/dV d128 backward TFLOP/s without / turns at S^T,dP^T / at whole steps, two rounds: causal 1k
#       312,311 / 307,274 / 294,287; 4k 427,404 / 412,430 / 371,408; 16k 483,487 / 470,480 / 450,452: no gain)
#   bash benchmarks/run_gpu_s38.sh 2   # the forward's timings alone (its first config per head dim checked),
#       d128 and d64, with and without ping-pong, round-robin twice
#   (part 2, on an H200: ping-pong no faster on the whole: row-tile 0.89-1.01x, persistent 0.95-1.06x, see NOTES)
#   bash benchmarks/run_gpu_s38.sh 3   # d128 forward with 128-key tiles (3 stages fit the row-tile kernel in 224 KB),
#       with and without ping-pong, against the configs in use, round-robin three times
#   (part 3, on an H200: 128-key tiles on three stages 1.07-1.12x the configs in use at 4k and 16k; ping-pong no
#       help there either)
#   bash benchmarks/run_gpu_s38.sh 4   # d128 forward: CONFIGS[128] now 128-key tiles on three stages from 2k queries
#       (ping-pong reverted): its check and timings at 1k and 2k against the persistent 64-key config, d128 fwd+bwd
#       against the anchors at 4k and 16k, then the GPU tests of the forward and block-sparse files
#   (part 4, on an H200: the check passed, but 23 of the forward's GPU tests failed on CONFIGS[128] (224 KB of shared
#       memory), NaN or wrong rows; fwd+bwd 0.95-0.98x cuDNN with it)
#   bash benchmarks/run_gpu_s38.sh 5   # d128 forward: 128-key tiles with K and V in rings of their own (2 + 2 tiles,
#       160 KB): the forward GPU tests first (what failed), then the timings of the candidates at 1k-16k, then
#       fwd+bwd against the anchors
#   (part 5, on an H200: d128's 78 forward tests passed; the d64 and d256 ones failed at launch, their row-tile
#       launches lacking the new V_STAGES constexpr (fixed); d128 forward TFLOP/s 128-key 2+2 / persistent: causal
#       1k 361-363 / 407-417, 4k 531-545 / 506-565, 16k 612-619 / 526-530; full 1k 512 / 520-525, 4k 610-612 /
#       554-587, 16k 628-653 / 565-569; fwd+bwd 0.95-0.97x cuDNN, 1.22-1.34x Flex, 1.66-1.71x SDPA flash)
#   bash benchmarks/run_gpu_s38.sh 6   # the forward and block-sparse GPU tests on the final rule, then block-sparse
#       d128 fwd+bwd with the forward's row-tile kernel (128-key tiles) against its persistent one (64-key), n16k
#   (part 6, on an H200: 307 passed, 2 failed: the bitwise persistent-vs-row-tile forward test at d128, whose two
#       kernels now walk different key tiles (it now checks each against the reference there); block-sparse d128
#       fwd+bwd row-tile ÷ persistent forward from graphs 0.93-0.99 up to 6.25%, 1.01-1.04 from 10%)
#   bash benchmarks/run_gpu_s38.sh 7   # the changed block-sparse test (PERSISTENT_FORWARD now from 10 tiles at d128)
source "$(dirname "$0")/gpu_call.sh"
machine_info
# d128's forward configs (`check_hopper_fwd.py`, the first checked, all timed twice round-robin):
# $R/NAME.{json,log}, its verdicts printed
check_fwd_d128() {  # [HANG_S=..] check_fwd_d128 SECONDS NAME [more check_hopper_fwd.py arguments]
  local secs=$1 name=$2
  shift 2
  timeout "$secs" python benchmarks/check_hopper_fwd.py --headdims 128 --check-quick --rounds 2 "$@" \
    --out "$R/$name.json" > "$R/$name.log" 2>&1
  echo "fwd rc $?"; grep -e "^FAIL" -e "^ok" -e "^d" -e "Error" "$R/$name.log" | head -n 20
}
case "$1" in
1)
  HANG_S=300 timeout 290 python benchmarks/check_hopper_fwd.py --headdims 128 64 --rounds 2 --out "$R/check_fwd.json" \
    > "$R/check_fwd.log" 2>&1
  echo "fwd rc $?"; grep -e "^ok" -e "^FAIL" -e "^d" -e "Error" "$R/check_fwd.log" | head -n 40
  HANG_S=300 timeout 290 python benchmarks/check_hopper_dkdv.py --headdims 128 --rounds 2 --speed 128:causal 128:full \
    --out "$R/check_dkdv.json" > "$R/check_dkdv.log" 2>&1
  echo "dkdv rc $?"; grep -e "^ok" -e "^FAIL" -e "^d" -e "Error" "$R/check_dkdv.log" | head -n 30
  ;;
2)
  HANG_S=500 timeout 480 python benchmarks/check_hopper_fwd.py --headdims 128 64 --check-quick --rounds 2 \
    --out "$R/check_fwd.json" > "$R/check_fwd.log" 2>&1
  echo "fwd rc $?"; grep -e "^FAIL" -e "^d" -e "Error" "$R/check_fwd.log" | head -n 40
  ;;
3)
  HANG_S=500 timeout 480 python benchmarks/check_hopper_fwd.py --headdims 128 --check-quick --rounds 3 \
    --out "$R/check_fwd.json" > "$R/check_fwd.log" 2>&1
  echo "fwd rc $?"; grep -e "^FAIL" -e "^d" -e "Error" "$R/check_fwd.log" | head -n 40
  ;;
4)
  HANG_S=200 check_fwd_d128 170 check_fwd_1k_2k --seqlens 1024 2048
  d128_against_anchors 230 4096 16384
  timeout -s INT 170 python -m pytest -q -n 5 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -rf > "$R/gpu_tests_fwd.log" 2>&1
  tail -n 3 "$R/gpu_tests_fwd.log"
  ;;
5)
  timeout -s INT 170 python -m pytest -q -n 5 -m gpu tests/kernels/test_flash_fwd_hopper.py -rf > "$R/gpu_tests_fwd.log" 2>&1
  tail -n 3 "$R/gpu_tests_fwd.log"
  HANG_S=200 check_fwd_d128 190 check_fwd
  d128_against_anchors 200 4096 16384
  ;;
6)
  timeout -s INT 200 python -m pytest -q -n 5 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -rf > "$R/gpu_tests_fwd_bs.log" 2>&1
  tail -n 3 "$R/gpu_tests_fwd_bs.log"
  timeout 200 python benchmarks/ab_block_sparse.py --variants d128_row_tile_forward --headdims 128 --seqlens 16384 \
    --max-density 0.5 --out "$R/ab_d128_forward.json" 2>&1 | quiet | tail -n 14
  ;;
7)
  timeout -s INT 150 python -m pytest -q -n 5 -m gpu tests/kernels/test_block_sparse_hopper.py -rf \
    -k "persistent_and_row_tile or compiled_launches or any_list_length" > "$R/gpu_tests_bs_routes.log" 2>&1
  tail -n 3 "$R/gpu_tests_bs_routes.log"
  ;;
esac
