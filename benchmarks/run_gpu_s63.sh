#!/usr/bin/env bash
# Device calls on one GPU (session 63). Each part is what one call ran; the outputs are in
# benchmarks/results/s63/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s63.sh 1   # the ordered one-kernel backward's first adder of each item storing instead of
#       adding (FIRST_STORES; no zero fill of the fp32 dq buffer): the ordered and block-sparse one-kernel GPU tests
#       (buffers' unwritten elements NaN), then fwd+bwd against SDPA cuDNN with it off and on (ab_cudnn.py
#       --zero-filled, five rounds) at d128 causal 4k-16k and full 4k-16k
#   bash benchmarks/run_gpu_s63.sh 2   # block-sparse d128 through the ordered one-kernel backward at every density,
#       first stores off / on (ab_block_sparse.py d128_first_stores) at n4k and n16k
# Calls 3-9 (the machine of calls 1-2, warm; same tree but for bench_host_overhead.py's profile on the calling
# thread in call 8), each prefixed with `source benchmarks/gpu_call.sh; machine_info;`:
#   3: bs_ab 250 one_kernel_fs_n16k --variants d128_one_kernel_backward --seqlens 16384 --headdims 128 \
#        --min-density 0.04 --max-density 0.5 --no-flex
#      bs_ab 150 one_kernel_fs_n4k --variants d128_one_kernel_backward --seqlens 4096 --headdims 128 \
#        --max-density 0.5 --no-flex
#   4: ab_cudnn.py --zero-filled --headdims 128 --rounds 5 at causal 32768 49152 65536 and full 32768 65536
#   5: the part-3 A/B again at n16k 10% (--min-density 0.09 --max-density 0.11) and n4k 19-24% (0.15-0.3)
#   6: bs_bench 390 block_sparse_n16k_d128 --seqlens 16384 --headdims 128
#   7: bs_bench 220 block_sparse_n4k_d128 --seqlens 4096 --headdims 128
#   8: bench_host_overhead.py --seqlen 4096 --headdim 128 --butterfly F:L --no-parts --top 18 for 5:8 and 5:2
#   9: the GPU tests of tests/kernels/test_flash_bwd_fused_hopper.py and test_block_sparse_hopper.py, whole
#  10 (a fresh machine): ab_train_route.py --route d64_one_kernel --seqlen 8192 --rounds 8
#  11 (a fresh machine, commit e7330d3: the persistent dK/dV kernel moved to its own file): the GPU tests of
#      test_block_sparse_hopper.py and test_flash_bwd_hopper.py -k "persistent or compiled or short or any_list_length"
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels/test_block_sparse_hopper.py
case "$1" in
1)
  timeout -s KILL 220 python -m pytest -q -n 6 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_flash_bwd_fused_hopper.py -k "ordered or torch_deterministic" > "$R/gpu_tests_ordered.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_ordered.log"
  timeout -s INT 120 python -m pytest -q -n 6 -m gpu -rf $T -k "one_kernel" > "$R/gpu_tests_one_kernel.log" 2>&1
  tail -n 2 "$R/gpu_tests_one_kernel.log"
  for causal in yes no; do
    timeout -s KILL 110 python benchmarks/ab_cudnn.py --zero-filled --headdims 128 --causal $causal \
      --seqlens 4096 8192 16384 --rounds 5 --out "$R/ab_cudnn_first_stores_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
2)
  bs_ab 250 first_stores_n16k --variants d128_first_stores --seqlens 16384 --headdims 128 --min-density 0.04 \
    --max-density 0.5 --no-flex
  bs_ab 120 first_stores_n4k --variants d128_first_stores --seqlens 4096 --headdims 128 --max-density 0.5 --no-flex
  ;;
esac
