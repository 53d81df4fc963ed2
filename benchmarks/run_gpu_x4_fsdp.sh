#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): where FSDP2's step time goes at four 4k sequences per GPU
# (GPT-2 medium, Triton attention), profiled on 4 GPUs: as configured (with the one-GPU anchor in the
# same call), with the blocks' weights kept gathered after the forward (parallel.reshard_after_forward=
# false: no all-gather in the backward), with the gradients reduced in bf16 (parallel.reduce_dtype), and
# both. Lands in $OUT/results.tgz.
# VARIANTS="reshard bf16_reduce" runs only those.
#   source .whl/install.sh && bash benchmarks/run_gpu_x4_fsdp.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
fsdp() {  # $1: name, then extra bench_scaling arguments
  local name=$1
  shift
  mkdir -p "$R/$name"
  timeout "${EACH_S:-130}" python benchmarks/bench_scaling.py --strategies fsdp --batch-size 4 \
    --fit-models --timeout 120 --profile "$R/$name" --out "$R/fsdp_b4_$name.json" "$@" 2>&1 | quiet \
    | tee "$R/fsdp_b4_$name.log"
}
want() { [[ " ${VARIANTS:-reshard keep_gathered bf16_reduce keep_gathered_bf16_reduce} " == *" $1 "* ]]; }
want reshard && fsdp reshard --gpus 1 4
want keep_gathered && fsdp keep_gathered --gpus 4 --override parallel.reshard_after_forward=false
want bf16_reduce && fsdp bf16_reduce --gpus 4 --override parallel.reduce_dtype=bfloat16
want keep_gathered_bf16_reduce && fsdp keep_gathered_bf16_reduce --gpus 4 \
  --override parallel.reshard_after_forward=false --override parallel.reduce_dtype=bfloat16
head -n 30 "$R"/*/scaling_profile_*.txt | cut -c1-60,100-200
