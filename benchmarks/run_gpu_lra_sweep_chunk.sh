#!/usr/bin/env bash
# One lease-sized piece of an LRA sweep too long for one call: up to four runs side by side, run i on
# GPU i mod the GPU count (one each on an nvidia-h200-x4, two each on an -x2), each resumed from the
# carried run directory, trained for SECONDS (trainer.time_limit_s; the trainer then checkpoints and
# stops) and handed back packed as
# $OUT/carry/runs.tgz, like run_gpu_lra_chunk.sh does for one run. The runs must be the same in every
# call of a sweep: they are one of this file's sets (SWEEP, below; Pathfinder-32, see NOTES_lra.md) unless
# given as arguments (one quoted string of Hydra overrides per run). The data come from .carry/data.tar.xz
# when it is there (the data cache, packed: Pathfinder-32 is 21 MB, generated once on any machine with
# `load_lra_dataset` and `tar cJf .carry/data.tar.xz -C <cache_dir> .`), else are generated once per call
# with all cores (111 s on an x2's 32) into one cache the runs then only read. RUN_IDS="0 1" runs only
# those, leaving the other runs carried unchanged; GPU_LIST="0 1" puts the k-th of them on the k-th GPU
# listed (modulo the list), leaving the others free for other work in the same call. NPROC=2 instead runs
# the chosen runs one after another, each data-parallel over the first NPROC GPUs of GPU_LIST (torchrun,
# parallel=ddp, the per-GPU batch divided by NPROC so the global batch stays): a run carried from one GPU
# goes on with the same data position and losses (Trainer._resume_on_other_world_size).
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
# - rotary: 50 epochs each, two runs per GPU of an x2. The recipe at lr 3e-4 with axial 2-D
#   rotary positions (a score depends on the pixels' 2-D offset) and with sin-cos as the start of learned
#   positions; LRA's transformer config with learned positions (with which a reader of LRA's code
#   reports about 70%, where LRA's fixed sin-cos stayed at 50%: long-range-arena issue 60) and with rotary.
#   Run 2026-11-22 for 17-30 epochs: all four collapsed to one prediction (validation accuracy exactly 50%;
#   across images, run 2's logit difference varied by 1e-5): at the GPT-2 init (std 0.02) the attention of
#   a width-64/128 model is nearly uniform and the mean-pooled features hardly depend on the image.
# - init: the same four at init std 1/sqrt(width) (0.125 at 64, 0.088 at 128; Flax's
#   lecun-normal scale, which LRA's code used), recipe and LRA config, learned and rotary positions.
#   Run 2026-11-22 (one call, two runs per GPU, ~10k steps each): only run 3 (LRA config, rotary) learned:
#   validation accuracy 50.0 -> 54.5%, loss 0.694 -> 0.687, by step 8,750; learned positions (run 2)
#   memorised (validation loss up to 0.705); the width-64 recipe runs stayed at chance.
# - init2: run 3 of init continued to its 50 epochs (its directory renamed to init2_3), and
#   three variants of it from scratch: lr 2e-3, two layers, init std 0.15.
#   Run 2026-11-22: init_3 ended its 50 epochs at 54.6% test (55.2% val), now experiment=lra/pathfinder32;
#   two layers reached 54.8% val at step 10k, still rising; init std 0.15 peaked at 54.7% (step 7.5k) and
#   fell back; lr 2e-3 collapsed to one prediction.
# - long: LRA's 200 epochs (62,400 steps of 512) of the experiment's config, of its two-layer variant,
#   and of both with CLS pooling. Runs 1 and 3 (two layers, mean / CLS) run 2026-11-22 for 8k steps, one
#   per GPU of an x4 (a median 49-52 ms per step alone; two such runs sharing a GPU later took 63-66 ms
#   each, so much of a lone step is host time): both stayed at exactly 50% validation accuracy throughout. On the 15,600-step schedule the same model left 50% only
#   after step 5,000, when the cosine had brought lr below ~7e-4; on the 62,400-step one lr is still
#   0.98e-3 at step 7.5k. A peak lr of 1e-3 held that long keeps the model at one prediction.
# - lr (the default): the 200 epochs at lower peak lr, 5e-4 and 3e-4, one and two layers. Two x2 calls
#   on 2026-11-22 (two runs per GPU): all four learn (two layers from step 3,750, one from 6-7.5k); run 1
#   (two layers, lr 5e-4) then went on data-parallel over both GPUs of an x2 (NPROC=2 RUN_IDS=1, two
#   calls) to its 62,400 steps: 89.45% test. That is experiment=lra/pathfinder32 now. Runs 0 and 2 stopped
#   at 20.3k steps, run 3 at 18.6k (in .carry/runs.tgz).
sweep=${SWEEP:-lr}
# The bases and the long/lr sets pin what experiment=lra/pathfinder32 has since changed (it was init2_3's
# config, then lr_1's), so the sets below still describe the runs that were made.
recipe="model.n_layer=2 model.n_head=2 model.d_model=64 model.attn_dropout=0.1 optim.min_lr=0
  optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999 model.dropout=0.1 trainer.batch_size=256
  task.positions=learned model.init_std=0.02 model.rope_theta=10000"
epochs100="trainer.max_steps=62400"  # of 256 images
lra_transformer="model.n_layer=1 model.n_head=4 model.d_model=128 model.dropout=0.2 model.attn_dropout=0.1
  optim.lr=1e-3 optim.min_lr=0 optim.warmup_steps=312 optim.weight_decay=0 optim.beta2=0.999
  trainer.batch_size=512 task.positions=learned model.init_std=0.02 model.rope_theta=10000"
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
    rotary) RUNS=(
      "$recipe optim.lr=3e-4 $rotary trainer.max_steps=31200"
      "$recipe optim.lr=3e-4 task.positions=sincos_init trainer.max_steps=31200"
      "$lra_transformer task.positions=learned trainer.max_steps=15600"
      "$lra_transformer $rotary trainer.max_steps=15600"
    ) ;;
    init) RUNS=(
      "$recipe optim.lr=3e-4 $rotary model.init_std=0.125 trainer.max_steps=31200"
      "$recipe optim.lr=3e-4 task.positions=learned model.init_std=0.125 trainer.max_steps=31200"
      "$lra_transformer task.positions=learned model.init_std=0.088 trainer.max_steps=15600"
      "$lra_transformer $rotary model.init_std=0.088 trainer.max_steps=15600"
    ) ;;
    init2) RUNS=(
      "$lra_transformer $rotary model.init_std=0.088 optim.lr=2e-3 trainer.max_steps=15600"
      "$lra_transformer $rotary model.init_std=0.088 model.n_layer=2 trainer.max_steps=15600"
      "$lra_transformer $rotary model.init_std=0.15 trainer.max_steps=15600"
      "$lra_transformer $rotary model.init_std=0.088 trainer.max_steps=15600"
    ) ;;
    long) RUNS=(
      "trainer.max_steps=62400 optim.lr=1e-3 model.n_layer=1"
      "trainer.max_steps=62400 optim.lr=1e-3 model.n_layer=2"
      "trainer.max_steps=62400 optim.lr=1e-3 model.n_layer=1 task.pooling=cls"
      "trainer.max_steps=62400 optim.lr=1e-3 model.n_layer=2 task.pooling=cls"
    ) ;;
    lr) RUNS=(
      "trainer.max_steps=62400 optim.lr=5e-4 model.n_layer=1"
      "trainer.max_steps=62400 optim.lr=5e-4 model.n_layer=2"
      "trainer.max_steps=62400 optim.lr=3e-4 model.n_layer=1"
      "trainer.max_steps=62400 optim.lr=3e-4 model.n_layer=2"
    ) ;;
    *) echo "SWEEP=$sweep: choose recipe, rotary, init, init2, long or lr" >&2; exit 2 ;;
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
read -r -a gpu_list <<< "${GPU_LIST:-$(seq -s ' ' 0 $((gpus > 0 ? gpus - 1 : 0)))}"
train() {  # train I DEVICES SECONDS [NPROC]: run I on DEVICES, data-parallel over NPROC processes if > 1
  local i=$1 devices=$2 t=$3 nproc=${4:-1} batch launch=(python train.py)
  if [ "$nproc" -gt 1 ]; then  # the per-GPU batch divided so the global batch stays the run's
    # shellcheck disable=SC2086
    batch=$(python -c "import sys; from flashtrain.config import compose_config as c
print(c(['experiment=$exp', *sys.argv[1:]]).trainer.batch_size // $nproc)" ${RUNS[$i]} ${EXTRA:-})
    launch=(torchrun --standalone --nproc_per_node="$nproc" train.py parallel=ddp trainer.batch_size="$batch")
  fi
  # shellcheck disable=SC2086  # each entry is several overrides
  CUDA_VISIBLE_DEVICES=$devices timeout --kill-after=30 $((t + 120)) "${launch[@]}" experiment="$exp" \
    ${RUNS[$i]} trainer.run_name="${name}_${sweep}_$i" trainer.resume=auto trainer.time_limit_s="$t" \
    trainer.out_dir="$work/runs" trainer.keep_checkpoints=1 trainer.compile="${COMPILE:-true}" \
    trainer.eval_interval=1250 trainer.log_interval=100 trainer.progress_bar=false logger=none \
    task.cache_dir="$cache" ${EXTRA:-} 2>&1 |
    grep -v -e Saving -e Generating -e Map -e OMP_NUM_THREADS -e '^W1' >> "$work/runs/${name}_${sweep}_$i.log"
}
if [ "${NPROC:-1}" -gt 1 ]; then  # one run after another, each over the first NPROC GPUs listed
  devices=$(echo "${gpu_list[@]:0:$NPROC}" | tr ' ' ,)
  for i in $ids; do train "$i" "$devices" $((secs - ($(date +%s) - start))) "$NPROC"; done
else  # side by side, one GPU each
  k=0
  for i in $ids; do
    if [ -n "${GPU_LIST:-}" ]; then gpu=${gpu_list[$((k % ${#gpu_list[@]}))]}; else gpu=$((i % ${#gpu_list[@]})); fi
    k=$((k + 1))
    train "$i" "$gpu" "$left" &
  done
fi
wait
tar czf "$OUT/carry/runs.tgz" -C "$work" runs
for i in $ids; do
  echo "== $i: ${RUNS[$i]}"
  grep -e 'val/acc' -e 'ms/step' "$work/runs/${name}_${sweep}_$i.log" | tail -n 3
done | tee "$R/summary.txt"
du -sh "$OUT/carry/runs.tgz"
