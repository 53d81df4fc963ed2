#!/usr/bin/env bash
# Session 90's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s90.sh PART, results in $OUT/results.tgz
# (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s90/callN/.
#   1: GPT-2 small 1k, ours against SDPA cuDNN in one process, the two models' blocks of steps alternating
#      (ab_train_route.py --impls, new): the row is bound by the host, whose pace moved ours ÷ cuDNN between 0.80x
#      and 1.02x from one bench_train.py process to the next (README ‡), so both meet the same host here. Two
#      processes, to see whether the ratio holds between them; then 4k (bound by the GPU) as the control, where
#      bench_train.py's rows read ours 1.01x cuDNN
#   2: call 1: small 1k ours 1.001x cuDNN in the first process (both ~33 ms a step, 495k tokens/s), 0.827x in the
#      second (cuDNN 39.2 ms, ours 47.4: that process's steps ran 31-54 ms both ways); 4k 1.002x. So on the GPU the
#      two are level and a slow host costs ours more. Two more processes at 1k, then 1k replayed from CUDA graphs
#      (reduce-overhead: the host out of the step), then GPT-2 medium 1k (the issue's 55% MFU row)
source "$(dirname "$0")/gpu_call.sh"
machine_info
# ab_train_route.py --impls sdpa_cudnn triton on MODEL at SEQLEN, ROUNDS rounds of STEPS steps a way, killed after
# SECONDS: $R/NAME.json, its row printed
impls_ab() {  # impls_ab SECONDS NAME MODEL SEQLEN ROUNDS STEPS [COMPILE_MODE]
  timeout -s KILL "$1" python benchmarks/ab_train_route.py --impls sdpa_cudnn triton --model "$3" --seqlen "$4" \
    --rounds "$5" --steps "$6" --compile-mode "${7:-default}" --out "$R/$2.json" 2>&1 | quiet \
    | grep -e "^{" -e Error -e error | sed -e "s/'[a-z_]*attention_kernels': \[[^]]*\], //g" | tail -n 5
}
case "${1:?part}" in
1)
  impls_ab 200 small_1k_a gpt2_small 1024 12 6
  impls_ab 200 small_1k_b gpt2_small 1024 12 6
  impls_ab 180 small_4k gpt2_small 4096 8 4
  ;;
2)
  impls_ab 150 small_1k_c gpt2_small 1024 12 6
  impls_ab 150 small_1k_d gpt2_small 1024 12 6
  impls_ab 200 small_1k_graphs gpt2_small 1024 12 6 reduce-overhead
  impls_ab 200 medium_1k gpt2_medium 1024 8 4
  ;;
esac
