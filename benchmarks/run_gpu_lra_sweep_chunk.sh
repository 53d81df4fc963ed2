#!/usr/bin/env bash
# One lease-sized piece of an LRA sweep too long for one call: up to four runs side by side, one per GPU
# of an nvidia-h200-x4, each resumed from the carried run directory, trained for SECONDS
# (trainer.time_limit_s; the trainer then checkpoints and stops) and handed back packed as
# $OUT/carry/runs.tgz, like run_gpu_lra_chunk.sh does for one run. The runs must be the same in every
# call of a sweep: they are this file's default (Pathfinder-32, see NOTES_lra.md) unless given as
# arguments (one quoted string of Hydra overrides per run). The data are generated once per call, with all
# cores, into one cache the runs then only read. RUN_IDS="0 1" runs only those (run i always on GPU i),
# leaving the other GPUs to other work; the runs not run are carried unchanged.
#
#   here:  device run --carry .whl .carry "source .whl/install.sh >/dev/null && bash benchmarks/run_gpu_lra_sweep_chunk.sh 480"
#   then:  rm -rf .carry && cp -r <files_at>/carry .carry     (.carry/ is git-ignored)
source "$(dirname "$0")/gpu_call.sh"
machine_info
secs=$1
shift
exp=${EXP:-lra/pathfinder32}
name=${exp#lra/}
# Pathfinder-32, 100 epochs (62,400 steps of 256) each. Run 0 is the recipe of the Nystromformer LRA
# code (2 layers, width 64, 2 heads, attention dropout 0.1, lr 1e-4, no weight decay, AdamW's default
# betas), whose softmax transformer is reported at 74.2% on Pathfinder; the others vary its lr (1e-4, 3e-4) and width (64, 128).
recipe="model.n_layer=2 model.n_head=2 model.d_model=64 model.attn_dropout=0.1 optim.min_lr=0
  optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999 trainer.max_steps=62400"
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(
  "$recipe optim.lr=1e-4"
  "$recipe optim.lr=3e-4"
  "$recipe optim.lr=1e-4 model.d_model=128 model.n_head=4"
  "$recipe optim.lr=3e-4 model.d_model=128 model.n_head=4"
)
work=/tmp/lra-carry
rm -rf "$work"  # a warm machine may hold an earlier call's runs
mkdir -p "$work/runs" "$OUT/carry"
[ -f .carry/runs.tgz ] && tar xzf .carry/runs.tgz -C "$work"
cache=/tmp/flashtrain-lra
start=$(date +%s)
# shellcheck disable=SC2086
python - "$name" "$cache" ${EXTRA:-} <<'EOF' 2>&1 | grep -v -e Generating -e Saving -e Map | tee "$R/data.log"
import sys, time
from omegaconf import OmegaConf
from flashtrain.tasks.classification import load_lra_dataset
from flashtrain.tasks import TaskConfig
task = OmegaConf.load(f"configs/experiment/lra/{sys.argv[1]}.yaml")["task"]
t = time.time()
extra = OmegaConf.from_dotlist(sys.argv[3:]).get("task", {})
splits = load_lra_dataset(TaskConfig(**{**task, **extra, "cache_dir": sys.argv[2]}))
print({k: len(v) for k, v in splits.items()}, f"ready in {time.time() - t:.0f} s")
EOF
left=$((secs - ($(date +%s) - start)))
ids=${RUN_IDS:-${!RUNS[*]}}
for i in $ids; do
  # shellcheck disable=SC2086  # each entry is several overrides
  CUDA_VISIBLE_DEVICES=$i timeout --kill-after=30 $((left + 120)) python train.py experiment="$exp" \
    ${RUNS[$i]} trainer.run_name="${name}_sweep_$i" trainer.resume=auto trainer.time_limit_s="$left" \
    trainer.out_dir="$work/runs" trainer.keep_checkpoints=1 trainer.compile="${COMPILE:-true}" trainer.eval_interval=1250 \
    trainer.log_interval=100 trainer.progress_bar=false logger=none task.cache_dir="$cache" ${EXTRA:-} 2>&1 |
    grep -v -e Saving -e Generating -e Map >> "$work/runs/${name}_sweep_$i.log" &
done
wait
tar czf "$OUT/carry/runs.tgz" -C "$work" runs
for i in $ids; do
  echo "== $i: ${RUNS[$i]}"
  grep -e 'val/acc' -e 'ms/step' "$work/runs/${name}_sweep_$i.log" | tail -n 3
done | tee "$R/summary.txt"
du -sh "$OUT/carry/runs.tgz"
