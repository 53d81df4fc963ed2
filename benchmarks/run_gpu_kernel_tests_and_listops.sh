# One device call (nvidia-h200): the kernel tests on the GPU (bf16 included), the ring's local-attention
# routes on CUDA (varlen for documents, block-sparse for layouts), dropout's cost, then a 10k-step ListOps run.
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 170 python -m pytest -q -m gpu tests/kernels -x 2>&1 | tail -6 | tee $OUT/kernel_gpu_tests.log
timeout 90 python -m pytest -q tests/distributed/test_local_attention.py tests/kernels/test_tuning.py 2>&1 \
  | tail -6 | tee $OUT/local_attention_cuda_tests.log
# the cost of in-kernel dropout (Philox4x32 since 2026-11-22) against SDPA flash's
timeout 120 python benchmarks/bench_attention.py --seqlens 4096 16384 --headdims 64 128 --causal causal \
  --impls triton triton_dropout sdpa_flash sdpa_flash_dropout --out $OUT/attention_dropout.json 2>&1 \
  | tail -10 | tee $OUT/attention_dropout.log
timeout 170 python train.py experiment=lra/listops trainer.max_steps=10000 trainer.eval_interval=2000 logger=none \
  trainer.progress_bar=false trainer.log_interval=1000 trainer.out_dir=$OUT/runs task.cache_dir=/tmp/lra 2>&1 \
  | grep -v -e Saving -e Generating -e Map | tee $OUT/lra_listops_10k.log | tail -4
