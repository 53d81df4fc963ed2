#!/usr/bin/env bash
# Device calls on one GPU (session 46). Each part is what one call ran; the outputs are in
# benchmarks/results/s46/callN/ (each call's machine.txt names its GPU). Parts 1-4 ran the experiment tree
# (results/s46/sem_modes.patch applied: the FLASHTRAIN_EXP_* switches); parts 5 and 6 the kept tree.
#   bash benchmarks/run_gpu_s46.sh 1   # does the ordered causal backward's dq repeat bit for bit, per launch order
#       (FLASHTRAIN_EXP_LIGHTEST: 1 lightest first over chunks of heads, one key group at any length; 0 the kept
#       grid order) and semaphore mode (FLASHTRAIN_EXP_SEM: 0 relaxed count; 3 fence.acq_rel.gpu in every thread, then
#       the relaxed add; 4 Triton's release add; 6 that and acquire loads in the waits): exp_ordered_sem.py at causal 4k-32k, one process per mode, each killed after a time limit
source "$(dirname "$0")/gpu_call.sh"
machine_info
# (sem_repeats and sem_timing give each run the longest time limit the calls used: call 3 gave its 16k repeats 60 s
# and calls 2-4 their full-attention timings 90 s)
sem_repeats() {  # sem_repeats LIGHTEST SEM [exp_ordered_sem.py options]: the bitwise repeats of one mode
  local lightest=$1 sem=$2
  shift 2
  FLASHTRAIN_EXP_LIGHTEST=$lightest FLASHTRAIN_EXP_SEM=$sem timeout -s KILL 85 python benchmarks/exp_ordered_sem.py \
    "$@" --out "$R/sem_l${lightest}_s${sem}.json" 2>&1 | quiet | tee -a "$R/exp_ordered_sem.log"
}
sem_timing() {  # sem_timing SEM causal|full: ab_fused_bwd.py --ordered of one mode in grid order
  local sem=$1 seqlens="4096 16384" flag=""
  [ "$2" = causal ] && seqlens="2048 4096 8192" flag=--causal
  FLASHTRAIN_EXP_LIGHTEST=0 FLASHTRAIN_EXP_SEM=$sem timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --ordered \
    $flag --seqlens $seqlens --rounds 3 --out "$R/ab_$2_s$sem.json" 2>&1 | quiet | sed "s/^/s$sem /"
}
ordered_timing() {  # ab_fused_bwd.py --ordered at causal 2k-8k and full 4k and 16k
  timeout -s KILL 80 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 2048 4096 8192 --rounds 3 \
    --out "$R/ab_ordered_causal_bwd.json" 2>&1 | quiet
  timeout -s KILL 70 python benchmarks/ab_fused_bwd.py --ordered --seqlens 4096 16384 --rounds 3 \
    --out "$R/ab_ordered_full_bwd.json" 2>&1 | quiet
}
head -n 2 "$R/machine.txt"
case "$1" in
1)
  for mode in 1:0 1:3 1:4 1:6 0:0 0:4; do
    sem_repeats ${mode%:*} ${mode#*:}
  done
  ;;
2)
  for sem in 0 6 3; do
    sem_timing $sem causal
    sem_timing $sem full
  done
  ;;
3)
  sem_repeats 1 7
  sem_repeats 0 7
  sem_repeats 1 0 --shapes 1,16384,16,16
  for sem in 7 0; do
    sem_timing $sem causal
    sem_timing $sem full
  done
  ;;
4)
  sem_repeats 1 8
  for sem in 8 7 0; do
    sem_timing $sem causal
  done
  sem_timing 8 full
  ;;
5)
  ordered_tests
  ordered_timing
  timeout -s KILL 200 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal yes \
    --seqlens 2048 4096 8192 --rounds 5 --out "$R/ab_cudnn_d128_causal.json" 2>&1 | quiet | ratios
  ;;
6)
  timeout -s KILL 300 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal no \
    --seqlens 4096 8192 16384 --rounds 5 --out "$R/ab_cudnn_d128_full.json" 2>&1 | quiet | ratios
  ;;
7)
  cudnn_d128 150
  ;;
8)
  ordered_tests
  ordered_timing
  lightest_stress
  ;;
9)
  lightest_stress
  ;;
10)
  timeout -s KILL 80 python benchmarks/ab_fused_bwd.py --ordered --causal --ordered-causal-key-groups 2 \
    --seqlens 16384 --rounds 5 --out "$R/ab_ordered_causal16k_bwd.json" 2>&1 | quiet
  timeout -s KILL 150 python benchmarks/ab_cudnn.py --two-kernels --ordered-causal-key-groups 2 --headdims 128 \
    --causal yes --seqlens 16384 --rounds 7 --out "$R/ab_cudnn_d128_causal16k.json" 2>&1 | quiet | ratios
  ;;
11)
  ordered_tests
  lightest_stress
  ;;
esac
