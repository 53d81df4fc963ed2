#!/usr/bin/env bash
# Device calls (nvidia-h200, one GPU) after a change to the dropout draw. Lands in $OUT/results.tgz.
#   PHASE=check: the bf16 kernel GPU tests and the ring's local routes on CUDA side by side, then every
#     tile config of the three kernels run alone with dropout 0.1 at d64 and d128 against float64.
#   PHASE=bench: dropout's cost against SDPA flash's (d64, d128; 4k, 16k; causal), then (ROUNDS10=1) the
#     same 16k rows with ten Philox rounds instead of seven (a patched copy of kernels/), then, when
#     BEFORE names a directory holding an earlier checkout's kernels/ and benchmarks/, its 16k rows.
#   PHASE=train: GPT-2 small trained with attention dropout 0.1 (as GPT-2 was released) at 4k and 8k:
#     ours against SDPA flash and cuDNN with the same dropout (bench_train.py, a fresh process per row).
#   source .whl/install.sh && PHASE=check bash benchmarks/run_gpu_dropout.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${PHASE:-check}" in
check)
  cuda_tests 240 0 0 -
  tail -n 2 "$R"/*tests.log
  for d in 128 64; do
    timeout 170 python benchmarks/check_kernel_configs.py --batch 2 --seqlen 4096 --nheads 16 --headdim $d \
      --causal --dropout 0.1 --others fwd=0,dkdv=1,dq=1 --jobs 4 --out "$R/dropout_config_scan_d$d.json" 2>&1 \
      | quiet | tail -26
  done
  ;;
bench)
  rows=(--causal causal --headdims 64 128)
  timeout 280 python benchmarks/bench_attention.py --seqlens 4096 16384 "${rows[@]}" \
    --impls triton triton_dropout sdpa_flash sdpa_flash_dropout --out "$R/attention_dropout.json" 2>&1 | quiet | tail -8
  if [ "${ROUNDS10:-0}" = 1 ]; then
    rm -rf /tmp/rounds10 && mkdir -p /tmp/rounds10 && cp -r kernels benchmarks /tmp/rounds10/
    sed -i 's/^PHILOX_ROUNDS = 7$/PHILOX_ROUNDS = 10/' /tmp/rounds10/kernels/reference.py
    grep -q "^PHILOX_ROUNDS = 10$" /tmp/rounds10/kernels/reference.py && (cd /tmp/rounds10 &&
      timeout 150 python benchmarks/bench_attention.py --seqlens 16384 "${rows[@]}" --impls triton_dropout \
        --out "$R/attention_dropout_rounds10.json" 2>&1 | quiet | tail -4)
  fi
  if [ -n "${BEFORE:-}" ]; then
    (cd "$BEFORE" && timeout 150 python benchmarks/bench_attention.py --seqlens 16384 "${rows[@]}" \
      --impls triton_dropout --out "$R/attention_dropout_before.json" 2>&1 | quiet | tail -4)
  fi
  ;;
train)
  timeout 560 python benchmarks/bench_train.py --models gpt2_small --seqlens 8192,4096 \
    --impls triton,sdpa_flash,sdpa_cudnn --attn-dropout 0.1 --out "$R/train_attn_dropout.json" 2>&1 | quiet | tail -12
  ;;
esac
