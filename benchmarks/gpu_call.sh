# Sourced by the run_gpu_*.sh scripts whose results come back as one archive: $OUT brings back only a
# few files, so everything goes to $R and is packed into $OUT/results.tgz when the script exits (also on
# a time-out inside it). $R starts empty, so a warm machine's earlier call does not leak into this one.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
# Two scripts side by side in one call (each on its own GPUs) give each its own R and OUT.
R=${R:-/tmp/flashtrain-results}
rm -rf "$R"
mkdir -p "$OUT" "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
trap pack EXIT
quiet() { grep -v -e Warning -e warn -e '^W1' -e '\*\*\*\*' -e USDT; }  # launcher and library noise
machine_info() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvidia-smi topo -m
    python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    > "$R/machine.txt" 2>&1
}
# The GPU correctness suites, each on its own GPU, side by side; returns when all have ended. A GPU of
# "-" skips that suite. Logs: $R/kernel_gpu_tests.log (bf16 kernel tests), local_attention_cuda_tests.log
# (the ring's local routes on CUDA), step_accumulate_cuda_tests.log (the fused ring-step kernels).
cuda_tests() {  # cuda_tests SECONDS GPU_KERNELS GPU_LOCAL GPU_STEPS
  local secs=$1
  [ "$2" != - ] && CUDA_VISIBLE_DEVICES=$2 timeout "$secs" python -m pytest -q -n 4 -m gpu tests/kernels -rf \
    > "$R/kernel_gpu_tests.log" 2>&1 &
  [ "$3" != - ] && CUDA_VISIBLE_DEVICES=$3 timeout "$secs" python -m pytest -q -n 6 \
    tests/distributed/test_local_attention.py -rf > "$R/local_attention_cuda_tests.log" 2>&1 &
  [ "$4" != - ] && CUDA_VISIBLE_DEVICES=$4 timeout "$secs" python -m pytest -q -n 4 \
    tests/kernels/test_step_accumulate.py -rf > "$R/step_accumulate_cuda_tests.log" 2>&1 &
  wait
}
# The GPU tests of the given files on WORKERS xdist workers, and the slow portable-autotune test in its own
# process beside them (in the xdist pool a worker kept it queued). Logs: $R/gpu_tests.log,
# $R/gpu_tests_slow_portable.log.
gpu_tests_beside_slow() {  # gpu_tests_beside_slow SLOW_SECONDS SECONDS WORKERS FILE...
  local slow_secs=$1 secs=$2 workers=$3
  shift 3
  local slow=tests/kernels/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels
  timeout -s INT "$slow_secs" python -m pytest -q -m gpu -rf "$slow" > "$R/gpu_tests_slow_portable.log" 2>&1 &
  timeout -s INT "$secs" python -m pytest -q -n "$workers" -m gpu -rf "$@" --deselect "$slow" \
    > "$R/gpu_tests.log" 2>&1
  wait
  tail -n 4 "$R/gpu_tests.log" "$R/gpu_tests_slow_portable.log"
}
# The GPU tests of the Hopper backward (dq and dK/dV kernels, one-kernel backward), Hopper block-sparse,
# packed QKV and dense kernel files, the slow test beside them.
hopper_backward_tests() {
  local T=tests/kernels
  gpu_tests_beside_slow 500 540 5 $T/test_flash_bwd_hopper.py $T/test_flash_bwd_fused_hopper.py \
    $T/test_block_sparse_hopper.py $T/test_qkvpacked.py $T/test_flash_attention.py
}
# d128 fwd+bwd, ours against SDPA cuDNN, FlexAttention and SDPA flash (also replayed from CUDA graphs) at the
# given lengths: $R/attention_d128.{json,md,png}, and its table printed.
d128_against_anchors() {  # d128_against_anchors SECONDS SEQLEN...
  local secs=$1
  shift
  timeout "$secs" python benchmarks/bench_attention.py --seqlens "$@" --headdims 128 --graphs \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d128.json" 2>&1 | quiet | grep "^|" | tail -n 20
}
# The ratios of ab_cudnn.py's printed rows (standard input), per-round ranges left out.
ratios() {
  python -c "import ast, sys; [print({k: v for k, v in ast.literal_eval(l).items() if 'over' in k and 'range' not in k}) for l in sys.stdin if l.startswith('{')]"
}
# ab_cudnn.py at d128 with both impls settled at the power cap (each call run back to back for 1.5 s before 500 ms
# of timing, three rounds, clocks sampled), causal (yes|no) at SEQLENS with the OPTIONs, killed after SECONDS:
# $R/NAME_causal_CAUSAL.json, its ratios printed.
settled_cudnn() {  # settled_cudnn SECONDS NAME CAUSAL "SEQLENS" OPTION...
  local secs=$1 name=$2 causal=$3 lens=$4
  shift 4
  # (word splitting of the lengths intended)
  timeout -s KILL "$secs" python benchmarks/ab_cudnn.py --headdims 128 --causal "$causal" --rounds 3 --seqlens $lens \
    --gpu-clocks --settle-ms 1500 --rep-ms 500 "$@" --out "$R/${name}_causal_$causal.json" 2>&1 | quiet | ratios
}
# The GPU tests (-m gpu) pytest selects from PYTEST_ARGS on WORKERS xdist workers, killed after SECONDS (in
# case programs wait on each other for ever): $R/gpu_tests.log, its exit status and last lines printed.
gpu_tests() {  # gpu_tests SECONDS WORKERS PYTEST_ARG...
  local secs=$1 workers=$2
  shift 2
  timeout -s KILL "$secs" python -m pytest -q -n "$workers" -rf -m gpu "$@" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
}
# ab_cudnn.py at d128 under GQA, 32 query heads on 8 kv heads, causal at CAUSAL_SEQLENS then full at FULL_SEQLENS,
# with the OPTIONs (--rounds, variants), each run killed after SECONDS: $R/NAME_causal_{yes,no}.json, the ratios
# printed.
gqa_cudnn() {  # gqa_cudnn SECONDS NAME "CAUSAL_SEQLENS" "FULL_SEQLENS" OPTION...
  local secs=$1 name=$2 causal_lens=$3 full_lens=$4
  shift 4
  for causal in yes no; do
    # (word splitting of the lengths intended)
    timeout -s KILL "$secs" python benchmarks/ab_cudnn.py --headdims 128 --nheads 32 --nheads-kv 8 --causal $causal \
      --seqlens $([ $causal = yes ] && echo "$causal_lens" || echo "$full_lens") "$@" --out "$R/${name}_causal_$causal.json" \
      2>&1 | quiet | ratios
  done
}
# bench_train.py with the OPTIONs, killed after SECONDS: $R/NAME.json, the last ROWS lines of its table printed.
train_table() {  # train_table SECONDS ROWS NAME OPTION...
  local secs=$1 rows=$2 name=$3
  shift 3
  timeout "$secs" python benchmarks/bench_train.py "$@" --out "$R/$name.json" 2>&1 | quiet | grep "^|" | tail -n "$rows"
}
# ab_trees.py: fwd+bwd of ab_base/ (a carried tree, main before the change) against this checkout at the SHAPEs,
# ROUNDS alternating rounds of 20 calls, killed after SECONDS: $R/NAME.json (written after each shape).
trees_ab() {  # trees_ab SECONDS ROUNDS NAME SHAPE...
  local secs=$1 rounds=$2 name=$3
  shift 3
  timeout -s KILL "$secs" python benchmarks/ab_trees.py --trees ab_base . --rounds "$rounds" --reps 20 \
    --shapes "$@" --out "$R/$name.json" 2>&1 | quiet
}
# ab_cudnn.py --two-kernels at d128, causal 2k-8k then full 4k-16k, five rounds, each run killed after SECONDS:
# $R/ab_cudnn_d128_causal_{yes,no}.json, the ratios printed.
cudnn_d128() {  # cudnn_d128 SECONDS
  for causal in yes no; do
    timeout -s KILL "$1" python benchmarks/ab_cudnn.py --two-kernels --headdims 128 --causal $causal \
      --seqlens $([ $causal = yes ] && echo 2048 4096 8192 || echo 4096 8192 16384) --rounds 5 \
      --out "$R/ab_cudnn_d128_causal_$causal.json" 2>&1 | quiet | ratios
  done
}
# The ordered backward's and the determinism switch's GPU tests, killed after a time limit (in case programs
# wait on each other for ever): $R/gpu_tests.log, its exit status and last lines printed.
ordered_tests() {
  timeout -s KILL 200 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_bwd_hopper.py \
    -k "ordered or torch_deterministic" > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests.log"
}
# exp_ordered_sem.py with results/s46/lightest_stress.patch applied (lightest-first launch), then reverted:
# $R/stress_lightest.json. The patch applies to the trees of sessions 46-48 only; since session 49 the
# causal convoy launches lightest first by itself (NOTES_attention.md, session 52).
lightest_stress() {
  git apply benchmarks/results/s46/lightest_stress.patch
  LIGHTEST_PATCH=1 timeout -s KILL 90 python benchmarks/exp_ordered_sem.py --out "$R/stress_lightest.json" 2>&1 | quiet
  git apply -R benchmarks/results/s46/lightest_stress.patch
}
ordered_ab() {  # ordered_ab CAUSAL_JSON FULL_JSON CAUSAL_SECONDS FULL_SECONDS "FULL_SEQLENS" [ab_fused_bwd.py options]:
  # ab_fused_bwd.py --ordered, five rounds, at causal 2k-8k and at full attention FULL_SEQLENS, each run killed
  # after its SECONDS, into $R
  local causal_json=$1 full_json=$2 causal_secs=$3 full_secs=$4 full_seqlens=$5
  shift 5
  timeout -s KILL "$causal_secs" python benchmarks/ab_fused_bwd.py --ordered "$@" --causal --seqlens 2048 4096 8192 \
    --rounds 5 --out "$R/$causal_json" 2>&1 | quiet
  timeout -s KILL "$full_secs" python benchmarks/ab_fused_bwd.py --ordered "$@" --seqlens $full_seqlens --rounds 5 \
    --out "$R/$full_json" 2>&1 | quiet
}
# The metric rows of an `ncu --csv` output file (its lines that start with a quote): kernel, metric, value, unit
ncu_rows() { python -c "import csv, sys; rows = csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('\"'));
[print(r['Kernel Name'][:28], r['Metric Name'], r['Metric Value'], r['Metric Unit']) for r in rows]" "$1"; }
# Nsight Compute's time, L2 hit rate and DRAM bytes of the backward kernels of one d128 fwd+bwd per run "NAME
# SEQLEN IMPL CAUSAL" (NAME two_kernels*: FLASHTRAIN_ORDERED_BWD=0), the causal convoy's limit lifted to 64k:
# $R/ncu_NAME_SEQLEN.csv, the metrics printed
ncu_backward() {
  local metrics=gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum
  for run in "$@"; do
    set -- $run
    FLASHTRAIN_ORDERED_BWD=$([ "${1#two_kernels}" != "$1" ] && echo 0 || echo 1) timeout 150 ncu --profile-from-start off \
      -k regex:attn_bwd --metrics $metrics --csv python benchmarks/ncu_attention.py --impl $3 --seqlen $2 \
      --headdim 128 --causal $4 --causal-convoy-upto 65536 > "$R/ncu_$1_$2.csv" 2> "$R/ncu_$1_$2.err"
    echo "$1 $2 exit $?"
    ncu_rows "$R/ncu_$1_$2.csv"
  done
}
# Nsight Compute's speed of light (duration, compute and memory throughput as % of peak) of each kernel of one
# block-sparse fwd+bwd per run "NAME SEQLEN HEADDIM IMPL" (IMPL bs:F:L or flexbs:F:L, ncu_attention.py), and
# the sections named in NCU_SECTIONS and the metrics in NCU_METRICS (comma-separated) besides: $R/ncu_bs_NAME.csv,
# the rows printed
ncu_block_sparse() {
  local sections="--section SpeedOfLight" s
  for s in ${NCU_SECTIONS:-}; do sections="$sections --section $s"; done
  for run in "$@"; do
    set -- $run
    timeout 150 ncu --profile-from-start off $sections ${NCU_METRICS:+--metrics $NCU_METRICS} --csv \
      python benchmarks/ncu_attention.py --impl $4 --seqlen $2 --headdim $3 > "$R/ncu_bs_$1.csv" 2> "$R/ncu_bs_$1.err"
    echo "$1 exit $?"
    ncu_rows "$R/ncu_bs_$1.csv"
  done
}
# bench_train.py (its options follow SECONDS) with the ordered one-kernel backward at head dim 64 as well
# (CONFIGS[64] = 64-query steps on two stages, as commit 9f3d075 had it), killed after SECONDS
d64_on() {  # d64_on SECONDS OPTION...: the ordered one-kernel backward at head dim 64, then bench_train.py here
  local secs=$1
  shift
  PYTHONPATH=. timeout "$secs" python -c "
import runpy, sys
import kernels._flash_bwd_fused_hopper as fused
fused.CONFIGS[64] = fused.dkdv.HopperDkdvConfig(block_m=64, block_n=64, consumers=2, stages=2, consumer_regs=240)
sys.argv = ['benchmarks/bench_train.py', *sys.argv[1:]]
runpy.run_path('benchmarks/bench_train.py', run_name='__main__')
" "$@"
}
# Per row of each bench_train.py results file: its tokens/s and error, each timed step's host and device ms
# (median, max; with --gpu-clocks every step's device ms) with, where recorded, the CPU medians and the three
# slowest steps (host ms, main-thread CPU ms, other threads' CPU ms, busy cores), and the GPU's clocks where
# sampled (--gpu-clocks: the run's, and each step's [MHz, W, slowdown reasons])
train_rows() { python -c "
import json, statistics as st, sys
for f in sys.argv[1:]:
  for r in json.load(open(f))['rows']:
    h, d = r.get('step_ms_host', []), r.get('step_ms_device', [])
    print(f.split('/')[-1], r.get('impl'), round(r.get('tokens_per_s', 0)), 'host med/max', st.median(h) if h else '-',
          max(h, default='-'), 'device med/max', st.median(d) if d else '-', max(d, default='-'), r.get('error', ''))
    clocks = {k: v for k, v in r.get('gpu_clocks', {}).items() if k != 'trace'}
    if clocks:
        print('   clocks', clocks, '\n   device ms', d)
    if 'step_cpu_ms_main' in r:
        cols = [h, r['step_cpu_ms_main'], r['step_cpu_ms_other_threads'], r['step_busy_cores']]
        print('   median', [st.median(c) if None not in c else None for c in cols],
              'slowest', [tuple(c[i] for c in cols) for i in sorted(range(len(h)), key=lambda i: -h[i])[:3]])
" "$@"; }
# Each row of ab_cudnn.py / ab_fwd_configs.py JSON files run with --gpu-clocks: its length and every timed call's
# [median SM clock MHz, median power W] over its timed windows
clock_medians() { python -c "import json, sys
for f in sys.argv[1:]:
    for r in json.load(open(f))['rows']:
        print(f.split('/')[-1], r['seqlen'], {k: v.get('median_mhz_w', v) for k, v in r['gpu_clocks'].items()})" "$@"; }
# ab_fwd_configs.py's printed rows (standard input) as one line: each length and its configs' cudnn_over_* ratios
fwd_ratios() { grep -o "'cudnn_over[^,]*,\|seqlen': [0-9]*" | paste -sd' '; }
# ab_fwd_configs.py, five rounds, each config also with its consumers taking turns (--pingpong), killed after
# SECONDS: $R/ab_fwd_NAME.json, its ratios printed
fwd_ab() {  # fwd_ab SECONDS NAME OPTION...
  local secs=$1 name=$2
  shift 2
  timeout -s KILL "$secs" python benchmarks/ab_fwd_configs.py --rounds 5 --pingpong "$@" --out "$R/ab_fwd_$name.json" \
    2>&1 | quiet | fwd_ratios
}
# The block-sparse benchmark (bench_block_sparse.py) with its options, after SECONDS cut short:
# $R/NAME.{json,md,png}, its table printed
bs_bench() {  # bs_bench SECONDS NAME OPTION...
  local secs=$1 name=$2
  shift 2
  timeout "$secs" python benchmarks/bench_block_sparse.py "$@" --out "$R/$name.json" 2>&1 | quiet | grep "^|"
}
# ab_block_sparse.py with its options, killed after SECONDS: $R/ab_bs_NAME.{json,md}, a summary line a point printed
bs_ab() {  # bs_ab SECONDS NAME OPTION...
  local secs=$1 name=$2
  shift 2
  timeout -s KILL "$secs" python benchmarks/ab_block_sparse.py "$@" --out "$R/ab_bs_$name.json" 2>&1 | quiet | python -c "
import ast, sys
keys = ('variant', 'seqlen', 'headdim', 'density_pct', 'max_diff_off_on', 'on_speedup_graph', 'off_vs_flex_graph',
        'on_vs_flex_graph')
[print({k: ast.literal_eval(l).get(k) for k in keys}) for l in sys.stdin if l.startswith('{')]"
}
# ab_decode_*.py's printed rows (standard input): the point, the graph-replay medians, and the ratios
ab_rows() {
  python -c "import sys, ast
for line in sys.stdin:
    if not line.startswith('{'): print(line, end=''); continue
    r = ast.literal_eval(line)
    medians = ['%s %.4f' % (k, v) for k, v in r.items() if k.endswith('_graph_median')]
    ratios = ['%s %.3f' % (k, v) for k, v in r.items() if '_over_' in k and k.endswith('_graph')]
    print(r['heads'], r['batch'], r['cache_len'], *medians, *ratios)"
}
# The generation and block-sparse model tests (and the bench script's) on CUDA, with FILE... besides, on
# WORKERS workers, killed after SECONDS: $R/cuda_tests_generate.log, its exit status and last lines printed
generate_tests() {  # generate_tests SECONDS WORKERS FILE...
  local secs=$1 workers=$2
  shift 2
  timeout -s KILL "$secs" python -m pytest -q -rf -n "$workers" tests/flashtrain/test_generate.py \
    tests/flashtrain/test_block_sparse_model.py tests/benchmarks/test_bench_generate_block_sparse.py "$@" \
    > "$R/cuda_tests_generate.log" 2>&1
  echo "tests exit $?"; tail -n 4 "$R/cuda_tests_generate.log"
}
# bench_generate_block_sparse.py with its options, killed after SECONDS: $R/NAME.json, its table printed
bs_generate() {  # bs_generate SECONDS NAME OPTION...
  local secs=$1 name=$2
  shift 2
  timeout -s KILL "$secs" python benchmarks/bench_generate_block_sparse.py "$@" --out "$R/$name.json" 2>&1 | quiet | grep "^|"
}
