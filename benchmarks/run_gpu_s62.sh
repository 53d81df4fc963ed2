#!/usr/bin/env bash
# Device calls on one GPU (session 62). Each part is what one call ran; the outputs are in
# benchmarks/results/s62/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s62.sh 1   # Nsight Compute on one block-sparse fwd+bwd at n4k (d64 and d128 at 6.25% and
#       19%, and FlexAttention's at d128 6.25%): each kernel's duration, memory and compute throughput against peak,
#       its SM-active against elapsed cycles and its warps' stall reasons: do the n4k kernels wait on bytes or on
#       latency?
#   bash benchmarks/run_gpu_s62.sh 2   # the grid d64 dK/dV kernel on 128-query steps, three stages, against 64-query
#       steps on four (fwd+bwd, ab_block_sparse.py) at n16k from 20% density
#   bash benchmarks/run_gpu_s62.sh 3   # block-sparse d128 through the one-kernel backward (`ONE_KERNEL_BACKWARD`,
#       the dK/dV kernel's lists with dQ added per step, in key-tile order or as the adds land): its GPU tests, then
#       fwd+bwd against the two kernels (ab_block_sparse.py) at n4k, 3-49%
#   bash benchmarks/run_gpu_s62.sh 4   # the same A/B at n16k, 5-45%
#   bash benchmarks/run_gpu_s62.sh 5   # the ordered one-kernel backward walking each key tile's list from the last
#       item down (part 3-4's walked up: 0.29-0.87x, waiting in chains): its GPU tests, the A/B at n16k and n4k
#   bash benchmarks/run_gpu_s62.sh 6   # the same A/B at n64k from 4% density
#   bash benchmarks/run_gpu_s62.sh 10  # after the releasing warps' shared hand-over (`_add_in_turn`: the dense ordered
#       builds' SASS differs from before in register numbers and order only, same instructions): the ordered
#       backward's GPU tests and the block-sparse one-kernel ones
#   bash benchmarks/run_gpu_s62.sh 7   # with d128's ordered one-kernel backward from 30 tiles a program (the default
#       since call 6): the block-sparse GPU tests, then the issue's block-sparse benchmark at n16k d128
# Calls 8 and 9 (commit 1f1aad9; the machine of call 7, warm), the issue's block-sparse benchmark on the
# default routes at n64k and n4k, d128:
#   source benchmarks/gpu_call.sh; machine_info; bs_bench 440 block_sparse_n64k_d128 --seqlens 65536 --headdims 128
#   source benchmarks/gpu_call.sh; machine_info; bs_bench 200 block_sparse_n4k_d128 --seqlens 4096 --headdims 128
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels/test_block_sparse_hopper.py
case "$1" in
10)
  timeout -s KILL 200 python -m pytest -q -n 6 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_flash_bwd_fused_hopper.py -k "ordered or torch_deterministic" > "$R/gpu_tests_ordered.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_ordered.log"
  timeout -s INT 120 python -m pytest -q -n 6 -m gpu -rf $T -k "one_kernel" > "$R/gpu_tests_one_kernel.log" 2>&1
  tail -n 2 "$R/gpu_tests_one_kernel.log"
  ;;
7)
  timeout -s INT 170 python -m pytest -q -n 6 -m gpu -rf $T > "$R/gpu_tests_bs.log" 2>&1
  tail -n 3 "$R/gpu_tests_bs.log"
  bs_bench 380 block_sparse_n16k_d128 --seqlens 16384 --headdims 128
  ;;
6)
  bs_ab 560 ordered_down_n64k --variants d128_one_kernel_backward --seqlens 65536 --headdims 128 --min-density 0.04 \
    --max-density 0.5 --no-flex
  ;;
5)
  timeout -s INT 200 python -m pytest -q -n 6 -m gpu -rf $T -k "one_kernel" > "$R/gpu_tests_one_kernel.log" 2>&1
  tail -n 3 "$R/gpu_tests_one_kernel.log"
  bs_ab 250 ordered_down_n16k --variants d128_one_kernel_backward --seqlens 16384 --headdims 128 --min-density 0.04 \
    --max-density 0.5 --no-flex
  bs_ab 120 ordered_down_n4k --variants d128_one_kernel_backward --seqlens 4096 --headdims 128 --max-density 0.5 \
    --no-flex
  ;;
4)
  bs_ab 560 one_kernel_n16k --variants d128_one_kernel_backward d128_one_kernel_backward_unordered --seqlens 16384 \
    --headdims 128 --min-density 0.04 --max-density 0.5 --no-flex
  ;;
3)
  timeout -s INT 240 python -m pytest -q -n 6 -m gpu -rf $T -k "one_kernel" > "$R/gpu_tests_one_kernel.log" 2>&1
  tail -n 3 "$R/gpu_tests_one_kernel.log"
  bs_ab 320 one_kernel_n4k --variants d128_one_kernel_backward d128_one_kernel_backward_unordered --seqlens 4096 \
    --headdims 128 --max-density 0.5 --no-flex
  ;;
1)
  stalls=long_scoreboard,barrier,membar,wait,math_pipe_throttle,mio_throttle,short_scoreboard,lg_throttle,sleeping
  stalls=$stalls,no_instruction,dispatch_stall,drain,branch_resolving,selected,not_selected,misc,imc_miss,tex_throttle
  NCU_METRICS=$(echo $stalls | sed -E 's/([a-z_]+)/smsp__average_warps_issue_stalled_\1_per_issue_active.ratio/g') \
  NCU_SECTIONS="WarpStateStats LaunchStats Occupancy" ncu_block_sparse "d64_6 4096 64 bs:1:0" "d64_19 4096 64 bs:5:0" \
    "d128_6 4096 128 bs:1:0" "d128_19 4096 128 bs:5:0" "flex_d128_6 4096 128 flexbs:1:0" 2>&1 | \
    grep -e exit -e Duration -e Throughput -e "Cycles" -e "Registers" -e "Grid Size" -e stalled -e "Warp Cycles"
  ;;
2)
  bs_ab 250 d64_grid_steps --variants d64_grid_dkdv_128_query_steps --seqlens 16384 --headdims 64 --min-density 0.2 \
    --max-density 0.5 --no-flex
  ;;
esac
