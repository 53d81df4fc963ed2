#!/usr/bin/env bash
# Session 84's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s84.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s84/callN/.
#   1: where does our d128 fwd+bwd spend work that cuDNN's does not, at the points under the 1.05 aim (causal and
#      full 16k)? At the power cap time follows energy (session 83), so the count of instructions, shared-memory
#      wavefronts and L2 / DRAM traffic per call is what to compare, not the durations (ncu locks the clocks).
#      Nsight Compute on one fwd+bwd of each (ncu_attention.py): per kernel the instruction statistics, the
#      compute and memory workload tables, the L2 reads / writes / reductions / atomics and the per-SASS-instruction
#      executed counts (SourceCounters), as CSV: details, raw and sass pages
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  ncu --version | tail -n 1
  metrics=lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum
  metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
  for causal in causal full; do
    for impl in triton sdpa_cudnn; do
      name=${impl}_${causal}
      timeout 140 ncu --profile-from-start off --import-source no --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section SourceCounters --metrics "$metrics" -o "$R/$name" \
        python benchmarks/ncu_attention.py --impl "$impl" --seqlen 16384 --headdim 128 --causal "$causal" \
        > "$R/$name.log" 2>&1
      echo "$name exit $?"
      tail -n 2 "$R/$name.log"
      ncu -i "$R/$name.ncu-rep" --page details --csv > "$R/details_$name.csv" 2>&1
      ncu -i "$R/$name.ncu-rep" --page raw --csv > "$R/raw_$name.csv" 2>&1
      ncu -i "$R/$name.ncu-rep" --page source --csv --print-source sass > "$R/sass_$name.csv" 2> "$R/sass_$name.err"
      rm -f "$R/$name.ncu-rep"
    done
  done
  ls -la "$R"
  ;;
esac
