#!/usr/bin/env bash
# Device calls on one GPU (session 34). Each part is what one call ran; the outputs are in
# benchmarks/results/s34/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s34.sh 1   # the Gluon dK/dV kernel at d64 with 3 stages (in use) and 4, timed
#       round-robin three times (branch dkdv-carry-ds's call had 3 stages at 0.83-0.88x the portable kernel,
#       where session 33's call had it at 1.04-1.13x); GPT-2 medium 8k with each, alternating
#   bash benchmarks/run_gpu_s34.sh 2   # (part 1, on an H200: both 0.96-1.14x the portable kernel, 4 / 3 stages 1.01
#       at the median; GPT-2 medium 8k 125.0-125.3k tokens/s with 4 stages, 124.7k with 3)
#       with 4 stages in use at d64: the GPU tests of the Hopper backward, Hopper block-sparse, packed QKV and
#       dense kernel files
#   bash benchmarks/run_gpu_s34.sh 3   # (part 2, on an H200: 314 passed, and the slow test alone) d64 against the
#       anchors at 1k-16k (graphs); the block-sparse backward's two routes at d64 (BACKWARD_MIN_TILES); GPT-2
#       medium 1k with 4 stages and 3
#   bash benchmarks/run_gpu_s34.sh 4   # (part 3, on an H200: graphs 0.89-1.03x cuDNN, 1.17-1.33x Flex; the
#       block-sparse routes as before; GPT-2 medium 1k 193.0k tokens/s with 4 stages, 192.3k with 3) d64's
#       dK/dV candidates with K and V in registers and with 128-query tiles, timed round-robin twice;
#       GPT-2 medium 8k with K and V in registers and without, alternating (run on a tree with branch
#       dkdv-kv-regs's kernel; its d64 candidates then: 64x64 on 4 stages, the same and 3 stages with K
#       and V in registers, 128x64 on 2 and 3 stages)
#   bash benchmarks/run_gpu_s34.sh 5   # (part 4, on an H200: K and V in registers no faster, GPT-2 medium 8k
#       123.8-123.9k tokens/s against 124.7-124.8k; 128-query tiles (2 stages) 1.01-1.09x at causal
#       1k-16k, the check ran past its 330 s before the full and packed cases) d64's 128-query-tile
#       candidates against the one in use, round-robin twice; GPT-2 medium 8k with 128-query tiles (2
#       stages) and without, alternating
#   bash benchmarks/run_gpu_s34.sh 6   # (part 5, on an H200: 128-query tiles 0.94-1.08x, 1.02x at the median of
#       14 timings; GPT-2 medium 8k 125.9k tokens/s twice against 124.5k and 124.9k) with 128-query tiles in
#       use at d64 (block-sparse keeps 64): part 2's GPU tests
#   bash benchmarks/run_gpu_s34.sh 7   # (part 6, on an H200: 314 passed, and the slow test alone) d64 against the
#       anchors (graphs) with 128-query tiles; GPT-2 medium 1k and 16k with 128-query tiles and with 64
#       (which stopped: its config override then named a field main lacks, `call7/bench_train.log`)
#   bash benchmarks/run_gpu_s34.sh 8   # part 7's GPT-2 medium runs
source benchmarks/gpu_call.sh
machine_info
medium_stages() {  # medium_stages SEQLEN STAGES TAG [bench_train args]: GPT-2 medium from CUDA graphs with
  # the d64 dK/dV config's stages set to STAGES (K, V in registers with KV_REGS=1; BLOCK_M queries a step)
  local seqlen=$1 stages=$2 tag=$3; shift 3
  timeout 150 python -c "
import dataclasses, runpy, sys
from kernels import _flash_dkdv_hopper as m
extra = dict(kv_in_registers=True) if ${KV_REGS:-0} == 1 else {}  # (a field of branch dkdv-kv-regs only)
m.CONFIGS[64] = dataclasses.replace(m.CONFIGS[64], stages=$stages, block_m=${BLOCK_M:-64}, **extra)
sys.argv = ['benchmarks/bench_train.py'] + sys.argv[1:]
runpy.run_path('benchmarks/bench_train.py', run_name='__main__')
" --models gpt2_medium --seqlens "$seqlen" --impls triton --compile-mode reduce-overhead --in-process \
    --out "$R/train_medium${seqlen}_s$stages$tag.json" "$@" 2>&1 | quiet | tee -a "$R/bench_train.log" \
    | grep "^|.*gpt2" | sed "s/^/stages=$stages $tag /"
}
check_d64_twice() {  # check_d64_twice NAME SECONDS: d64's dK/dV candidates checked, then timed twice
  HANG_S=$(($2 - 10)) timeout "$2" python benchmarks/check_hopper_dkdv.py --headdims 64 --rounds 2 \
    --speed 64:causal 64:full 64:packed --out "$R/check_dkdv_d64_$1.json" 2>&1 | quiet \
    | tee "$R/check_dkdv_d64_$1.log" | grep -v "^  File" | tail -n 14
}
medium_8k_against_four_stages() {  # TAG STAGES VAR=VALUE: GPT-2 medium 8k with the d64 config VAR=VALUE
  # selects, on STAGES, then with 64-query steps on four stages; twice, alternating
  for run in 1 2; do
    (export "$3"; medium_stages 8192 "$2" "_$1_run$run" --steps 20)
    medium_stages 8192 4 "_run$run" --steps 20
  done
}
medium_1k_16k() {  # GPT-2 medium 1k and 16k with 128-query steps (two stages) and with 64 (four)
  BLOCK_M=128 medium_stages 1024 2 _m128 --steps 40
  medium_stages 1024 4 "" --steps 40
  BLOCK_M=128 medium_stages 16384 2 _m128 --steps 20
  medium_stages 16384 4 "" --steps 20
}
case "${1:?part 1}" in
1)
  head -n 2 "$R/machine.txt"
  HANG_S=280 timeout 290 python benchmarks/check_hopper_dkdv.py --headdims 64 --rounds 3 \
    --speed 64:causal 64:full 64:packed --out "$R/check_dkdv_d64_rounds.json" 2>&1 | quiet \
    | tee "$R/check_dkdv_d64_rounds.log" | grep -v "^  File" | tail -n 12
  for run in 1 2; do
    medium_stages 8192 4 _run$run --steps 20
    medium_stages 8192 3 _run$run --steps 20
  done
  ;;
2 | 6)
  hopper_backward_tests
  ;;
3)
  head -n 2 "$R/machine.txt"
  timeout 270 python benchmarks/bench_attention.py --seqlens 1024 4096 16384 --headdims 64 --graphs \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d64.json" 2>&1 | quiet | grep "^|" | tail -n 20
  timeout 150 python benchmarks/check_bs_bwd_routes.py --headdims 64 --seqlens 4096 16384 \
    --out "$R/check_bs_routes_d64.json" 2>&1 | quiet | tee "$R/check_bs_routes_d64.log" | tail -n 30
  medium_stages 1024 4 "" --steps 40
  medium_stages 1024 3 "" --steps 40
  ;;
4)
  head -n 2 "$R/machine.txt"
  check_d64_twice kvregs 340
  medium_8k_against_four_stages kvregs 4 KV_REGS=1
  ;;
5)
  head -n 2 "$R/machine.txt"
  check_d64_twice m128 300
  medium_8k_against_four_stages m128 2 BLOCK_M=128
  ;;
7)
  head -n 2 "$R/machine.txt"
  timeout 200 python benchmarks/bench_attention.py --seqlens 1024 4096 16384 --headdims 64 --graphs \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d64.json" 2>&1 | quiet | grep "^|" | tail -n 20
  medium_1k_16k
  ;;
8)  # (part 7's GPT-2 runs, which had stopped at a config field that main lacks)
  head -n 2 "$R/machine.txt"
  medium_1k_16k
  ;;
esac
