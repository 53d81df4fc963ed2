#!/usr/bin/env bash
# One short call on nvidia-h200-x2: the gradients of one sp=2 step with activation checkpointing
# (ring, GPT-2 small, rotary, chunked loss, 64k tokens) against one GPU (`check_sp_gradients.py`), then
# the GPU test of sequence-parallel training with the same settings at 16k tokens against one GPU.
#   source .whl/install.sh && bash benchmarks/run_gpu_x2_sp_check.sh
source "$(dirname "$0")/gpu_call.sh"
machine_info
n=65536
timeout "${GRADS_S:-170}" torchrun --standalone --nproc-per-node 2 benchmarks/check_sp_gradients.py \
  --out "$R/sp_gradients_64k.json" --variants sp \
  --override model=gpt2_small --override model.vocab_size=50304 --override model.attention=triton \
  --override model.pos_embedding=rotary --override model.loss_chunk=8192 --override model.dropout=0.0 \
  --override model.max_seq_len=$n --override trainer.seq_len=$n --override trainer.batch_size=1 \
  --override trainer.activation_checkpointing=true --override parallel=ddp --override parallel.sp=2 \
  --override data.max_documents=null --override trainer.eval_interval=0 --override logger.kind=none \
  --override trainer.out_dir=/tmp/spg --override data.cache_dir=/tmp/spg/cache 2>&1 | quiet \
  > "$R/sp_gradients_64k.log"
grep variant "$R/sp_gradients_64k.log" | cut -c1-700
timeout "${TEST_S:-110}" python -m pytest -q -m gpu tests/distributed/test_data_parallel.py -k long_context -rf \
  > "$R/sp_long_gpu_test.log" 2>&1
tail -n 3 "$R/sp_long_gpu_test.log"
