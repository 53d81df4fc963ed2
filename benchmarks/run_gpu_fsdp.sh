#!/usr/bin/env bash
# One call on nvidia-h200-x2 or -x4 (through `device`): where FSDP2's step time goes at four 4k sequences
# per GPU (GPT-2 medium, Triton attention), each variant on all GPUS (2 or 4) and profiled, beside the
# one-GPU anchor and DDP in the same call:
#   anchor_ddp     one GPU, then DDP
#   reshard        FSDP2 as configured
#   simple         FSDP2 with NCCL's Simple protocol forced (NCCL_PROTO=Simple; earlier profiles showed
#                  its all-gathers and reduce-scatters running the low-latency LL kernels)
#   bf16_reduce    gradients reduce-scattered in bf16 (parallel.reduce_dtype=bfloat16)
#   keep_gathered  blocks stay gathered after the forward (parallel.reshard_after_forward=false)
#   deepspeed      DeepSpeed ZeRO-2
#   best           keep_gathered and bf16_reduce together
#   compiled_anchor, compiled, compiled_best
#                  the one-GPU anchor, FSDP2 as configured and `best`, with trainer.compile=true
#   unitsN         FSDP2 with N blocks per unit (parallel.blocks_per_unit=N; N in 2 4 8)
#   units4_gathered  4 blocks per unit, kept gathered after the forward (gradients reduced in fp32)
#   units4_best, units8_best, compiled_units4_best
#                  4 blocks per unit with `best`, uncompiled and compiled
#   bf16_residual  FSDP2 as configured with parallel.residual_dtype=bfloat16 (FSDP2 casts every unit's
#                  inputs; the default keeps the residual stream fp32, as one GPU)
#   units4_gathered_bf16_residual  units4_gathered with parallel.residual_dtype=bfloat16
#   before         FSDP2 as configured, from the checkout in $BEFORE (its flashtrain/, this bench_scaling.py)
# Every run also times the phases of the step (bench_scaling --phases). Lands in $OUT/results.tgz.
#   source .whl/install.sh && GPUS=2 VARIANTS="anchor_ddp reshard simple" bash benchmarks/run_gpu_fsdp.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
env | grep -E '^(NCCL|TORCH)_' | sort > "$R/env.txt"
G=${GPUS:-4}
scaling() {  # $1: name, then extra bench_scaling arguments
  local name=$1
  shift
  mkdir -p "$R/$name"
  echo "== $name $(date -u +%T)" | tee -a "$R/times.txt"
  local secs=${EACH_S:-170}
  timeout "$secs" python benchmarks/bench_scaling.py --batch-size 4 --fit-models --timeout $((secs - 10)) --phases \
    --profile "$R/$name" --out "$R/scaling_b4_$name.json" "$@" 2>&1 | quiet | tee "$R/scaling_b4_$name.log"
}
want() { [[ " ${VARIANTS:-anchor_ddp reshard simple bf16_reduce keep_gathered} " == *" $1 "* ]]; }
want anchor_ddp && scaling anchor_ddp --strategies ddp --gpus 1 "$G"
want reshard && scaling reshard --strategies fsdp --gpus "$G"
want simple && (export NCCL_PROTO=Simple && scaling simple --strategies fsdp --gpus "$G")
want bf16_reduce && scaling bf16_reduce --strategies fsdp --gpus "$G" --override parallel.reduce_dtype=bfloat16
want keep_gathered && scaling keep_gathered --strategies fsdp --gpus "$G" \
  --override parallel.reshard_after_forward=false
best=(--override parallel.reshard_after_forward=false --override parallel.reduce_dtype=bfloat16)
want best && scaling best --strategies fsdp --gpus "$G" "${best[@]}"
want compiled_anchor && scaling compiled_anchor --strategies fsdp --gpus 1 --compile
want compiled && scaling compiled --strategies fsdp --gpus "$G" --compile
want compiled_best && scaling compiled_best --strategies fsdp --gpus "$G" --compile "${best[@]}"
for n in 2 4 8; do
  want "units$n" && scaling "units$n" --strategies fsdp --gpus "$G" --override "parallel.blocks_per_unit=$n"
done
want units4_gathered && scaling units4_gathered --strategies fsdp --gpus "$G" --override parallel.blocks_per_unit=4 \
  --override parallel.reshard_after_forward=false
want bf16_residual && scaling bf16_residual --strategies fsdp --gpus "$G" --override parallel.residual_dtype=bfloat16
want units4_gathered_bf16_residual && scaling units4_gathered_bf16_residual --strategies fsdp --gpus "$G" \
  --override parallel.blocks_per_unit=4 --override parallel.reshard_after_forward=false \
  --override parallel.residual_dtype=bfloat16
want units8_best && scaling units8_best --strategies fsdp --gpus "$G" --override parallel.blocks_per_unit=8 "${best[@]}"
want units4_best && scaling units4_best --strategies fsdp --gpus "$G" --override parallel.blocks_per_unit=4 "${best[@]}"
want compiled_units4_best && scaling compiled_units4_best --strategies fsdp --gpus "$G" --compile \
  --override parallel.blocks_per_unit=4 "${best[@]}"
want deepspeed && scaling deepspeed --strategies deepspeed --gpus "$G"
if want before; then
  cp benchmarks/bench_scaling.py "$BEFORE/benchmarks/"
  (cd "$BEFORE" && scaling before --strategies fsdp --gpus "$G")
fi
echo "== end $(date -u +%T)" >> "$R/times.txt"
head -n 30 "$R"/*/scaling_profile_*.txt | cut -c1-60,100-200
