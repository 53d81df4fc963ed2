#!/usr/bin/env bash
# Session 87's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s87.sh PART, results in $OUT/results.tgz
# (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s87/callN/.
#   1: causal 64k (cuDNN ÷ ours 1.034, our SM clock 1590 MHz against cuDNN's 1665 at the same ~690 W): does the
#      ordered backward's releasing warps' spin on their counts draw power? Their waits with a nanosleep between
#      reads (`SPIN_SLEEP_NS`, 100 and 1000 ns; removed after the calls: `git apply
#      benchmarks/results/s87/call1/spin_sleep.patch` for part 1), and the causal convoy in two key groups (its dq sum now one pass at
#      copy bandwidth), against the default and cuDNN, settled at the power cap, clocks sampled; then the
#      200 ns sleep at causal 16k and 32k
#   2: call 1: the sleeps within the spread (÷ the default 1.002 / 1.005 at 64k, 0.996 / 0.997 at 16k / 32k at 200 ns;
#      the same clocks); the causal convoy in two key groups 0.992 at 64k (cuDNN ÷ it 1.056, ÷ the default 1.047),
#      faster in every round. The convoy's lengths (24k-64k) in two and three key groups against one and cuDNN
#   3: call 2: three key groups ÷ one 0.976 / 0.980 / 0.981 / 0.975 at 24k / 32k / 48k / 64k (two 0.981-0.992), every
#      round; cuDNN ÷ ours in three 1.069-1.078. Change: the causal convoy in three key groups by default. Its GPU
#      tests (the sums; the deterministic route at causal 17k-48k takes the convoy), then settled against one and
#      four key groups at 16 heads (32k, 64k) and 8 heads (24k, 64k: session 54 had three groups lose there at
#      24k-40k, then on torch's sum)
#   4: call 3: GPU tests 30 passed; three key groups (the default) against one / four: 16 heads 32k 1.015 / 1.002 (64k
#      killed at its time limit), 8 heads 24k 1.033 / 0.996, 64k 1.023 / 0.993 (one ÷ three, four ÷ three). Now
#      deterministic=False (the unordered kernel from causal 12k, `ordered_is_faster`) against the default at the
#      convoy's lengths, settled with cuDNN: causal 24k, 32k, 64k
#   5: call 4: the ordered kernel ÷ the unordered one 0.992 / 0.989 / 0.989 at causal 24k / 32k / 64k (every round
#      0.982-0.997; cuDNN ÷ the default 1.066 / 1.067 / 1.071), so `ordered_is_faster` takes causal calls from 24k.
#      The same between: causal 12k, 16k (two key groups) and 20k (the convoy). Outcome (call 5): 0.997 / 0.995 /
#      0.983, every round under 1, so `ordered_is_faster` takes every causal call the ordered kernel takes
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  settled_cudnn 240 spin_64k yes 65536 --deterministic-only --spin-sleep 100 1000 --also-convoy-key-groups 2
  clock_medians "$R/spin_64k_causal_yes.json"
  settled_cudnn 200 spin_16k_32k yes "16384 32768" --deterministic-only --spin-sleep 200
  clock_medians "$R/spin_16k_32k_causal_yes.json"
  ;;
2)
  settled_cudnn 330 convoy_groups yes "24576 32768 49152 65536" --deterministic-only --also-convoy-key-groups 2 3
  clock_medians "$R/convoy_groups_causal_yes.json"
  ;;
3)
  gpu_tests 230 8 tests/kernels/test_grad_sums.py tests/kernels/test_flash_bwd_fused_hopper.py \
    -k "sums or deterministic_backward_takes_the_ordered"
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  settled_cudnn 130 convoy_groups_16_heads yes "32768 65536" --deterministic-only --also-convoy-key-groups 1 4
  clock_medians "$R/convoy_groups_16_heads_causal_yes.json"
  settled_cudnn 130 convoy_groups_8_heads yes "24576 65536" --nheads 8 --deterministic-only --also-convoy-key-groups 1 4
  clock_medians "$R/convoy_groups_8_heads_causal_yes.json"
  ;;
4)
  settled_cudnn 260 default_and_nondeterministic yes "24576 32768 65536"
  clock_medians "$R/default_and_nondeterministic_causal_yes.json"
  ;;
5)
  settled_cudnn 230 default_and_nondeterministic yes "12288 16384 20480"
  clock_medians "$R/default_and_nondeterministic_causal_yes.json"
  ;;
esac
