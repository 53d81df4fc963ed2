#!/usr/bin/env bash
# Session 82's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s82.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s82/callN/.
#   1: the issue's end-to-end table for GPT-2 small on the settled harness (sessions 55-56's rows carried the
#      power-cap dip): 1k and 4k with eager attention, SDPA flash, SDPA cuDNN and ours, each row a fresh
#      process, clocks sampled, one measured matmul peak for all eight rows
#   2: the rest of the table: GPT-2 small at 8k and 16k, GPT-2 medium at 16k, with SDPA flash, SDPA cuDNN and ours
#      (eager attention's N x N scores ran out of memory from 8k in sessions 55-56)
#   3: d128 MHA fwd+bwd against SDPA cuDNN, settled (1.5 s back to back, 500 ms timed, three rounds): causal 64k,
#      which did not finish in session 81 (its settle queued ~30 s of work; run_for's max_ahead bounds it now),
#      and full 32k / 64k, not yet timed at the power cap
#   4: call 3: settled, causal 64k 1.029 (ours' fwd+bwd at 1590 MHz against cuDNN's 1665, the same ~690 W; full
#      64k both at 1665), full 32k / 64k 1.062 / 1.049. The backward's routes were chosen on unsettled timings
#      (do_bench, below the cap): at the cap, does the causal convoy (32k, 64k) or the rotation in two key groups
#      (causal and full 16k) still beat the two deterministic kernels (`--two-kernels`), and at what clocks?
#   5: call 4: they do (the two kernels 1.06-1.09x slower, causal 16k-64k and full 16k), but our forward runs at
#      1545-1575 MHz against cuDNN forward's 1620-1672 at the same power, causal and full. The forward's
#      configs, each settled at its own draw (`ab_fwd_configs.py --settle-ms`), with their clocks: does one that
#      draws less per cycle run faster at the cap? Causal 16k / 64k, every candidate with and without turns;
#      full 16k / 64k, the two 128-key ones
#   6: call 1's GPT-2 small 1k row of ours ran 0.763x cuDNN's tokens/s, bound by the host (its power 590-645 W
#      under the cap, clocks at the top, the device step as long as the host's); where does the host's time go?
#      cProfile over 10 steps of both rows (`--host-profile`)
# (Parts 3-5 ran inline copies of what is now gpu_call.sh's clock_medians; parts 4-5's also printed each row's
# ratios, which `ratios` / `fwd_ratios` print above them.)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  train_table 560 8 train_small_1k_4k --models gpt2_small --seqlens 1024,4096 \
    --impls eager,sdpa_flash,sdpa_cudnn,triton --gpu-clocks
  train_rows "$R"/train_small_1k_4k.json | grep -v "^   "
  ;;
2)
  train_table 330 6 train_small_8k_16k --models gpt2_small --seqlens 8192,16384 \
    --impls sdpa_flash,sdpa_cudnn,triton --gpu-clocks
  train_table 220 3 train_medium_16k --models gpt2_medium --seqlens 16384 --impls sdpa_flash,sdpa_cudnn,triton \
    --gpu-clocks
  train_rows "$R"/train_*.json | grep -v "^   "
  ;;
3)
  for causal in yes no; do
    timeout -s KILL 200 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --rounds 3 --deterministic-only \
      --seqlens $([ $causal = yes ] && echo 65536 || echo 32768 65536) --gpu-clocks \
      --settle-ms 1500 --rep-ms 500 --out "$R/ab_cudnn_d128_settled_long_causal_$causal.json" 2>&1 | quiet | ratios
  done
  clock_medians "$R"/ab_cudnn_d128_*.json
  ;;
4)
  for causal in yes no; do
    timeout -s KILL 240 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --rounds 3 --deterministic-only \
      --two-kernels --seqlens $([ $causal = yes ] && echo 16384 32768 65536 || echo 16384) --gpu-clocks \
      --settle-ms 1500 --rep-ms 500 --out "$R/ab_cudnn_d128_routes_causal_$causal.json" 2>&1 | quiet | ratios
  done
  clock_medians "$R"/ab_cudnn_d128_*.json
  ;;
5)
  timeout -s KILL 250 python benchmarks/ab_fwd_configs.py --headdim 128 --causal --seqlens 16384 65536 --rounds 3 \
    --pingpong --settle-ms 1500 --rep-ms 500 --gpu-clocks --out "$R/ab_fwd_causal.json" 2>&1 | quiet | fwd_ratios
  timeout -s KILL 150 python benchmarks/ab_fwd_configs.py --headdim 128 --seqlens 16384 65536 --rounds 3 --pingpong \
    --only rows_128key_rings2 persistent_128key_rings2 --settle-ms 1500 --rep-ms 500 --gpu-clocks \
    --out "$R/ab_fwd_full.json" 2>&1 | quiet | fwd_ratios
  clock_medians "$R"/ab_fwd_*.json
  ;;
6)
  timeout 200 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 --impls triton,sdpa_cudnn \
    --host-profile 10 --out "$R/train_small_1k_host.json" 2>&1 | quiet | tail -120
  ;;
esac
