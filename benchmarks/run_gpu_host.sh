#!/usr/bin/env bash
# Device calls on one GPU (session 20): where the dense path's host time goes, and what cutting it buys.
#   source .whl/install.sh && bash benchmarks/run_gpu_host.sh 1   # host time per layer of the dense path
#   source .whl/install.sh && bash benchmarks/run_gpu_host.sh 2   # part 1, then the bf16 GPU kernel tests
#   source .whl/install.sh && bash benchmarks/run_gpu_host.sh 3   # n1k/4k against Flex and SDPA flash
#   source .whl/install.sh && bash benchmarks/run_gpu_host.sh 4   # H200: GPU kernel tests, the README's n1k-8k sweep
#   source .whl/install.sh && bash benchmarks/run_gpu_host.sh 5   # H200: block-sparse n16k, end to end, host time
#   source .whl/install.sh && bash benchmarks/run_gpu_host.sh 6   # H200: block-sparse n16k again, with time to finish
# Results: $OUT/results.tgz (gpu_call.sh packs $R when the script exits, a time-out included).
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part 1 to 6}" in
1|2)
  timeout 200 python benchmarks/bench_host_overhead.py --calls "${CALLS:-200}" --out "$R/host_overhead.json" \
    2>&1 | quiet | tee "$R/host_overhead.log"
  [ "$1" = 2 ] || exit 0
  timeout 300 python -m pytest -q -n 4 -m gpu tests/kernels -rf > "$R/kernel_gpu_tests.log" 2>&1
  tail -n 3 "$R/kernel_gpu_tests.log"
  ;;
3)
  timeout 500 python benchmarks/bench_attention.py --seqlens 1024 4096 --headdims 64 128 --causal both \
    --impls triton flex sdpa_flash --out "$R/attention_flex_n1k_4k.json" 2>&1 | quiet \
    | tee "$R/bench_attention.log" | tail -16
  ;;
4)
  timeout 200 python -m pytest -q -n 4 -m gpu tests/kernels -rf > "$R/kernel_gpu_tests.log" 2>&1
  tail -n 3 "$R/kernel_gpu_tests.log"
  timeout 330 python benchmarks/bench_attention.py --seqlens 1024 4096 8192 --headdims 64 128 --causal both \
    --impls triton flex sdpa_flash sdpa_cudnn --out "$R/attention_flex_static_n1k_8k.json" 2>&1 | quiet \
    | tee "$R/bench_attention.log" | tail -14
  ;;
5)
  timeout 150 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 64 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tee "$R/bench_block_sparse.log" | tail -12
  timeout 240 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192,1024 \
    --impls triton,sdpa_flash --out "$R/train_medium.json" 2>&1 | quiet | tee "$R/bench_train.log" | tail -8
  timeout 120 python benchmarks/bench_host_overhead.py --out "$R/host_overhead.json" 2>&1 | quiet \
    | grep -v "ms own     " | tee "$R/host_overhead.log" | tail -20
  ;;
6)  # part 5's block-sparse sweep ran out of its 150 s after four rows
  timeout 500 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 64 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tee "$R/bench_block_sparse.log" | tail -24
  ;;
esac
