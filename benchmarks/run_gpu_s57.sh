#!/usr/bin/env bash
# Device calls on one GPU (session 57). Each part is what one call ran; the outputs are in
# benchmarks/results/s57/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s57.sh 1   # FlashAttention-3's ping-pong in the Gluon forward, on named barriers
#       (`_flash_fwd_hopper.wait_turn`): every forward config with it on the edge shapes
#       (check_hopper_fwd.py, correctness only), then timed alternating against cuDNN's forward
#       (ab_fwd_configs.py --pingpong, five rounds) at d128 causal / full 2k-16k and d64 causal 4k-16k;
#       then GPT-2 medium 8k with the GPU's SM clock and power sampled (bench_train.py --gpu-clocks), d64 on the
#       two kernels and on the ordered one-kernel backward, alternating, in-process
#   bash benchmarks/run_gpu_s57.sh 2   # with the turns on by default (d128 full calls' row-tile kernel, d64's persistent
#       variant: `_flash_fwd_hopper.PINGPONG_CONFIGS`): the forward's and packed-QKV GPU tests; the forward alone
#       (ab_fwd_configs.py --pingpong, five rounds) at d64 full 1k-16k and causal 1k-2k, d128 full 32k-64k; then
#       fwd+bwd against SDPA cuDNN at d128 full 4k-32k (ab_cudnn.py, five rounds)
#   bash benchmarks/run_gpu_s57.sh 3   # d64 fwd+bwd against SDPA cuDNN with the turns (ab_cudnn.py, five rounds, causal
#       and full 1k / 4k / 16k); GPT-2 medium 1k, ours with the turns and without (FLASHTRAIN_FWD_PINGPONG=0), alternating,
#       twice, each a fresh process; GPT-2 small 1k from CUDA graphs, ours (the row session 56 cut off at 58 s)
#   bash benchmarks/run_gpu_s57.sh 4   # the other GPU tests whose calls now take the turns through the public API: the
#       Hopper backward, the dense kernels and Hopper block-sparse files (the slow portable-autotune test left out)
#   bash benchmarks/run_gpu_s57.sh 5   # the issue's benchmark at d64 full 4k and 16k (ours with the turns, SDPA cuDNN,
#       FlexAttention, SDPA flash): the README's d64 n16k full row on the new forward
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  PYTHONPATH=. timeout -s KILL 150 python -c "
import sys
import benchmarks.check_hopper_fwd as check
check.CANDIDATES = {d: [c for c in cfgs if c.pingpong] for d, cfgs in check.CANDIDATES.items() if d in (64, 128)}
sys.argv = ['check_hopper_fwd.py', '--skip-speed', '--out', '$R/check_fwd_pingpong.json']
check.main()
" 2>&1 | quiet | tail -n 3
  for causal in "--causal" ""; do
    fwd_ab 100 d128${causal:+_causal} --headdim 128 $causal --seqlens 2048 4096 8192 16384
  done
  fwd_ab 60 d64_causal --headdim 64 --causal --seqlens 4096 8192 16384
  for run in 1 2; do
    timeout 100 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton --in-process \
      --gpu-clocks --out "$R/train_medium8k_two_kernels_run$run.json" 2>&1 | quiet | grep "^| gpt2"
    d64_on 100 --models gpt2_medium --seqlens 8192 --impls triton --in-process --gpu-clocks \
      --out "$R/train_medium8k_d64_ordered_run$run.json" 2>&1 | quiet | grep "^| gpt2"
  done
  train_rows "$R"/train_medium8k_*.json
  ;;
2)
  timeout -s KILL 240 python -m pytest -q -n 4 -m gpu -rf tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_qkvpacked.py > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  fwd_ab 70 d64 --headdim 64 --seqlens 1024 4096 16384
  fwd_ab 40 d64_causal --headdim 64 --causal --seqlens 1024 2048
  fwd_ab 70 d128 --headdim 128 --seqlens 32768 65536
  timeout -s KILL 150 python benchmarks/ab_cudnn.py --headdims 128 --causal no --seqlens 4096 8192 16384 32768 \
    --rounds 5 --out "$R/ab_cudnn_d128_causal_no.json" 2>&1 | quiet | ratios
  ;;
3)
  for causal in yes no; do
    timeout -s KILL 90 python benchmarks/ab_cudnn.py --headdims 64 --causal $causal --seqlens 1024 4096 16384 \
      --rounds 5 --out "$R/ab_cudnn_d64_causal_$causal.json" 2>&1 | quiet | ratios
  done
  for run in 1 2; do
    for pp in 1 0; do
      FLASHTRAIN_FWD_PINGPONG=$pp timeout 70 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 \
        --impls triton --out "$R/train_medium1024_triton_pingpong${pp}_run$run.json" 2>&1 | quiet | grep "^| gpt2"
    done
  done
  timeout 90 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 --impls triton --steps 30 \
    --compile-mode reduce-overhead --out "$R/train_small1024_triton_graphs.json" 2>&1 | quiet | grep "^| gpt2"
  ;;
4)
  T=tests/kernels
  timeout -s KILL 420 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_bwd_hopper.py $T/test_flash_attention.py \
    $T/test_block_sparse_hopper.py --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 4 "$R/gpu_tests.log"
  ;;
5)
  timeout 160 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 64 --causal full \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d64_full.json" 2>&1 | quiet | grep "^|" | tail -n 12
  ;;
esac
