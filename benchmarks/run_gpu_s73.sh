#!/usr/bin/env bash
# Session 73's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s73.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s73/callN/.
#   1: Hopper's dq kernel reads a wide `out` (64-bit row-group offsets; session 72's route was the portable
#      WIDE dq): dq_route_cost (128k causal fwd+bwd, WIDE forced, the two dq routes) and causal_bwd_full
#      (1.11M tokens x 16 heads x 128, every head: now all Hopper kernels, and a warm call's seconds) alone
#      first; then, beside the extent and Hopper dq GPU tests, session 72's causal cases with their fixed
#      references and decode's WIDE build in its session-72 review form
#   2: the Hopper dq GPU test on a wide out (call 1 gave it head dim 64, which the kernel has no config for);
#      the usual build's cost of the change (ab_trees.py: session 72's dq kernel file, put in the checkout
#      beforehand by `git show 42ae63e:kernels/_flash_dq_hopper.py > .ab_base/_flash_dq_hopper.py`, against this one, on
#      a shape whose dq takes it: d128 GQA 32 on 8, causal 16k); the anchors
#      (SDPA cuDNN and flash) on causal fwd+bwd of 1.11M tokens x 16 heads of 128
#   3: cuDNN's dq in call 2 was 2.5e-3 off float32 in the last rows (ours and SDPA flash 2.5e-5-2.8e-5):
#      ours and cuDNN again at 1.11M tokens and at 512k (1.07e9 elements, under 2**31), with the
#      references' scales: does its error come with the length or with the 2**31 extent?
#   4: call 3: right at 512k (4.0e-5), wrong at 1.11M (2.2e-3 of a largest 8.1e-3). cuDNN alone at 1.11M
#      tokens x 8 heads (past 2**20 rows, 1.14e9 elements) and 655k x 32 heads (2.7e9 elements, under 2**20
#      rows): which limit is it?
#   5: call 4: right at 8 heads (2.6e-5); 32 heads ran out of memory (135 GB held). 20 heads of 983k tokens
#      (2.5e9 elements, under 2**20 rows), its peak memory reported
#   6: call 5: out of memory too. cuDNN on 9 sequences of 131k x 16 x 128 (2.4e9 elements in all, each
#      sequence 2.7e8), beside ours; cuDNN at 1.11M x 16 again for its peak memory
#   7: call 6 gave ours a process peak of 123 GB at 1.11M x 16 x 128 (46.7 over 9 x 131k): each call's own
#      peak (beyond what it found held), first and warm call
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  timeout -s KILL 280 python benchmarks/check_large_offsets.py --cases dq_route_cost causal_bwd_full \
    --out "$R/large_offsets_dq.json" 2>&1 | quiet | cut -c1-600
  T=tests/kernels
  timeout -s INT 240 python -m pytest -q -rf -n 3 $T/test_sequence_extent.py > "$R/cuda_extent_tests.log" 2>&1 &
  timeout -s INT 240 python -m pytest -q -rf -n 3 -m gpu $T/test_flash_bwd_hopper.py $T/test_block_sparse_hopper.py \
    -k dq > "$R/hopper_dq_tests.log" 2>&1 &
  timeout -s KILL 240 python benchmarks/check_large_offsets.py --cases causal causal_bwd decode \
    --out "$R/large_offsets_causal.json" 2>&1 | quiet | cut -c1-600
  wait
  echo "extent tests:"; tail -n 3 "$R/cuda_extent_tests.log"
  echo "hopper dq tests:"; tail -n 3 "$R/hopper_dq_tests.log"
  ;;
2)
  timeout -s INT 200 python -m pytest -q -rf tests/kernels/test_sequence_extent.py -k hopper_dq 2>&1 | tail -n 2
  mkdir -p /tmp/base && cp -r kernels /tmp/base/ && cp .ab_base/_flash_dq_hopper.py /tmp/base/kernels/
  timeout -s KILL 150 python benchmarks/ab_trees.py --trees /tmp/base . --rounds 4 --reps 10 --out "$R/ab_dq_offsets.json" \
    --shapes 1,16384,32,8,128,1 2>&1 | quiet | cut -c1-300
  timeout -s KILL 300 python benchmarks/check_large_offsets.py --cases anchors --out "$R/large_offsets_anchors.json" \
    2>&1 | quiet | cut -c1-900
  ;;
3)
  for n in 524288 1114112; do
    timeout -s KILL 240 python benchmarks/check_large_offsets.py --cases anchors_cudnn --tokens $n \
      --out "$R/large_offsets_anchors_cudnn_$n.json" 2>&1 | quiet | cut -c1-900
  done
  ;;
4)
  timeout -s KILL 200 python benchmarks/check_large_offsets.py --cases cudnn_h8 --tokens 1114112 \
    --out "$R/large_offsets_cudnn_h8.json" 2>&1 | quiet | cut -c1-900
  timeout -s KILL 200 python benchmarks/check_large_offsets.py --cases cudnn_h32 --tokens 655360 \
    --out "$R/large_offsets_cudnn_h32.json" 2>&1 | quiet | cut -c1-900
  ;;
5)
  timeout -s KILL 300 python benchmarks/check_large_offsets.py --cases cudnn_h20 --tokens 983040 \
    --out "$R/large_offsets_cudnn_h20.json" 2>&1 | quiet | cut -c1-900
  ;;
6)
  timeout -s KILL 150 python benchmarks/check_large_offsets.py --cases cudnn_batch --tokens 131072 \
    --out "$R/large_offsets_cudnn_batch.json" 2>&1 | quiet | cut -c1-900
  timeout -s KILL 220 python benchmarks/check_large_offsets.py --cases anchors_cudnn \
    --out "$R/large_offsets_anchors_cudnn.json" 2>&1 | quiet | cut -c1-900
  ;;
7)
  timeout -s KILL 200 python benchmarks/check_large_offsets.py --cases ours_memory \
    --out "$R/large_offsets_ours_memory.json" 2>&1 | quiet | cut -c1-900
  ;;
esac
