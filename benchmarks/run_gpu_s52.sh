#!/usr/bin/env bash
# Device calls on one GPU (session 52). Each part is what one call ran; the outputs are in
# benchmarks/results/s52/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s52.sh 1   # (ran on commit 3b30fb1, the PDL experiment; on a later tree apply
#       results/s52/call1/pdl.patch first) programmatic dependent launch (PDL) of the Gluon kernels: fwd+bwd with it off and
#       on, alternating (ab_pdl.py: dense d64 / d128 at 1k and 4k, causal and full, against SDPA cuDNN; block-sparse
#       butterfly up to 11% density at n4k and n16k against FlexAttention; graph and eager, bitwise check), then the GPU
#       tests of the Hopper block-sparse and forward files with PDL on
#   bash benchmarks/run_gpu_s52.sh 2   # where the ordered backward's consumers stall: Nsight Compute's warp-state sampling
#       per SASS instruction (SourceCounters) of the one-kernel backward at d128 causal 16k, ordered (the default, the
#       causal convoy) and unordered (deterministic=False), and ordered at causal 48k (walking down): the .ncu-rep
#       files and each one's source page as CSV
#   bash benchmarks/run_gpu_s52.sh 3   # the ordered backward handing each add over a step late (LAG 1: a consumer waits for
#       the add of two steps before, not the last one's): the ordered and determinism GPU tests with
#       FLASHTRAIN_HANDOVER_LAG=1, then the backward alone, every ordered variant with and without the lag, against the
#       two kernels and the unordered kernel (ab_fused_bwd.py --handover-lag, five rounds) at causal 4k-64k and full
#       4k-64k
#   bash benchmarks/run_gpu_s52.sh 4   # the ordered backward's consumers only stage their dQ halves; a warp per consumer
#       adds them in their items' order and counts them (dkdv._releaser): the ordered and determinism GPU tests, the
#       backward alone against the two kernels and the unordered kernel (ab_fused_bwd.py, five rounds) at causal
#       4k-64k and full 4k-64k, then fwd+bwd against SDPA cuDNN (ab_cudnn.py --two-kernels, five rounds) at causal
#       16k / 64k and full 32k
#   bash benchmarks/run_gpu_s52.sh 5   # the staged ordered backward of call 4, kept: the GPU tests of the Hopper backward,
#       dense kernel and packed QKV files (the slow portable-autotune test left out), then fwd+bwd against SDPA cuDNN
#       (ab_cudnn.py --two-kernels, five rounds) at causal 32k / 48k and full 16k / 64k
#   bash benchmarks/run_gpu_s52.sh 6   # fwd+bwd against SDPA cuDNN (ab_cudnn.py --two-kernels, five rounds) at causal and
#       full 4k / 8k (on the warm machine of call 5, same tree)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
case "$1" in
1)
  timeout -s KILL 330 python benchmarks/ab_pdl.py --rounds 3 --out "$R/ab_pdl.json" 2>&1 | quiet | cut -c1-400
  timeout -s KILL 220 python -m pytest -q -n 5 -rf -m gpu tests/kernels/test_block_sparse_hopper.py \
    tests/kernels/test_flash_fwd_hopper.py > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  ;;
2)
  ncu --version | tail -n 1
  for run in "ordered_16k triton 16384" "unordered_16k triton_atomic 16384" "ordered_48k triton 49152"; do
    set -- $run
    timeout 200 ncu --profile-from-start off -k regex:attn_bwd_fused --section SourceCounters --section WarpStateStats \
      --import-source no -o "$R/ncu_$1" python benchmarks/ncu_attention.py --impl $2 --seqlen $3 --headdim 128 \
      --causal causal > "$R/ncu_$1.log" 2>&1
    echo "$1 exit $?"; tail -n 2 "$R/ncu_$1.log"
    ncu -i "$R/ncu_$1.ncu-rep" --page source --csv --print-source sass > "$R/src_$1.csv" 2> "$R/src_$1.err"
    ncu -i "$R/ncu_$1.ncu-rep" --page details --csv > "$R/details_$1.csv" 2>&1
    wc -l "$R/src_$1.csv" "$R/details_$1.csv"; head -c 600 "$R/src_$1.err"
  done
  ;;
3)
  FLASHTRAIN_HANDOVER_LAG=1 timeout -s KILL 200 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered or torch_deterministic" > "$R/gpu_tests_lag1.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_lag1.log"
  summary() { python -c "import json, sys; [print(r['seqlen'], {k: round(v, 3) for k, v in r.items() if '_over_' in k}) for r in json.load(open(sys.argv[1]))['rows']]" "$1"; }
  timeout -s KILL 190 python benchmarks/ab_fused_bwd.py --ordered --causal --handover-lag --seqlens 4096 8192 16384 32768 \
    49152 65536 --rounds 5 --out "$R/ab_lag_causal.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_lag_causal.json"
  timeout -s KILL 130 python benchmarks/ab_fused_bwd.py --ordered --handover-lag --seqlens 4096 16384 32768 65536 \
    --rounds 5 --out "$R/ab_lag_full.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_lag_full.json"
  ;;
4)
  timeout -s KILL 200 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered or torch_deterministic" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
  summary() { python -c "import json, sys; [print(r['seqlen'], {k: round(v, 3) for k, v in r.items() if '_over_' in k}) for r in json.load(open(sys.argv[1]))['rows']]" "$1"; }
  timeout -s KILL 150 python benchmarks/ab_fused_bwd.py --ordered --causal --seqlens 4096 8192 16384 32768 49152 65536 \
    --rounds 5 --out "$R/ab_stage_causal.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_stage_causal.json"
  timeout -s KILL 100 python benchmarks/ab_fused_bwd.py --ordered --seqlens 4096 16384 32768 65536 --rounds 5 \
    --out "$R/ab_stage_full.json" 2>&1 | quiet | cut -c1-150
  summary "$R/ab_stage_full.json"
  for point in "yes 16384 65536" "no 32768"; do
    set -- $point
    timeout -s KILL 150 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $1 --seqlens ${@:2} \
      --rounds 5 --out "$R/ab_cudnn_d128_causal_$1.json" 2>&1 | quiet | ratios
  done
  ;;
5)
  T=tests/kernels
  timeout -s KILL 280 python -m pytest -q -n 5 -rf -m gpu $T/test_flash_bwd_hopper.py $T/test_flash_attention.py \
    $T/test_qkvpacked.py --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  for point in "yes 32768 49152" "no 16384 65536"; do
    set -- $point
    timeout -s KILL 110 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $1 --seqlens ${@:2} \
      --rounds 5 --out "$R/ab_cudnn_d128_causal_$1.json" 2>&1 | quiet | ratios
  done
  ;;
6)
  for c in yes no; do
    timeout -s KILL 100 python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $c --seqlens 4096 8192 \
      --rounds 5 --out "$R/ab_cudnn_d128_causal_$c.json" 2>&1 | quiet | ratios
  done
  ;;
esac
