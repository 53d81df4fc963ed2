#!/usr/bin/env bash
# Device calls on one GPU (session 33). Each part is what one call ran; the outputs are in
# benchmarks/results/s33/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s33.sh 1   # head dim 64 since session 32's dK/dV change: the Gluon dK/dV kernel's
#       correctness and the backward with it against the portable one (1k, 4k, 16k causal and full; GPT-2
#       medium's packed layer at 8k); the block-sparse backward's two routes at d64 (BACKWARD_MIN_TILES)
#   bash benchmarks/run_gpu_s33.sh 2   # (part 1, on an H200: correct on every edge shape; the backward with the
#       Gluon dK/dV kernel 1.04-1.09x the portable one causal, 1.08-1.13x full, 1.10x on the packed layer; the
#       block-sparse Hopper route faster from 2 tiles per program at n4k, from 1 at n16k) GPT-2 medium 1k and 8k
#       from CUDA graphs, the Gluon dK/dV kernel at d64 (dispatched from this part on) on and off alternating,
#       with SDPA cuDNN at 1k and SDPA flash at 8k
#   bash benchmarks/run_gpu_s33.sh 3   # (part 2, on an H200: 8k 124.5-124.6k tokens/s against 120.7-120.8k without it,
#       SDPA flash 103.0k; 1k 195.1-195.3k against 194.1k, SDPA cuDNN 192.3k) the Gluon dq kernel at d64 inside
#       the backward that now has the Gluon dK/dV kernel; d64 against the anchors at 1k-16k; GPT-2 medium 8k on
#       SDPA cuDNN
#   bash benchmarks/run_gpu_s33.sh 4   # (part 3, on an H200: the Gluon dq kernel at d64 0.91-1.03x the backward, so
#       not dispatched; d64 fwd+bwd from graphs 0.90-1.02x cuDNN, 1.19-1.33x Flex, 1.39-1.64x SDPA flash, eager
#       causal 1k 1.16 ms against 0.86 from graphs; GPT-2 medium 8k on SDPA cuDNN 124.8k tokens/s) host time of
#       a d64 n1k call with the Gluon dK/dV kernel on and off; block-sparse d64 at n4k and n16k against Flex
#   bash benchmarks/run_gpu_s33.sh 5   # (part 4, on an H200: fwd+bwd host time at (1, 1024, 16, 64) 0.91 ms with the
#       Gluon dK/dV kernel, 0.68 without; block-sparse d64 from graphs 1.21-1.40x Flex at n4k, 1.11-1.45x at n16k)
#       the GPU tests of the Hopper backward, Hopper block-sparse, packed QKV and dense kernel files
#   bash benchmarks/run_gpu_s33.sh 6   # (part 5, on an H200: 314 passed, and the slow portable-autotune test alone)
#       GPT-2 medium 4k and 16k on ours, SDPA cuDNN and SDPA flash
#   bash benchmarks/run_gpu_s33.sh 7   # (part 6, on an H200: 4k ours 158.1k tokens/s, cuDNN 157.4k, flash 138.7k;
#       16k 87.0k, 90.6k, 69.5k) GPT-2 small 8k and 16k on ours and SDPA cuDNN
source benchmarks/gpu_call.sh
machine_info
medium() {  # medium SEQLEN IMPL TAG HOPPER_DKDV [bench_train args]: GPT-2 medium from CUDA graphs
  local seqlen=$1 impl=$2 tag=$3 dkdv=$4; shift 4
  FLASHTRAIN_HOPPER_DKDV=$dkdv timeout 150 python benchmarks/bench_train.py --models gpt2_medium \
    --seqlens "$seqlen" --impls "$impl" --compile-mode reduce-overhead --in-process \
    --out "$R/train_medium${seqlen}_$impl$tag.json" "$@" 2>&1 | quiet | tee -a "$R/bench_train.log" \
    | grep "^|.*gpt2" | sed "s/^/dkdv=$dkdv $tag /"
}
case "${1:?part 1}" in
1)
  head -n 2 "$R/machine.txt"
  HANG_S=370 timeout 380 python benchmarks/check_hopper_dkdv.py --quick --headdims 64 \
    --speed 64:causal 64:full 64:packed --out "$R/check_dkdv_d64.json" 2>&1 | quiet \
    | tee "$R/check_dkdv_d64.log" | grep -v "^  File" | tail -n 14
  timeout 190 python benchmarks/check_bs_bwd_routes.py --headdims 64 --seqlens 4096 16384 \
    --out "$R/check_bs_routes_d64.json" 2>&1 | quiet | tee "$R/check_bs_routes_d64.log" | tail -n 40
  ;;
2)
  head -n 2 "$R/machine.txt"
  for run in 1 2; do
    medium 1024 triton _dkdv1_run$run 1 --steps 40
    medium 1024 triton _dkdv0_run$run 0 --steps 40
    medium 8192 triton _dkdv1_run$run 1 --steps 20
    medium 8192 triton _dkdv0_run$run 0 --steps 20
    if [ $run = 1 ]; then  # (as run, this was `[ $run = 1 ] && ...`: the same rows, and exit status 1)
      medium 8192 sdpa_flash "" 1 --steps 20
      medium 1024 sdpa_cudnn "" 1 --steps 40
    fi
  done
  ;;
3)
  head -n 2 "$R/machine.txt"
  HANG_S=200 timeout 210 python benchmarks/check_hopper_dq.py --quick --headdims 64 --out "$R/check_dq_d64.json" \
    2>&1 | quiet | tee "$R/check_dq_d64.log" | grep -v "^  File" | tail -n 10
  timeout 270 python benchmarks/bench_attention.py --seqlens 1024 4096 16384 --headdims 64 --graphs \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d64.json" 2>&1 | quiet | grep "^|" | tail -n 20
  medium 8192 sdpa_cudnn "" 1 --steps 20
  ;;
4)
  head -n 2 "$R/machine.txt"
  for dkdv in 1 0; do
    FLASHTRAIN_HOPPER_DKDV=$dkdv timeout 80 python benchmarks/bench_host_overhead.py --headdim 64 --seqlen 1024 \
      --parts-seqlen 1024 --out "$R/host_overhead_d64_n1k_dkdv$dkdv.json" 2>&1 | quiet \
      | tee "$R/host_overhead_d64_n1k_dkdv$dkdv.log" | grep -E "host_ms|synced|^dense|parts" | head -n 20
  done
  timeout 400 python benchmarks/bench_block_sparse.py --seqlens 4096 16384 --headdims 64 \
    --out "$R/block_sparse_d64.json" 2>&1 | quiet | tail -n 24
  ;;
5)
  hopper_backward_tests
  ;;
6)
  head -n 2 "$R/machine.txt"
  for n in 4096 16384; do
    medium $n triton "" 1 --steps 20
    medium $n sdpa_cudnn "" 1 --steps 20
    medium $n sdpa_flash "" 1 --steps 20
  done
  ;;
7)
  head -n 2 "$R/machine.txt"
  for n in 8192 16384; do
    for impl in triton sdpa_cudnn; do
      timeout 60 python benchmarks/bench_train.py --models gpt2_small --seqlens $n --impls $impl \
        --compile-mode reduce-overhead --in-process --steps 20 --out "$R/train_small${n}_$impl.json" 2>&1 | quiet \
        | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
    done
  done
  ;;
esac
