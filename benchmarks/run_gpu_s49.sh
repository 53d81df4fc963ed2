#!/usr/bin/env bash
# Device calls on one GPU (session 49). Each part is what one call ran; the outputs are in
# benchmarks/results/s49/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s49.sh 1   # the causal convoy (FLASHTRAIN_ORDERED_CAUSAL_CONVOY=1, still opt-in): the
#       ordered GPU tests with it on (causal 16k, 16640 with GQA, compared with the two kernels too), fwd+bwd
#       against SDPA cuDNN at causal 16k / 32k / 64k (ab_cudnn.py --two-kernels, five rounds), and the backward
#       alone at causal 64k (ab_fused_bwd.py --ordered)
#   bash benchmarks/run_gpu_s49.sh 2   # experiment (CAUSAL_CONVOY_SCHED_SLOTS): the causal convoy with all heads'
#       programs interleaved tile by tile (variant ordered_causal_convoy_mixed) beside the kept launch order,
#       the two kernels and the unordered kernel: the backward alone at causal 16k / 32k / 48k / 64k
#       (ab_fused_bwd.py --ordered --causal), then the ordered GPU tests with the mixed order on. Ran on commit
#       03b1545 (results/s49/mixed_heads.patch; not kept: 0.69-0.71x the two kernels)
#   bash benchmarks/run_gpu_s49.sh 3   # the causal convoy on by default (up to 48k query rows a key head): the
#       ordered GPU tests, fwd+bwd against SDPA cuDNN at causal 16k / 32k / 48k (ab_cudnn.py --two-kernels), and
#       the issue's d128 benchmark at 16k against SDPA cuDNN, FlexAttention and SDPA flash
#   bash benchmarks/run_gpu_s49.sh 4   # the GPU tests of the Hopper backward, Hopper block-sparse, packed QKV and
#       dense kernel files with the causal convoy on by default (the slow portable-autotune test beside them)
#   bash benchmarks/run_gpu_s49.sh 5   # the causal convoy with GQA, its row limit lifted: the backward alone with 2
#       query heads a key head at causal 16k / 24k / 32k and with 4 at 12k / 16k (ab_fused_bwd.py --ordered --causal
#       --group, five rounds), against the two kernels and the unordered kernel. Ran on commit 482ba46, where a row
#       limit (--causal-convoy-rows 1000000) stood for today's group limit (--ordered-max-group 4)
#   bash benchmarks/run_gpu_s49.sh 6   # the full-attention convoy with GQA: the backward alone with 2 query heads a
#       key head at full 20k / 32k and with 4 at 32k (ab_fused_bwd.py --ordered --group, five rounds)
#   bash benchmarks/run_gpu_s49.sh 7   # the causal convoy without GQA only (calls 5-6): the ordered GPU tests again
#   bash benchmarks/run_gpu_s49.sh 8   # the ordered causal backward in one key group (2k-8448 tokens) with GQA, never
#       timed before: the backward alone with 2 and 4 query heads a key head at causal 4k / 8k (ab_fused_bwd.py
#       --ordered --causal --group, five rounds). Ran on commit 4516d83, before the group limits
#   bash benchmarks/run_gpu_s49.sh 9   # the ordered full-attention backward in one or two key groups with GQA: the
#       backward alone with 2 query heads a key head at full 8k and with 4 at 4k / 16k (ab_fused_bwd.py --ordered
#       --group, five rounds). Ran on commit 96ccc8c, before the group limits
#   bash benchmarks/run_gpu_s49.sh 10  # ordered calls without GQA in causal and up to 2 query heads a key head in full
#       attention's key groups (calls 8-9): the ordered GPU tests again
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  FLASHTRAIN_ORDERED_CAUSAL_CONVOY=1 ordered_tests
  FLASHTRAIN_ORDERED_CAUSAL_CONVOY=1 timeout -s KILL 200 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 \
    --causal yes --seqlens 16384 32768 65536 --rounds 5 --out "$R/ab_cudnn_d128_causal_long.json" 2>&1 | quiet | ratios
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 65536 --rounds 5 \
    --out "$R/ab_causal_convoy_64k.json" 2>&1 | quiet
  ;;
2)
  timeout -s KILL 330 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 16384 32768 49152 65536 \
    --rounds 5 --out "$R/ab_causal_convoy_mixed.json" 2>&1 | quiet
  FLASHTRAIN_EXP_CONVOY_SLOTS=4096 FLASHTRAIN_ORDERED_CAUSAL_CONVOY=1 ordered_tests
  ;;
3)
  ordered_tests
  timeout -s KILL 200 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal yes \
    --seqlens 16384 32768 49152 --rounds 5 --out "$R/ab_cudnn_d128_causal_convoy.json" 2>&1 | quiet | ratios
  d128_against_anchors 200 16384
  ;;
4)
  hopper_backward_tests
  ;;
5)
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --ordered --causal --group 2 --ordered-max-group 4 \
    --seqlens 16384 24576 32768 --rounds 5 --out "$R/ab_causal_convoy_gqa2.json" 2>&1 | quiet
  timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --ordered --causal --group 4 --ordered-max-group 4 \
    --seqlens 12288 16384 --rounds 5 --out "$R/ab_causal_convoy_gqa4.json" 2>&1 | quiet
  ;;
6)
  timeout -s KILL 170 python benchmarks/ab_fused_bwd.py --ordered --group 2 --seqlens 20480 32768 --rounds 5 \
    --out "$R/ab_convoy_full_gqa2.json" 2>&1 | quiet
  timeout -s KILL 130 python benchmarks/ab_fused_bwd.py --ordered --group 4 --seqlens 32768 --rounds 5 \
    --out "$R/ab_convoy_full_gqa4.json" 2>&1 | quiet
  ;;
7)
  ordered_tests
  ;;
8)
  for group in 2 4; do
    timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --ordered --causal --group $group --ordered-max-group 4 \
      --seqlens 4096 8192 --rounds 5 --out "$R/ab_ordered_causal_gqa$group.json" 2>&1 | quiet
  done
  ;;
9)
  timeout -s KILL 60 python benchmarks/ab_fused_bwd.py --ordered --group 2 --ordered-max-group 4 --seqlens 8192 --rounds 5 \
    --out "$R/ab_ordered_full_gqa2.json" 2>&1 | quiet
  timeout -s KILL 80 python benchmarks/ab_fused_bwd.py --ordered --group 4 --ordered-max-group 4 --seqlens 4096 16384 --rounds 5 \
    --out "$R/ab_ordered_full_gqa4.json" 2>&1 | quiet
  ;;
10)
  ordered_tests
  ;;
esac
