#!/usr/bin/env bash
# Device calls on one GPU (session 38). Each part is what one call ran; the outputs are in
# benchmarks/results/s38/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s38.sh 1   # ping-pong between the two consumer warpgroups (`turn_barriers`): the
#       forward's configs with and without it at d128 and d64 (correctness on the edge shapes, then time round-robin
#       twice), then the dK/dV kernel's at d128 (turns at S^T/dP^T, or at whole steps)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  HANG_S=300 timeout 290 python benchmarks/check_hopper_fwd.py --headdims 128 64 --rounds 2 --out "$R/check_fwd.json" \
    > "$R/check_fwd.log" 2>&1
  echo "fwd rc $?"; grep -e "^ok" -e "^FAIL" -e "^d" -e "Error" "$R/check_fwd.log" | head -n 40
  HANG_S=300 timeout 290 python benchmarks/check_hopper_dkdv.py --headdims 128 --rounds 2 --speed 128:causal 128:full \
    --out "$R/check_dkdv.json" > "$R/check_dkdv.log" 2>&1
  echo "dkdv rc $?"; grep -e "^ok" -e "^FAIL" -e "^d" -e "Error" "$R/check_dkdv.log" | head -n 30
  ;;
esac
