#!/usr/bin/env bash
# Device calls on one GPU (session 29). Each part is what one call ran; the outputs are in
# benchmarks/results/s29/callN/ (call1-call5 on an H100: parts 1, 2, 3, 3 again, 4; call6-call10 on an
# H200: parts 5 to 9; call11 on an H100: part 10; each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s29.sh 1   # where GPT-2 medium 1k's step goes with our attention against SDPA
#       cuDNN (device busy against wall, the top kernels), the layer's attention kernels alone (ours,
#       cuDNN, SDPA flash: b16 n1k h16 d64 causal), and the host functions of our step
#   bash benchmarks/run_gpu_s29.sh 2   # (part 1, on an H100: ours and cuDNN 177.5k tokens/s, ours busy 89.6 of
#       92.3 ms per step) where in the step the device idles (benchmarks.common.device_gaps), medium 1k and
#       8k, ours and cuDNN
#   bash benchmarks/run_gpu_s29.sh 3   # (part 2: at 1k ours idles 2.5 of 94 ms per profiled step, so the step
#       is the device's) the forward's persistent variant: correctness on the edge shapes and speed against
#       the row-tile kernel, the portable one and SDPA (dense, d64 and d128), then on block-sparse butterfly
#       layouts at n16k against Flex (forward alone)
#   bash benchmarks/run_gpu_s29.sh 4   # (part 3, on an H100: d64 and d128 with 3 stages correct, d128 with 4
#       stages wrong (its separate output buffers took 230 KB); long causal calls slower than the row-tile
#       kernel) out through the Q buffers (d128 with 4 stages fits), items in snake order; part 3 again
#   bash benchmarks/run_gpu_s29.sh 5   # (part 4: every config correct; the block-sparse part ran out of its
#       time) with the persistent variant dispatched (full calls, causal up to 4k): the forward's GPU
#       tests, then block-sparse d128 n16k forward, persistent against row-tile and Flex
#   bash benchmarks/run_gpu_s29.sh 6   # (part 5, one H200: 127 forward GPU tests passed; block-sparse d128
#       forward 0.80-0.83x the row-tile time at 0.8-2.3% density) with the block-sparse d128 forward on the
#       persistent variant: the block-sparse GPU tests, GPT-2 medium 1k (ours now with the persistent d64
#       forward, and SDPA cuDNN), block-sparse d64 n16k forward
#   bash benchmarks/run_gpu_s29.sh 7   # (part 6: block-sparse GPU tests 167 passed, 1 failed (the compiled-launch
#       test counted the row-tile forward's launches only); GPT-2 medium 1k ours 183.8k tokens/s against
#       cuDNN's 195.4k, below session 23's 189k) GPT-2 medium 1k with the Hopper forward off (portable, as
#       before this session at d64 1k) and on, twice, alternating, with the step's top kernels
#   bash benchmarks/run_gpu_s29.sh 8   # (part 7: 192.5k/192.7k tokens/s off, 194.9k/192.7k on; the compiled-
#       launch tests passed) fwd and fwd+bwd at d64 and d128, 1k and 4k, against the anchors
#   bash benchmarks/run_gpu_s29.sh 9   # (part 8: d128 n1k causal fwd+bwd 209 TFLOP/s eager, 0.82x Flex, where
#       session 28 had 272) that row again, twice, eager and replayed from CUDA graphs
#   bash benchmarks/run_gpu_s29.sh 10   # the session's final tree: the Hopper forward, backward and
#       block-sparse GPU tests
source benchmarks/gpu_call.sh
machine_info
case "${1:?part 1}" in
1)
  for impl in triton sdpa_cudnn; do
    timeout 200 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 --impls $impl \
      --profile 3 --profile-top 40 --out "$R/train_medium1k_profile_$impl.json" 2>&1 | quiet \
      | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  done
  timeout 120 python benchmarks/profile_attention.py --shape 16,1024,16,64,causal \
    --impls triton sdpa_cudnn sdpa_flash --iters 20 --out "$R/profile_medium1k_layer.json" 2>&1 | quiet | tail -n 24
  timeout 200 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 --impls triton \
    --host-profile 3 --out "$R/train_medium1k_host_profile.json" 2>&1 | quiet \
    | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  ;;
2)
  for impl in triton sdpa_cudnn; do
    for n in 1024 8192; do
      timeout 200 python benchmarks/bench_train.py --models gpt2_medium --seqlens $n --impls $impl \
        --gaps 3 --out "$R/train_medium${n}_gaps_$impl.json" 2>&1 | quiet \
        | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
    done
  done
  ;;
3)
  HANG_S=420 timeout 450 python benchmarks/check_hopper_fwd.py --headdims 64 128 --out "$R/check_fwd_persistent.json" \
    2>&1 | quiet | tee "$R/check_fwd_persistent.log" | grep -v "^ok" | tail -n 40
  for d in 128 64; do
    timeout 150 python benchmarks/check_persistent_fwd.py --seqlen 16384 --headdim $d \
      --out "$R/persistent_bs_d${d}_n16k.json" 2>&1 | quiet | tee -a "$R/persistent_bs.log" | grep "^n"
  done
  ;;
4)
  HANG_S=330 timeout 340 python benchmarks/check_hopper_fwd.py --headdims 64 128 --out "$R/check_fwd_persistent.json" \
    2>&1 | quiet | tee "$R/check_fwd_persistent.log" | grep -v "^FAIL.*shape" | tail -n 40
  for d in 128 64; do
    timeout 110 python benchmarks/check_persistent_fwd.py --seqlen 16384 --headdim $d \
      --out "$R/persistent_bs_d${d}_n16k.json" 2>&1 | quiet | tee -a "$R/persistent_bs.log" | grep "^n"
  done
  ;;
5)
  timeout -s INT 260 python -m pytest -q -n 8 -m gpu tests/kernels/test_flash_fwd_hopper.py -rf \
    > "$R/gpu_tests_fwd.log" 2>&1; tail -n 5 "$R/gpu_tests_fwd.log"
  timeout 230 python benchmarks/check_persistent_fwd.py --seqlen 16384 --headdim 128 \
    --out "$R/persistent_bs_d128_n16k.json" 2>&1 | quiet | tee -a "$R/persistent_bs.log" | grep "^n"
  ;;
6)
  timeout -s INT 200 python -m pytest -q -n 8 -m gpu tests/kernels/test_block_sparse_hopper.py -rf \
    > "$R/gpu_tests_block_sparse.log" 2>&1; tail -n 5 "$R/gpu_tests_block_sparse.log"
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 --impls triton,sdpa_cudnn \
    --out "$R/train_medium1k.json" 2>&1 | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  timeout 200 python benchmarks/check_persistent_fwd.py --seqlen 16384 --headdim 64 \
    --out "$R/persistent_bs_d64_n16k.json" 2>&1 | quiet | tee -a "$R/persistent_bs.log" | grep "^n"
  ;;
7)
  for run in 1 2; do
    for hopper in 0 1; do
      FLASHTRAIN_HOPPER_FWD=$hopper timeout 130 python benchmarks/bench_train.py --models gpt2_medium \
        --seqlens 1024 --impls triton --profile 2 --profile-top 12 --out "$R/train_medium1k_hopper_fwd_${hopper}_run$run.json" \
        2>&1 | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
    done
  done
  timeout -s INT 100 python -m pytest -q -n 4 -m gpu tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py -k compiled_launches -rf 2>&1 | tail -n 3
  ;;
8)
  timeout 330 python benchmarks/bench_attention.py --headdims 64 128 --seqlens 1024 4096 \
    --impls sdpa_flash sdpa_cudnn flex triton --out "$R/attention_n1k_n4k.json" 2>&1 | quiet | tail -n 40
  ;;
9)
  for run in 1 2; do
    timeout 130 python benchmarks/bench_attention.py --headdims 128 --seqlens 1024 --causal causal --graphs \
      --impls sdpa_flash flex triton --out "$R/attention_d128_n1k_causal_run$run.json" 2>&1 | quiet | tail -n 4
  done
  ;;
10)
  timeout -s INT 400 python -m pytest -q -n 8 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_block_sparse_hopper.py -rf \
    > "$R/gpu_tests_hopper_final.log" 2>&1; tail -n 5 "$R/gpu_tests_hopper_final.log"
  ;;
esac
