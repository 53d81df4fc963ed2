#!/usr/bin/env bash
# Device calls on one GPU (session 54). Each part is what one call ran; the outputs are in
# benchmarks/results/s54/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s54.sh 1   # the backward alone (ab_fused_bwd.py, five rounds): full attention in the convoy
#       order at 4k-16k against the rule's key groups (--full-convoy), then the causal convoy at one key group's lengths
#       (4k, 8k) against one key group, with 1, 2 and 4 query heads a key head (--causal-convoy-everywhere)
#   bash benchmarks/run_gpu_s54.sh 2   # the training shape of gpt2_medium_d128 (8 heads of 128, batch 16k / n): causal
#       fwd and fwd+bwd against SDPA cuDNN at 8k and 16k (ab_cudnn.py --nheads 8, five rounds), then its 16k step
#       profiled with SDPA pinned to cuDNN and with `auto` (bench_train.py --profile 2)
#   bash benchmarks/run_gpu_s54.sh 3   # the backward alone at causal 16k (ab_fused_bwd.py, five rounds), 8 heads (the
#       training shape) and 16: the rule's convoy walking up and down against two key groups
#       (--ordered-causal-key-groups 2 --causal-convoy-everywhere); then 8 heads at 32k, up against down
#   bash benchmarks/run_gpu_s54.sh 4   # call 3's finding (two key groups past the convoy at 16k) over lengths: the
#       backward alone, causal, key groups (--ordered-causal-key-groups 2 at 12k / 16k, 4 at 24k / 32k) against the
#       rule's convoy, 8 and 16 heads
#   bash benchmarks/run_gpu_s54.sh 5   # causal calls in two key groups by default (ORDERED_CAUSAL_KEY_GROUPS 2): the
#       ordered and determinism GPU tests (new cases: 12k with GQA 2, 16k and 16640 in two key groups, 17000 and 20480
#       in the convoy walking up), causal GQA with 2 query heads a key head in two key groups against the two kernels
#       and the convoy (ab_fused_bwd.py, 12k / 16k), then fwd+bwd against SDPA cuDNN (ab_cudnn.py, five rounds) at
#       causal 12k / 16k, 8 heads and 16
#   bash benchmarks/run_gpu_s54.sh 6   # GPT-2 medium's width in heads of 128 at 16k (its causal calls now in two key
#       groups), SDPA pinned to cuDNN against `auto`; then the issue's benchmark at d128 n16k (bench_attention.py)
#   bash benchmarks/run_gpu_s54.sh 7   # the CUDA-graph tests (new case: causal 12k in two key groups), then the 16k
#       step with `auto` profiled (bench_train.py --profile 2): its attention kernels' time per step against call 2's
#   bash benchmarks/run_gpu_s54.sh 8   # the causal convoy in key groups, the heaviest group first: the ordered and
#       determinism GPU tests with FLASHTRAIN_CAUSAL_CONVOY_KEY_GROUPS=2 (its default route in 2 groups; new edge
#       cases in 2 and 3), then the backward alone (ab_fused_bwd.py --convoy-key-groups, five rounds) at causal
#       32k / 64k with 8 heads (1, 2, 4 groups) and 32k with 16 (1, 2)
#   bash benchmarks/run_gpu_s54.sh 9   # call 8's A/B again over more lengths, seven rounds: the causal convoy in 1, 2
#       and 3 key groups at 24k-64k with 8 heads, in 1 and 2 at 24k / 48k / 64k with 16
#   bash benchmarks/run_gpu_s54.sh 10  # fwd+bwd against SDPA cuDNN at causal 12k / 16k with both routes in the same
#       rounds: two key groups (the default) and the convoy (ab_cudnn.py --also-causal-key-groups 1), 16 and 8 heads
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
summary() { python -c "import json, sys; [print(r['seqlen'], r['group'], {k: round(v, 3) for k, v in r.items() if '_over_' in k or k.endswith('bitwise')}) for r in json.load(open(sys.argv[1]))['rows']]" "$1"; }
case "$1" in
1)
  timeout -s KILL 160 python benchmarks/ab_fused_bwd.py --ordered --full-convoy --seqlens 4096 8192 16384 \
    --rounds 5 --out "$R/ab_full_convoy.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_full_convoy.json"
  for group in 1 2 4; do
    timeout -s KILL 90 python benchmarks/ab_fused_bwd.py --ordered --causal --causal-convoy-everywhere --group $group \
      --ordered-max-group $group --seqlens 4096 8192 --rounds 5 --out "$R/ab_causal_convoy_g$group.json" 2>&1 \
      | quiet | cut -c1-150
    summary "$R/ab_causal_convoy_g$group.json"
  done
  ;;
2)
  timeout -s KILL 150 python benchmarks/ab_cudnn.py --nheads 8 --headdims 128 --causal yes --seqlens 8192 16384 \
    --rounds 5 --out "$R/ab_cudnn_d128_h8_causal.json" 2>&1 | quiet | ratios
  timeout 300 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 16384 --impls sdpa_cudnn,auto \
    --profile 2 --profile-top 15 --out "$R/train_medium_d128_profile.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
3)
  for nheads in 8 16; do
    timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --nheads $nheads --ordered --causal --walk-down \
      --ordered-causal-key-groups 2 --causal-convoy-everywhere --seqlens 16384 --rounds 5 \
      --out "$R/ab_causal_16k_h$nheads.json" 2>&1 | quiet | cut -c1-150
    summary "$R/ab_causal_16k_h$nheads.json"
  done
  timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --nheads 8 --ordered --causal --walk-down --seqlens 32768 \
    --rounds 5 --out "$R/ab_causal_32k_h8.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_causal_32k_h8.json"
  ;;
4)
  for nheads in 8 16; do
    timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --nheads $nheads --ordered --causal \
      --ordered-causal-key-groups 2 --causal-convoy-everywhere --seqlens 12288 16384 --rounds 5 \
      --out "$R/ab_causal_kg2_h$nheads.json" 2>&1 | quiet | cut -c1-150
    summary "$R/ab_causal_kg2_h$nheads.json"
    timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --nheads $nheads --ordered --causal \
      --ordered-causal-key-groups 4 --causal-convoy-everywhere --seqlens 24576 32768 --rounds 5 \
      --out "$R/ab_causal_kg4_h$nheads.json" 2>&1 | quiet | cut -c1-150
    summary "$R/ab_causal_kg4_h$nheads.json"
  done
  ;;
5)
  ordered_tests
  timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --ordered --causal --group 2 --ordered-max-group 2 \
    --causal-convoy-everywhere --seqlens 12288 16384 --rounds 5 --out "$R/ab_causal_gqa2_kg2.json" 2>&1 \
    | quiet | cut -c1-150
  summary "$R/ab_causal_gqa2_kg2.json"
  for nheads in 8 16; do
    timeout -s KILL 100 python benchmarks/ab_cudnn.py --nheads $nheads --headdims 128 --causal yes \
      --seqlens 12288 16384 --rounds 5 --out "$R/ab_cudnn_d128_h${nheads}_causal.json" 2>&1 | quiet | ratios
  done
  ;;
6)
  timeout 200 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 16384 --impls sdpa_cudnn,auto \
    --out "$R/train_medium_d128_auto.json" 2>&1 | quiet | grep "^|" | tail -n 8
  d128_against_anchors 200 16384
  ;;
7)
  timeout -s KILL 150 python -m pytest -q -rf tests/kernels/test_cuda_graphs.py > "$R/gpu_tests_graphs.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_graphs.log"
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 16384 --impls auto --profile 2 \
    --profile-top 4 --out "$R/train_medium_d128_profile.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
8)
  FLASHTRAIN_CAUSAL_CONVOY_KEY_GROUPS=2 ordered_tests
  timeout -s KILL 200 python benchmarks/ab_fused_bwd.py --nheads 8 --ordered --causal --convoy-key-groups 2 4 \
    --seqlens 32768 65536 --rounds 5 --out "$R/ab_convoy_groups_h8.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_convoy_groups_h8.json"
  timeout -s KILL 90 python benchmarks/ab_fused_bwd.py --ordered --causal --convoy-key-groups 2 \
    --seqlens 32768 --rounds 5 --out "$R/ab_convoy_groups_h16.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_convoy_groups_h16.json"
  ;;
9)
  timeout -s KILL 200 python benchmarks/ab_fused_bwd.py --nheads 8 --ordered --causal --convoy-key-groups 2 3 \
    --seqlens 24576 32768 40960 49152 65536 --rounds 7 --out "$R/ab_convoy_groups_h8.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_convoy_groups_h8.json"
  timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --ordered --causal --convoy-key-groups 2 \
    --seqlens 24576 49152 65536 --rounds 7 --out "$R/ab_convoy_groups_h16.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_convoy_groups_h16.json"
  ;;
10)
  for nheads in 16 8; do
    timeout -s KILL 100 python benchmarks/ab_cudnn.py --nheads $nheads --also-causal-key-groups 1 --headdims 128 \
      --causal yes --seqlens 12288 16384 --rounds 5 --out "$R/ab_cudnn_d128_h${nheads}_routes.json" 2>&1 | quiet | ratios
  done
  ;;
esac
