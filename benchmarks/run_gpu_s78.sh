#!/usr/bin/env bash
# Session 78's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s78.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s78/callN/. ab_base/ (carried,
# not committed) holds main's kernels/ before the session's change (git archive e320e3c kernels).
#   1: the GQA backward route's per-kv-head dK / dV sums: torch.sum over the middle dim ran at 2.43 / 1.45 TB/s
#      (repeat 4 / 2) against a clone's 4.1 (session 77, call 8). Now one Triton kernel (`kernels._head_sums`, from
#      results/s77/head_sums.patch): its GPU tests and the route's at 4k, it against torch.sum and a clone at
#      16-128 rows a program, then the route's fwd+bwd with it ÷ without (ab_trees.py, alternating processes) at
#      GQA 32 on 8, causal 4k / full 4k / causal 8k
#   2: call 1: 5 GPU tests passed; the sums at 4.05-4.09 / 3.80 TB/s (repeat 4 / 2, 32 rows a program; 128 rows fell
#      to 0.35), bitwise torch.sum's; fwd+bwd with ÷ without 0.984 / 0.982 at causal / full 4k (the 8k shape was
#      killed at the run's limit). Causal 8k again, then the route's floors against cuDNN with the faster sums
#      (ab_cudnn.py --gqa-expanded: the route at causal 2k 0.99x and full 1k 0.96x the two kernels in session 77)
#   3: call 2: causal 8k with ÷ without the sums kernel 0.992; the route ÷ the two kernels (fwd+bwd, five rounds)
#      0.981 / 0.960 at causal 2k / 3k, 0.960 / 0.930 at full 1k / 1.5k (4-5 rounds of 5 ahead each): floors
#      now 2048 causal, 1024 full. The route's GPU tests at those lengths and `auto`'s; the route at full 512 /
#      768 (lower still?) and causal 2k / full 1k again; the GQA model (8 heads of 128 on 2) at 2k end to end in
#      two processes (1.028x cuDNN in session 76 on the two kernels; `auto` takes GQA from 4k)
#   4: call 3: 11 GPU tests passed; the route ÷ the two kernels at full 512 / 768 1.026 / 1.010 (the floor stays 1024;
#      causal 2k and full 1k now take the route by default, so their columns compare it with itself); the GQA model
#      at 2k 1.017x and 1.012x cuDNN's tokens/s: `auto` takes GQA from 2k keys (was 4k). `auto`'s GPU tests on that
#      rule, then GQA 32 on 8 against cuDNN on the session's final rule, causal 2k / 4k / 16k and full 1k / 4k / 16k
#   5: call 4: `auto`'s GPU test at GQA 2k failed: it still ran cuDNN, as every d128 call under 4k (a call ours
#      beats cuDNN on went to `auto_picks_triton` with sdpa_runs_cudnn=False, and its AUTO_TRITON_MIN_SEQLEN, set
#      against SDPA flash, kept it with SDPA, i.e. cuDNN). cuDNN ÷ ours fwd+bwd on the final rule: causal 2k / 4k /
#      16k 1.103 / 1.006 / 1.054, full 1k / 4k / 16k 1.105 / 1.069 / 1.041. Now `auto` takes ours where it beats the
#      cuDNN kernel SDPA would run (MHA from 1k keys, GQA from 2k): `auto`'s GPU tests, then the models end to end
#      with `auto` against cuDNN: GPT-2 medium's width in 8 heads of 128 at 1k (twice), on 2 kv heads at 2k
#   6: call 5: 10 GPU tests passed; `auto` ran our kernels and trained GPT-2 medium's width in 8 heads of 128 at 1k
#      at 1.024x / 1.021x cuDNN's tokens/s, but the GQA model at 2k at 0.941x (its device step 78.6-88.9 ms, noisy,
#      against 79.5 for `triton` in call 3, same kernels). `triton` and `auto` in one process, twice, in both orders
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  gpu_tests 120 4 tests/kernels/test_head_sums.py tests/kernels/test_flash_bwd_fused_hopper.py \
    -k "bf16_at_a_routes_size or (gqa_expanded and 4096)"
  timeout -s KILL 60 python benchmarks/bench_head_sums.py --block-rows 16 32 64 128 --out "$R/head_sums.json" \
    2>&1 | quiet
  trees_ab 300 6 ab_trees_head_sums 4,4096,32,8,128,1 4,4096,32,8,128,0 2,8192,32,8,128,1
  ;;
2)
  trees_ab 120 5 ab_trees_head_sums_8k 2,8192,32,8,128,1
  gqa_cudnn 170 ab_cudnn_gqa_route_floors "2048 3072" "1024 1536" --gqa-expanded --rounds 5
  ;;
3)
  gpu_tests 150 4 tests/flashtrain/test_gpt.py tests/kernels/test_flash_bwd_fused_hopper.py \
    -k "auto or (gqa_expanded and (2048 or 1200 or 512))"
  gqa_cudnn 150 ab_cudnn_gqa_route_floors_again "2048" "512 768 1024" --gqa-expanded --rounds 5
  for run in 1 2; do
    train_table 150 3 train_medium_d128_gqa_2k_$run --models gpt2_medium_d128_gqa --seqlens 2048 \
      --impls sdpa_cudnn,triton
  done
  ;;
4)
  gpu_tests 100 4 tests/flashtrain/test_gpt.py -k "auto"
  gqa_cudnn 170 ab_cudnn_gqa_32_8_final "2048 4096 16384" "1024 4096 16384" --rounds 3
  ;;
5)
  gpu_tests 100 4 tests/flashtrain/test_gpt.py -k "auto"
  for run in 1 2; do
    train_table 120 2 train_medium_d128_1k_auto_$run --models gpt2_medium_d128 --seqlens 1024 --impls sdpa_cudnn,auto
  done
  train_table 120 2 train_medium_d128_gqa_2k_auto --models gpt2_medium_d128_gqa --seqlens 2048 \
    --impls sdpa_cudnn,auto
  ;;
6)
  train_table 150 3 train_medium_d128_gqa_2k_three_1 --models gpt2_medium_d128_gqa --seqlens 2048 \
    --impls sdpa_cudnn,triton,auto
  train_table 120 2 train_medium_d128_gqa_2k_three_2 --models gpt2_medium_d128_gqa --seqlens 2048 --impls auto,triton
  ;;
esac
