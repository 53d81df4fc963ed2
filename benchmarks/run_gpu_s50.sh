#!/usr/bin/env bash
# Device calls on one GPU (session 50). Each part is what one call ran; the outputs are in
# benchmarks/results/s50/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s50.sh 1   # the ordered GPU tests after session 49's GQA limits (its part 10, refused
#       for want of device time): causal ordered calls without GQA, full attention's key groups up to 2 query
#       heads a key head; then the host cost of block-sparse d64 calls at n16k 6.25% (butterfly 7:0) and n4k
#       (bench_host_overhead.py, ours against FlexAttention on the same block mask)
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
esac
