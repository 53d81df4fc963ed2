#!/usr/bin/env bash
# Device calls on one GPU (session 41). Each part is what one call ran; the outputs are in
# benchmarks/results/s41/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s41.sh 1   # CUDA-graph capture of one fwd+bwd after what may run before it
#       (check_graph_capture.py, a process per case), beside it the GPU tests of the CUDA-graph file and of
#       the kernel files not run on session 40's 256-query rule (block-sparse, loss, decode, dropout, varlen)
#       and, after the check, flashtrain's
#   (part 1, on an H200: call1/; the check ran out of its 280 s after 13 of its 24 cases)
#   bash benchmarks/run_gpu_s41.sh 2   # ab_short_dense.py below 256 queries (64 and 128 tokens), its graph
#       captures on the mended harness
#   (part 2, on an H200: call2/, after the check's SDPA and block-sparse cases, typed into the call:
#       check_graph_capture.py --impls sdpa_cudnn sdpa_flash block_sparse --patterns default_kept side)
#   bash benchmarks/run_gpu_s41.sh 3   # the Gluon kernels from 128 queries (d128 causal backward from 256): the
#       GPU tests of the dense Hopper forward and backward, packed QKV, dense kernel and CUDA-graph files
#   (part 3, on an H200: call3/, 284 passed and the slow test passed)
#   bash benchmarks/run_gpu_s41.sh 4   # after the capture recipe moved into benchmarks.common.capture_graph: the
#       CUDA-graph GPU tests and two cases of the capture check
#   (part 4, on an H200: call4/, 8 passed; the check as in call1/ and call2/)
#   call5/ (on an H200, typed into the call over call5/k_regs.patch applied to kernels/_flash_dkdv_hopper.py):
#       EXP_K_REGS=1 EXP_V_REGS=1 python benchmarks/ab_dkdv_two_pass.py --out "$R/ab_dkdv_two_pass.json"
#   bash benchmarks/run_gpu_s41.sh 6   # Nsight Compute (--set full) on one d128 n16k fwd+bwd, ours and SDPA cuDNN's,
#       full and causal: each kernel's details page as CSV (ncu_attention.py)
#   (part 6, on an H200: call6/)
#   bash benchmarks/run_gpu_s41.sh 7   # where the d128 dK/dV kernel's warps stall: Nsight Compute's per-instruction
#       source page (SASS, warp-stall samples by reason) of that kernel in a d128 n16k full fwd+bwd, and the dq kernel's
#   (part 7, on an H200: call7/)
#   call8/ (on an H200, typed into the call over call8/defer.patch applied to kernels/_flash_dkdv_hopper.py): for two
#       rounds, EXP_DEFER=0 then =1: python benchmarks/exp_dkdv_defer.py --out "$R/defer${e}_round${round}.json"
#   call9/ (on an H200, over call9/rz.patch): for two rounds, EXP_RZ=0 then =1:
#       python benchmarks/exp_dkdv_defer.py --stages 2 --label rz$e --out "$R/rz${e}_round${round}.json"
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "$1" in
1)
  T=tests/kernels
  { timeout 280 python benchmarks/check_graph_capture.py --timeout 90 --out "$R/graph_capture.json" 2>&1 | quiet \
      > "$R/graph_capture.log"
    timeout -s INT 250 python -m pytest -q -m gpu -rf tests/flashtrain > "$R/gpu_tests_flashtrain.log" 2>&1; } &
  timeout -s INT 530 python -m pytest -q -n 5 -m gpu -rf $T/test_cuda_graphs.py $T/test_block_sparse.py \
    $T/test_block_sparse_hopper.py $T/test_cross_entropy.py $T/test_decode.py $T/test_dropout.py $T/test_varlen.py \
    > "$R/gpu_tests.log" 2>&1
  wait
  tail -n 3 "$R/gpu_tests_flashtrain.log"
  grep -v "^Traceback\|^  " "$R/graph_capture.log" | tail -n 30
  tail -n 3 "$R/gpu_tests.log"
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  ;;
2)
  timeout 560 python benchmarks/ab_short_dense.py --seqlens 128 64 --out "$R/ab_short_dense.json" 2>&1 | quiet \
    | tail -n 30
  ;;
3)
  T=tests/kernels
  gpu_tests_beside_slow 480 480 6 $T/test_flash_fwd_hopper.py $T/test_flash_bwd_hopper.py $T/test_qkvpacked.py \
    $T/test_flash_attention.py $T/test_cuda_graphs.py
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" "$R/gpu_tests_slow_portable.log" | head -n 20
  ;;
4)
  timeout -s INT 200 python -m pytest -q -m gpu -rf tests/kernels/test_cuda_graphs.py > "$R/gpu_tests.log" 2>&1
  tail -n 2 "$R/gpu_tests.log"
  timeout 150 python benchmarks/check_graph_capture.py --impls triton_gluon block_sparse --patterns side \
    default_kept --timeout 60 --out "$R/graph_capture.json" 2>&1 | quiet | grep -v "^Traceback\|^  "
  ;;
6)
  for impl in triton sdpa_cudnn; do
    for causal in full causal; do
      name=ncu_${impl}_${causal}
      timeout 240 ncu --profile-from-start off --set full -o "$R/$name" python benchmarks/ncu_attention.py \
        --impl "$impl" --seqlen 16384 --headdim 128 --causal "$causal" > "$R/$name.log" 2>&1
      tail -n 2 "$R/$name.log"
      ncu --import "$R/$name.ncu-rep" --page details --csv > "$R/${name}_details.csv" 2>&1
      rm -f "$R/$name.ncu-rep"  # (large; the CSV keeps every section's values)
    done
  done
  ls -la "$R"
  ;;
7)
  for kernel in dkdv dq; do
    name=ncu_source_$kernel
    timeout 200 ncu --profile-from-start off -k "regex:$kernel" --section WarpStateStats --section SourceCounters \
      --section ComputeWorkloadAnalysis -o "$R/$name" python benchmarks/ncu_attention.py --impl triton \
      --seqlen 16384 --headdim 128 --causal full > "$R/$name.log" 2>&1
    tail -n 2 "$R/$name.log"
    ncu --import "$R/$name.ncu-rep" --page source --csv --print-source sass > "$R/${name}_sass.csv" 2>&1
    ncu --import "$R/$name.ncu-rep" --page raw --csv > "$R/${name}_raw.csv" 2>&1
    rm -f "$R/$name.ncu-rep"
  done
  ls -la "$R"
  ;;
esac
