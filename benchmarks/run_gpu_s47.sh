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
ratios() {  # the ratios of ab_cudnn.py's printed rows (standard input), per-round ranges left out
  python -c "import ast, sys; [print({k: v for k, v in ast.literal_eval(l).items() if 'over' in k and 'range' not in k}) for l in sys.stdin if l.startswith('{')]"
}
ordered_tests() {  # the ordered and determinism GPU tests (killed after a time limit, in case programs wait on
  # each other for ever)
  timeout -s KILL 200 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered or torch_deterministic" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
}
zero_fill_timing() {  # ab_fused_bwd.py --ordered --zero-fill at causal 2k-8k and full 4k-16k
  timeout -s KILL 110 python benchmarks/ab_fused_bwd.py --ordered --zero-fill --causal --seqlens 2048 4096 8192 \
    --rounds 5 --out "$R/ab_zero_fill_causal_bwd.json" 2>&1 | quiet
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --ordered --zero-fill --seqlens 4096 8192 16384 --rounds 5 \
    --out "$R/ab_zero_fill_full_bwd.json" 2>&1 | quiet
}
lightest_stress() {  # exp_ordered_sem.py with results/s46/lightest_stress.patch applied (lightest first), then reverted
  git apply benchmarks/results/s46/lightest_stress.patch
  LIGHTEST_PATCH=1 timeout -s KILL 90 python benchmarks/exp_ordered_sem.py --out "$R/stress_lightest.json" 2>&1 | quiet
  git apply -R benchmarks/results/s46/lightest_stress.patch
}
case "$1" in
1)
  head -n 2 "$R/machine.txt"
  ordered_tests
  zero_fill_timing
  ;;
2)
  head -n 2 "$R/machine.txt"
  ordered_tests
  timeout 420 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 64 128 \
    --out "$R/block_sparse_n16k.json" 2>&1 | quiet | tail -n 20
  ;;
3)
  head -n 2 "$R/machine.txt"
  timeout 230 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 64 128 \
    --out "$R/block_sparse_n64k.json" 2>&1 | quiet | grep "^|"
  timeout 250 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 64 128 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | grep "^|"
  ;;
4)
  head -n 2 "$R/machine.txt"
  timeout -s KILL 120 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 2048 4096 8192 --rounds 5 \
    --out "$R/ab_exp_first_causal.json" 2>&1 | quiet
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --ordered --seqlens 4096 16384 --rounds 5 \
    --out "$R/ab_exp_first_full.json" 2>&1 | quiet
  ;;
5)
  head -n 2 "$R/machine.txt"
  ordered_tests
  timeout -s KILL 90 python benchmarks/ab_fused_bwd.py --ordered --zero-fill --causal --seqlens 2048 4096 8192 \
    --rounds 5 --out "$R/ab_zero_fill_causal_bwd.json" 2>&1 | quiet
  timeout -s KILL 90 python benchmarks/ab_fused_bwd.py --ordered --zero-fill --seqlens 4096 16384 --rounds 5 \
    --out "$R/ab_zero_fill_full_bwd.json" 2>&1 | quiet
  for causal in yes no; do
    timeout -s KILL 150 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $causal \
      --seqlens $([ $causal = yes ] && echo 2048 4096 8192 || echo 4096 8192 16384) --rounds 5 \
      --out "$R/ab_cudnn_d128_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
6)
  head -n 2 "$R/machine.txt"
  for causal in yes no; do
    timeout -s KILL 200 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $causal \
      --seqlens $([ $causal = yes ] && echo 2048 4096 8192 || echo 4096 8192 16384) --rounds 5 \
      --out "$R/ab_cudnn_d128_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
7)
  head -n 2 "$R/machine.txt"
  timeout -s KILL 80 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 2048 4096 8192 --rounds 5 \
    --out "$R/ab_spin_causal.json" 2>&1 | quiet
  timeout -s KILL 80 python benchmarks/ab_fused_bwd.py --ordered --seqlens 4096 16384 --rounds 5 \
    --out "$R/ab_spin_full.json" 2>&1 | quiet
  FLASHTRAIN_EXP_SPIN_RELAXED=1 lightest_stress
  ;;
esac
