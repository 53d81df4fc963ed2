#!/usr/bin/env bash
# One call on a single-GPU machine (through `device`): model/trainer GPU tests, the end-to-end training
# benchmark, and the LRA runs that fit in a call. Everything it measures lands under $OUT.
#   source .whl/install.sh && bash benchmarks/run_gpu_single.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

# 1. GPU tests of the model side (bf16 trainer run, MFU/memory metrics, block-sparse backend)
timeout 150 python -m pytest -q -m gpu tests/flashtrain tests/kernels/test_block_sparse.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"

# 2. LRA: ListOps trained in full (5k steps); Pathfinder / Path-X / Path-256 throughput probes
lra() { timeout "$1" python train.py "${@:2}" logger=none trainer.progress_bar=false trainer.out_dir="$OUT/runs" \
        task.cache_dir=/tmp/lra-cache 2>&1 | grep -v -e Saving -e Generating -e Map; }
lra 200 experiment=lra/listops | tee "$OUT/lra_listops.log"
lra 80 experiment=lra/pathfinder32 task.n_train=4096 task.n_val=1024 task.n_test=1024 trainer.max_steps=200 \
    trainer.eval_interval=100 trainer.eval_batches=4 trainer.checkpoint_interval=0 | tee "$OUT/lra_pathfinder32_probe.log"
lra 80 experiment=lra/path256 task.init_from=null task.n_train=64 task.n_val=16 task.n_test=16 trainer.max_steps=12 \
    trainer.eval_interval=0 trainer.checkpoint_interval=0 trainer.log_interval=1 | tee "$OUT/lra_path256_probe.log"

# 3. End-to-end training throughput (rows are written as they finish)
timeout 300 python benchmarks/bench_train.py --models gpt2_medium,gpt2_small --seqlens 1024,8192 \
    --out "$OUT/train_h200.json" 2>&1 | grep -v Warning | tee "$OUT/bench_train.log"
