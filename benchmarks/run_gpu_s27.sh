#!/usr/bin/env bash
# Device calls on one GPU (session 27: head dim 256 through the Gluon Hopper kernels; block-sparse d64 at
# n64k). Each part is what one call ran; the outputs are in benchmarks/results/hopper_d256_h200/.
#   bash benchmarks/run_gpu_s27.sh 1   # the Hopper kernel tests (now with d256 edges, the dK/dV kernel
#       in two passes there), then each d256 candidate config of the forward, dq and dK/dV kernels:
#       correctness on the edge shapes and speed against the portable kernels and SDPA
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out} HANG_S=200
mkdir -p "$OUT"
case "${1:?part 1}" in
1)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/machine.txt"
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/machine.txt"
  timeout -s INT 200 python -m pytest -q -n 8 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py -rf > "$OUT/gpu_tests_call1.log" 2>&1
  tail -n 15 "$OUT/gpu_tests_call1.log"
  timeout 130 python benchmarks/check_hopper_fwd.py --headdims 256 --out "$OUT/check_fwd_d256.json" 2>&1 \
    | tee "$OUT/check_fwd_d256.log" | grep -v "^ok"
  timeout 110 python benchmarks/check_hopper_dq.py --headdims 256 --out "$OUT/check_dq_d256.json" 2>&1 \
    | tee "$OUT/check_dq_d256.log" | grep -v "^ok"
  timeout 110 python benchmarks/check_hopper_dkdv.py --headdims 256 --speed 256:causal 256:full \
    --out "$OUT/check_dkdv_d256.json" 2>&1 | tee "$OUT/check_dkdv_d256.log" | grep -v "^ok"
  ;;
esac
