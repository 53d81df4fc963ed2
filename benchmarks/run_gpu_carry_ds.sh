#!/usr/bin/env bash
# Device calls for branch dkdv-carry-ds (run on that branch; main lacks carry_ds): the Gluon dK/dV kernel
# with each step's dK product issued in the next step (HopperDkdvConfig.carry_ds). Outputs go to
# benchmarks/results/carry_ds/callN/ (part 1, session 34, one H200: all correct; no faster, see
# NOTES_attention.md "Where d128's backward time goes").
#   bash benchmarks/run_gpu_carry_ds.sh 1   # correctness of every d64 and d128 candidate on the edge
#       shapes (bf16, fp16) and the backward with each, d64 causal/full/packed and d128 causal/full
source benchmarks/gpu_call.sh
machine_info
case "${1:?part 1}" in
1)
  head -n 2 "$R/machine.txt"
  HANG_S=560 timeout 570 python benchmarks/check_hopper_dkdv.py --headdims 64 128 \
    --speed 64:causal 64:full 64:packed 128:causal 128:full --out "$R/check_dkdv_carry.json" 2>&1 | quiet \
    | tee "$R/check_dkdv_carry.log" | grep -v "^  File" | tail -n 30
  ;;
esac
