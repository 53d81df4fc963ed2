#!/usr/bin/env bash
# Session 88's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s88.sh PART, results in $OUT/results.tgz
# (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s88/callN/.
#   1: the two-kernel backward's dK/dV kernel as a programmatic dependent launch of the dq kernel
#      (`_flash_dkdv_hopper.DEPENDENT_AFTER_DQ`, new, on by default): its GPU tests (bitwise the ordinary launch's
#      results, eager and from a CUDA graph, dense and block-sparse), and session 87's tests not yet run on a GPU
#      (deterministic=False's causal route at 16k and 20k); then block-sparse n4k fwd+bwd with it off / on,
#      alternating (ab_block_sparse.py, d128 and d64, butterfly 3-49%)
#   2: call 1: the dependent launch ÷ the ordinary one from graphs at n4k, two-kernel points: d128 0.972 / 0.983 /
#      0.978 / 0.991 / 0.989 at 3-24%, d64 0.981 / 0.992 / 0.997 / 0.993 / 0.994 / 0.997 at 3-49% (d128 49% takes the
#      one-kernel backward: 1.009, its spread); its GPU tests failed in the CUDA-graph capture (the test's own
#      call before it kept its autograd graph alive; fixed: results detached). The GPU tests of the dq / dK/dV and
#      block-sparse Hopper files whole (the dependent launch is the default there now), then block-sparse n16k
#      at 0.8-10% with it off / on
#   3: call 2: GPU tests, 492 passed before the time limit (none failed); block-sparse n16k from graphs, dependent ÷
#      ordinary 0.993 / 1.025 / 1.037 / 1.047 / 1.004 at d128 0.8 / 2.3 / 4.7 / 6.25 / 10%, d64 0.994 / 0.997 / 1.017 /
#      1.004 / 1.024, where the eager rows read level or faster (d128 6.25%: 1.06 against 1.08 ms). Again, to tell
#      the run's spread from a loss: n16k at 2-11% and n4k at 3-10%, both head dims, beside the dq kernel's programs
#      letting the dK/dV kernel launch late (`DEPENDENTS_AT_START` off: a persistent program at its last item, a grid
#      program as it exits); then causal 4k / 8k against cuDNN on the final tree (session 87's Next; session 84's
#      figures until now)
#   4: call 3: n4k dependent ÷ ordinary 0.972-0.988 again (0.974-1.000 with the dq programs letting it launch late);
#      n16k 0.968-1.124 either way, the ordinary timings themselves 1-9% apart; cuDNN ÷ ours causal 4k / 8k 1.084 /
#      1.083. Change: the dependent launch only where the dq kernel has at most 4 work items an SM
#      (`dependent_after_dq`: n4k's 512 on 132 SMs, not n16k's 2048); the late trigger removed
#      (results/s88/call3/late_trigger.patch). The GPU tests of the dq / dK/dV and block-sparse Hopper files whole.
#      Outcome (call 4): 500 passed
# (Part 3 ran with the late trigger, now removed: `git apply benchmarks/results/s88/call3/late_trigger.patch` first.)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  gpu_tests 240 8 tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_flash_bwd_fused_hopper.py -k "dependent_dkdv or nondeterministic_backward_takes_the_fused"
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  timeout -s KILL 300 python benchmarks/ab_block_sparse.py --variants dependent_dkdv --seqlens 4096 \
    --headdims 128 64 --max-density 0.5 --no-flex --out "$R/ab_dependent_dkdv_n4k.json" 2>&1 | quiet | grep "^|"
  ;;
2)
  gpu_tests 330 8 tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_flash_bwd_fused_hopper.py::test_gpu_nondeterministic_backward_takes_the_fused_kernel
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  timeout -s KILL 200 python benchmarks/ab_block_sparse.py --variants dependent_dkdv --seqlens 16384 \
    --headdims 128 64 --max-density 0.11 --no-flex --out "$R/ab_dependent_dkdv_n16k.json" 2>&1 | quiet | grep "^|"
  ;;
3)
  timeout -s KILL 220 python benchmarks/ab_block_sparse.py --variants dependent_dkdv dependent_dkdv_late \
    --seqlens 16384 --headdims 128 64 --min-density 0.02 --max-density 0.11 --no-flex --out "$R/ab_dependent_dkdv_n16k.json" 2>&1 \
    | quiet | grep "^|"
  timeout -s KILL 120 python benchmarks/ab_block_sparse.py --variants dependent_dkdv dependent_dkdv_late \
    --seqlens 4096 --headdims 128 64 --max-density 0.1 --no-flex --out "$R/ab_dependent_dkdv_n4k.json" 2>&1 | quiet | grep "^|"
  settled_cudnn 130 final_tree yes "4096 8192" --deterministic-only
  clock_medians "$R/final_tree_causal_yes.json"
  ;;
4)
  gpu_tests 450 8 tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_flash_bwd_fused_hopper.py::test_gpu_nondeterministic_backward_takes_the_fused_kernel
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  ;;
esac
