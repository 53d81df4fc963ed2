#!/usr/bin/env bash
# Device calls on one GPU (session 56). Each part is what one call ran; the outputs are in
# benchmarks/results/s56/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s56.sh 1   # GPT-2 small 1k (host-bound), each step timed on the host and the device
#       (bench_train.py's step_ms_host / step_ms_device), 30 steps: ours four times, SDPA cuDNN twice, each a fresh
#       process, to see whether ours' slow runs (s55: 331.6k / 369.6k / 507.7k tokens/s) are slow every step or stall
#       in a few; then GPT-2 medium 8k profiled (--profile 2), ours on the two d64 kernels and with the ordered
#       one-kernel backward at d64 (CONFIGS[64] = 64-query steps on 2 stages, as commit 9f3d075 had it), in-process
#   bash benchmarks/run_gpu_s56.sh 2   # GPT-2 small 1k again on a fresh machine, 40 steps, SDPA cuDNN first then ours,
#       alternating, three each, with each step's CPU time (the main thread's, the other threads') and the machine's
#       busy cores (bench_train.py's step_cpu_ms_main, step_cpu_ms_other_threads, step_busy_cores), and top's
#       heaviest processes every 2 s beside them ($R/top.txt): who takes the host when a run is slow
#   bash benchmarks/run_gpu_s56.sh 3   # the end-to-end rows session 55 left out: GPT-2 medium 4k with SDPA flash, SDPA
#       cuDNN, ours and eager attention, and eager attention at medium 8k / 16k and small 1k / 8k
#   bash benchmarks/run_gpu_s56.sh 4   # GPT-2 small 4k and 16k with SDPA flash, SDPA cuDNN, ours and eager attention
#       (parts 3-4: each row a fresh process, compiled blocks launched kernel by kernel, bench_train.py's default)
#   bash benchmarks/run_gpu_s56.sh 5   # the d64 one-kernel backward alone at GPT-2 medium 8k's shape (batch 2, 16 heads,
#       causal), ordered (--fused-configs 64:2) against the two kernels, on separate q, k, v and on views of one
#       packed tensor with the gradients stored into one (--packed, as training runs it): does the packed layout
#       cost the one kernel the 5% it lost in the training step (part 1)?
#   bash benchmarks/run_gpu_s56.sh 6   # GPT-2 small 1k and 4k (host-bound launched kernel by kernel) replayed from CUDA
#       graphs (--compile-mode reduce-overhead, as trainer.cuda_graphs=true), SDPA cuDNN against ours, each a fresh
#       process, 30 steps: the two on the device with the host's speed out of the way
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  for run in 1 2 3 4; do
    timeout 80 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 --impls triton --steps 30 \
      --out "$R/train_small1024_triton_run$run.json" 2>&1 | quiet | grep "^| gpt2"
    [ $run -le 2 ] && timeout 80 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 \
      --impls sdpa_cudnn --steps 30 --out "$R/train_small1024_sdpa_cudnn_run$run.json" 2>&1 | quiet | grep "^| gpt2"
  done
  train_rows "$R"/train_small1024_*.json
  timeout 100 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton --in-process \
    --profile 2 --out "$R/train_medium8k_two_kernels.json" 2>&1 | quiet | grep "^| gpt2"
  d64_on 100 --models gpt2_medium --seqlens 8192 --impls triton --in-process --profile 2 \
    --out "$R/train_medium8k_d64_ordered.json" 2>&1 | quiet | grep "^| gpt2"
  ;;
2)
  top -b -d 2 -n 150 -w 160 | awk '/^top -/ {print; n = 0} /^ *PID/ {n = 8} n > 0 {print; n--; fflush()}' \
    > "$R/top.txt" &
  for run in 1 2 3; do
    for impl in sdpa_cudnn triton; do
      timeout 80 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 --impls $impl --steps 40 \
        --out "$R/train_small1024_${impl}_run$run.json" 2>&1 | quiet | grep "^| gpt2"
      echo "$(date +%T) row done: $impl run $run" >> "$R/rows.txt"
    done
  done
  pkill -x top
  train_rows "$R"/train_small1024_*.json
  ;;
3)
  for impl in sdpa_flash sdpa_cudnn triton eager; do
    timeout 70 python benchmarks/bench_train.py --models gpt2_medium --seqlens 4096 --impls $impl \
      --out "$R/train_medium4096_$impl.json" 2>&1 | quiet | grep "^| gpt2"
  done
  for row in medium:8192 medium:16384 small:1024 small:8192; do
    timeout 70 python benchmarks/bench_train.py --models gpt2_${row%:*} --seqlens ${row#*:} --impls eager \
      --out "$R/train_${row%:*}${row#*:}_eager.json" 2>&1 | quiet | grep "^| gpt2"
  done
  ;;
4)
  for n in 4096 16384; do
    for impl in sdpa_flash sdpa_cudnn triton eager; do
      timeout 70 python benchmarks/bench_train.py --models gpt2_small --seqlens $n --impls $impl \
        --out "$R/train_small${n}_$impl.json" 2>&1 | quiet | grep "^| gpt2"
    done
  done
  ;;
5)
  for layout in separate packed; do
    timeout 130 python benchmarks/ab_fused_bwd.py --headdim 64 --nheads 16 --fused-configs 64:2 --ordered --causal \
      --seqlens 8192 --rounds 8 $([ $layout = packed ] && echo --packed) --out "$R/ab_d64_causal8k_$layout.json" 2>&1 \
      | quiet | cut -c1-400
  done
  ;;
6)
  for n in 1024 4096; do
    for impl in sdpa_cudnn triton; do
      timeout 58 python benchmarks/bench_train.py --models gpt2_small --seqlens $n --impls $impl --steps 30 \
        --compile-mode reduce-overhead --out "$R/train_small${n}_${impl}_graphs.json" 2>&1 | quiet | grep "^| gpt2"
    done
  done
  train_rows "$R"/train_small*_graphs.json
  ;;
esac
