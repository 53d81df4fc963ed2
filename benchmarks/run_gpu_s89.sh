#!/usr/bin/env bash
# Session 89's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s89.sh PART, results in $OUT/results.tgz
# (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s89/callN/.
#   1: the dependent dK/dV launch's GPU tests again (their helper's CUDA graph now goes through
#      benchmarks.common.capture_graph, changed after session 88's last GPU run); the host time of one GPT-2 small
#      layer's attention calls, ours against SDPA cuDNN (profile_layer_host.py, new: GPT-2 small 1k is host-bound
#      with ours, README ‡), at batch 2 (the GPU never the pace) and at the model's batch 16; then session 87's
#      open convoy point: the causal convoy in 1 / 3 (default) / 4 key groups with 8 heads at 32k and 48k
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  gpu_tests 200 8 tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_block_sparse_hopper.py -k dependent_dkdv
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  for batch in 2 16; do
    timeout -s KILL 90 python benchmarks/profile_layer_host.py --batch $batch --out "$R/layer_host_b$batch.json" \
      2>&1 | quiet > "$R/layer_host_b$batch.log"
    head -n 7 "$R/layer_host_b$batch.log"
  done
  settled_cudnn 190 convoy_groups_8_heads yes "32768 49152" --nheads 8 --deterministic-only --also-convoy-key-groups 1 4
  clock_medians "$R/convoy_groups_8_heads_causal_yes.json"
  ;;
esac
