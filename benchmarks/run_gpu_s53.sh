#!/usr/bin/env bash
# Device calls on one GPU (session 53). Each part is what one call ran; the outputs are in
# benchmarks/results/s53/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s53.sh 1   # session 52's review mend on the GPU (the ordered and determinism tests), many
#       bitwise repeats of the default d128 backward in each of its orders (check_determinism.py, 300 repeats: one key
#       group, the causal convoy walking up and down, the full-attention rotation and convoy), then the routing rules
#       tuned on the consumers before the staged dQ, the backward alone (ab_fused_bwd.py, five rounds): walking down
#       against up at causal 24k-40k, and causal GQA (2 and 4 query heads a key head) and full GQA (4) in the ordered
#       kernel against the two kernels
#   bash benchmarks/run_gpu_s53.sh 2   # the backward alone again (ab_fused_bwd.py, five rounds): walking down against up at
#       causal 16k-32k, causal GQA with 2 query heads a key head in one key group (2k-8k); then the issue's benchmark at
#       d128 n16k and n64k on session 52's staged dQ (bench_attention.py: ours, SDPA cuDNN, FlexAttention, SDPA flash)
#   bash benchmarks/run_gpu_s53.sh 3   # the routing of calls 1-2 (walking down past 20k, causal GQA with 2 query heads a
#       key head in one key group): the ordered and determinism GPU tests, fwd+bwd against SDPA cuDNN at causal 24k /
#       32k (ab_cudnn.py --two-kernels, five rounds), then GPT-2 medium's width in 8 heads of 128 trained at 8k and 16k
#       with SDPA pinned to cuDNN and with ours (bench_train.py, each row in a fresh process)
#   bash benchmarks/run_gpu_s53.sh 4   # `auto` taking ours over cuDNN at head dim 128 without GQA on sm_90: the GPU tests
#       of the dense kernel file (causal GQA with 2 query heads a key head now takes the ordered backward) and of auto's
#       choice, then GPT-2 medium's width in heads of 128 at 4k and 8k, SDPA pinned to cuDNN against `auto`
#   bash benchmarks/run_gpu_s53.sh 5   # the GPU tests of the Hopper backward and packed-QKV files on calls 1-4's routing
#       (the slow portable-autotune test left out), then GPT-2 medium's width in heads of 128 at 16k again, SDPA pinned
#       to cuDNN against `auto`
#   bash benchmarks/run_gpu_s53.sh 6   # the CUDA-graph tests with the ordered backward's cases added (`auto` now gives it
#       head dim 128 calls, under trainer.cuda_graphs too), then 100 bitwise repeats of full attention at 64k (the
#       convoy), which call 1's 300 did not reach
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
summary() { python -c "import json, sys; [print(r['seqlen'], r['group'], {k: round(v, 3) for k, v in r.items() if '_over_' in k}) for r in json.load(open(sys.argv[1]))['rows']]" "$1"; }
case "$1" in
1)
  ordered_tests
  timeout -s KILL 100 python benchmarks/check_determinism.py --impls triton --repeats 300 \
    --shape 2,8192,16,128,causal --shape 1,16384,16,128,causal --shape 1,49152,16,128,causal \
    --shape 4,4096,16,128 --shape 1,65536,16,128 --out "$R/stress_repeats.json" 2>&1 | quiet | cut -c1-300
  timeout -s KILL 110 python benchmarks/ab_fused_bwd.py --ordered --causal --walk-down --seqlens 24576 32768 40960 \
    --rounds 5 --out "$R/ab_walk_down.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_walk_down.json"
  timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --ordered --causal --group 2 --ordered-max-group 2 \
    --seqlens 4096 8192 16384 32768 65536 --rounds 5 --out "$R/ab_causal_gqa2.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_causal_gqa2.json"
  timeout -s KILL 60 python benchmarks/ab_fused_bwd.py --ordered --causal --group 4 --ordered-max-group 4 \
    --seqlens 8192 32768 --rounds 5 --out "$R/ab_causal_gqa4.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_causal_gqa4.json"
  timeout -s KILL 60 python benchmarks/ab_fused_bwd.py --ordered --group 4 --ordered-max-group 4 \
    --seqlens 4096 8192 16384 --rounds 5 --out "$R/ab_full_gqa4.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_full_gqa4.json"
  ;;
2)
  timeout -s KILL 110 python benchmarks/ab_fused_bwd.py --ordered --causal --walk-down --seqlens 16384 20480 24576 32768 \
    --rounds 5 --out "$R/ab_walk_down.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_walk_down.json"
  timeout -s KILL 60 python benchmarks/ab_fused_bwd.py --ordered --causal --group 2 --ordered-max-group 2 \
    --seqlens 2048 4096 6144 8192 --rounds 5 --out "$R/ab_causal_gqa2.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_causal_gqa2.json"
  d128_against_anchors 280 16384 65536
  ;;
3)
  ordered_tests
  timeout -s KILL 100 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal yes --seqlens 24576 32768 \
    --rounds 5 --out "$R/ab_cudnn_d128_causal_yes.json" 2>&1 | quiet | ratios
  timeout 330 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 8192,16384 --impls sdpa_cudnn,triton \
    --out "$R/train_medium_d128.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
4)
  timeout -s KILL 220 python -m pytest -q -n 5 -rf -m gpu tests/kernels/test_flash_attention.py \
    > "$R/gpu_tests_kernels.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_kernels.log"
  timeout -s KILL 100 python -m pytest -q -rf -m gpu tests/flashtrain/test_gpt.py > "$R/gpu_tests_auto.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_auto.log"
  timeout 300 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 4096,8192 --impls sdpa_cudnn,auto \
    --out "$R/train_medium_d128_auto.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
5)
  T=tests/kernels
  timeout -s KILL 280 python -m pytest -q -n 5 -rf -m gpu $T/test_flash_bwd_hopper.py $T/test_qkvpacked.py \
    --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 16384 --impls sdpa_cudnn,auto \
    --out "$R/train_medium_d128_auto.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
6)
  timeout -s KILL 120 python -m pytest -q -rf tests/kernels/test_cuda_graphs.py > "$R/gpu_tests_graphs.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_graphs.log"
  timeout -s KILL 100 python benchmarks/check_determinism.py --impls triton --repeats 100 --shape 1,65536,16,128 \
    --out "$R/stress_repeats_full64k.json" 2>&1 | quiet | cut -c1-300
  ;;
esac
