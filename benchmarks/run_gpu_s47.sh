#!/usr/bin/env bash
# Device calls on one GPU (session 47). Each part is what one call ran; the outputs are in
# benchmarks/results/s47/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s47.sh 1   # the ordered backward's first adds as stores (FIRST_STORES): its GPU tests,
#       and the backward alone against the zero-filled buffer with every add a reduce-add, alternating. Ran on
#       commit 33993a9 (results/s47/first_stores.patch on d07ce55; reverted after: 4-8% slower), whose
#       ab_fused_bwd.py had --zero-fill
#   bash benchmarks/run_gpu_s47.sh 2   # the ordered and determinism GPU tests on the reverted tree (two key groups'
#       sum written into dq), and the block-sparse sweep at n16k, d64 and d128, eager and from CUDA graphs
#   bash benchmarks/run_gpu_s47.sh 3   # the block-sparse sweep at n64k (eager) and n4k (eager and from CUDA graphs)
#   bash benchmarks/run_gpu_s47.sh 4   # experiment tree (results/s47/exp_first.patch, FLASHTRAIN_EXP_FIRST): why the first
#       adds as stores ran slower. ab_fused_bwd.py --ordered with variants ordered (every add a reduce-add),
#       ordered_stores (the first add a store, on the zero-filled buffer: its build spills 13 / 19) and
#       ordered_all_stores (every add a store: wrong sums, timed only; spills as the kept build, 4 / 11)
#   bash benchmarks/run_gpu_s47.sh 5   # the releasing warp zeroes each item's tile before its first add
#       (ZEROS_IN_KERNEL): the ordered GPU tests, the backward alone against the zero-filled buffer, alternating,
#       and fwd+bwd against SDPA cuDNN (ab_cudnn.py, causal 2k-8k and full 4k-16k). Ran on commit 63493cf
#       (results/s47/zeros_in_kernel.patch on d4ea81d; reverted after: 0.96-1.01x the zero-filled buffer), whose
#       ab_fused_bwd.py had --zero-fill
#   bash benchmarks/run_gpu_s47.sh 6   # the kept tree: fwd+bwd against SDPA cuDNN at d128, causal 2k-8k and full 4k-16k
#   bash benchmarks/run_gpu_s47.sh 7   # experiment tree (results/s47/spin_relaxed.patch, FLASHTRAIN_EXP_SPIN_RELAXED): the
#       ordered adds' spin waits in relaxed loads (no L1 invalidation, CCTL.IVALL, per load). ab_fused_bwd.py --ordered
#       with the variant ordered_spin_relaxed, then the lightest-first stress test with the relaxed spin. Ran on the
#       experiment tree (reverted after: -0.7% to +3% against the acquire loads, one run)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  ordered_tests
  ordered_ab ab_zero_fill_causal_bwd.json ab_zero_fill_full_bwd.json 110 150 "4096 8192 16384" --zero-fill
  ;;
2)
  ordered_tests
  timeout 420 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 64 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 20
  ;;
3)
  timeout 230 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 64 128 \
    --out "$R/block_sparse_n64k.json" 2>&1 | quiet | grep "^|"
  timeout 250 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 64 128 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | grep "^|"
  ;;
4)
  ordered_ab ab_exp_first_causal.json ab_exp_first_full.json 120 150 "4096 16384"
  ;;
5)
  ordered_tests
  ordered_ab ab_zero_fill_causal_bwd.json ab_zero_fill_full_bwd.json 90 90 "4096 16384" --zero-fill
  cudnn_d128 150
  ;;
6)
  cudnn_d128 200
  ;;
7)
  ordered_ab ab_spin_causal.json ab_spin_full.json 80 80 "4096 16384"
  FLASHTRAIN_EXP_SPIN_RELAXED=1 lightest_stress
  ;;
esac
