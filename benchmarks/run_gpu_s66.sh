#!/usr/bin/env bash
# Device calls on one GPU (session 66). Each part is what one call ran; the outputs are in
# benchmarks/results/s66/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s66.sh 1   # flash_decode in one launch (each work item's last split merges, through a
#       counter per item): decode's tests on CUDA (all, the merge both ways; the one-launch merge against the merge
#       kernel eagerly and from a graph) and generation's GPU tests; ab_decode_merge.py (both merges and SDPA cuDNN,
#       alternating rounds); bench_generate.py --merge-ab (GPT-2 medium's steps both ways). (Ran at commit 61c1f50, whose
#       ab_decode_merge.py and --merge-ab are gone since: the one-launch merge was slower and its merge order changed
#       between runs; dropped.)
#   bash benchmarks/run_gpu_s66.sh 2   # flash_decode's two kernels as programmatic dependent launches (PDL), one split
#       writing out and lse itself: decode's tests on CUDA (PDL against ordinary launches bitwise, eagerly and from a
#       graph) and generation's and the compiled launches' GPU tests; ab_decode_launch.py (PDL, ordinary, SDPA cuDNN in
#       alternating rounds); bench_generate.py --pdl-ab (GPT-2 medium's steps both ways). (The generation tests, with
#       test_launch.py's, ran past their 200 s and were killed, no failure shown.)
#   bash benchmarks/run_gpu_s66.sh 3   # call 2: PDL 1-5% faster with MHA at batch 1, 2-8% slower with GQA at d128: the
#       merge kernel let in after the split kernel's key loop instead of at its start (pdl_late), against both, at 12
#       points; generation's GPU tests alone with a longer limit
#   bash benchmarks/run_gpu_s66.sh 4   # call 3: the late trigger no better, GQA d128 at batch 8 at 0.80-0.88x cuDNN: 576
#       programs on 528 places (9 splits rounded up); little work's split count now rounded down: decode's tests on
#       CUDA, ab_decode_launch.py at 18 points (PDL, ordinary launches, PDL with the old rounding up, SDPA cuDNN)
#   bash benchmarks/run_gpu_s66.sh 5   # call 4: rounding down helped d128 (GQA batch 8 1.19-1.31x) but cost d64 batch 8
#       3.5-4.6% (d64 holds 5 programs an SM): the split count capped at the programs the SMs hold (a table from ptxas);
#       decode's tests on CUDA (the table against the compiled kernels), ab_decode_launch.py (PDL capped / ordinary /
#       uncapped, SDPA cuDNN). (The table's test failed at d32 first: the compiled kernel held 62 registers, not the 72 of
#       a CPU build with other strides; rebuilt on the CPU with the call's own strides, d128 holds 4 programs causal, 5
#       full, 3 with GQA: no one table per head dim, so the rule became "round down from head dim 128", which gives
#       the split counts this call measured at d64 and d128.)
#   bash benchmarks/run_gpu_s66.sh 6   # the final rule: decode's tests on CUDA, generation's GPU tests, and
#       ab_decode_launch.py at the four points the rounding moved or could have (d64 and GQA d128 at batch 8, 16k, 64k)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
# (ab_rows, the printer of ab_decode_*.py rows: gpu_call.sh. Each part printed its own columns when it ran.)
case "$1" in
1)
  timeout -s KILL 200 python -m pytest -q -rf $T/test_decode.py tests/flashtrain/test_generate.py \
    > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_decode.log"
  timeout -s KILL 200 python benchmarks/ab_decode_merge.py --rounds 5 --out "$R/ab_decode_merge.json" 2>&1 | quiet \
    | ab_rows
  timeout -s KILL 200 python benchmarks/bench_generate.py --merge-ab --models gpt2-medium --batches 1 8 \
    --prompts 512 4096 --rounds 3 --out "$R/generate_merge_ab_h200.json" 2>&1 | quiet | tail -n 6
  ;;
2)
  timeout -s KILL 200 python -m pytest -q -rf $T/test_decode.py > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_decode.log"
  timeout -s KILL 200 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py $T/test_launch.py \
    > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_generate.log"
  timeout -s KILL 200 python benchmarks/ab_decode_launch.py --rounds 5 --out "$R/ab_decode_launch.json" 2>&1 | quiet \
    | ab_rows
  timeout -s KILL 200 python benchmarks/bench_generate.py --pdl-ab --models gpt2-medium --batches 1 8 \
    --prompts 512 4096 --rounds 3 --out "$R/generate_pdl_ab_h200.json" 2>&1 | quiet | tail -n 6
  ;;
3)
  timeout -s KILL 300 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_generate.log"
  timeout -s KILL 240 python benchmarks/ab_decode_launch.py --rounds 5 --cache-lens 4096 16384 \
    --out "$R/ab_decode_launch.json" 2>&1 | quiet | ab_rows
  ;;
4|5)  # (the same commands on two trees: little work rounded down at every head dim; then capped by a table)
  timeout -s KILL 200 python -m pytest -q -rf $T/test_decode.py > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_decode.log"
  timeout -s KILL 300 python benchmarks/ab_decode_launch.py --rounds 5 --out "$R/ab_decode_launch.json" 2>&1 | quiet \
    | ab_rows
  ;;
6)
  timeout -s KILL 150 python -m pytest -q -rf $T/test_decode.py > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_decode.log"
  timeout -s KILL 150 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_generate.log"
  for h in d64_mha16 d128_gqa32_8; do
    timeout -s KILL 100 python benchmarks/ab_decode_launch.py --rounds 3 --heads $h --batches 8 --cache-lens 16384 65536 \
      --out "$R/ab_decode_launch_$h.json" 2>&1 | quiet | ab_rows
  done
  ;;
esac
