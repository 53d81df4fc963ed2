#!/usr/bin/env bash
# One lease-sized piece of a long LRA run (runs are resumable across short GPU leases): resume from the
# carried run if there is one, train for SECONDS (trainer.time_limit_s: data set-up included; then the
# trainer checkpoints and stops), and hand the run directory back packed as $OUT/carry/runs.tgz ($OUT
# returns files at most two folders down; a run's checkpoints lie deeper).
#
#   here:    device run --carry .whl .carry  "source .whl/install.sh && bash benchmarks/run_gpu_lra_chunk.sh lra/pathfinder32 480"
#   then:    rm -rf .carry && cp -r <files_at>/carry .carry     (.carry/ is git-ignored; keep it < 64 MiB)
#
# NGPU=4 trains data-parallel on 4 GPUs (torchrun, parallel=ddp; trainer.batch_size is per GPU, so pass
# trainer.batch_size=<global / NGPU> to keep the configured global batch). Extra arguments are Hydra
# overrides. The generated data are not carried: they are rebuilt each call (all cores).
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
exp=$1 secs=$2
shift 2
ngpu=${NGPU:-1}
work=/tmp/lra-carry
rm -rf "$work"  # a warm machine may hold an earlier call's run
mkdir -p "$work" "$OUT/carry"
[ -f .carry/runs.tgz ] && tar xzf .carry/runs.tgz -C "$work"
if [ "$ngpu" -gt 1 ]; then
  launch=(torchrun --standalone --nproc-per-node="$ngpu" train.py parallel=ddp)
else
  launch=(python train.py)
fi
# the outer timeout only guards against a hang: the trainer stops itself at time_limit_s
timeout --kill-after=30 $((secs + 240)) "${launch[@]}" experiment="$exp" trainer.resume=auto \
  trainer.time_limit_s="$secs" trainer.out_dir="$work/runs" trainer.keep_checkpoints=1 \
  trainer.progress_bar=false logger=none task.cache_dir=/tmp/flashtrain-lra "$@" 2>&1 |
  grep -v -e Saving -e Generating -e Map | tee -a "$OUT/lra_chunk.log"
tar czf "$OUT/carry/runs.tgz" -C "$work" runs
du -sh "$work/runs" "$OUT/carry/runs.tgz" | tee -a "$OUT/lra_chunk.log"
