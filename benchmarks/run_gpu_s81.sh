#!/usr/bin/env bash
# Session 81's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s81.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s81/callN/.
#   1: d128 MHA fwd+bwd against SDPA cuDNN at causal and full 4k and 16k, five rounds, timed two ways in one
#      call: as before (do_bench's 25 ms warm-up, 100 ms timed) and with each call run back to back for 1.5 s
#      before 500 ms of timing (the power controller's ~1 s scale), the SM clock and power sampled beside the
#      timings: do the per-round spreads (0.92-1.09 at 4k in session 80) narrow, where does the ratio land, and
#      does one impl run at lower clocks than the other?
#   2: the issue's end-to-end table on the settled harness (session 80): GPT-2 medium at 1k and 4k with eager
#      attention, SDPA flash, SDPA cuDNN and ours, each row a fresh process, clocks sampled
#   3: the same at 8k and 16k, SDPA flash, SDPA cuDNN and ours (eager attention's N x N scores ran out of memory
#      there in sessions 55-56)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  for timing in default:"" settled:"--settle-ms 1500 --rep-ms 500"; do
    for causal in yes no; do
      echo "${timing%%:*} causal $causal"
      # (word splitting of the timing options intended)
      timeout -s KILL 150 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --seqlens 4096 16384 \
        --rounds 5 --deterministic-only --gpu-clocks ${timing#*:} \
        --out "$R/ab_cudnn_d128_${timing%%:*}_causal_$causal.json" 2>&1 | quiet | ratios
    done
  done
  # each row's per-impl median clock and power over its timed windows
  python -c "import json, sys
for f in sys.argv[1:]:
    for r in json.load(open(f))['rows']:
        print(f.split('/')[-1], r['seqlen'], {k: v.get('median_mhz_w', v) for k, v in r['gpu_clocks'].items()})" \
    "$R"/ab_cudnn_d128_*.json
  ;;
2)
  train_table 560 9 train_medium_1k_4k --models gpt2_medium --seqlens 1024,4096 \
    --impls eager,sdpa_flash,sdpa_cudnn,triton --gpu-clocks
  train_rows "$R/train_medium_1k_4k.json" | grep -v "^   "
  ;;
3)
  train_table 560 7 train_medium_8k_16k --models gpt2_medium --seqlens 8192,16384 \
    --impls sdpa_flash,sdpa_cudnn,triton --gpu-clocks
  train_rows "$R/train_medium_8k_16k.json" | grep -v "^   "
  ;;
esac
