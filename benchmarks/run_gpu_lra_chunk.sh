#!/usr/bin/env bash
# One lease-sized piece of a long LRA run (runs are resumable across short GPU leases): resume from the
# carried run directory if there is one, train for SECONDS, then USR1 makes the trainer checkpoint at the
# next step and stop (flashtrain/preemption.py); the run directory goes to $OUT/carry/ for the next call.
#
#   here:    device run --carry .whl .carry  "source .whl/install.sh && bash benchmarks/run_gpu_lra_chunk.sh lra/pathfinder32 480"
#   then:    rm -rf .carry && cp -r <files_at>/carry .carry     (.carry/ is git-ignored; keep it < 64 MiB)
#
# Extra arguments are Hydra overrides. The generated data are not carried: they are rebuilt each call.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
exp=$1 secs=$2
shift 2
mkdir -p .carry/runs "$OUT/carry"
timeout --signal=USR1 --kill-after=120 "$secs" python train.py experiment="$exp" trainer.resume=auto \
  trainer.out_dir=.carry/runs trainer.keep_checkpoints=1 trainer.progress_bar=false logger=none \
  task.cache_dir=/tmp/flashtrain-lra "$@" 2>&1 | grep -v -e Saving -e Generating -e Map | tee -a "$OUT/lra_chunk.log"
cp -r .carry/runs "$OUT/carry/"
du -sh .carry/runs | tee -a "$OUT/lra_chunk.log"
