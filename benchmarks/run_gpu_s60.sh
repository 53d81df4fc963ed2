#!/usr/bin/env bash
# Device calls on one GPU (session 60). Each part is what one call ran; the outputs are in
# benchmarks/results/s60/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s60.sh 1   # d64's ordered one-kernel backward in GPT-2 medium 8k's step, both routes
#       in one training process alternating (ab_train_route.py, first GPU run) with each route's attention
#       kernels profiled; the per-kernel device time of block-sparse fwd+bwd at n4k (d64 and d128; butterfly
#       6.25% and 19%; ours and Flex, our dense kernel beside) and the device's copy bandwidth: where n4k's
#       fixed cost goes against the bytes each kernel must move
#   bash benchmarks/run_gpu_s60.sh 2   # the dq kernel's O load before its Q/dO wait (DELTA_ORDER 1) and also its
#       delta summed under step 0's products (2), each against the order in use (0), block-sparse fwd+bwd
#       (ab_block_sparse.py) at n4k d64 and d128 up to 19%, then n16k d128 up to 10%; then ab_train_route's
#       d64 one-kernel route at GPT-2 medium 8k again with the portable dq in its attention tally (part 2 runs
#       from commit 7671d0a, where the dq kernel's DELTA_ORDER and the two variants exist; the n16k A/B printed
#       nothing before its time limit)
#   bash benchmarks/run_gpu_s60.sh 3   # O loaded before the wait kept (DELTA_ORDER 1's SASS): the Hopper backward
#       and block-sparse GPU test files, then the issue's block-sparse benchmark at n4k (d128, d64)
#   (call 3's test run reached 100% with every test passed, 524, and was interrupted in pytest's summary)
#   bash benchmarks/run_gpu_s60.sh 4   # the issue's block-sparse benchmark at n16k (d128, d64) on the dq kernel's
#       O loaded early, with the new graph ideal and bytes-floor columns
# Call 5 (from the project root at commit 7671d0a's kernels/_flash_dq_hopper.py and ab_block_sparse.py):
#   source benchmarks/gpu_call.sh; bs_ab 215 dq_o_early_n16k --variants dq_o_early --seqlens 16384 --headdims 128 \
#     --max-density 0.11
#   (the A/B of the O load's place at n16k, after call 4 read d128 10% and d64 25% about 5% slower than sessions 47
#   and 50: no point finished inside the limit, nothing came back)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
copy_bandwidth() {  # the device's copy bandwidth (read + write bytes / s) on 1 GiB (common.copy_bandwidth; calls 1 and 4
  # took the median of 20 copies between CUDA events, since session 60's review it is time_ms's median)
  python -c "
import json
from benchmarks.common import copy_bandwidth
row = copy_bandwidth()
print(row); json.dump(row, open('$R/copy_bandwidth.json', 'w'))"
}
case "$1" in
4)
  timeout 480 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 64 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | grep -e "^|" -e "^copy"
  ;;
3)
  T=tests/kernels
  timeout -s INT 330 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_bwd_hopper.py $T/test_block_sparse_hopper.py \
    --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels > "$R/gpu_tests.log" 2>&1
  tail -n 3 "$R/gpu_tests.log"
  timeout 230 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 128 64 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | grep "^|"
  ;;
2)
  bs_ab 200 dq_delta_n4k --variants dq_o_early dq_delta_under_products --seqlens 4096 --headdims 64 128 \
    --max-density 0.19
  bs_ab 150 dq_delta_n16k --variants dq_o_early dq_delta_under_products --seqlens 16384 --headdims 128 \
    --max-density 0.1
  timeout 200 python benchmarks/ab_train_route.py --route d64_one_kernel --seqlen 8192 --profile --rounds 6 \
    --out "$R/ab_train_d64_one_kernel_8k.json" 2>&1 | quiet | tail -n 3
  ;;
1)
  copy_bandwidth
  timeout 260 python benchmarks/ab_train_route.py --route d64_one_kernel --seqlen 8192 --profile \
    --out "$R/ab_train_d64_one_kernel_8k.json" 2>&1 | quiet | tail -n 12
  timeout 200 python benchmarks/profile_attention.py --shape 1,4096,16,64 --shape 1,4096,16,128 \
    --impls triton bs:1:0 bs:5:0 flexbs:1:0 --iters 20 --out "$R/profile_bs_n4k.json" 2>&1 | quiet | tail -n 60
  ;;
esac
