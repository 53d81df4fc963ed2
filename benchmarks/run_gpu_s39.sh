#!/usr/bin/env bash
# Device calls on one GPU (session 39). Each part is what one call ran; the outputs are in
# benchmarks/results/s39/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s39.sh 1   # PERSISTENT_FORWARD[128] = 20 (the row-tile forward's 128-key tiles on long
#       d128 lists): the GPU tests of the Hopper backward, block-sparse, packed QKV and dense kernel files (the dense
#       backward ones not yet run on session 38's forward)
#   (part 1, on an H200: 327 passed, and the slow portable-autotune test)
#   bash benchmarks/run_gpu_s39.sh 2   # the block-sparse sweep at d128 on that route: n16k, n64k, n4k
#   (part 2, on an H200: n16k ran past its 230 s and wrote nothing; n64k and n4k in call2/)
#   bash benchmarks/run_gpu_s39.sh 3   # the block-sparse sweep at d128, n16k, with the time it needs
#   (part 3, on an H200: call3/; the first part's compiles had been the time)
#   bash benchmarks/run_gpu_s39.sh 4   # dense d128 fwd+bwd against the anchors on session 38's final forward rule,
#       1k, 4k, 16k and 64k (the 64k row in the README predates the Gluon kernels)
#   (part 4, on an H200: call4/; ours / cuDNN 0.94-0.99 fwd+bwd)
#   bash benchmarks/run_gpu_s39.sh 5   # the rest of the kernels' GPU tests (with part 1, the whole of
#       `pytest -m gpu tests/kernels` on this tree)
#   (part 5, on an H200: 138 passed; with part 1 all 466 of the kernels' GPU tests)
#   bash benchmarks/run_gpu_s39.sh 6   # the issue's attention sweep on this tree in one run (the six impls, 512 to
#       64k, causal and full), d128 then d64, as far as the call's time goes (rows are written as they come)
#   (part 6, on an H200: cut at 493 s, the session's device time, after 178 rows: d128 whole, d64 but full past 8k;
#       md and png made here from its JSON with --merge)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  hopper_backward_tests
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" "$R/gpu_tests_slow_portable.log" | head -n 20
  ;;
2)
  timeout 230 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 10
  timeout 160 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 128 \
    --out "$R/block_sparse_n64k.json" 2>&1 | quiet | tail -n 10
  timeout 150 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 128 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | tail -n 10
  ;;
3)
  timeout 450 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 10
  ;;
4)
  d128_against_anchors 560 1024 4096 16384 65536
  ;;
5)
  T=tests/kernels
  CUDA_VISIBLE_DEVICES=0 timeout -s INT 400 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_fwd_hopper.py \
    $T/test_block_sparse.py $T/test_cross_entropy.py $T/test_decode.py $T/test_dropout.py $T/test_varlen.py \
    > "$R/gpu_tests_rest.log" 2>&1
  tail -n 3 "$R/gpu_tests_rest.log"
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests_rest.log" | head -n 20
  ;;
6)
  timeout 570 python benchmarks/bench_attention.py --headdims 128 64 \
    --impls eager sdpa_flash sdpa_cudnn sdpa_mem_eff flex triton --out "$R/attention_sweep.json" 2>&1 | quiet \
    | grep "^|" | tail -n 40
  ;;
esac
