#!/usr/bin/env bash
# Device calls on one GPU (session 35). Each part is what one call ran; the outputs are in
# benchmarks/results/s35/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s35.sh 1   # the compiled launches with each TMA descriptor encoded once (kernels/_launch.py)
#       against the tree before (carried in .carry/old: `git archive <commit> kernels benchmarks/*.py flashtrain`):
#       host time of one eager fwd+bwd at n4k, block-sparse (butterfly 2 factors), dense and Flex, d128 and d64,
#       the two trees alternating, twice; the launch path's GPU tests
#   bash benchmarks/run_gpu_s35.sh 2   # (part 1, on an H200: host times too noisy between processes to compare,
#       Flex's own from 0.56 to 1.05 ms; 3 of the 4 launch tests passed, the new one's in-place write hit a leaf
#       that requires grad) both ways in one process, alternating (check_launch_encoding.py); the launch tests
#       again; block-sparse n4k at d128 and d64, eager and from graphs, against Flex
#   bash benchmarks/run_gpu_s35.sh 3   # (part 2, on an H200: the A/B stopped on a key error after its first case; 4
#       launch tests passed; block-sparse n4k eager 0.61-1.31x Flex, both ~0.6-0.9 ms a call, from graphs
#       1.09-1.35x at d128, 1.21-1.38x at d64) the A/B again, at n4k and at n1k; the GPU tests of the
#       Hopper forward, backward, block-sparse, packed QKV and dense kernel files and of the launch path
#   bash benchmarks/run_gpu_s35.sh 4   # (part 3, on an H200: encoded once 1.06-1.26x less host time per eager
#       fwd+bwd, 1.17-1.26x per forward; 315 + 1 + 127 GPU tests passed) block-sparse n16k at d128 and d64,
#       eager and from graphs, against Flex; eager n1k d128 and d64 against the anchors
#   bash benchmarks/run_gpu_s35.sh 5   # (part 4, on an H200: block-sparse n16k eager 1.23-1.28x Flex at d128 and
#       1.21-1.41x at d64 from 4.7%, host-bound below; n1k 0.89-1.00x cuDNN, 1.15-1.31x Flex) GPT-2 small 1k,
#       ours with descriptors encoded once and without (FLASHTRAIN_ENCODE_ONCE=0), alternating, and SDPA cuDNN
#   bash benchmarks/run_gpu_s35.sh 6   # (part 5, on an H200: 493k and 433k tokens/s encoded once, 427k without,
#       SDPA cuDNN 489k: process-to-process spread larger than the difference) the same, four pairs
#   bash benchmarks/run_gpu_s35.sh 7   # (part 6, on an H200: medians 466k tokens/s encoded once, 462k without,
#       spread 427k-497k) the persistent dq kernel against the row-tile one (check_persistent_dq.py:
#       bitwise checks, the dq kernel alone from graphs), then the GPU tests of the Hopper backward and
#       block-sparse files (the row-tile dq kernel now runs its rows through `_dq_rows`)
#   bash benchmarks/run_gpu_s35.sh 8   # (part 7, on an H200: 24 of 24 bitwise equal; dq alone 1.09-1.34x at
#       block-sparse d64, 1.24x at d128 one block per row, slower on longer lists and dense d128; 303
#       passed) NOT RUN (the session's device time ran out): the GPU tests of the Hopper backward and
#       block-sparse files with FLASHTRAIN_PERSISTENT_DQ=1
#   bash benchmarks/run_gpu_s35.sh 9   # NOT RUN: block-sparse n4k and n16k at d64 and d128 with it off and on
source "$(dirname "$0")/gpu_call.sh"
machine_info
host_ab() {  # host_ab ROUND: bench_host_overhead.py on the old tree and the new, d128 and d64
  local round=$1 tree script d
  for tree in old new; do
    script=benchmarks/bench_host_overhead.py
    [ "$tree" = old ] && script=.carry/old/benchmarks/bench_host_overhead.py
    for d in 128 64; do
      timeout 150 python "$script" --seqlen 4096 --headdim "$d" --butterfly 2:0 --no-parts --calls 200 \
        --out "$R/host_${tree}_d${d}_r${round}.json" > "$R/host_${tree}_d${d}_r${round}.log" 2>&1
      echo "$tree d$d round $round: $(grep -o "'path': '[a-z_]*'\|'fwdbwd_host_ms': [0-9.]*\|'fwdbwd_synced_ms': [0-9.]*" \
        "$R/host_${tree}_d${d}_r${round}.log" | cut -d: -f2 | paste -sd' ')" | tee -a "$R/host_ab.log"
    done
  done
}
case "${1:?part 1 to 9}" in
1)
  python -c "import sys; sys.path.insert(0, '.carry/old'); import kernels._launch as l; print('old tree:', l.__file__, 'c launcher' if hasattr(l, '_CLauncher') else 'run path')" | tee "$R/trees.txt"
  host_ab 1
  timeout -s INT 150 python -m pytest -q -m gpu -rf tests/kernels/test_launch.py tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -k "compiled or encoded or launch" > "$R/gpu_tests_launch.log" 2>&1
  tail -n 3 "$R/gpu_tests_launch.log"
  host_ab 2
  ;;
2)
  timeout 200 python benchmarks/check_launch_encoding.py --seqlens 4096 --headdims 128 64 \
    --out "$R/launch_encoding_n4k.json" 2>&1 | quiet | tee "$R/launch_encoding.log"
  timeout -s INT 120 python -m pytest -q -m gpu -rf tests/kernels/test_launch.py tests/kernels/test_flash_bwd_hopper.py \
    tests/kernels/test_block_sparse_hopper.py -k "compiled or encoded or launch" > "$R/gpu_tests_launch.log" 2>&1
  tail -n 3 "$R/gpu_tests_launch.log"
  timeout 240 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 128 64 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | tail -n 20
  ;;
3)
  timeout 150 python benchmarks/check_launch_encoding.py --seqlens 4096 1024 --headdims 128 64 \
    --out "$R/launch_encoding.json" 2>&1 | quiet | tee "$R/launch_encoding.log"
  timeout -s INT 400 python -m pytest -q -n 3 -m gpu -rf tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_launch.py > "$R/gpu_tests_fwd_launch.log" 2>&1 &
  hopper_backward_tests
  wait
  tail -n 2 "$R/gpu_tests_fwd_launch.log"
  ;;
4)
  timeout 400 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 64 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 16
  timeout 170 python benchmarks/bench_attention.py --seqlens 1024 --headdims 128 64 \
    --impls triton flex sdpa_flash sdpa_cudnn --out "$R/attention_n1k.json" 2>&1 | quiet | grep "^|"
  ;;
5|6)
  runs="triton:1:a triton:0:a triton:1:b sdpa_cudnn:1:a"
  [ "$1" = 6 ] && runs="triton:0:a triton:1:a triton:1:b triton:0:b triton:0:c triton:1:c triton:1:d triton:0:d"
  for run in $runs; do
    IFS=: read -r impl once tag <<< "$run"
    FLASHTRAIN_ENCODE_ONCE=$once timeout 140 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 \
      --impls "$impl" --steps 40 --out "$R/train_small1k_${impl}_encode${once}_$tag.json" 2>&1 | quiet \
      | tee -a "$R/bench_train.log" | grep "^|.*gpt2" | sed "s/^/encode_once=$once /"
  done
  ;;
7)
  timeout 240 python benchmarks/check_persistent_dq.py --out "$R/persistent_dq.json" 2>&1 | quiet \
    | tee "$R/persistent_dq.log" | grep -v "^ok "
  T=tests/kernels
  timeout -s INT 300 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_bwd_hopper.py $T/test_block_sparse_hopper.py \
    --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels > "$R/gpu_tests.log" 2>&1
  tail -n 3 "$R/gpu_tests.log"
  ;;
8)
  FLASHTRAIN_PERSISTENT_DQ=1 hopper_backward_tests
  ;;
9)
  for on in 0 1; do
    FLASHTRAIN_PERSISTENT_DQ=$on timeout 280 python benchmarks/bench_block_sparse.py --seqlens 4096 16384 \
      --headdims 64 128 --out "$R/block_sparse_persistent_dq$on.json" 2>&1 | quiet | tail -n 30
  done
  ;;
esac
