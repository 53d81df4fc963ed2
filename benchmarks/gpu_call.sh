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
# The GPU tests of the Hopper backward, Hopper block-sparse, packed QKV and dense kernel files, the slow
# test beside them.
hopper_backward_tests() {
  local T=tests/kernels
  gpu_tests_beside_slow 500 540 5 $T/test_flash_bwd_hopper.py $T/test_block_sparse_hopper.py $T/test_qkvpacked.py \
    $T/test_flash_attention.py
}
# d128 fwd+bwd, ours against SDPA cuDNN, FlexAttention and SDPA flash (also replayed from CUDA graphs) at the
# given lengths: $R/attention_d128.{json,md,png}, and its table printed.
d128_against_anchors() {  # d128_against_anchors SECONDS SEQLEN...
  local secs=$1
  shift
  timeout "$secs" python benchmarks/bench_attention.py --seqlens "$@" --headdims 128 --graphs \
    --impls triton sdpa_cudnn flex sdpa_flash --out "$R/attention_d128.json" 2>&1 | quiet | grep "^|" | tail -n 20
}
