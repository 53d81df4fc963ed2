#!/usr/bin/env bash
# Device calls on one GPU (session 67). Each part is what one call ran; the outputs are in
# benchmarks/results/s67/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s67.sh 1   # session 66's last two changes on a GPU (PDL's gate for GQA and sm_80, the
#       PDL test on MHA heads): decode's tests on CUDA; then decode at batch 1 (cuDNN 2-8% ahead) swept over the split
#       kernel's launch shape, the shortest split (MIN_SPLIT_TILES) among them, at d64 MHA 16, d128 GQA 32/8 and
#       d128 MHA 32, 4k-64k caches, SDPA cuDNN alongside
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
T=tests/kernels
# bench_decode.py's printed rows (standard input): the point, the launch and the replayed time
decode_rows() {
  python -c "import sys, ast
for line in sys.stdin:
    if not line.startswith('{'): continue
    r = ast.literal_eval(line)
    print(r['headdim'], r['nheads'], r['nheads_kv'], r['batch'], r['cache_len'], r['impl'], r.get('launch', '-'),
          r.get('graph_ms', r.get('error')))"
}
case "$1" in
1)
  timeout -s KILL 150 python -m pytest -q -rf $T/test_decode.py > "$R/gpu_tests_decode.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_decode.log"
  LAUNCHES="default 4,4,2,64,2 4,4,2,64,1 4,4,3 4,4,3,64,2 4,4,2,128 8,4,2,64,2 8,4,3"
  for heads in "64 16 16" "128 32 8" "128 32 32"; do
    set -- $heads
    timeout -s KILL 150 python benchmarks/bench_decode.py --batches 1 --cache-lens 4096 16384 65536 \
      --headdim "$1" --nheads "$2" --nheads-kv "$3" --impls triton sdpa_cudnn --launch $LAUNCHES \
      --out "$R/decode_b1_sweep_d$1_h$2_kv$3.json" 2>&1 | quiet | decode_rows
  done
  ;;
esac
