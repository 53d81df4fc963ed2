#!/usr/bin/env bash
# Session 70's GPU calls (one H200 each; `device`, carrying .whl for hydra): bash benchmarks/run_gpu_s70.sh PART,
# results in $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s70/callN/.
#   1: after fp32 calls tune over two tiles (ptxas took minutes on the rest): the 3 fp32 window tests no
#      CUDA run had reached (results/s70/fp32_window_tests.txt), with their durations; beside them the
#      generation, decode (a layout and a window together among them) and block-sparse model tests, the
#      command-line ones with hydra; then the per-head-layout decode (random layout, GQA) re-timed after
#      session 69's last refactor of the split kernel
#   2 (carrying .whl_ci: the CI's packages but wandb): the test packages other than kernels and distributed on
#      CUDA (never run there whole), then bench_decode.py through block-sparse layouts (butterfly on GPT-2
#      medium's 16 heads, a random pattern per head on 16 query heads over 4 kv heads) against dense decode
#      and SDPA cuDNN
#   3 (carrying .whl_hydra): after flash_decode through a layout walks the row's list of kept tiles, split evenly
#      (commit "flash_decode through a layout walks..."): the decode, generation and block-sparse model tests,
#      and the tests that took the device fixture after part 2, on CUDA; part 2's bench_decode.py runs again;
#      bench_generate_block_sparse.py (butterfly d64, batch 1; the random per-head layout on GQA as part 1)
#   4 (carrying .whl_ci): the 2 tests part 3 could not run for want of `datasets`; bench_generate_block_sparse.py
#      at batch 8 (butterfly d64, as session 69's call 6)
#   5: bench_generate_block_sparse.py with the steps timed alone (cache_step, dense_step): butterfly d64 at batch 1
#      and 8, and the random per-head layout on GQA at batch 1
#   8: bench_decode.py --launch through both layouts: programs per SM, stages and the shortest split, for the
#      tile lists' split count (which reuses dense decode's rule)
#   9: ab_decode_launch.py through both layouts, splits of one tile (min_tiles_1: MIN_SPLIT_TILES=1, the floor the
#      lists took then) against the default (2), 5 rounds; since, LAYOUT_MIN_SPLIT_TILES=1 and the variant is
#      layout_min_tiles_2
#   10 (carrying .whl_hydra): the final tree's decode and generation tests on CUDA; part 2's bench_decode.py runs
#      (through both layouts, against dense decode and SDPA cuDNN) again
#   7: the final tree's decode, layout, generation and block-sparse model tests on CUDA
#   6 (at commit 34de7e2, whose flash_decode took each head's keep from a copy beside the tile list; dropped after):
#      ab_decode_launch.py --layout random (a pattern per head, 16 query heads on 4 kv heads, d64): that copy (the
#      default there) against the layout (keep_from_layout), 5 rounds;
#      the decode tests on CUDA; then `python train.py` (the README's main job, offline default; no wandb here) 20 steps
source "$(dirname "$0")/gpu_call.sh"
# The tests whose ids LIST_FILE holds (one a line; ids with spaces, so not through the shell), on WORKERS
# workers, interrupted after SECONDS, each thread's stack dumped after DUMP seconds in one test:
# $R/cuda_tests_listed.log, what passed and failed and the durations printed
listed_tests() {  # listed_tests SECONDS WORKERS DUMP LIST_FILE
  timeout -s INT "$1" python -c "
import sys, pytest
ids = open('$4').read().splitlines()
sys.exit(pytest.main(['-v', '-rf', '-n', '$2', '-p', 'no:cacheprovider', '-o', 'faulthandler_timeout=$3',
                      '--durations=0', *ids]))
" > "$R/cuda_tests_listed.log" 2>&1
  echo "tests exit $?"; grep -E "PASSED|FAILED|ERROR|[0-9.]+s (call|setup)" "$R/cuda_tests_listed.log" | head -40
  tail -n 2 "$R/cuda_tests_listed.log"
}
# bench_decode.py through a butterfly layout (GPT-2 medium's 16 heads of 64) and a random pattern per head
# (16 query heads on 4 kv heads), batch 1 and 8, 4k-64k caches, against dense decode and SDPA cuDNN:
# $R/decode_layout_{butterfly,random}.{json,md}, the tables printed
decode_layouts() {
  for run in "butterfly 16" "random 4"; do
    set -- $run
    timeout -s KILL 100 python benchmarks/bench_decode.py --layout $1 --nheads 16 --nheads-kv $2 --headdim 64 \
      --batches 1 8 --cache-lens 4096 16384 65536 --impls triton triton_layout sdpa_cudnn \
      --out "$R/decode_layout_$1.json" 2>&1 | quiet | grep "^|"
  done
}
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  listed_tests 330 3 240 benchmarks/results/s70/fp32_window_tests.txt &
  generate_tests 300 6 tests/kernels/test_decode.py
  wait
  bs_generate 120 generate_block_sparse_random_gqa --headdims 64 --layout random --kv-heads 4 --prompts 4096 16384 \
    --new-tokens 16 --rounds 2
  ;;
2)
  timeout -s INT 330 python -m pytest -q -rf -n 8 -p no:cacheprovider tests/flashtrain tests/data tests/benchmarks \
    > "$R/cuda_tests_packages.log" 2>&1
  echo "tests exit $?"; grep -E "^(FAILED|ERROR)" "$R/cuda_tests_packages.log" | head -60; tail -n 2 "$R/cuda_tests_packages.log"
  decode_layouts
  ;;
3)
  generate_tests 300 8 tests/kernels/test_decode.py tests/flashtrain/test_gpt.py tests/flashtrain/test_parallelize.py \
    tests/benchmarks/test_ab_host_trims.py tests/flashtrain/test_classifier.py::test_evaluation_scores_a_split_smaller_than_a_batch \
    tests/flashtrain/test_resume_safety.py::test_a_validation_split_smaller_than_a_batch_fails_at_setup \
    tests/flashtrain/test_trainer.py::test_cuda_graph_settings_fail_clearly
  grep -E "^(FAILED|ERROR)" "$R/cuda_tests_generate.log" | head -20
  decode_layouts
  bs_generate 150 generate_block_sparse --headdims 64 --prompts 512 4096 16384 --new-tokens 32 --rounds 2
  bs_generate 100 generate_block_sparse_random_gqa --headdims 64 --layout random --kv-heads 4 --prompts 4096 16384 \
    --new-tokens 16 --rounds 2
  ;;
4)
  timeout -s KILL 200 python -m pytest -q -rf -n 2 \
    tests/flashtrain/test_classifier.py::test_evaluation_scores_a_split_smaller_than_a_batch \
    tests/flashtrain/test_resume_safety.py::test_a_validation_split_smaller_than_a_batch_fails_at_setup \
    > "$R/cuda_tests_data.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/cuda_tests_data.log"
  bs_generate 150 generate_block_sparse_b8 --headdims 64 --batches 8 --prompts 4096 16384 --new-tokens 16 --rounds 2
  ;;
5)
  bs_generate 200 generate_block_sparse_steps --headdims 64 --prompts 512 4096 16384 --new-tokens 32 --rounds 2
  bs_generate 150 generate_block_sparse_steps_b8 --headdims 64 --batches 8 --prompts 4096 16384 --new-tokens 16 --rounds 2
  bs_generate 120 generate_block_sparse_steps_random_gqa --headdims 64 --layout random --kv-heads 4 \
    --prompts 4096 16384 --new-tokens 16 --rounds 2
  ;;
6)
  timeout -s KILL 150 python -m pytest -q -rf -n 4 tests/kernels/test_decode.py > "$R/cuda_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/cuda_tests_decode.log"
  timeout -s KILL 150 python benchmarks/ab_decode_launch.py --layout random --heads d64_gqa16_4 --batches 1 8 \
    --cache-lens 16384 65536 --rounds 5 --impls keep_from_layout cudnn --out "$R/ab_decode_keep_listed.json" 2>&1 \
    | quiet | ab_rows
  timeout -s KILL 180 python train.py trainer.max_steps=20 logger=none trainer.out_dir="$R/runs" 2>&1 | quiet | tail -n 12 \
    | tee "$R/train_main.log"
  ;;
7)  # (carrying .whl_hydra) the final tree's decode, generation and block-sparse model tests on CUDA
  generate_tests 240 8 tests/kernels/test_decode.py tests/kernels/test_layouts.py
  ;;
8)
  for run in "butterfly 16" "random 4"; do
    set -- $run
    timeout -s KILL 120 python benchmarks/bench_decode.py --layout $1 --nheads 16 --nheads-kv $2 --headdim 64 \
      --batches 1 8 --cache-lens 16384 65536 --impls triton_layout \
      --launch default 8,4,2 16,4,2 4,4,3 8,4,3 4,4,2,64,1 8,4,2,64,1 --out "$R/decode_layout_launch_$1.json" 2>&1 \
      | quiet | grep "^|"
  done
  ;;
9)
  for run in "butterfly d64_mha16" "random d64_gqa16_4"; do
    set -- $run
    timeout -s KILL 110 python benchmarks/ab_decode_launch.py --layout $1 --heads $2 --batches 1 8 \
      --cache-lens 16384 65536 --rounds 5 --impls layout_min_tiles_2 --out "$R/ab_decode_min_tiles_1_$1.json" 2>&1 | quiet | ab_rows
  done
  ;;
10)
  generate_tests 200 8 tests/kernels/test_decode.py tests/kernels/test_layouts.py
  decode_layouts
  ;;
esac
