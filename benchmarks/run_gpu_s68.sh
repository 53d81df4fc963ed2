#!/usr/bin/env bash
# Device calls on one GPU (session 68). Each part is what one call ran; the outputs are in
# benchmarks/results/s68/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s68.sh 1   # decode's split kernel with each warp on its own slice of a key tile
#       (`SPLIT_SLICES`, no barrier a tile) against the kept kernel and cuDNN; block_sparse_attention's inference
#       calls without the autograd Function: the GPU tests of both, ab_host_trims.py --trims s68. (Ran at commit
#       44eebb5: its two decode variants are gone since, so this part no longer runs as it stands.)
#   bash benchmarks/run_gpu_s68.sh 2   # call 1: the slices 1.01-1.49x slower everywhere (dropped); block-sparse
#       inference 1.23-1.29x less host time, but d64's forward 0.125 ms against d128's 0.076: where the host's time
#       goes, fwd+bwd and a no_grad forward, n4k, butterfly 2 factors (bench_host_overhead.py, cProfile).
#   bash benchmarks/run_gpu_s68.sh 3   # call 2: d64 and d128 alike in that call (0.115 / 0.084 ms), no d64-only cost.
#       The block-sparse files' whole GPU suites on the inference route; its host time again (4k) and a block-sparse
#       GPT-2 medium's generation (512-token prompt, 16 tokens, each the whole sequence again), trimmed / untrimmed.
#   bash benchmarks/run_gpu_s68.sh 4   # call 3: 480 passed, 8 failed: CPU-only tests whose tensors were on the CPU
#       (stubbed kernels but a real delta preprocess; the strided-views test): on the GPU no interpreter runs them.
#       Those 8 again, on `device`; where a block-sparse model's generation spends its host time (cProfile, d128).
#   bash benchmarks/run_gpu_s68.sh 5   # call 4: the 8 passed (12 selected). Are there more tests that assume the CPU?
#       Every kernel test not marked gpu, on CUDA (the `device` fixture), 12 workers, cut at 480 s.
#   bash benchmarks/run_gpu_s68.sh 6   # call 5: 789 passed, 27 failed before the cut: 24 more tests on CPU tensors
#       (stubbed kernels, real launches beside them: the fused backward's routing, the autotuner's, the delta
#       preprocess) and check_kernel_builds.py's 2 (its recording runs the interpreter, which this image's numpy
#       breaks). The 25 moved to `device`, on CUDA. (Call 6: 24 passed; the autotuner write-back test's 3 never reach
#       Autotuner.run on the H200: now the interpreter's alone; 2 more CPU-tensor tests found, moved, not yet run there.)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
case "$1" in
1)
  timeout -s KILL 150 python -m pytest -q -rf $T/test_decode.py > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_decode.log"
  timeout -s KILL 100 python -m pytest -q -rf $T/test_block_sparse.py -k "inference or gpu_bf16_realistic" \
    > "$R/gpu_tests_block_sparse.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_block_sparse.log"
  timeout -s KILL 320 python benchmarks/ab_decode_launch.py --rounds 5 --heads d64_mha16 d128_gqa32_8 d128_mha32 \
    --batches 1 8 --cache-lens 4096 16384 65536 --impls slices_4 slices_4_d128_regs168 cudnn \
    --out "$R/ab_decode_launch.json" 2>&1 | quiet | ab_rows
  timeout -s KILL 100 python benchmarks/ab_host_trims.py --trims s68 --paths block_sparse_inference --seqlen 4096 \
    --out "$R/host_trims_s68.json" 2>&1 | quiet | grep s68
  ;;
2)
  for d in 64 128; do
    timeout -s KILL 150 python benchmarks/bench_host_overhead.py --seqlen 4096 --headdim $d --butterfly 2:0 \
      --no-parts --top 25 --out "$R/host_overhead_d$d.json" 2>&1 | quiet
  done
  ;;
3)
  timeout -s KILL 330 python -m pytest -q -n 4 -rf $T/test_block_sparse.py $T/test_block_sparse_hopper.py \
    > "$R/gpu_tests_block_sparse.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_block_sparse.log"
  timeout -s KILL 60 python benchmarks/ab_host_trims.py --trims s68 --paths block_sparse_inference --seqlen 4096 \
    --out "$R/host_trims_s68_4k.json" 2>&1 | quiet | grep s68
  timeout -s KILL 150 python benchmarks/ab_host_trims.py --trims s68 --paths generate_block_sparse --seqlen 512 \
    --batches 6 --calls 5 --out "$R/host_trims_s68_generate.json" 2>&1 | quiet | grep s68
  ;;
4)
  timeout -s KILL 200 python -m pytest -q -rf $T/test_block_sparse.py $T/test_block_sparse_hopper.py \
    -k "strided_views or ordered_one_kernel or d128_backward_takes" > "$R/gpu_tests_block_sparse.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_block_sparse.log"
  timeout -s KILL 150 python -c "
from benchmarks.ab_host_trims import generation
from benchmarks.common import host_profile
fn = generation(512, 128, attention='block_sparse')
fn()
for e in host_profile(fn, steps=3, top=25):
    print('%9.3f ms own %9.3f ms cum %6d calls  %s' % (e['own_ms'], e['cum_ms'], e['calls'], e['function']))
" 2>&1 | quiet | tee "$R/profile_generate_block_sparse.txt"
  ;;
5)
  timeout -s INT 480 python -m pytest tests/kernels -m "not gpu" -n 12 -v -rf -p no:cacheprovider \
    > "$R/cuda_tests_not_gpu_marked.log" 2>&1
  echo "tests exit $?"; grep -c PASSED "$R/cuda_tests_not_gpu_marked.log"; grep -E "^FAILED|^ERROR" \
    "$R/cuda_tests_not_gpu_marked.log" | head -40; tail -n 2 "$R/cuda_tests_not_gpu_marked.log"
  ;;
6)
  timeout -s KILL 200 python -m pytest -q -rf $T/test_tuning.py $T/test_launch.py $T/test_flash_bwd_fused_hopper.py \
    -k "buffer_the_autotuner or tuned_key_launches or delta_preprocess_matches or deterministic_calls or \
sums_its_key_groups" > "$R/cuda_tests_moved.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/cuda_tests_moved.log"
  ;;
esac
