#!/usr/bin/env bash
# One call on nvidia-h200-x4 (through `device`): four ListOps runs side by side, one per GPU, each a set
# of Hydra overrides on `experiment=lra/listops`, given as arguments (one quoted string per run; the
# default is the first sweep's four) (the run to report is the one with the best validation
# accuracy; all four test accuracies are kept). Each run generates its own copy of the data (its own
# cache directory, so no two processes write one cache). With GPU_TESTS=1 the kernel GPU tests, the ring's
# local routes on CUDA and the fused ring-step kernels run beside them (their own GPU each; the ListOps
# wall times are then shared-machine times).
#   source .whl/install.sh && bash benchmarks/run_gpu_lra_sweep.sh ["overrides of run 0" ...]
source "$(dirname "$0")/gpu_call.sh"
machine_info
LIMIT=${LIMIT:-420}  # seconds per ListOps run; set max_steps so that a run ends (and tests) before it

RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(
  "optim.lr=5e-4 optim.min_lr=5e-5 trainer.max_steps=20000"
  "optim.lr=5e-4 optim.min_lr=5e-5 trainer.max_steps=20000 task.pooling=cls"
  "model.n_layer=4 model.d_model=256 model.n_head=4 optim.lr=3e-4 optim.min_lr=3e-5 trainer.max_steps=12000"
  "optim.lr=1e-3 optim.min_lr=1e-4 optim.warmup_steps=2000 trainer.batch_size=64 trainer.max_steps=10000"
)
for i in "${!RUNS[@]}"; do
  # shellcheck disable=SC2086  # each entry is several overrides
  CUDA_VISIBLE_DEVICES=$i timeout "$LIMIT" python train.py experiment=lra/listops ${RUNS[$i]} \
    trainer.run_name="listops_sweep_$i" trainer.out_dir=/tmp/lra-runs trainer.checkpoint_interval=0 \
    trainer.eval_interval=1000 logger=none trainer.progress_bar=false task.cache_dir="/tmp/lra-cache-$i" \
    2>&1 | grep -v -e Saving -e Generating -e Map -e 'ms/step' > "$R/listops_sweep_$i.log" &
done
[ "${GPU_TESTS:-0}" = 1 ] && cuda_tests 300 0 1 2 &
wait
for i in "${!RUNS[@]}"; do echo "== $i: ${RUNS[$i]}"; grep -e 'val/acc' "$R/listops_sweep_$i.log" | tail -3; done
tail -n 2 "$R"/*tests.log 2>/dev/null
