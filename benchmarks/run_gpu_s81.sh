#!/usr/bin/env bash
# Session 81's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s81.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s81/callN/.
#   1: d128 MHA fwd+bwd against SDPA cuDNN at causal and full 4k and 16k, five rounds, timed two ways in one
#      call: as before (do_bench's 25 ms warm-up, 100 ms timed) and with each call run back to back for 1.5 s
#      before 500 ms of timing (the power controller's ~1 s scale), the SM clock and power sampled beside the
#      timings: do the per-round spreads (0.92-1.09 at 4k in session 80) narrow, where does the ratio land, and
#      does one impl run at lower clocks than the other?
#   2: call 1: settled, the per-round spreads narrowed to 1.02-1.07 (from 0.90-1.10) and the two impls ran at the
#      same clocks and power; full 16k did not finish inside its limit, and each first round's window had held
#      the compile (the GPU idle and cooling). ab_cudnn.py now builds every call before timing. Settled only,
#      three rounds, causal 4k-64k and full 4k-16k
#   3: the issue's end-to-end points on the settled harness (session 80's had cuDNN and ours): GPT-2 medium at 1k
#      with eager attention, SDPA flash, SDPA cuDNN and ours, and at 8k with the last three (eager attention's
#      N x N scores ran out of memory there in sessions 55-56), each row a fresh process, clocks sampled
#   4: call 2 did not reach causal 64k inside its limit: it alone, settled as call 2; and GPT-2 medium at 4k with
#      the four attentions as part 3
#   5: call 4's 64k wrote nothing inside 130 s either: where does the time go? Its run timed step by step, two
#      rounds (the output: results/s81/call5/diag_64k.log; run inline in call 5 on commit 227954e's kernels and
#      ab_cudnn, whose run_for had no max_ahead; rf passes the keywords on, as later trees need)
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
  for causal in yes no; do
    timeout -s KILL 270 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --rounds 3 --deterministic-only \
      --seqlens $([ $causal = yes ] && echo 4096 8192 16384 65536 || echo 4096 8192 16384) --gpu-clocks \
      --settle-ms 1500 --rep-ms 500 --out "$R/ab_cudnn_d128_settled_causal_$causal.json" 2>&1 | quiet | ratios
  done
  ;;
3)
  train_table 300 5 train_medium_1k --models gpt2_medium --seqlens 1024 --impls eager,sdpa_flash,sdpa_cudnn,triton \
    --gpu-clocks
  train_table 240 4 train_medium_8k --models gpt2_medium --seqlens 8192 --impls sdpa_flash,sdpa_cudnn,triton \
    --gpu-clocks
  train_rows "$R"/train_medium_*.json | grep -v "^   "
  ;;
4)
  timeout -s KILL 130 python benchmarks/ab_cudnn.py --headdims 128 --causal yes --rounds 3 --deterministic-only \
    --seqlens 65536 --gpu-clocks --settle-ms 1500 --rep-ms 500 --out "$R/ab_cudnn_d128_settled_causal_64k.json" \
    2>&1 | quiet | ratios
  train_table 250 5 train_medium_4k --models gpt2_medium --seqlens 4096 --impls eager,sdpa_flash,sdpa_cudnn,triton \
    --gpu-clocks
  train_rows "$R"/train_medium_4k.json | grep -v "^   "
  ;;
5)
  timeout -s KILL 170 python - <<'PY' 2>&1 | grep -v -i warn | tail -40
import sys, time, runpy
sys.path.insert(0, '.')
import benchmarks.common as c
t0 = time.time()
ot, orr = c.time_ms, c.run_for
def tm(fn, **kw):
    r = ot(fn, **kw); print('time_ms done', round(time.time() - t0, 1), round(r, 2)); return r
def rf(fn, s, **kw):
    n = orr(fn, s, **kw); print('run_for', round(time.time() - t0, 1), n); return n
c.time_ms, c.run_for = tm, rf
sys.argv = ['ab_cudnn.py', '--headdims', '128', '--causal', 'yes', '--rounds', '2', '--deterministic-only',
            '--seqlens', '65536', '--gpu-clocks', '--settle-ms', '1500', '--rep-ms', '500', '--out', '/tmp/x.json']
print('start', flush=True)
runpy.run_path('benchmarks/ab_cudnn.py', run_name='__main__')
print('end', round(time.time() - t0, 1))
PY
  ;;
esac
