#!/usr/bin/env bash
# Session 69's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s69.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s69/callN/.
#   1: the block-sparse model's KV-cache generation and one-layout-per-model tests on CUDA, then
#      bench_generate_block_sparse.py (cache against recompute against dense, d64 and d128, 512-16k prompts)
#   3: part 1 again after the tile lists' cache key (`kernels.layouts.lists_key`: a decode step's one
#      query shares its key tile's lists), the Hopper block-sparse GPU tests, and a host profile of one
#      cached block-sparse generate (d64, 4096-token prompt, 16 tokens)
#   4: after flash_decode took block layouts (a block-sparse model's decode steps on the device, replayed from
#      CUDA graphs): the generation, decode, layout tests on CUDA, then bench_generate_block_sparse.py again
#   5: after flash_decode took a layout per head under GQA: part 4's tests, the 6 kernel tests part 2 did not
#      reach (results/s69/kernel_tests_not_reached_in_call4.txt), bench_generate_block_sparse.py in 2 rounds
#   6: bench_generate_block_sparse.py at batch 8 (butterfly, d64), and a random layout (a pattern per head) on
#      GQA (16 query heads on 4) at batch 1
#   2: the kernel tests session 68's CUDA run of the not-gpu-marked tests did not reach (its list:
#      results/s69/kernel_tests_not_run_on_cuda.txt), the atomic-variant routing test among them
source "$(dirname "$0")/gpu_call.sh"
# The tests whose ids LIST_FILE holds (one a line; ids with spaces, so not through the shell), on WORKERS
# workers, interrupted after SECONDS: $R/cuda_tests_remaining.log, how many passed and what failed printed
listed_tests() {  # listed_tests SECONDS WORKERS LIST_FILE
  timeout -s INT "$1" python -c "
import sys, pytest
ids = open('$3').read().splitlines()
sys.exit(pytest.main(['-v', '-rf', '-n', '$2', '-p', 'no:cacheprovider', *ids]))
" > "$R/cuda_tests_remaining.log" 2>&1
  echo "tests exit $?"; grep -c PASSED "$R/cuda_tests_remaining.log"; grep -E "^FAILED|^ERROR" \
    "$R/cuda_tests_remaining.log" | head -40; tail -n 2 "$R/cuda_tests_remaining.log"
}
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  generate_tests 240 4
  bs_generate 330 generate_block_sparse --headdims 64 128 --prompts 512 4096 16384 --new-tokens 32 --rounds 3
  ;;
2)
  listed_tests 420 8 benchmarks/results/s69/kernel_tests_not_run_on_cuda.txt
  ;;
3)
  generate_tests 200 4 tests/kernels/test_layouts.py
  timeout -s KILL 240 python -m pytest -q -rf -n 8 -m gpu tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_block_sparse.py > "$R/gpu_tests_block_sparse.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_block_sparse.log"
  bs_generate 240 generate_block_sparse --headdims 64 128 --prompts 512 4096 16384 --new-tokens 32 --rounds 3
  timeout -s KILL 90 python -c "
import torch
from benchmarks.bench_generate_block_sparse import models
from benchmarks.common import host_profile
from flashtrain.generate import generate
sparse, _ = models(64, 4096 + 16, 'cuda', torch.bfloat16)
prompt = torch.randint(0, 50304, (1, 4096), device='cuda')
fn = lambda: generate(sparse, prompt, 16, temperature=0)
fn()
for e in host_profile(fn, steps=2, top=30):
    print('%9.3f ms own %9.3f ms cum %6d calls  %s' % (e['own_ms'], e['cum_ms'], e['calls'], e['function']))
" 2>&1 | quiet | tee "$R/profile_generate_block_sparse.txt"
  ;;
4)
  generate_tests 200 6 tests/kernels/test_layouts.py tests/kernels/test_decode.py
  bs_generate 330 generate_block_sparse --headdims 64 128 --prompts 512 4096 16384 --new-tokens 32 --rounds 3
  ;;
5)
  generate_tests 150 6 tests/kernels/test_decode.py
  listed_tests 150 6 benchmarks/results/s69/kernel_tests_not_reached_in_call4.txt
  bs_generate 200 generate_block_sparse --headdims 64 128 --prompts 512 4096 16384 --new-tokens 32 --rounds 2
  ;;
6)
  bs_generate 100 generate_block_sparse_b8 --headdims 64 --batches 8 --prompts 4096 16384 --new-tokens 16 --rounds 2
  bs_generate 80 generate_block_sparse_random_gqa --headdims 64 --layout random --kv-heads 4 --prompts 4096 16384 \
    --new-tokens 16 --rounds 2
  ;;
esac
