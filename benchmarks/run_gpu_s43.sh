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
#   bash benchmarks/run_gpu_s43.sh 3   # ab_cudnn.py with each round starting one impl later (calls 1 and 2 timed in a
#       fixed order, and identical kernels timed second came out 5-8% slower at d64 16k): d128 4k-16k causal and
#       full, five rounds; d64 16k, three rounds
#   (part 3, on an H100: call3/, six rounds at d128)
#   bash benchmarks/run_gpu_s43.sh 4   # ab_fwd_configs.py: the Hopper forward's configs (persistent 64-key tiles,
#       row-tile 128-key tiles, row-tile 64-key tiles) against each other and cuDNN's forward, d128 causal 2k-8k and
#       full 1k-8k, d64 causal 4k and 8k and full 4k; then ab_fused_bwd.py at causal 2k with the fused kernel
#       taking causal calls from 2k (--causal-from 2048)
#   (part 4, on an H200: call4/; kept: d128 causal forward calls from 4k queries on the row-tile kernel)
#   bash benchmarks/run_gpu_s43.sh 5   # the final tree: the GPU tests of the Hopper forward file and the dense file,
#       then ab_cudnn.py at d128 4k-16k, causal and full, six rounds
#   (part 5, on an H200: call5/, 140 passed)
#   bash benchmarks/run_gpu_s43.sh 6   # host time of the block-sparse and dense paths and FlexAttention's (cProfile's
#       top 80 functions): d64 and d128 at n4k with one block per row, d64 at n16k on the all-factor butterfly (6.25%)
#   (part 6, on an H200: call6/; the n16k run wrote nothing, exit status 1, and the device time left allowed no rerun)
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
3)
  timeout 300 python benchmarks/ab_cudnn.py --headdims 128 --seqlens 4096 8192 16384 --rounds 6 \
    --out "$R/ab_cudnn_d128.json" 2>&1 | quiet
  timeout 100 python benchmarks/ab_cudnn.py --headdims 64 --seqlens 16384 --rounds 3 \
    --out "$R/ab_cudnn_d64.json" 2>&1 | quiet
  ;;
4)
  timeout 150 python benchmarks/ab_fwd_configs.py --headdim 128 --causal --seqlens 2048 4096 8192 \
    --out "$R/ab_fwd_d128_causal.json" 2>&1 | quiet
  timeout 150 python benchmarks/ab_fwd_configs.py --headdim 128 --seqlens 1024 2048 4096 8192 \
    --out "$R/ab_fwd_d128_full.json" 2>&1 | quiet
  timeout 100 python benchmarks/ab_fwd_configs.py --headdim 64 --causal --seqlens 4096 8192 \
    --out "$R/ab_fwd_d64_causal.json" 2>&1 | quiet
  timeout 60 python benchmarks/ab_fwd_configs.py --headdim 64 --seqlens 4096 \
    --out "$R/ab_fwd_d64_full.json" 2>&1 | quiet
  timeout 100 python benchmarks/ab_fused_bwd.py --causal --seqlens 2048 --rounds 6 --causal-from 2048 \
    --out "$R/ab_fused_bwd_causal2k.json" 2>&1 | quiet
  ;;
5)
  timeout -s INT 300 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_attention.py > "$R/gpu_tests.log" 2>&1
  tail -n 3 "$R/gpu_tests.log"
  timeout 200 python benchmarks/ab_cudnn.py --headdims 128 --seqlens 4096 8192 16384 --rounds 6 \
    --out "$R/ab_cudnn_d128.json" 2>&1 | quiet
  ;;
6)
  for d in 64 128; do
    timeout 120 python benchmarks/bench_host_overhead.py --headdim $d --seqlen 4096 --butterfly 0:0 --no-parts \
      --top 80 --out "$R/host_bs_d${d}_n4k.json" 2>&1 | quiet | grep "^{"
  done
  timeout 150 python benchmarks/bench_host_overhead.py --headdim 64 --seqlen 16384 --butterfly 7:0 --no-parts \
    --top 80 --out "$R/host_bs_d64_n16k.json" 2>&1 | quiet | grep "^{"
  ;;
esac
