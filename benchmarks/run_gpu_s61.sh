#!/usr/bin/env bash
# Device calls on one GPU (session 61). Each part is what one call ran; the outputs are in
# benchmarks/results/s61/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s61.sh 1   # block-sparse producers loading list entries a step ahead (the dK/dV
#       kernel's also its rows' lse and delta after the step's TMA; `LIST_PREFETCH`), each against the order in
#       use, fwd+bwd (ab_block_sparse.py) at n4k d64 and d128 up to 25%; then the Hopper block-sparse GPU tests
#       (prefetch on) and the Hopper forward's GPU tests (the code moved to `_hopper_pipeline.py` in session 60)
#   bash benchmarks/run_gpu_s61.sh 2   # the Hopper backward's GPU test files (dq and dK/dV, one-kernel
#       backward: moved in session 60), then the issue's block-sparse benchmark at n4k
#   (calls 1 and 2 ran at commit c609582, where LIST_PREFETCH and the A/B variants exist; call 2 with both knobs set
#   False first, `sed -i 's/^LIST_PREFETCH = True/LIST_PREFETCH = False/' kernels/_flash_dkdv_hopper.py
#   kernels/_hopper_pipeline.py`: the code main has, the prefetch reverted after call 1)
#   bash benchmarks/run_gpu_s61.sh 3   # the issue's block-sparse benchmark at n16k (d128, d64) on main: session 60
#       read d128 10% at 1.248x Flex (1.27-1.30 in sessions 39-50)
#   bash benchmarks/run_gpu_s61.sh 4   # block-sparse d64's dK/dV kernel on the dense path's 128-query steps (two
#       stages) against its 64-query steps (four stages), which were never timed on tile lists: fwd+bwd
#       (ab_block_sparse.py) at n4k to 50%, then n16k 5-25% without Flex (calls 4 and 5: the same part twice)
# Call 6 (from commit 1b7c1c4 with kernels/_block_sparse_hopper.py's PERSISTENT_DKDV[64] set to
# `dataclasses.replace(dkdv_hopper.CONFIGS[64], persistent=True)`, as main has it since):
#   source benchmarks/gpu_call.sh; timeout -s INT 200 python -m pytest -q -n 5 -m gpu -rf \
#     tests/kernels/test_block_sparse_hopper.py > "$R/gpu_tests_bs.log" 2>&1
#   bs_ab 100 d64_dkdv_steps_n4k_third --variants d64_dkdv_128_query_steps --seqlens 4096 --headdims 64 \
#     --max-density 0.3 --no-flex
#   (the A/B's files were written as ab_bs_d64_dkdv_steps_n4k_causal.*, renamed: its layouts are not causal; the
#   tail of its output kept the last three points, the .md has all five)
#   bash benchmarks/run_gpu_s61.sh 7   # the issue's block-sparse benchmark at n4k d64 on main, its persistent dK/dV
#       kernel on 128-query steps
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
case "$1" in
7)
  bs_bench 200 block_sparse_n4k_d64 --seqlens 4096 --headdims 64
  ;;
4)
  bs_ab 170 d64_dkdv_steps_n4k --variants d64_dkdv_128_query_steps --seqlens 4096 --headdims 64 --max-density 0.5
  bs_ab 250 d64_dkdv_steps_n16k --variants d64_dkdv_128_query_steps --seqlens 16384 --headdims 64 \
    --min-density 0.05 --max-density 0.26 --no-flex
  ;;
3)
  bs_bench 520 block_sparse_n16k --seqlens 16384 --headdims 128 64
  ;;
2)
  timeout -s INT 300 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_bwd_hopper.py $T/test_flash_bwd_fused_hopper.py \
    --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels > "$R/gpu_tests_bwd.log" 2>&1
  tail -n 3 "$R/gpu_tests_bwd.log"
  bs_bench 230 block_sparse_n4k --seqlens 4096 --headdims 128 64
  ;;
1)
  bs_ab 230 list_prefetch_n4k --variants dkdv_list_prefetch kv_list_prefetch --seqlens 4096 --headdims 64 128 \
    --max-density 0.25
  timeout -s INT 150 python -m pytest -q -n 5 -m gpu -rf $T/test_block_sparse_hopper.py > "$R/gpu_tests_bs.log" 2>&1
  tail -n 3 "$R/gpu_tests_bs.log"
  timeout -s INT 170 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_fwd_hopper.py > "$R/gpu_tests_fwd.log" 2>&1
  tail -n 3 "$R/gpu_tests_fwd.log"
  ;;
esac
