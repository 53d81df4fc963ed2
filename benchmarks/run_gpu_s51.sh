#!/usr/bin/env bash
# Device calls on one GPU (session 51). Each part is what one call ran; the outputs are in
# benchmarks/results/s51/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s51.sh 1   # session 50's part 7 (refused): the ordered routing GPU tests with the 48k case
#       in blocks, and the determinism switch's; then fwd+bwd against SDPA cuDNN at causal 48k / 64k on the blocked
#       convoy (ab_cudnn.py --two-kernels, five rounds) and the issue's d128 n64k rows again (bench_attention.py).
#       Ran on commit 5b73d7f, with session 50's blocks; on a later tree 48k and 64k walk down
#   bash benchmarks/run_gpu_s51.sh 2   # the causal convoy walking each program's tiles from the last (DOWN, the CPU
#       model's down:blocks:1): the ordered GPU tests on every edge case (up and down, blocks of 1 and 3), then the
#       backward alone at causal 32k / 48k / 64k, blocks of 1 and 16, walking up and down, against the two kernels
#       and the unordered kernel (ab_fused_bwd.py --walk-down, three rounds), and the same with GQA (2 query heads a
#       key head) at 32k
#   bash benchmarks/run_gpu_s51.sh 3   # the rule from call 2 (past 32k the causal convoy walks down, blocks of 1): the
#       ordered routing GPU tests (48k among them) and the determinism switch's, fwd+bwd against SDPA cuDNN at causal
#       48k / 64k (ab_cudnn.py --two-kernels, five rounds), and the causal convoy with GQA walking up and down
#       (ab_fused_bwd.py --walk-down, three rounds): 2 query heads a key head at 16k / 48k / 64k, 4 at 32k / 64k
#   bash benchmarks/run_gpu_s51.sh 4   # the kept tree: the GPU tests of the Hopper backward, Hopper block-sparse, packed
#       QKV and dense kernel files (the slow portable-autotune test beside them), then the issue's d128 n64k rows
#       again (bench_attention.py: causal 64k now walks down)
#   bash benchmarks/run_gpu_s51.sh 5   # walking down against blocks again, five rounds (the rule rests on call 2's three):
#       the backward alone at causal 40k / 48k / 64k, blocks of 1 and 16, up and down (ab_fused_bwd.py --walk-down);
#       then Nsight Compute's L2 hit rate and DRAM bytes of the backward walking down at causal 48k and 64k
#       (ncu_backward, as session 50's calls 4-5)
#   bash benchmarks/run_gpu_s51.sh 6   # the kept tree against SDPA cuDNN over the rest of the convoys' range: fwd+bwd at
#       causal 16k / 32k / 40k (40k walks down) and full 16k / 32k (ab_cudnn.py --two-kernels, five rounds)
#   bash benchmarks/run_gpu_s51.sh 7   # the causal convoy with GQA in launch blocks (call 3: walking down in blocks of 1,
#       0.89-0.96x the two kernels past 32k): the backward alone with 2 query heads a key head at 48k / 64k and 4
#       at 32k / 64k, blocks of 16 and 32, up and down (ab_fused_bwd.py --walk-down, three rounds)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  timeout -s KILL 150 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "takes_the_ordered or torch_deterministic" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  timeout -s KILL 230 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal yes \
    --seqlens 49152 65536 --rounds 5 --out "$R/ab_cudnn_d128_causal_blocks.json" 2>&1 | quiet | ratios
  d128_against_anchors 190 65536
  ;;
2)
  timeout -s KILL 150 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered_fused_backward_matches" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  timeout -s KILL 200 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 32768 49152 65536 --rounds 3 \
    --convoy-blocks 1 16 --walk-down --causal-convoy-upto 65536 --out "$R/ab_walk_down.json" 2>&1 | quiet
  timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --ordered --causal --group 2 --ordered-max-group 2 \
    --seqlens 32768 --rounds 3 --convoy-blocks 1 16 --walk-down --out "$R/ab_walk_down_gqa2.json" 2>&1 | quiet
  ;;
3)
  timeout -s KILL 150 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "takes_the_ordered or torch_deterministic" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  timeout -s KILL 200 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal yes \
    --seqlens 49152 65536 --rounds 5 --out "$R/ab_cudnn_d128_causal_down.json" 2>&1 | quiet | ratios
  for point in "2 16384 49152 65536" "4 32768 65536"; do
    set -- $point
    timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --ordered --causal --group $1 --ordered-max-group $1 \
      --seqlens ${@:2} --rounds 3 --convoy-blocks 1 --walk-down --causal-convoy-upto 65536 \
      --out "$R/ab_walk_down_gqa$1.json" 2>&1 | quiet | cut -c1-200
    python -c "import json, sys; [print(r['seqlen'], {k: round(v, 3) for k, v in r.items() if k.startswith('deterministic_over')}) for r in json.load(open(sys.argv[1]))['rows']]" "$R/ab_walk_down_gqa$1.json"
  done
  ;;
4)
  hopper_backward_tests
  d128_against_anchors 170 65536
  ;;
5)
  timeout -s KILL 200 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 40960 49152 65536 --rounds 5 \
    --convoy-blocks 1 16 --walk-down --causal-convoy-upto 65536 --out "$R/ab_walk_down_r5.json" 2>&1 | quiet \
    | cut -c1-100
  python -c "import json, sys; [print(r['seqlen'], {k: round(v, 3) for k, v in r.items() if k.startswith('deterministic_over')}) for r in json.load(open(sys.argv[1]))['rows']]" "$R/ab_walk_down_r5.json"
  ncu_backward "down 49152 triton causal" "down 65536 triton causal"
  ;;
6)
  for causal in yes no; do
    timeout -s KILL 170 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $causal \
      --seqlens 16384 32768 $([ $causal = yes ] && echo 40960) --rounds 5 \
      --out "$R/ab_cudnn_d128_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
7)
  for point in "2 49152 65536" "4 32768 65536"; do
    set -- $point
    timeout -s KILL 110 python benchmarks/ab_fused_bwd.py --ordered --causal --group $1 --ordered-max-group $1 \
      --seqlens ${@:2} --rounds 3 --convoy-blocks 16 32 --walk-down --causal-convoy-upto 65536 \
      --out "$R/ab_blocks_gqa$1.json" 2>&1 | quiet | cut -c1-100
    python -c "import json, sys; [print(r['seqlen'], {k: round(v, 3) for k, v in r.items() if k.startswith('deterministic_over')}) for r in json.load(open(sys.argv[1]))['rows']]" "$R/ab_blocks_gqa$1.json"
  done
  ;;
esac
