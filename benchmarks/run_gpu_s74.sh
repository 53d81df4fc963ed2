#!/usr/bin/env bash
# Session 74's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s74.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s74/callN/.
#   1: session 73's unrun change on a GPU: the block-sparse backward past 2**31 elements now on the Hopper dq
#      and dK/dV kernels (check_large_offsets.py's block_sparse_bwd, 1.11M tokens x 16 heads of 128), beside
#      the Hopper block-sparse GPU tests; then d128 under GQA (32 query heads on 8, Llama-like) against SDPA
#      cuDNN, fwd and fwd+bwd in alternating rounds (never timed: `auto` gives such calls to cuDNN untimed)
#   2: call 1: ours 0.96-1.00x cuDNN fwd+bwd under GQA 32/8 (two deterministic kernels; deterministic=False
#      1.02-1.06x). The ordered one-kernel backward on K/V repeated per query head (MHA; dK/dV summed over each
#      group after, as FlashAttention-2 does): its GPU test, then alternating rounds against the default
#   3: call 2: 1.02-1.06x at 5 of 6 points, 0.996-1.031x cuDNN. Taken by default up to 16k keys; GPU tests of the
#      one-kernel backward's and packed QKV's files, then GPT-2 medium's width in 8 heads of 128 on 2 kv heads
#      trained with SDPA pinned to cuDNN and with ours (bench_train.py, each row in a fresh process)
#   4: call 3: 1.015x cuDNN's tokens/s at 8k, 1.000x at 16k. `auto` now takes ours under GQA at 4k-16k keys, and
#      the route from 4096 keys only (the range timed). GPU tests of the route, `auto` and the dense kernels, then
#      the final tree against cuDNN under GQA 32/8 (alternating rounds)
#   5: call 4: at 4k ours and cuDNN traded places (0.986-1.017 over calls 2 and 4), from 8k ours led: `auto` takes
#      GQA from 8k keys. Its GPU test; then the other groups `auto` now gives ours at 8k-16k: 32 query heads on 4
#      (8 a kv head) and on 16 (2), against cuDNN in alternating rounds
#   6: call 5: 1.00-1.08x cuDNN at 4 and 16 kv heads too. Past 16k keys GQA calls keep the two kernels (the limit of
#      the lengths measured): the route on repeated K/V at 32k and 64k (causal and full, 32 on 8) against them
#      and cuDNN, three alternating rounds
#   7: call 6: causal 32k / 64k 1.09 / 1.07x the two kernels, 1.05 / 1.03x cuDNN (full attention there takes the
#      ordered convoy under GQA itself). The route and `auto` up to 64k keys: their GPU tests (a causal 32k case)
#   8: the review's shared check in the two GPU tests of the ordered backward (unchanged assertions)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  T=tests/kernels
  timeout -s INT 200 python -m pytest -q -rf -n 4 -m gpu $T/test_block_sparse_hopper.py \
    > "$R/block_sparse_hopper_tests.log" 2>&1 &
  timeout -s KILL 150 python benchmarks/check_large_offsets.py --cases block_sparse_bwd \
    --out "$R/large_offsets_block_sparse_bwd.json" 2>&1 | quiet | cut -c1-600
  wait
  echo "block-sparse hopper tests:"; tail -n 3 "$R/block_sparse_hopper_tests.log"
  for causal in yes no; do
    timeout -s KILL 170 python benchmarks/ab_cudnn.py --headdims 128 --nheads 32 --nheads-kv 8 --causal $causal \
      --seqlens 4096 8192 16384 --rounds 3 --out "$R/ab_cudnn_gqa_32_8_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
2)
  timeout -s INT 200 python -m pytest -q -rf -m gpu tests/kernels/test_flash_bwd_fused_hopper.py -k repeated_kv \
    > "$R/gqa_expanded_tests.log" 2>&1
  echo "gqa expanded tests:"; tail -n 3 "$R/gqa_expanded_tests.log"
  for causal in yes no; do
    timeout -s KILL 200 python benchmarks/ab_cudnn.py --gqa-expanded --headdims 128 --nheads 32 --nheads-kv 8 \
      --causal $causal --seqlens 4096 8192 16384 --rounds 3 --out "$R/ab_cudnn_gqa_expanded_causal_$causal.json" \
      2>&1 | quiet | ratios
  done
  ;;
3)
  T=tests/kernels
  timeout -s KILL 220 python -m pytest -q -n 4 -rf -m gpu $T/test_flash_bwd_fused_hopper.py $T/test_qkvpacked.py \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  timeout 300 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 8192,16384 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
4)
  T=tests/kernels
  timeout -s KILL 300 python -m pytest -q -n 5 -rf -m gpu $T/test_flash_attention.py $T/test_qkvpacked.py \
    tests/flashtrain/test_gpt.py "$T/test_flash_bwd_fused_hopper.py" -k "not test_flash_bwd_fused_hopper or repeated_kv" \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  for causal in yes no; do
    timeout -s KILL 150 python benchmarks/ab_cudnn.py --headdims 128 --nheads 32 --nheads-kv 8 --causal $causal \
      --seqlens 4096 8192 16384 --rounds 3 --out "$R/ab_cudnn_gqa_32_8_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
5)
  timeout -s KILL 150 python -m pytest -q -rf -m gpu tests/flashtrain/test_gpt.py > "$R/gpu_tests_auto.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_auto.log"
  for kv in 4 16; do
    for causal in yes no; do
      timeout -s KILL 110 python benchmarks/ab_cudnn.py --headdims 128 --nheads 32 --nheads-kv $kv --causal $causal \
        --seqlens 8192 16384 --rounds 3 --out "$R/ab_cudnn_gqa_32_${kv}_causal_$causal.json" 2>&1 | quiet | ratios
    done
  done
  ;;
6)
  for causal in yes no; do
    timeout -s KILL 250 python benchmarks/ab_cudnn.py --gqa-expanded --headdims 128 --nheads 32 --nheads-kv 8 \
      --causal $causal --seqlens 32768 65536 --rounds 3 --out "$R/ab_cudnn_gqa_expanded_long_causal_$causal.json" \
      2>&1 | quiet | ratios
  done
  ;;
7)
  timeout -s KILL 250 python -m pytest -q -rf -m gpu tests/kernels/test_flash_bwd_fused_hopper.py tests/flashtrain/test_gpt.py \
    -k "repeated_kv or auto" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  ;;
8)
  timeout -s KILL 220 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_fused_hopper.py \
    -k "repeated_kv or takes_the_ordered_kernel" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  ;;
esac
