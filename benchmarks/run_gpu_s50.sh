#!/usr/bin/env bash
# Device calls on one GPU (session 50). Each part is what one call ran; the outputs are in
# benchmarks/results/s50/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s50.sh 1   # the ordered GPU tests after session 49's GQA limits (its part 10, refused
#       for want of device time): causal ordered calls without GQA, full attention's key groups up to 2 query
#       heads a key head; then the host cost of block-sparse d64 calls at n16k 6.25% (butterfly 7:0) and n4k
#       (bench_host_overhead.py, ours against FlexAttention on the same block mask)
#   bash benchmarks/run_gpu_s50.sh 2   # the block-sparse host trims (results/s50/host_trim.patch):
#       the Hopper block-sparse GPU tests, then host time per fwd+bwd before / after (the patch reversed in a copy
#       of the tree), alternating processes, three rounds: bench_host_overhead.py at d64 and d128, n4k, all-factor
#       butterfly (block-sparse and dense paths)
#   bash benchmarks/run_gpu_s50.sh 3   # the host trims against without them in one process (ab_host_trims.py: 20
#       alternating batches, n4k, d64 and d128, block-sparse and dense), then the issue-4 sweep at n16k, d64 and
#       d128 (bench_block_sparse.py: eager and from CUDA graphs, against FlexAttention on the same block mask)
#   bash benchmarks/run_gpu_s50.sh 4   # is the causal convoy's 64k loss its L2? Nsight Compute on the backward kernels of
#       one causal d128 fwd+bwd (batch 1, 16 heads): time, L2 hit rate and DRAM bytes of the convoy at 32k and at 64k
#       (its limit lifted), the unordered one-kernel backward at 64k and the two deterministic kernels at 64k (call 4
#       ran it with the metrics printed by cut; the same runs as today's ncu_backward)
#   bash benchmarks/run_gpu_s50.sh 5   # the same Nsight Compute metrics for the causal convoy and the unordered kernel at
#       48k, and for the full-attention convoy (1.11x the two kernels in session 48) and the two kernels at full 64k
#   bash benchmarks/run_gpu_s50.sh 6   # the causal convoy launched in blocks (ORDERED_CAUSAL_CONVOY_BLOCK; calls 4-5: at 64k
#       its L2 hit rate fell to 69%): the ordered GPU tests with blocks of 16 (and the edge cases with blocks of 3),
#       then the backward alone at causal 32k / 48k / 64k with blocks of 1 (today's order), 8, 16 and 33 against the
#       two kernels and the unordered kernel (ab_fused_bwd.py --convoy-blocks, three rounds)
#   bash benchmarks/run_gpu_s50.sh 7   # the rule kept from call 6 (blocks of 16 past 32k, the causal convoy up to 64k): the
#       ordered routing GPU tests (48k in blocks among them) and the determinism switch's
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  ordered_tests
  for point in "16384 7:0" "4096 0:0"; do
    set -- $point
    timeout 150 python benchmarks/bench_host_overhead.py --headdim 64 --seqlen $1 --butterfly $2 --no-parts \
      --top 60 --out "$R/host_bs_d64_n$(($1 / 1024))k.json" 2>&1 | quiet | grep "^{"
  done
  ;;
2)
  timeout -s KILL 200 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_block_sparse_hopper.py \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  rm -rf /tmp/before && cp -r . /tmp/before && (cd /tmp/before && git apply -R benchmarks/results/s50/host_trim.patch) \
    && echo "before tree ready"
  for round in 1 2 3; do
    for tree in before after; do
      dir=$([ $tree = before ] && echo /tmp/before || pwd)
      for d in 64 128; do
        (cd "$dir" && timeout 90 python benchmarks/bench_host_overhead.py --headdim $d --seqlen 4096 --no-parts \
          --calls 300 --top 40 --out "$R/host_${tree}_d${d}_r$round.json" 2>&1 | quiet | grep "^{" | cut -c1-220)
      done
    done
  done
  ;;
3)
  timeout 120 python benchmarks/ab_host_trims.py --out "$R/host_trims.json" 2>&1 | quiet | grep "fwd+bwd"
  timeout 420 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 64 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | grep "^|" | tail -n 20
  ;;
4)
  ncu_backward "convoy 32768 triton causal" "convoy 65536 triton causal" "unordered 65536 triton_atomic causal" \
    "two_kernels 65536 triton causal"
  ;;
6)
  FLASHTRAIN_CAUSAL_CONVOY_BLOCK=16 timeout -s KILL 130 python -m pytest -q -n 4 -rf -m gpu \
    tests/kernels/test_flash_bwd_hopper.py -k "ordered_fused_backward_matches or takes_the_ordered" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  timeout -s KILL 170 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 32768 49152 65536 --rounds 3 \
    --convoy-blocks 1 8 16 33 --causal-convoy-upto 65536 --out "$R/ab_convoy_blocks.json" 2>&1 | quiet
  ;;
7)
  timeout -s KILL 150 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "takes_the_ordered or torch_deterministic" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  ;;
5)
  ncu_backward "convoy 49152 triton causal" "unordered 49152 triton_atomic causal" "full_convoy 65536 triton full" \
    "two_kernels_full 65536 triton full"
  ;;
esac
