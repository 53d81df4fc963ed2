#!/usr/bin/env bash
# One lease-sized piece of an LRA sweep too long for one call: up to four runs side by side, run i on
# GPU i mod (the GPU count: one each on an nvidia-h200-x4, two each on an -x2), each resumed from the carried run directory, trained for SECONDS
# (trainer.time_limit_s; the trainer then checkpoints and stops) and handed back packed as
# $OUT/carry/runs.tgz, like run_gpu_lra_chunk.sh does for one run. The runs must be the same in every
# call of a sweep: they are one of this file's sets (SWEEP, below; Pathfinder-32, see NOTES_lra.md) unless
# given as arguments (one quoted string of Hydra overrides per run). The data come from .carry/data.tar.xz
# when it is there (the data cache, packed: Pathfinder-32 is 21 MB, generated once on any machine with
# `load_lra_dataset` and `tar cJf .carry/data.tar.xz -C <cache_dir> .`), else are generated once per call
# with all cores (111 s on an x2's 32) into one cache the runs then only read. RUN_IDS="0 1" runs only
# those, leaving the other runs carried unchanged.
#
#   here:  device run --carry .whl .carry "source .whl/install.sh >/dev/null && bash benchmarks/run_gpu_lra_sweep_chunk.sh 480"
#   then:  cp <files_at>/carry/runs.tgz .carry/     (.carry/ is git-ignored; keep its data.tar.xz)
source "$(dirname "$0")/gpu_call.sh"
machine_info
secs=$1
shift
exp=${EXP:-lra/pathfinder32}
name=${exp#lra/}
# Pathfinder-32 sweeps (SWEEP=...), 100 epochs each unless said; runs are named <task>_<sweep>_<i>.
# - recipe (run 2026-11-22; its runs were then named pathfinder32_sweep_<i>): the Nystromformer LRA code's
#   recipe (2 layers, width 64, 2 heads, attention dropout 0.1, lr 1e-4, no weight decay, AdamW's default
#   betas; its paper reports 74.2% for a softmax transformer) at lr 1e-4 / 3e-4 and width 64 / 128. All
#   four stayed at chance (NOTES_lra.md).
# - positions (not run yet): the same recipe with sin-cos 2-D positions, fixed or as the start
#   of learned ones, and LRA's own transformer config (1 layer, width 128, 4 heads, dropout 0.2, lr 1e-3,
#   batch 512, fixed sin-cos positions as in LRA; 100 epochs = 31,200 steps of 512).
# - rotary (the default): 50 epochs each, two runs per GPU of an x2. The recipe at lr 3e-4 with axial 2-D
#   rotary positions (a score depends on the pixels' 2-D offset) and with sin-cos as the start of learned
#   positions; LRA's transformer config with learned positions (with which a reader of LRA's code
#   reports about 70%, where LRA's fixed sin-cos stayed at 50%: long-range-arena issue 60) and with rotary.
sweep=${SWEEP:-rotary}
recipe="model.n_layer=2 model.n_head=2 model.d_model=64 model.attn_dropout=0.1 optim.min_lr=0
  optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999"
epochs100="trainer.max_steps=62400"  # of 256 images
lra_transformer="model.n_layer=1 model.n_head=4 model.d_model=128 model.dropout=0.2 model.attn_dropout=0.1
  optim.lr=1e-3 optim.min_lr=0 optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999
  trainer.batch_size=512"
rotary="task.positions=rotary model.rope_theta=100"  # 100: the slowest of 8 pairs per axis still turns 1 rad in 32 px
RUNS=("$@")
if [ ${#RUNS[@]} -eq 0 ]; then
  case $sweep in
    recipe) RUNS=(
      "$recipe $epochs100 optim.lr=1e-4"
      "$recipe $epochs100 optim.lr=3e-4"
      "$recipe $epochs100 optim.lr=1e-4 model.d_model=128 model.n_head=4"
      "$recipe $epochs100 optim.lr=3e-4 model.d_model=128 model.n_head=4"
    ) ;;
    positions) RUNS=(
      "$recipe $epochs100 optim.lr=3e-4 task.positions=sincos"
      "$recipe $epochs100 optim.lr=3e-4 task.positions=sincos_init"
      "$recipe $epochs100 optim.lr=1e-4 task.positions=sincos"
      "$lra_transformer trainer.max_steps=31200 task.positions=sincos"
    ) ;;
    rotary) RUNS=(
      "$recipe optim.lr=3e-4 $rotary trainer.max_steps=31200"
      "$recipe optim.lr=3e-4 task.positions=sincos_init trainer.max_steps=31200"
      "$lra_transformer task.positions=learned trainer.max_steps=15600"
      "$lra_transformer $rotary trainer.max_steps=15600"
    ) ;;
    *) echo "SWEEP=$sweep: choose recipe, positions or rotary" >&2; exit 2 ;;
  esac
fi
work=/tmp/lra-carry
rm -rf "$work"  # a warm machine may hold an earlier call's runs
mkdir -p "$work/runs" "$OUT/carry"
[ -f .carry/runs.tgz ] && tar xzf .carry/runs.tgz -C "$work"
cache=/tmp/flashtrain-lra
start=$(date +%s)
if [ -f .carry/data.tar.xz ]; then mkdir -p "$cache" && tar xJf .carry/data.tar.xz -C "$cache"; fi
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
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
for i in $ids; do
  # shellcheck disable=SC2086  # each entry is several overrides
  CUDA_VISIBLE_DEVICES=$((i % (gpus > 0 ? gpus : 1))) timeout --kill-after=30 $((left + 120)) python train.py experiment="$exp" \
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
