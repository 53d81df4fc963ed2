#!/usr/bin/env bash
# Session 79's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s79.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s79/callN/.
#   1: session 78's open ends. (a) The GQA model (GPT-2 medium's width in 8 heads of 128 on 2) at 2k read 0.94x
#      cuDNN in rows whose device steps ran 81-97 ms against 78-79 settled, with the same kernels as rows at
#      1.01-1.03x: four rows in one run (each its own process), cuDNN, ours, `auto`, ours again, with more warm-up
#      and timed steps, the GPU's clock, power, temperature and slowdown reasons sampled beside them (step by
#      step). (b) GQA 32 on 8 against cuDNN at causal / full 4k, five rounds (causal 4k read 1.006 on a machine
#      just started, against 1.043-1.069 before), and at 64k on the in-place route (not run since session 74)
#   2: call 1: the GPU ran at its software power cap (~690-700 W, SM 1380-1980 MHz, median 1710-1860) through every
#      row; the rows' host time (main thread plus autograd's backward thread) matched their device time step by
#      step, and the last row's slow steps (94-103 ms, ours again) came with a busier main thread (43 ms a step
#      against 30), higher clocks and lower power: the device waiting on the host. cuDNN 195.8k, ours 197.3k,
#      `auto` 199.1k, ours 179.1k. GQA 32 on 8 cuDNN ÷ ours: causal / full 4k 1.061 / 1.060, 64k 1.039 / 1.033.
#      The same model's rows replayed from CUDA graphs (the host out of the step), cuDNN and ours twice each,
#      and GPT-2 medium's width in 8 heads of 128 at 1k (1.02x cuDNN eagerly in session 78) the same way
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  train_table 330 5 train_gqa_2k_clocks --models gpt2_medium_d128_gqa --seqlens 2048 \
    --impls sdpa_cudnn,triton,auto,triton --gpu-clocks --warmup 6 --steps 30
  train_rows "$R/train_gqa_2k_clocks.json"
  gqa_cudnn 80 ab_cudnn_gqa_4k "4096" "4096" --rounds 5
  gqa_cudnn 110 ab_cudnn_gqa_64k "65536" "65536" --rounds 3
  ;;
2)
  train_table 330 5 train_gqa_2k_graphs --models gpt2_medium_d128_gqa --seqlens 2048 \
    --impls sdpa_cudnn,triton,sdpa_cudnn,triton --compile-mode reduce-overhead --gpu-clocks --warmup 6 --steps 30
  train_rows "$R/train_gqa_2k_graphs.json"
  train_table 180 3 train_d128_1k_graphs --models gpt2_medium_d128 --seqlens 1024 \
    --impls sdpa_cudnn,triton --compile-mode reduce-overhead --gpu-clocks --warmup 6 --steps 30
  train_rows "$R/train_d128_1k_graphs.json"
  ;;
esac
