#!/usr/bin/env bash
# Session 75's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s75.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s75/callN/.
#   1: session 74's review mends on a GPU (the GQA route's and `auto`'s GPU tests, never rerun after the shared
#      predicate); then GQA never timed: head dim 64 (GPT-2's, 32 query heads on 8) against SDPA cuDNN, and head
#      dim 128 under 4k keys (32 on 8, 1k and 2k) with the route on repeated K/V forced, alternating rounds
#   2: call 1: d64 GQA 0.95-0.96x cuDNN at 4k-16k (as MHA), 1.07-1.18x at 1k; d128 GQA under 4k ours (two kernels)
#      1.01-1.12x cuDNN, the route no faster there (0.99-1.01x). A second run, 512 to 4k keys in five rounds,
#      then GPT-2 medium's width in 8 heads of 128 on 2 kv heads at 1k and 2k, cuDNN and ours (fresh processes)
#   3: call 2: kernels 1.01-1.25x cuDNN at 512-2k, 0.983 / 0.996 at 4k; end to end 0.963x at 1k (ours' step times
#      spread 71-83 ms), 1.028x at 2k. The same model again at 1k with the GPU's clocks sampled, at 4k, and at 32k
#      (one sequence of 32k a step: GQA end to end past 16k, never run)
#   4: call 3: GQA end to end 0.941x cuDNN at 1k (ours' steps 71.7-90.3 ms, cuDNN's 72.3-76.0), 0.994x at 4k, 1.007x at
#      32k. `auto` takes ours for MHA at head dim 128 at every length, but under 4k its kernels were last timed in
#      sessions 44-47 (0.97-0.99x cuDNN) and its model never: d128 MHA at 512-2k against cuDNN on this tree (five
#      rounds), then GPT-2 medium's width in 8 heads of 128 at 1k and 2k, cuDNN and ours
#   5: call 4: MHA kernels 1.006-1.042x cuDNN at 1k-2k (full 512 0.82, ours' rounds 0.61-0.91 ms: the host), the MHA
#      model 1.023 / 1.016x at 1k / 2k: `auto`'s MHA rule holds there. Yet the GQA model at 1k runs 0.94-0.96x with
#      ours' steps spread: where its device idles (--gaps) and its host's top functions, MHA beside it
#   6: call 5: that process ran fast (1.010x cuDNN, device idle 2.7 ms a step). The GQA model at 1k with ours in three
#      more fresh processes and cuDNN in one, each with its gaps and host profile: a slow process's against a fast one's
#   7: call 6: ours 1.020 / 0.943 / 1.033x, the host deciding. `auto` takes GQA at head dim 128 up to 64k keys, timed end to
#      end up to 32k: the GQA model at 64k (one sequence a step), cuDNN and ours
#   8: the options' new bool checks (return_lse, deterministic) and the zero-head check on CUDA: the GPU tests of the
#      dense, decode and block-sparse kernels and of the model's backends
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  timeout -s KILL 200 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_fused_hopper.py \
    tests/flashtrain/test_gpt.py -k "repeated_kv or auto or takes_the_ordered_kernel" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  for causal in yes no; do
    timeout -s KILL 130 python benchmarks/ab_cudnn.py --headdims 64 --nheads 32 --nheads-kv 8 --causal $causal \
      --seqlens 1024 4096 16384 --rounds 3 --out "$R/ab_cudnn_d64_gqa_32_8_causal_$causal.json" 2>&1 | quiet | ratios
  done
  for causal in yes no; do
    timeout -s KILL 100 python benchmarks/ab_cudnn.py --gqa-expanded --headdims 128 --nheads 32 --nheads-kv 8 \
      --causal $causal --seqlens 1024 2048 --rounds 3 --out "$R/ab_cudnn_gqa_expanded_short_causal_$causal.json" \
      2>&1 | quiet | ratios
  done
  ;;
2)
  for causal in yes no; do
    timeout -s KILL 150 python benchmarks/ab_cudnn.py --headdims 128 --nheads 32 --nheads-kv 8 --causal $causal \
      --seqlens 512 1024 2048 4096 --rounds 5 --out "$R/ab_cudnn_gqa_32_8_short_causal_$causal.json" 2>&1 | quiet | ratios
  done
  timeout 280 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 1024,2048 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_short.json" 2>&1 | quiet | grep "^|" | tail -n 8
  ;;
3)
  timeout 200 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 1024,4096 --gpu-clocks \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_1k_4k.json" 2>&1 | quiet | grep "^|" | tail -n 6
  timeout 200 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 32768 --tokens-per-step 32768 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_32k.json" 2>&1 | quiet | grep "^|" | tail -n 4
  ;;
4)
  for causal in yes no; do
    timeout -s KILL 130 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --seqlens 512 1024 2048 \
      --rounds 5 --out "$R/ab_cudnn_d128_short_causal_$causal.json" 2>&1 | quiet | ratios
  done
  timeout 300 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 1024,2048 --gpu-clocks \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_short.json" 2>&1 | quiet | grep "^|" | tail -n 6
  ;;
5)
  for model in gpt2_medium_d128_gqa gpt2_medium_d128; do
    timeout 200 python benchmarks/bench_train.py --models $model --seqlens 1024 --impls triton --gaps 5 \
      --host-profile 5 --out "$R/train_${model}_1k_gaps.json" 2>&1 | quiet | grep "^|" | tail -n 2
  done
  ;;
6)
  for run in 1 2 3; do
    timeout 150 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 1024 --impls triton --gaps 5 \
      --host-profile 5 --out "$R/train_gqa_1k_triton_run$run.json" 2>&1 | quiet | grep "^| gpt2" | tail -n 1
  done
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 1024 --impls sdpa_cudnn --gaps 5 \
    --host-profile 5 --out "$R/train_gqa_1k_cudnn.json" 2>&1 | quiet | grep "^| gpt2" | tail -n 1
  ;;
7)
  timeout 400 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 65536 --tokens-per-step 65536 \
    --steps 6 --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_64k.json" 2>&1 | quiet | grep "^|" | tail -n 4
  ;;
8)
  T=tests/kernels
  timeout -s KILL 240 python -m pytest -q -n 4 -rf -m gpu $T/test_flash_attention.py $T/test_decode.py \
    $T/test_block_sparse.py tests/flashtrain/test_gpt.py > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  ;;
esac
