#!/usr/bin/env bash
# Device calls on one GPU (session 43). Each part is what one call ran; the outputs are in
# benchmarks/results/s43/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s43.sh 1   # ab_cudnn.py: ours (deterministic and not) against SDPA cuDNN in alternating
#       rounds, forward and fwd+bwd, d128 at 4k-16k and d64 at 4k and 16k, causal and full, five rounds
#   (part 1, on an H100: call1/)
#   bash benchmarks/run_gpu_s43.sh 2   # after deterministic=False calls the one-kernel backward does not take run the
#       deterministic route on Hopper: the GPU tests of the Hopper backward file and the dense file's atomic-dq
#       tests, then ab_cudnn.py at d64 4k and 16k, three rounds
#   (part 2, on an H100: call2/, 176 passed)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  timeout 280 python benchmarks/ab_cudnn.py --headdims 128 --seqlens 4096 8192 16384 --rounds 5 \
    --out "$R/ab_cudnn_d128.json" 2>&1 | quiet
  timeout 200 python benchmarks/ab_cudnn.py --headdims 64 --seqlens 4096 16384 --rounds 5 \
    --out "$R/ab_cudnn_d64.json" 2>&1 | quiet
  ;;
2)
  timeout -s INT 400 python -m pytest -q -n 4 -m gpu -rf tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_flash_attention.py::test_gpu_bf16_atomic_dq \
    --deselect tests/kernels/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/gpu_tests.log" 2>&1
  tail -n 3 "$R/gpu_tests.log"
  timeout 150 python benchmarks/ab_cudnn.py --headdims 64 --seqlens 4096 16384 --rounds 3 \
    --out "$R/ab_cudnn_d64.json" 2>&1 | quiet
  ;;
esac
