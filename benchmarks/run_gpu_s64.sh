#!/usr/bin/env bash
# Device calls on one GPU (session 64). Each part is what one call ran; the outputs are in
# benchmarks/results/s64/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s64.sh 1   # host trims (plain cdiv on the host; the delta preprocess through a
#       compiled launch): the GPU tests that run the preprocess (one-kernel backward, ordered, block-sparse one
#       kernel, compiled launches), the trims A/B in one process (ab_host_trims.py --trims s64, d128 and d64), and
#       bench_host_overhead.py's profiles of the block-sparse routes at n4k d128 after them (the tests were killed
#       at 240 s, the -k selecting whole files, and 5:8's profile at 60 s, before it wrote its file: part 2 again)
#   bash benchmarks/run_gpu_s64.sh 2   # part 1's GPU tests with a longer limit, and the 5:8 profile
#   bash benchmarks/run_gpu_s64.sh 3   # the issue's block-sparse benchmark at n4k, d128 and d64, with the trims
#   bash benchmarks/run_gpu_s64.sh 4   # the trims A/B again (30 batches), a second sample on the same machine
#   bash benchmarks/run_gpu_s64.sh 5   # the trims A/B with its per-batch ratios (ab_host_trims.py now reports them), 40 batches
#   bash benchmarks/run_gpu_s64.sh 6   # the decode kernels through compiled launches too: the plain kernels' GPU tests
#       (compiled against Triton's launches, bitwise), decode's bf16 test, and the decode A/B at 4k and 64k caches
#   bash benchmarks/run_gpu_s64.sh 7   # the trims in generation: GPT-2 medium's shape, 512- and 4096-token prompts, 16 new
#       tokens a call (ab_host_trims.py --paths generate), heads of 64 and 128
#   bash benchmarks/run_gpu_s64.sh 8   # the autotuned portable kernels' tuned keys through compiled launches: the GPU tests
#       of every compiled launch in test_launch.py (the portable ones: window, key padding, varlen, dropout, d64's dq),
#       and the A/B on a windowed call (dense_window, n4k d128)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
case "$1" in
1)
  timeout -s KILL 240 python -m pytest -q -n 6 -rf -m gpu $T/test_flash_bwd_fused_hopper.py \
    $T/test_flash_bwd_hopper.py $T/test_block_sparse_hopper.py $T/test_varlen.py \
    -k "ordered or one_kernel or compiled or lse or varlen or fused" > "$R/gpu_tests_preprocess.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_preprocess.log"
  timeout -s KILL 150 python benchmarks/ab_host_trims.py --trims s64 --headdims 128 64 \
    --out "$R/ab_host_trims_s64.json" 2>&1 | quiet
  for fl in 5:8 5:2; do
    timeout -s KILL 60 python benchmarks/bench_host_overhead.py --seqlen 4096 --headdim 128 --butterfly $fl \
      --no-parts --top 30 --out "$R/host_bs_n4k_${fl/:/_}.json" 2>&1 | quiet | tail -n 4
  done
  ;;
2)
  timeout -s KILL 300 python -m pytest -q -n 6 -rf -m gpu $T/test_flash_bwd_fused_hopper.py \
    $T/test_block_sparse_hopper.py $T/test_flash_attention.py $T/test_flash_bwd_hopper.py \
    -k "test_flash_bwd_fused_hopper or one_kernel or lse or compiled" > "$R/gpu_tests_preprocess.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_preprocess.log"
  timeout -s KILL 200 python benchmarks/bench_host_overhead.py --seqlen 4096 --headdim 128 --butterfly 5:8 \
    --no-parts --top 30 --out "$R/host_bs_n4k_5_8.json" 2>&1 | quiet | tail -n 4
  ;;
3)
  bs_bench 330 block_sparse_n4k --seqlens 4096 --headdims 128 64
  ;;
4)
  timeout -s KILL 240 python benchmarks/ab_host_trims.py --trims s64 --headdims 128 64 --batches 30 \
    --out "$R/ab_host_trims_s64.json" 2>&1 | quiet
  ;;
5)
  timeout -s KILL 300 python benchmarks/ab_host_trims.py --trims s64 --headdims 128 64 --batches 40 \
    --out "$R/ab_host_trims_s64.json" 2>&1 | quiet
  ;;
6)
  timeout -s KILL 150 python -m pytest -q -rf -m gpu $T/test_launch.py $T/test_decode.py \
    > "$R/gpu_tests_plain_launches.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_plain_launches.log"
  for n in 4096 65536; do
    timeout -s KILL 150 python benchmarks/ab_host_trims.py --trims s64 --paths decode --headdims 128 64 \
      --seqlen $n --batches 30 --out "$R/ab_host_trims_s64_decode_$n.json" 2>&1 | quiet
  done
  ;;
7)
  for n in 512 4096; do
    timeout -s KILL 200 python benchmarks/ab_host_trims.py --trims s64 --paths generate --headdims 64 128 \
      --seqlen $n --batches 12 --calls 3 --out "$R/ab_host_trims_s64_generate_$n.json" 2>&1 | quiet
  done
  ;;
8)
  timeout -s KILL 130 python -m pytest -q -n 4 -rf -m gpu $T/test_launch.py > "$R/gpu_tests_launches.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_launches.log"
  timeout -s KILL 60 python benchmarks/ab_host_trims.py --trims s64 --paths dense_window --headdims 128 \
    --batches 15 --out "$R/ab_host_trims_s64_window.json" 2>&1 | quiet
  ;;
esac
