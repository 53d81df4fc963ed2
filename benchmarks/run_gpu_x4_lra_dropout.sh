#!/usr/bin/env bash
# One call on nvidia-h200-x4 split three ways, each part on its own GPUs with its own results archive:
#   GPUs 0-1  Pathfinder-32, SWEEP=long runs 1 and 3 (two layers; mean and CLS pooling), one run per GPU,
#             resumed from and packed back to carry/runs.tgz (run_gpu_lra_sweep_chunk.sh) -> $OUT/pathfinder/
#   GPU 2     bench_lra_throughput.py: Path-64, Path-X and Path-256 as configured, compiled, then eager
#             -> $OUT/throughput/
#   GPU 3     the dropout-16bit branch (a copy of main with that branch's three kernel files, carried in
#             .carry/dropout16): its dropout GPU tests, dropout's cost against SDPA (d64/d128, 4k/16k,
#             causal), then its per-config scan at d128 -> $OUT/dropout16/
# SECONDS bounds the Pathfinder runs' training; the other parts stop on their own time-outs, inside it.
#   here:  device run --carry .whl .carry "source .whl/install.sh >/dev/null 2>&1; bash benchmarks/run_gpu_x4_lra_dropout.sh 470"
#   then:  cp <files_at>/pathfinder/carry/runs.tgz .carry/
set -uo pipefail
secs=${1:?usage: run_gpu_x4_lra_dropout.sh SECONDS}
root=$(cd "$(dirname "$0")/.." && pwd)
top=${OUT:-/tmp/flashtrain-out}

OUT=$top/pathfinder R=/tmp/r-pathfinder SWEEP=long RUN_IDS="1 3" GPU_LIST="0 1" \
  bash "$root/benchmarks/run_gpu_lra_sweep_chunk.sh" "$secs" > /tmp/pathfinder.log 2>&1 &

(
  export OUT=$top/throughput R=/tmp/r-throughput CUDA_VISIBLE_DEVICES=2
  source "$root/benchmarks/gpu_call.sh"
  machine_info
  timeout 260 python benchmarks/bench_lra_throughput.py --compile --out "$R/lra_throughput_compiled.json" 2>&1 \
    | grep -v -e Generating -e Saving -e Map | tail -n 8 | tee "$R/lra_throughput_compiled.log"
  timeout 200 python benchmarks/bench_lra_throughput.py --out "$R/lra_throughput_eager.json" 2>&1 \
    | grep -v -e Generating -e Saving -e Map | tail -n 8 | tee "$R/lra_throughput_eager.log"
) > /tmp/throughput.log 2>&1 &

(
  export OUT=$top/dropout16 R=/tmp/r-dropout16 CUDA_VISIBLE_DEVICES=3
  source "$root/benchmarks/gpu_call.sh"
  machine_info
  cd "$root/.carry/dropout16" || exit 1
  timeout 170 python -m pytest -q -n 4 -m gpu tests/kernels -k dropout -rf > "$R/dropout_gpu_tests.log" 2>&1
  tail -n 3 "$R/dropout_gpu_tests.log"
  timeout 170 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 64 128 --causal causal \
    --impls triton triton_dropout sdpa_flash sdpa_flash_dropout --out "$R/attention_dropout_16bit.json" 2>&1 \
    | tail -n 12 | tee "$R/attention_dropout_16bit.log"
  timeout 120 python benchmarks/check_kernel_configs.py --batch 2 --seqlen 4096 --nheads 16 --headdim 128 \
    --causal --dropout 0.1 --others fwd=0,dkdv=1,dq=1 --jobs 4 --out "$R/dropout_config_scan_16bit_d128.json" 2>&1 \
    | tail -n 21 | tee "$R/dropout_config_scan_16bit_d128.log"
) > /tmp/dropout16.log 2>&1 &

wait
for part in pathfinder throughput dropout16; do echo "=== $part"; tail -n 25 "/tmp/$part.log"; done
