#!/usr/bin/env bash
# Session 71's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s71.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s71/callN/.
#   1: bench_decode.py with the caches stored position-major (generation's KVCache: a position's kv heads side
#      by side) and head-major (each kv head's positions contiguous), through the butterfly (16 heads of 64) and
#      a random pattern per head (16 query heads on 4 kv heads), batch 1 and 8, 4k-64k, with dense decode and
#      SDPA cuDNN on the same caches
#   2: bench_decode.py --launch on dense decode at d64 with GQA (16 query heads on 4 kv heads), batch 1 and 8,
#      4k-64k: programs per SM 3-8, 3 stages, 128-key tiles, 8 warps (part 1 had it at 0.91x cuDNN at batch 8)
#   3: bench_decode.py --num-splits on dense decode at batch 8: d64 GQA 16/4 (default 17 splits, 544 programs) and
#      d128 GQA 32/8 (default 8), with each split kernel's registers and shared memory
#   4: ab_decode_launch.py, programmatic dependent launches under GQA too (pdl_gqa) against the default (none
#      under GQA), 4 rounds, d64 16/4 and 32/8, d128 32/8, batch 1 and 8, 4k-64k
#   5: ab_decode_launch.py at d64 (16 heads, 16/4, 32/8), batch 1 and 8, 4k-64k, 4 rounds: pdl_gqa, fill5 (one
#      wave of 5 programs an SM) and both, against the defaults
#   6: after the d64 rule (one wave of 5 programs an SM, PDL under GQA at d64): ab_decode_launch.py, the new
#      defaults against before_s71 and cuDNN, d64 16 / 16 on 4 / 32 on 8, 5 rounds; the decode, layout and
#      generation GPU tests (the command-line ones need hydra: not carried, deselected); bench_decode.py through
#      both layouts again (part 1's position-major rows are the before)
#   7: bench_decode.py --launch at d64 GQA (16 on 4, 32 on 8), batch 8, 4k-64k, on the new rule: 128-key tiles, 3
#      stages, 8 warps; the split kernels' registers printed
#   8: check_large_offsets.py: one sequence past 2**31 elements (1.11M tokens x 16 heads x 128) through the
#      windowed forward and backward, decode (2.2M positions x 8 kv heads), block-sparse and the causal forward
#   9: after the entry points refuse a sequence past 2**31 elements: check_large_offsets.py, each case in its own
#      process, with the refusal lifted (--no-guard: which routes fault or misread), then with it; and the batch
#      cases (40 sequences of 16k x 32 heads of 128: the batch past 2**31, each sequence short)
#   10: after the refusal spares inference calls through Hopper's forward: check_large_offsets.py with the check on
#      (causal should run and read right, window and window_bwd be refused); the flash_attention and decode GPU tests
#   11: after flash_decode walks a cache past 2**31 elements with 64-bit tile offsets (a WIDE build): the decode
#      cases of check_large_offsets.py with the check on; the decode GPU tests and the sequence-extent tests on CUDA
#   12: the final tree (the check's common case through the storage's size): check_large_offsets.py's decode, causal
#      and window cases with the check on; the decode, extent and flash_attention GPU tests
source "$(dirname "$0")/gpu_call.sh"
# bench_decode.py through both layouts with the cache orders given: $R/decode_order_{butterfly,random}.{json,md}
decode_orders() {  # decode_orders SECONDS ORDER...
  local secs=$1
  shift
  for run in "butterfly 16" "random 4"; do
    set -- $run "${@}"
    local kind=$1 hk=$2
    shift 2
    timeout -s KILL "$secs" python benchmarks/bench_decode.py --layout $kind --nheads 16 --nheads-kv $hk \
      --headdim 64 --batches 1 8 --cache-lens 4096 16384 65536 --impls triton triton_layout sdpa_cudnn \
      --cache-orders "$@" --out "$R/decode_order_$kind.json" 2>&1 | quiet | grep "^|"
  done
}
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  decode_orders 200 positions heads
  ;;
2)
  timeout -s KILL 420 python benchmarks/bench_decode.py --nheads 16 --nheads-kv 4 --headdim 64 --batches 1 8 \
    --cache-lens 4096 16384 65536 --impls triton sdpa_cudnn \
    --launch default 3,4,2 5,4,2 6,4,2 8,4,2 4,4,3 8,4,3 4,4,2,128 8,4,2,128 4,8,2,128 \
    --out "$R/decode_gqa_d64_launch.json" 2>&1 | quiet | grep "^|"
  ;;
3)
  timeout -s KILL 200 python benchmarks/bench_decode.py --nheads 16 --nheads-kv 4 --headdim 64 --batches 8 \
    --cache-lens 4096 16384 65536 --impls triton sdpa_cudnn --num-splits default 12 16 18 19 20 24 30 33 40 \
    --out "$R/decode_gqa_d64_splits.json" 2>&1 | quiet | grep -e "^|" -e "split kernels"
  timeout -s KILL 200 python benchmarks/bench_decode.py --nheads 32 --nheads-kv 8 --headdim 128 --batches 8 \
    --cache-lens 16384 65536 --impls triton sdpa_cudnn --num-splits default 6 7 9 10 12 16 \
    --out "$R/decode_gqa_d128_splits.json" 2>&1 | quiet | grep -e "^|" -e "split kernels"
  ;;
4)
  timeout -s KILL 400 python benchmarks/ab_decode_launch.py --heads d64_gqa16_4 d64_gqa32_8 d128_gqa32_8 \
    --batches 1 8 --cache-lens 4096 16384 65536 --rounds 4 --impls pdl_gqa cudnn --out "$R/ab_decode_pdl_gqa.json" \
    2>&1 | quiet | ab_rows
  ;;
5)
  timeout -s KILL 500 python benchmarks/ab_decode_launch.py --heads d64_mha16 d64_gqa16_4 d64_gqa32_8 \
    --batches 1 8 --cache-lens 4096 16384 65536 --rounds 4 --impls pdl_gqa fill5 fill5_pdl_gqa cudnn \
    --out "$R/ab_decode_fill5.json" 2>&1 | quiet | ab_rows
  ;;
6)
  timeout -s KILL 200 python -m pytest -q -rf -n 8 tests/kernels/test_decode.py tests/kernels/test_layouts.py \
    tests/flashtrain/test_generate.py -k "not samples_from and not refuses_a_classification" \
    > "$R/cuda_tests_decode.log" 2>&1 &
  sleep 1
  wait
  echo "tests exit $?"; tail -n 4 "$R/cuda_tests_decode.log"
  timeout -s KILL 240 python benchmarks/ab_decode_launch.py --heads d64_mha16 d64_gqa16_4 d64_gqa32_8 \
    --batches 1 8 --cache-lens 4096 16384 65536 --rounds 5 --impls before_s71 cudnn \
    --out "$R/ab_decode_d64_rule.json" 2>&1 | quiet | ab_rows
  for run in "butterfly 16" "random 4"; do
    set -- $run
    timeout -s KILL 100 python benchmarks/bench_decode.py --layout $1 --nheads 16 --nheads-kv $2 --headdim 64 \
      --batches 1 8 --cache-lens 4096 16384 65536 --impls triton_layout \
      --out "$R/decode_layout_$1.json" 2>&1 | quiet | grep "^|"
  done
  ;;
7)
  for heads in "16 4" "32 8"; do
    set -- $heads
    timeout -s KILL 200 python benchmarks/bench_decode.py --nheads $1 --nheads-kv $2 --headdim 64 --batches 8 \
      --cache-lens 4096 16384 65536 --impls triton --launch default 5,4,3 5,4,2,128 5,8,2,128 5,4,3,128 4,4,2,128 \
      --out "$R/decode_gqa_d64_launch_new_rule_$1_$2.json" 2>&1 | quiet | grep -e "^|" -e "split kernels"
  done
  ;;
8)
  timeout -s KILL 420 python benchmarks/check_large_offsets.py --out "$R/large_offsets.json" 2>&1 | quiet | tail -n 12
  ;;
9)
  timeout -s KILL 380 python benchmarks/check_large_offsets.py --no-guard --out "$R/large_offsets_no_guard.json" 2>&1 \
    | quiet | cut -c1-600
  timeout -s KILL 150 python benchmarks/check_large_offsets.py --cases window decode block_sparse causal \
    --out "$R/large_offsets_guard.json" 2>&1 | quiet | cut -c1-400
  ;;
10)
  timeout -s KILL 150 python benchmarks/check_large_offsets.py --cases causal window window_bwd \
    --out "$R/large_offsets_guard.json" 2>&1 | quiet | cut -c1-400
  timeout -s KILL 300 python -m pytest -q -rf -n 8 -m gpu tests/kernels/test_flash_attention.py \
    tests/kernels/test_decode.py tests/kernels/test_sequence_extent.py > "$R/cuda_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/cuda_tests.log"
  ;;
11)
  timeout -s KILL 150 python benchmarks/check_large_offsets.py --cases decode batch_decode \
    --out "$R/large_offsets_decode_wide.json" 2>&1 | quiet | cut -c1-400
  timeout -s KILL 240 python -m pytest -q -rf -n 8 tests/kernels/test_decode.py tests/kernels/test_sequence_extent.py \
    > "$R/cuda_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/cuda_tests.log"
  ;;
12)
  timeout -s KILL 200 python benchmarks/check_large_offsets.py --cases decode causal window \
    --out "$R/large_offsets_final.json" 2>&1 | quiet | cut -c1-300
  timeout -s KILL 240 python -m pytest -q -rf -n 8 tests/kernels/test_decode.py tests/kernels/test_sequence_extent.py \
    tests/kernels/test_flash_attention.py -m "gpu or not gpu" > "$R/cuda_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/cuda_tests.log"
  ;;
esac
