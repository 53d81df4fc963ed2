#!/usr/bin/env bash
# One short call on nvidia-h200-x2: the gradients of one sp=2 step with activation checkpointing
# (ring, GPT-2 small, rotary, chunked loss, 64k tokens) against one GPU (`check_sp_gradients.py`), then
# the GPU test of sequence-parallel training with the same settings at 16k tokens against one GPU.
#   source .whl/install.sh && bash benchmarks/run_gpu_x2_sp_check.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
timeout "${GRADS_S:-170}" torchrun --standalone --nproc-per-node 2 benchmarks/check_sp_gradients.py \
  --context 65536 --variants sp --out "$R/sp_gradients_64k.json" 2>&1 | quiet > "$R/sp_gradients_64k.log"
grep variant "$R/sp_gradients_64k.log" | cut -c1-700
timeout "${TEST_S:-110}" python -m pytest -q -m gpu tests/distributed/test_data_parallel.py -k long_context -rf \
  > "$R/sp_long_gpu_test.log" 2>&1
tail -n 3 "$R/sp_long_gpu_test.log"
