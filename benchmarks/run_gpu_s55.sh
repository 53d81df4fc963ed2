#!/usr/bin/env bash
# Device calls on one GPU (session 55). Each part is what one call ran; the outputs are in
# benchmarks/results/s55/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s55.sh 1   # the one-kernel backward at head dim 64 (GPT-2's heads), which takes no d64
#       call by default: the backward alone (ab_fused_bwd.py --headdim 64, four rounds), 16 heads (GPT-2 medium's),
#       the two deterministic kernels against the atomic and the ordered one-kernel backward on 64-query steps with
#       2 and 3 stages and 128-query steps with 2 (--fused-configs), causal 2k-16k and full 4k / 16k
#   bash benchmarks/run_gpu_s55.sh 2   # d64 takes the one-kernel backward (ordered from 4k queries full and 8k causal,
#       atomic from 4k): the ordered and determinism GPU tests (new: d64 edge cases and d64 routes), the unordered
#       kernel's GPU tests, then the backward alone at 16 heads over more lengths and six rounds (ab_fused_bwd.py
#       --headdim 64): causal 8k-64k (past 16896 keys the causal convoy), full 4k-32k (20k-32k in the convoy order)
#       (parts 2-3 ran on the tree that routed d64 there, commit 9f3d075, reverted after part 3: on the final tree
#       part 2's A/B needs --fused-configs 64:2)
#   bash benchmarks/run_gpu_s55.sh 3   # call 2's GPU tests again after the launch-key fix (a d64 and a d128 launch with
#       the same tile rows had shared one compiled kernel), then GPT-2 medium 8k with ours, the ordered backward on
#       and off (FLASHTRAIN_ORDERED_BWD=0: the two kernels), alternating, two runs each
#   bash benchmarks/run_gpu_s55.sh 4   # the end-to-end table again on this tree (d64 on the two kernels): GPT-2 medium
#       at 8k, 1k and 16k with SDPA flash, SDPA cuDNN and ours (triton), eager attention at 1k, each row a fresh
#       process, compiled blocks launched kernel by kernel (bench_train.py's default)
#   bash benchmarks/run_gpu_s55.sh 5   # the same for GPT-2 small at 8k and 1k (SDPA flash, SDPA cuDNN, ours)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
summary() { python -c "import json, sys; [print(r['seqlen'], r['group'], {k: round(v, 3) for k, v in r.items() if '_over_' in k or k.endswith('bitwise')}) for r in json.load(open(sys.argv[1]))['rows']]" "$1"; }
case "$1" in
1)
  timeout -s KILL 240 python benchmarks/ab_fused_bwd.py --headdim 64 --nheads 16 --fused-configs 64:2 64:3 128:2 \
    --ordered --causal --seqlens 2048 4096 8192 16384 --rounds 4 --out "$R/ab_d64_causal.json" 2>&1 | quiet \
    | cut -c1-150
  summary "$R/ab_d64_causal.json"
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --headdim 64 --nheads 16 --fused-configs 64:2 64:3 128:2 \
    --ordered --seqlens 4096 16384 --rounds 4 --out "$R/ab_d64_full.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_d64_full.json"
  ;;
2)
  timeout -s KILL 280 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered or torch_deterministic or gpu_fused_backward_matches" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --headdim 64 --nheads 16 --ordered --causal \
    --seqlens 8192 16384 32768 65536 --rounds 6 --out "$R/ab_d64_causal.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_d64_causal.json"
  timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --headdim 64 --nheads 16 --ordered \
    --seqlens 4096 16384 32768 --rounds 6 --out "$R/ab_d64_full.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_d64_full.json"
  ;;
3)
  timeout -s KILL 280 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered or torch_deterministic or gpu_fused_backward_matches" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  for run in 1 2; do
    for ordered in 1 0; do
      FLASHTRAIN_ORDERED_BWD=$ordered timeout 150 python benchmarks/bench_train.py --models gpt2_medium \
        --seqlens 8192 --impls triton --out "$R/train_medium8k_ordered${ordered}_run$run.json" 2>&1 | quiet \
        | grep "^| gpt2"
    done
  done
  ;;
4)
  for n in 8192 1024 16384; do
    for impl in sdpa_flash sdpa_cudnn triton $([ $n = 1024 ] && echo eager); do
      timeout 100 python benchmarks/bench_train.py --models gpt2_medium --seqlens $n --impls $impl \
        --out "$R/train_medium${n}_$impl.json" 2>&1 | quiet | grep "^| gpt2"
    done
  done
  ;;
5)
  for n in 8192 1024; do
    for impl in sdpa_flash sdpa_cudnn triton; do
      timeout 80 python benchmarks/bench_train.py --models gpt2_small --seqlens $n --impls $impl \
        --out "$R/train_small${n}_$impl.json" 2>&1 | quiet | grep "^| gpt2"
    done
  done
  ;;
esac
