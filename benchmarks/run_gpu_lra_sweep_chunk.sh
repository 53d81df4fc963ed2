#!/usr/bin/env bash
# One lease-sized piece of an LRA sweep too long for one call: up to four runs side by side, one per GPU
# of an nvidia-h200-x4, each resumed from the carried run directory, trained for SECONDS
# (trainer.time_limit_s; the trainer then checkpoints and stops) and handed back packed as
# $OUT/carry/runs.tgz, like run_gpu_lra_chunk.sh does for one run. The runs must be the same in every
# call of a sweep: they are one of this file's sets (SWEEP, below; Pathfinder-32, see NOTES_lra.md) unless
# given as arguments (one quoted string of Hydra overrides per run). The data are generated once per call, with all
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
# Pathfinder-32 sweeps (SWEEP=...), 100 epochs each; runs are named <task>_<sweep>_<i>.
# - recipe (run 2026-11-22; its runs were then named pathfinder32_sweep_<i>): the Nystromformer LRA code's
#   recipe (2 layers, width 64, 2 heads, attention dropout 0.1, lr 1e-4, no weight decay, AdamW's default
#   betas; its paper reports 74.2% for a softmax transformer) at lr 1e-4 / 3e-4 and width 64 / 128. All
#   four stayed at chance (NOTES_lra.md).
# - positions (the default, not run yet): the same recipe with sin-cos 2-D positions, fixed or as the start
#   of learned ones, and LRA's own transformer config (1 layer, width 128, 4 heads, dropout 0.2, lr 1e-3,
#   batch 512, fixed sin-cos positions as in LRA; 100 epochs = 31,200 steps of 512).
sweep=${SWEEP:-positions}
recipe="model.n_layer=2 model.n_head=2 model.d_model=64 model.attn_dropout=0.1 optim.min_lr=0
  optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999 trainer.max_steps=62400"
lra_transformer="model.n_layer=1 model.n_head=4 model.d_model=128 model.dropout=0.2 model.attn_dropout=0.1
  optim.lr=1e-3 optim.min_lr=0 optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999
  trainer.batch_size=512 trainer.max_steps=31200 task.positions=sincos"
RUNS=("$@")
if [ ${#RUNS[@]} -eq 0 ]; then
  case $sweep in
    recipe) RUNS=(
      "$recipe optim.lr=1e-4"
      "$recipe optim.lr=3e-4"
      "$recipe optim.lr=1e-4 model.d_model=128 model.n_head=4"
      "$recipe optim.lr=3e-4 model.d_model=128 model.n_head=4"
    ) ;;
    positions) RUNS=(
      "$recipe optim.lr=3e-4 task.positions=sincos"
      "$recipe optim.lr=3e-4 task.positions=sincos_init"
      "$recipe optim.lr=1e-4 task.positions=sincos"
      "$lra_transformer"
    ) ;;
    *) echo "SWEEP=$sweep: choose recipe or positions" >&2; exit 2 ;;
  esac
fi
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
    ${RUNS[$i]} trainer.run_name="${name}_${sweep}_$i" trainer.resume=auto trainer.time_limit_s="$left" \
    trainer.out_dir="$work/runs" trainer.keep_checkpoints=1 trainer.compile="${COMPILE:-true}" trainer.eval_interval=1250 \
    trainer.log_interval=100 trainer.progress_bar=false logger=none task.cache_dir="$cache" ${EXTRA:-} 2>&1 |
    grep -v -e Saving -e Generating -e Map >> "$work/runs/${name}_${sweep}_$i.log" &
done
wait
tar czf "$OUT/carry/runs.tgz" -C "$work" runs
for i in $ids; do
  echo "== $i: ${RUNS[$i]}"
  grep -e 'val/acc' -e 'ms/step' "$work/runs/${name}_${sweep}_$i.log" | tail -n 3
done | tee "$R/summary.txt"
du -sh "$OUT/carry/runs.tgz"
