#!/usr/bin/env bash
# Device calls on one GPU (session 21): where a GPT-2 medium training step spends its device time.
#   source .whl/install.sh && bash benchmarks/run_gpu_step.sh 1   # medium 8k/1k, ours and SDPA flash, profiled; d256 4k/16k
# Results: $OUT/results.tgz (gpu_call.sh packs $R when the script exits, a time-out included).
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part 1}" in
1)
  timeout 420 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192,1024 \
    --impls triton,sdpa_flash --profile 2 --profile-top 45 --out "$R/train_medium_profile.json" 2>&1 | quiet \
    | tee "$R/bench_train.log" | cut -c1-400 | tail -8
  timeout 150 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 256 --causal both \
    --impls triton flex sdpa_flash --out "$R/attention_d256.json" 2>&1 | quiet \
    | tee "$R/bench_attention.log" | tail -10
  ;;
esac
