set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 170 python -m pytest -q -m gpu tests/kernels -x 2>&1 | tail -6 | tee $OUT/kernel_gpu_tests.log
timeout 150 python train.py experiment=lra/listops trainer.max_steps=10000 trainer.eval_interval=2000 logger=none \
  trainer.progress_bar=false trainer.log_interval=1000 trainer.out_dir=$OUT/runs task.cache_dir=/tmp/lra 2>&1 \
  | grep -v -e Saving -e Generating -e Map | tee $OUT/lra_listops_10k.log | tail -4
