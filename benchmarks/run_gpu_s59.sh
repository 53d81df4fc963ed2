#!/usr/bin/env bash
# Device calls on one GPU (session 59). Each part is what one call ran; the outputs are in
# benchmarks/results/s59/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s59.sh 1   # the dK/dV kernel's consumers taking turns (HopperDkdvConfig.turns 1: at
#       S^T and dP^T, 2: also at dV and dK), first run: check_hopper_dkdv.py with the config in use and its two
#       turn variants at d64 and d128. Ran the edge-shape checks (d64 all three, d128 turns 0 and 1 passed) but
#       the time limits killed both before any timing (the portable backward it also times autotunes first), and
#       d128 turns 2's check printed nothing; the GPT-2 medium 8k run with turns 0 is the one row it left (its
#       commands: this script at commit 3422e17)
#   bash benchmarks/run_gpu_s59.sh 2   # the same turns timed on the kernel alone (ab_dkdv_configs.py, five rounds
#       rotated): d64 GPT-2 medium's packed layer, causal and full 1k / 4k / 16k; d128 causal and full 1k / 2k
#       (from 4k the one-kernel backward runs instead); then GPT-2 medium 8k with the packed layer's best turns
#       against none, alternating (a second pair where the call has time)
#   (Parts 2 and 3 time `HopperDkdvConfig.turns`, reverted afterwards to results/s59/dkdv_turns.patch: they run
#   as recorded at commit 071cc8b, where the option, ab_dkdv_configs.py's --turns and ab_block_sparse.py's
#   d128_dkdv_turns variant exist.)
#   bash benchmarks/run_gpu_s59.sh 3   # block-sparse d128 with the dK/dV grid kernel's turns (1) off and on
#       (ab_block_sparse.py, new variant d128_dkdv_turns) at n4k and n16k up to 25% density; then the per-kernel
#       device time of GPT-2 medium's attention layer (b2 n8k h16 d64 causal), ours against SDPA cuDNN
#       (profile_attention.py): where the d64 backward's time goes
# Calls 4-7 ran on the warm machine without this script (their commands, from the project root, after
# `source .whl/install.sh`; results in call4/-call7/):
#   4: python benchmarks/profile_attention.py --shape 4,4096,32,64,causal --shape 4,4096,32,64 \
#        --shape 1,16384,32,64,causal --shape 1,16384,32,64 --impls triton sdpa_cudnn
#   5: python benchmarks/ab_fwd_configs.py --headdim 64 --causal --seqlens 8192 16384 32768 --rounds 5 --pingpong
#   6: GPT-2 medium 16k, bench_train.py --models gpt2_medium --seqlens 16384 --impls triton, as it is and with the
#        ordered one-kernel backward at d64 (gpu_call.sh's d64_on), one run each
#   7: the same row with --impls sdpa_cudnn then triton, each with --profile 2 --profile-top 8
#   bash benchmarks/run_gpu_s59.sh 8   # after reverting the turns (kernels as at d7082ca): the Hopper backward,
#       block-sparse, packed-QKV and dense GPU test files to the end (session 58's call 3 was cut short)
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
dkdv_ab() {  # dkdv_ab SECONDS NAME OPTION...: ab_dkdv_configs.py, its ratio lines printed
  local secs=$1 name=$2
  shift 2
  timeout -s KILL "$secs" python benchmarks/ab_dkdv_configs.py "$@" --out "$R/ab_dkdv_$name.json" 2>&1 | quiet \
    | grep -e "^first" -e "Traceback" -e "Error" -e "Fatal" | sort | uniq -c
  python -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print(r['seqlen'], r['causal'], r['packed'], {k: round(v, 3) for k, v in r.items() if 'over' in k})" "$R/ab_dkdv_$name.json"
}
best_packed_turns() {  # the d64 packed layer's turns whose median beat the config in use most (0: none did)
  python -c "
import json
row = json.load(open('$R/ab_dkdv_d64_packed.json'))['rows'][0]
gains = {int(k[-1]): v for k, v in row.items() if k.startswith('in_use_over_turns')}
best = max(gains, key=gains.get)
print(best if gains[best] > 1.0 else 0)" 2>/dev/null || echo 0
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
8)
  hopper_backward_tests
  ;;
3)
  bs_ab 220 d128_dkdv_turns --variants d128_dkdv_turns --seqlens 4096 16384 --headdims 128 --max-density 0.25
  timeout 150 python benchmarks/profile_attention.py --shape 2,8192,16,64,causal --impls triton sdpa_cudnn \
    --out "$R/profile_d64_packed_shape.json" 2>&1 | quiet | tail -n 40
  ;;
2)
  dkdv_ab 100 d64_packed --headdim 64 --packed
  dkdv_ab 100 d64_causal --headdim 64 --causal
  dkdv_ab 100 d64_full --headdim 64
  dkdv_ab 100 d128_causal --headdim 128 --causal --seqlens 1024 2048
  dkdv_ab 100 d128_full --headdim 128 --seqlens 1024 2048
  best=$(best_packed_turns)
  echo "d64 packed layer's best turns: $best"
  if [ "$best" != 0 ]; then
    for run in 1 2; do  # (the second pair only while the call has time left)
      [ "$run" = 2 ] && [ "$SECONDS" -gt 380 ] && break
      train_turns 90 0 "turns0_run$run"
      train_turns 90 "$best" "turns${best}_run$run"
    done
  fi
  ;;
esac
