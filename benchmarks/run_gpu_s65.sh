#!/usr/bin/env bash
# Device calls on one GPU (session 65). Each part is what one call ran; the outputs are in
# benchmarks/results/s65/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s65.sh 1   # session 64's two review mends on the GPU: the compiled-launch tests that now share
#       one helper (test_launch.py's GPU tests, test_flash_bwd_hopper's compiled-launch test) and the persistent dK/dV
#       kernel whose partitions take one work tuple (test_block_sparse_hopper's persistent tests)
#   bash benchmarks/run_gpu_s65.sh 2   # generation through a captured CUDA graph a token (flashtrain.generate.DecodeStep) and
#       the prompt's prefill through flash_attention: test_generate.py's GPU tests, then bench_generate.py (GPT-2 and
#       GPT-2 medium shapes, batch 1 and 8, 512- and 4096-token prompts, 64 new tokens)
#   bash benchmarks/run_gpu_s65.sh 3   # test_generate.py's GPU tests again (call 2's prefill test had a helper's keyword
#       missing), and where the prompt's prefill through flash_attention starts to pay (call 2: slower up to 4096 tokens,
#       where prefill is bound by the host, faster at 32k): bench_generate.py --prefill-only over batch x prompt
#       (the GPU tests failed again on the same keyword: call 2's fix had not reached the file)
#   bash benchmarks/run_gpu_s65.sh 4   # the prompt's prefill routed by size (flash_attention from 8192 tokens, call 3):
#       test_generate.py's GPU tests (both prefill routes forced), and bench_generate.py's generation rows again
#   bash benchmarks/run_gpu_s65.sh 5   # the decode kernel's launch at GPT-2 medium's heads (16 of 64 or 128, MHA): call 4's
#       batch 8 x 16k step read caches and weights at 2.9 TB/s; bench_decode.py --launch, the key tile (SPLIT_BLOCK_N)
#       swept too, against SDPA cuDNN and flash
#   bash benchmarks/run_gpu_s65.sh 6   # decode's small-work rule by work items x head dim (call 5: d64 at batch 8, 128 items,
#       1.09-1.19x faster at 4 programs per SM): decode's and generation's GPU tests, bench_decode.py's default launch at
#       GPT-2 medium's heads against SDPA cuDNN, and bench_generate.py at batch 8 (GPT-2 medium, 4096- and 16k-token prompts)
#   bash benchmarks/run_gpu_s65.sh 7   # the capture under the model's device made current: generation's GPU tests, and the
#       command line end to end on CUDA (a 2-step CPU-debug run, then `python -m flashtrain.generate` greedy with the graph
#       on and off, which must print the same text)
#   bash benchmarks/run_gpu_s65.sh 8   # generate's cached path in its own function, the model's mode restored: generation's
#       and decode's GPU tests again
#   bash benchmarks/run_gpu_s65.sh 9   # review mends (one cache-list constructor; the benchmark's prefill routed through
#       PREFILL_FLASH_TOKENS): generation's GPU tests, and bench_generate.py --prefill-only on two of call 3's points
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
case "$1" in
1)
  timeout -s KILL 400 python -m pytest -q -n 6 -rf -m gpu $T/test_launch.py $T/test_flash_bwd_hopper.py \
    $T/test_block_sparse_hopper.py -k "test_launch or compiled_launches or persistent" \
    > "$R/gpu_tests_review_mends.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_review_mends.log"
  ;;
2)
  timeout -s KILL 150 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_generate.log"
  timeout -s KILL 360 python benchmarks/bench_generate.py --out "$R/generate_h200.json" 2>&1 | quiet | tail -n 14
  ;;
3)
  timeout -s KILL 120 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_generate.log"
  timeout -s KILL 240 python benchmarks/bench_generate.py --prefill-only --models gpt2-medium gpt2-medium-d128 \
    --batches 1 2 4 --prompts 2048 4096 8192 16384 --out "$R/prefill_h200.json" 2>&1 | quiet | tail -n 26
  timeout -s KILL 150 python benchmarks/bench_generate.py --prefill-only --models gpt2-medium --batches 1 \
    --prompts 65536 --rounds 3 --out "$R/prefill_64k_h200.json" 2>&1 | quiet | tail -n 3
  ;;
4)
  timeout -s KILL 120 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_generate.log"
  timeout -s KILL 400 python benchmarks/bench_generate.py --prompts 512 4096 16384 --out "$R/generate_h200.json" 2>&1 \
    | quiet | tail -n 16
  ;;
5)
  for d in 64 128; do
    timeout -s KILL 200 python benchmarks/bench_decode.py --batches 1 8 --cache-lens 4096 16384 65536 --nheads 16 \
      --nheads-kv 16 --headdim $d --impls triton sdpa_cudnn sdpa_flash \
      --launch default 2,4,2,128 4,4,2 4,4,3 2,4,3,128 2,8,2,128 4,4,3,128 2,8,3,128 \
      --out "$R/decode_launch_d${d}_h200.json" 2>&1 | quiet | tail -n 60
  done
  ;;
6)
  timeout -s KILL 150 python -m pytest -q -rf -m gpu tests/kernels/test_decode.py tests/kernels/test_launch.py \
    tests/flashtrain/test_generate.py -k "decode or generat or prefill or captured" > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_decode.log"
  for d in 64 128; do
    timeout -s KILL 100 python benchmarks/bench_decode.py --batches 1 8 --cache-lens 4096 16384 65536 --nheads 16 \
      --nheads-kv 16 --headdim $d --impls triton sdpa_cudnn --out "$R/decode_d${d}_h200.json" 2>&1 | quiet | tail -n 13
  done
  timeout -s KILL 200 python benchmarks/bench_generate.py --models gpt2-medium --batches 8 --prompts 4096 16384 \
    --out "$R/generate_b8_h200.json" 2>&1 | quiet | tail -n 4
  ;;
7)
  timeout -s KILL 120 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_generate.log"
  S=$(mktemp -d)
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, from the run's own directory
  (cd "$S" && timeout -s KILL 120 python "$OLDPWD/train.py" debug=cpu trainer.max_steps=2 trainer.run_name=smoke \
    > "$R/smoke_train.log" 2>&1; echo "train exit $?"
   for g in on off; do
     timeout -s KILL 60 python -m flashtrain.generate --run runs/smoke --device cuda --cuda-graph $g --temperature 0 \
       --prompt "ab" --max-new-tokens 40 > "$R/smoke_generate_$g.txt" 2> "$R/smoke_generate_$g.err"; echo "generate $g exit $?"
   done)
  cmp "$R/smoke_generate_on.txt" "$R/smoke_generate_off.txt" && echo "same text with the graph on and off"
  ;;
8)
  timeout -s KILL 150 python -m pytest -q -rf -m gpu tests/kernels/test_decode.py tests/flashtrain/test_generate.py \
    > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_generate.log"
  ;;
9)
  timeout -s KILL 120 python -m pytest -q -rf -m gpu tests/flashtrain/test_generate.py > "$R/gpu_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests_generate.log"
  timeout -s KILL 120 python benchmarks/bench_generate.py --prefill-only --models gpt2-medium --batches 1 4 \
    --prompts 2048 8192 --out "$R/prefill_h200.json" 2>&1 | quiet | tail -n 6
  ;;
esac
