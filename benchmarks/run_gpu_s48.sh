#!/usr/bin/env bash
# Device calls on one GPU (session 48). Each part is what one call ran; the outputs are in
# benchmarks/results/s48/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s48.sh 1   # the ordered backward's hand-over on named barriers: its GPU tests, the
#       lightest-first stress test, and the backward alone against session 46's mbarrier hand-over
#       (ab_fused_bwd.py --ordered: variants ordered, named barriers, and ordered_mbar), alternating. Ran on
#       commit 1788f65 (results/s48/named_handover.patch on 081569f; reverted after: 0.99-1.02x the mbarrier
#       hand-over, and 4 of 47 GPU tests found NaN rows in repeated gradients)
#   bash benchmarks/run_gpu_s48.sh 2   # experiment tree (EXP_ABLATE): where the ordered backward's time over the
#       unordered one goes. ab_fused_bwd.py --ordered with variants ordered (kept), ordered_no_wait (no wait on
#       the count), ordered_no_wait_no_read (nor its early read) and ordered_no_sync (nor the hand-over and
#       count), timed only (their dq sums come in no fixed order). Ran on commit 1fe4ef1 (results/s48/ablate.patch)
#   bash benchmarks/run_gpu_s48.sh 3   # experiment tree (EXP_VARIANT): 1, the releasing warp counts both halves of a
#       step after one GPU fence, in relaxed adds; 2, the consumers hand a step's adds over under the next step's
#       dV and dK products, not its S^T and dP^T; 3, both. ab_fused_bwd.py --ordered with each, alternating
#       (bitwise against the kept order), then the ordered GPU tests and the lightest-first stress test on 3.
#       Ran on commit 8e361dc (results/s48/variants.patch holds variants 1-4; not kept)
#   bash benchmarks/run_gpu_s48.sh 4   # experiment tree: EXP_VARIANT 4 hands a step's adds over once their source
#       is read, not once they are complete (timed only: a count may then come before its adds), against the kept
#       order and variant 1 again (ab_fused_bwd.py --ordered, alternating). Ran on commit d24263c
#       (results/s48/variants.patch; not kept)
#   bash benchmarks/run_gpu_s48.sh 5   # the kept tree (081569f's kernels): the issue's benchmark at d128 against
#       SDPA cuDNN, FlexAttention and SDPA flash (also from CUDA graphs), 1k / 4k / 16k / 64k, causal and full
#   bash benchmarks/run_gpu_s48.sh 6   # experiment tree (EXP_CONVOY): full attention's ordered adds in program order,
#       every program walking the items from the first, one key group at any length. ab_fused_bwd.py --ordered at
#       full 16k / 32k / 64k (batch 1; ordered_convoy against the two kernels, the unordered kernel and the kept
#       order, which takes 16k in two key groups), then the ordered GPU tests with the convoy on. Ran on commit
#       e9418bf (results/s48/convoy_experiment.patch; the kept convoy order is commit d6685f8's)
#   bash benchmarks/run_gpu_s48.sh 7   # the convoy order kept (full attention past 16.9k keys): the ordered GPU tests
#       (convoy cases among them), the backward alone at full 16k / 32k / 64k against the two kernels and the
#       unordered kernel (ab_fused_bwd.py --ordered), and fwd+bwd against SDPA cuDNN at full 32k and 64k
#   bash benchmarks/run_gpu_s48.sh 8   # experiment (EXP_CAUSAL_CONVOY, since ORDERED_CAUSAL_CONVOY, opt-in): causal calls
#       past one key group in one key group, a key head's programs started last keys first (each waits only on
#       started ones). ab_fused_bwd.py --ordered --causal at 16k and 32k (ordered_causal_convoy against the two
#       kernels and the unordered kernel). Ran on commit 9a21f92
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  ordered_tests
  lightest_stress
  ordered_ab ab_named_causal.json ab_named_full.json 100 100 "4096 8192 16384"
  ;;
2)
  ordered_ab ab_ablate_causal.json ab_ablate_full.json 150 150 "4096 8192 16384"
  ;;
3)
  ordered_ab ab_variant_causal.json ab_variant_full.json 150 150 "4096 8192 16384"
  export FLASHTRAIN_EXP_VARIANT=3
  ordered_tests
  lightest_stress
  ;;
4)
  ordered_ab ab_read_wait_causal.json ab_read_wait_full.json 120 120 "4096 8192 16384"
  ;;
5)
  d128_against_anchors 560 1024 4096 16384 65536
  ;;
6)
  timeout -s KILL 280 python benchmarks/ab_fused_bwd.py --ordered --seqlens 16384 32768 65536 --rounds 5 \
    --out "$R/ab_convoy_full.json" 2>&1 | quiet
  FLASHTRAIN_EXP_CONVOY=1 ordered_tests
  ;;
7)
  ordered_tests
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --ordered --seqlens 16384 32768 65536 --rounds 5 \
    --out "$R/ab_convoy_full.json" 2>&1 | quiet
  timeout -s KILL 150 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal no --seqlens 32768 65536 \
    --rounds 5 --out "$R/ab_cudnn_d128_full_long.json" 2>&1 | quiet | ratios
  ;;
8)
  timeout -s KILL 170 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 16384 32768 --rounds 5 \
    --out "$R/ab_causal_convoy.json" 2>&1 | quiet
  ;;
esac
