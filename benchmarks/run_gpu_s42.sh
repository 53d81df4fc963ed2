#!/usr/bin/env bash
# Device calls on one GPU (session 42). Each part is what one call ran; the outputs are in
# benchmarks/results/s42/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s42.sh 1   # the one-kernel backward (exp_fused_bwd.py: fp32 reference check, against
#       the default two-kernel backward and SDPA cuDNN), in two processes: the dK/dV kernels as on main, then with
#       non-causal query tiles in two sections (EXP_FIRST_TILE_ALONE=1, call1/first_tile_alone.patch; not kept)
#   (part 1, on an H200: call1/)
#   bash benchmarks/run_gpu_s42.sh 2   # exp_fused_bwd.py at d128 1k and 8k, then the GPU tests of the Hopper backward
#       file (the fused kernel's among them; the slow portable-autotune test left out)
#   (part 2, on an H200: call2/, 165 passed, on the tree before causal deterministic=False calls left the fused kernel)
#   bash benchmarks/run_gpu_s42.sh 3   # the same GPU tests on the final routes
#   (part 3, on an H200: call3/, 167 passed)
#   bash benchmarks/run_gpu_s42.sh 4   # exp_fused_bwd.py at d128 4k and 16k after the fused steps count their query
#       tile along instead of dividing by the section's length (21 spills in the full build's loops, not 63)
#   (part 4, on an H200: call4/)
#   bash benchmarks/run_gpu_s42.sh 5   # over results/s42/ablation.patch: exp_fused_ablation.py without the dS^T
#       wait, without the reduce-adds, without both, and as is, two rounds
#   (part 5, on an H200: call5/)
#   bash benchmarks/run_gpu_s42.sh 6   # the fused kernel with its full-attention query tiles in sections whose first is
#       the first tile alone (EXP_FIRST_ALONE=1) and without (=0), exp_fused_bwd.py at d128 4k and 16k, two rounds
#   (part 6, on an H200: call6/, over a tree with that setting; not kept: 0.96-0.99x, more spills in the hot loop)
#   bash benchmarks/run_gpu_s42.sh 7   # the final tree: bench_attention.py at d128 (ours deterministic and not, SDPA
#       cuDNN, 1k-16k, causal and full), then the GPU tests of the Hopper backward file
#   (part 7, on an H200: call7/)
#   bash benchmarks/run_gpu_s42.sh 8   # over call8/dq_red.patch: dQ added from registers (red.global.add, EXP_DQ_RED=1)
#       against through shared memory and TMA (=0), exp_fused_bwd.py at d128 4k and 16k, two rounds
#   (part 8, on an H200: call8/; not kept: 1.3x slower)
#   bash benchmarks/run_gpu_s42.sh 9   # causal calls through the fused kernel (EXP_FUSED_CAUSAL=1), its sections run
#       hot one first (EXP_HOT_FIRST=1, 71 spills in the causal build's loops, not 100) and in order (=0),
#       exp_fused_bwd.py at d128 1k-16k
#   (part 9, on an H200: call9/, over call9/hot_first.patch; kept: hot first, causal from 4k queries)
#   bash benchmarks/run_gpu_s42.sh 10  # the final tree: bench_attention.py at d128 as in part 7, then the GPU tests of
#       the Hopper backward file
#   (part 10, on an H200: call10/, 168 passed)
#   bash benchmarks/run_gpu_s42.sh 11  # ab_fused_bwd.py: fused against deterministic, alternating, causal 4k-16k and
#       full 8k, 16k, five rounds
#   (part 11, on an H200: call11/)
#   bash benchmarks/run_gpu_s42.sh 12  # over call12/d64.patch: the fused kernel at head dim 64 (64 x 64 tiles, 3 and 4
#       stages; no spills), exp_fused_bwd.py at 1k-16k
#   (part 12, on an H200: call12/; not kept: fwd+bwd 0.95-1.03x the deterministic path)
source "$(dirname "$0")/gpu_call.sh"
machine_info
# exp_fused NAME SECONDS ARGS...: exp_fused_bwd.py into $R/NAME.json and .log, then its reference checks and
# rows (a setting goes in front as an environment variable: EXP_X=1 exp_fused ...)
exp_fused() {
  local name=$1 secs=$2
  shift 2
  timeout "$secs" python benchmarks/exp_fused_bwd.py --out "$R/$name.json" "$@" 2>&1 | quiet > "$R/$name.log"
  echo "$name"
  grep "fp32 reference" "$R/$name.log"
  grep -o "'seqlen'.*vs_cudnn': [0-9.]*" "$R/$name.log"
}
# bwd_gpu_tests SECONDS: the GPU tests of the Hopper backward file (the slow portable-autotune test left out)
bwd_gpu_tests() {
  timeout -s INT "$1" python -m pytest -q -n 4 -m gpu -rf tests/kernels/test_flash_bwd_hopper.py \
    --deselect tests/kernels/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/gpu_tests_bwd_hopper.log" 2>&1
  tail -n 3 "$R/gpu_tests_bwd_hopper.log"
}
case "$1" in
1)
  for e in 0 1; do EXP_FIRST_TILE_ALONE=$e exp_fused "fused_first_tile_alone$e" 260; done
  ;;
2)
  exp_fused fused_1k_8k 200 --headdims 128 --seqlens 1024 8192
  bwd_gpu_tests 360
  ;;
3)
  bwd_gpu_tests 400
  ;;
4)
  exp_fused fused_d128 300 --headdims 128
  ;;
5)
  for round in 1 2; do
    for setting in "0 0" "1 0" "0 1" "1 1"; do
      set -- $setting
      EXP_NO_SYNC=$1 EXP_NO_REDUCE=$2 timeout 100 python benchmarks/exp_fused_ablation.py \
        --out "$R/ablation_sync$1_reduce$2_round$round.json" 2>&1 | quiet | tail -n 4
    done
  done
  ;;
6)
  for round in 1 2; do
    for e in 0 1; do EXP_FIRST_ALONE=$e exp_fused "first_alone${e}_round$round" 140 --headdims 128; done
  done
  ;;
7 | 10)
  timeout 230 python benchmarks/bench_attention.py --headdims 128 --seqlens 1024 2048 4096 8192 16384 \
    --impls triton triton_atomic sdpa_cudnn --out "$R/attention_d128_fused.json" 2>&1 | quiet > "$R/attention_d128_fused.log"
  tail -n 16 "$R/attention_d128_fused.log"
  bwd_gpu_tests 330
  ;;
8)
  for round in 1 2; do
    for e in 0 1; do EXP_DQ_RED=$e exp_fused "dq_red${e}_round$round" 140 --headdims 128; done
  done
  ;;
9)
  for e in 1 0; do
    EXP_FUSED_CAUSAL=1 EXP_HOT_FIRST=$e exp_fused "causal_hot_first$e" 200 --headdims 128 --seqlens 1024 4096 8192 16384
  done
  ;;
11)
  timeout 150 python benchmarks/ab_fused_bwd.py --causal --out "$R/ab_causal.json" 2>&1 | quiet | grep seqlen
  timeout 100 python benchmarks/ab_fused_bwd.py --seqlens 8192 16384 --out "$R/ab_full.json" 2>&1 | quiet | grep seqlen
  ;;
12)
  for st in 3 4; do
    EXP_FUSED_D64=1 EXP_D64_STAGES=$st exp_fused "d64_stages$st" 200 --headdims 64 --seqlens 1024 4096 8192 16384
  done
  ;;
*)
  echo "unknown part $1" >&2
  exit 2
  ;;
esac
