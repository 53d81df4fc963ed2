#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`), in three phases that fit one 600 s call:
#  A. side by side, one GPU each: the kernel GPU tests (bf16) and the fused ring-step kernels; the ring's
#     local-attention routes on CUDA; a per-config scan of the dropout kernels (d64, where a config faulted
#     before); dropout's cost against SDPA's;
#  B. the ring / Ulysses / hybrid / context-parallel benchmark on 4 GPUs with a zigzag profile;
#  C. data-parallel scaling on 1, 2 and 4 GPUs at BATCH sequences of 4k tokens per GPU.
#  L. (between A and B) the ring at 262k tokens against fp32, and sp=2 training at 64k / 262k tokens.
# Everything lands in $OUT/results.tgz.
#   source .whl/install.sh && bash benchmarks/run_gpu_x4_verify.sh
source "$(dirname "$0")/gpu_call.sh"
NGPU=$(nvidia-smi -L | wc -l)
machine_info

A=${PHASE_A_S:-130}
CUDA_VISIBLE_DEVICES=0 timeout "$A" python -m pytest -q -n 4 -m gpu tests/kernels -rf > "$R/kernel_gpu_tests.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout "$A" python -m pytest -q -n 4 tests/kernels/test_step_accumulate.py \
  tests/distributed/test_local_attention.py -rf > "$R/local_attention_cuda_tests.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2 timeout "$A" python benchmarks/check_kernel_configs.py --batch 2 --seqlen 4096 --nheads 16 \
  --headdim 64 --causal --dropout 0.1 --others fwd=0,dkdv=1,dq=1 --jobs 4 --timeout 100 \
  --out "$R/dropout_config_scan_d64.json" > "$R/dropout_config_scan.log" 2>&1 &
CUDA_VISIBLE_DEVICES=3 timeout "$A" python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 64 128 \
  --causal causal --impls triton triton_dropout sdpa_flash sdpa_flash_dropout --out "$R/attention_dropout.json" \
  > "$R/attention_dropout.log" 2>&1 &
wait
tail -n 3 "$R"/*tests.log; tail -n 14 "$R/attention_dropout.log"; tail -n 4 "$R/dropout_config_scan.log"

# L. long context: the ring at GPT-2 small's shapes and 262k tokens against the bf16 one-GPU kernel
# (P = 1..4), then sp=2 training steps at 64k and 262k tokens (a non-finite gradient names its parameters)
timeout "${PRECISION_S:-70}" torchrun --standalone --nproc-per-node "$NGPU" benchmarks/check_ring_precision.py \
  --seqlen 262144 --nheads 12 --nheads-kv 12 --headdim 64 --reference kernel --out "$R/ring_precision_262k_x$NGPU.json" 2>&1 | quiet \
  | tee "$R/ring_precision_262k.log"
timeout "${LONG_S:-100}" python benchmarks/bench_long_context.py --gpus 2 --contexts 65536 262144 --steps 1 \
  --warmup 1 --timeout 90 --out "$R/long_context_x2.json" 2>&1 | quiet | tee "$R/long_context_x2.log"
python - "$R/long_context_x2.json" <<'PY' | tee -a "$R/long_context_x2.log"
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r.get("context"), r.get("status"), (r.get("error") or "")[-700:])
PY

timeout "${RING_S:-110}" torchrun --standalone --nproc-per-node "$NGPU" benchmarks/bench_ring.py \
  --tokens-per-rank 8192 32768 --nheads 16 --modes ${RING_MODES:-zigzag ulysses hybrid torch_cp} \
  --profile "$R" --profile-modes zigzag \
  --out "$R/ring_h200_x$NGPU.json" 2>&1 | quiet | tee "$R/ring.log"

left=$(( ${BUDGET_S:-585} - SECONDS ))
timeout "$left" python benchmarks/bench_scaling.py --gpus 1 2 "$NGPU" --batch-size "${BATCH:-4}" --fit-models \
  --strategies ${STRATEGIES:-ddp fsdp} \
  --timeout 120 --out "$R/scaling_b${BATCH:-4}_h200.json" 2>&1 | quiet | tee "$R/scaling.log"
