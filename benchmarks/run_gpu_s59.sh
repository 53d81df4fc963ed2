#!/usr/bin/env bash
# Device calls on one GPU (session 59). Each part is what one call ran; the outputs are in
# benchmarks/results/s59/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s59.sh 1   # the dK/dV kernel's consumers taking turns (HopperDkdvConfig.turns 1: at
#       S^T and dP^T, 2: also at dV and dK), first run: check_hopper_dkdv.py with the config in use and its two
#       turn variants (edge shapes bf16 / fp16, then the backward timed three rounds, rotated) at d64 (causal and
#       full 1k / 4k / 16k, GPT-2 medium's packed layer at 8k) and d128 (causal and full 1k / 4k / 16k); then
#       GPT-2 medium 8k training with d64's dK/dV config as it is and with the turns the packed layer timed best
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
dkdv_turns() {  # dkdv_turns SECONDS HEADDIM SPEED_CASE...: check_hopper_dkdv.py, the config in use and its turns
  local secs=$1 d=$2
  shift 2
  PYTHONPATH=. timeout -s KILL "$secs" python -c "
import sys
import benchmarks.check_hopper_dkdv as check
base = check.CANDIDATES[$d][0]
check.CANDIDATES = {$d: [cfg for cfg in check.CANDIDATES[$d] if cfg.block_m == base.block_m and cfg.stages == base.stages]}
sys.argv = ['check_hopper_dkdv.py', '--headdims', '$d', '--speed', *'$*'.split(), '--rounds', '3',
            '--out', '$R/check_dkdv_turns_d$d.json']
check.main()
" 2>&1 | quiet | grep -e "^ok" -e "^FAIL" -e "TFLOP" -e "correct"
}
best_packed_turns() {  # the d64 packed layer's fastest turns (0, 1 or 2) by its median over the rounds
  python -c "
import json, re, statistics as st
rows = json.load(open('$R/check_dkdv_turns_d64.json'))['rows']
row = [r for r in rows if r.get('packed')][0]
ms = {}
for k, v in row.items():
    m = re.match(r'bwd_dkdv_128x64_s2(_turns(\d))?_r\d_ms$', k)
    if m:
        ms.setdefault(int(m.group(2) or 0), []).append(v)
print(min(ms, key=lambda t: st.median(ms[t])))"
}
train_turns() {  # train_turns SECONDS TURNS NAME: GPT-2 medium 8k with d64's dK/dV config taking TURNS turns
  PYTHONPATH=. timeout "$1" python -c "
import dataclasses, runpy, sys
import kernels._flash_dkdv_hopper as dkdv
dkdv.CONFIGS[64] = dataclasses.replace(dkdv.CONFIGS[64], turns=$2)
sys.argv = ['benchmarks/bench_train.py', '--models', 'gpt2_medium', '--seqlens', '8192', '--impls', 'triton',
            '--out', '$R/train_medium8k_$3.json']
runpy.run_path('benchmarks/bench_train.py', run_name='__main__')
" 2>&1 | quiet | grep "^| gpt2"
}
case "$1" in
1)
  dkdv_turns 210 64 64:causal 64:full 64:packed
  dkdv_turns 150 128 128:causal 128:full
  best=$(best_packed_turns)
  echo "d64 packed layer's best turns: $best"
  if [ "$best" != 0 ]; then
    train_turns 90 0 turns0
    train_turns 90 "$best" "turns$best"
  fi
  ;;
esac
