#!/usr/bin/env bash
# One short call on nvidia-h200-x4: why sequence-parallel training at 64k tokens stops on an infinite
# gradient norm (GPUs 0,1: sp=2 training with the ring
# and activation checkpointing, the ring alone against the one-GPU kernel, sp=2 without checkpointing); the grouped dropout kernels
# on GPU 2 (GPU test, cost against SDPA); one GPU at 524k tokens on GPU 3. Results in $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_x4_diag.sh
source "$(dirname "$0")/gpu_call.sh"
T=${T_S:-150}  # every branch stops by then; the device call gets a little more
long2() { python benchmarks/bench_long_context.py --gpus 2 --contexts 65536 --steps 1 --warmup 1 --timeout 55 "$@" 2>&1 | quiet; }
report() { python -c "import json,sys; [print(sys.argv[1], r.get('status'), r.get('step_ms'), (r.get('error') or '')[-600:]) for r in json.load(open(sys.argv[1]))['rows']]" "$1"; }
(
  export CUDA_VISIBLE_DEVICES=0,1
  long2 --run-root /tmp/l1 --out "$R/sp2_ring_ac.json" > "$R/sp2_ring_ac.log"; report "$R/sp2_ring_ac.json"
  timeout 45 torchrun --standalone --nproc-per-node 2 benchmarks/check_ring_precision.py --seqlen 65536 --nheads 12 \
    --nheads-kv 12 --headdim 64 --reference kernel --out "$R/ring_precision_64k_x2.json" 2>&1 | quiet | grep -v Traceback
  long2 --run-root /tmp/l2 --override trainer.activation_checkpointing=false --out "$R/sp2_ring_noac.json" \
    > "$R/sp2_ring_noac.log"; report "$R/sp2_ring_noac.json"
) > "$R/diag.log" 2>&1 &
DIAG=$!
( sleep "$T"; kill -- -$DIAG 2>/dev/null; pkill -f bench_long_context; pkill -f check_ring_precision ) &
(
  export CUDA_VISIBLE_DEVICES=2
  timeout "$T" python -m pytest -q tests/kernels/test_dropout.py -m gpu -rf > "$R/dropout_gpu_test.log" 2>&1
  timeout "$T" python benchmarks/bench_attention.py --seqlens 16384 --headdims 64 128 --causal causal \
    --impls triton_dropout sdpa_flash_dropout --out "$R/attention_dropout.json" 2>&1 | grep -E "^d=" | cut -c1-160 \
    > "$R/attention_dropout.log"
) &
CUDA_VISIBLE_DEVICES=3 timeout "$T" python benchmarks/bench_long_context.py --gpus 1 --contexts 524288 --steps 1 \
  --warmup 1 --timeout "$T" --run-root /tmp/l4 --out "$R/long_context_x1_524k.json" > "$R/long_x1.log" 2>&1 &
wait
cat "$R/diag.log"; tail -n 2 "$R/dropout_gpu_test.log"; cat "$R/attention_dropout.log"; report "$R/long_context_x1_524k.json"
