#!/usr/bin/env bash
# Runs once per node of a Slurm job (the templates start it with `srun --ntasks-per-node=1`): checks
# the node, then execs torchrun, which starts the training processes of this node and meets the other
# nodes at a rendezvous on the job's first node.
#
#   srun --ntasks-per-node=1 slurm/launch.sh [Hydra overrides...]
#
# Environment (all optional):
#   RUN_NAME        trainer.run_name; default <job name>-<job id> (array task: <job name>-<array job>_<task>),
#                   stable across requeues, so a requeued job finds its checkpoints and W&B run
#   OUT_DIR         trainer.out_dir (default: runs, under the submit directory); all nodes must see it
#   NPROC_PER_NODE  training processes per node; default: the GPUs Slurm gave the node
#   PYTHON          interpreter with flashtrain installed (default: python on PATH)
#   RDZV_HOST       rendezvous host (multi_node.sbatch sets the first node's address); RDZV_PORT its port
#   SWEEP           Hydra sweep overrides, e.g. "optim.lr=1e-3,3e-4 trainer.seed=1,2"; each array
#                   task runs one member (see slurm/sweep.py and slurm/README.md)
#
# The run always starts with trainer.resume=auto: a fresh job starts at step 0, a requeued one
# continues from its latest checkpoint.
set -euo pipefail

die() {
  echo "slurm/launch.sh on $(hostname -s): $*" >&2
  exit 1
}

[[ -n ${SLURM_JOB_ID:-} ]] || die "not inside a Slurm job (SLURM_JOB_ID is unset). Submit a template, e.g.
  sbatch slurm/single_node.sbatch experiment=gpt2_small_owt
or, without Slurm, run torchrun yourself (commands in slurm/README.md)."
[[ -n ${SLURM_STEP_ID:-} && ${SLURM_STEP_ID} != batch ]] ||
  die "run me with srun (one task per node), not directly from the batch script: srun --ntasks-per-node=1 $0 ..."

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python}
command -v "$python" >/dev/null || die "no '$python' on PATH; set PYTHON=/path/to/python of the flashtrain environment"

device=auto
parallel_given=0
for arg in "$@"; do
  case $arg in
    trainer.run_name=* | trainer.out_dir=* | trainer.resume=*)
      die "'$arg': the launcher sets ${arg%%=*} so a requeued job finds its run; set RUN_NAME / OUT_DIR in the
environment instead (sbatch --export=ALL,RUN_NAME=...), and leave resume to the launcher (always auto)" ;;
    trainer.device=*) device=${arg#trainer.device=} ;;
    parallel=*) parallel_given=1 ;;
  esac
done

overrides=("$@")
if [[ -n ${SWEEP:-} ]]; then
  [[ -n ${SLURM_ARRAY_TASK_ID:-} ]] || die "SWEEP is set but this is not an array job; submit with sbatch --array=0-<N-1>
(N from: $python $root/slurm/sweep.py --count $SWEEP)"
  # shellcheck disable=SC2086 # SWEEP is a list of overrides, split on spaces on purpose
  member=$("$python" "$root/slurm/sweep.py" --task "$SLURM_ARRAY_TASK_ID" $SWEEP) || exit 1
  read -r -a member_overrides <<<"$member"
  overrides+=("${member_overrides[@]}")
fi

if [[ -n ${SLURM_ARRAY_JOB_ID:-} ]]; then
  default_name=${SLURM_JOB_NAME}-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
else
  default_name=${SLURM_JOB_NAME}-${SLURM_JOB_ID}
fi
run_name=${RUN_NAME:-${default_name//[^A-Za-z0-9_.=,-]/_}}
out_dir=$(realpath -m "${OUT_DIR:-runs}")

# Fail on the node, before any process starts, with the fix in the message.
mkdir -p "$out_dir/$run_name" 2>/dev/null && [[ -w $out_dir/$run_name ]] ||
  die "cannot write the run directory $out_dir/$run_name; set OUT_DIR to a writable directory (shared by all nodes)"

if [[ $device == cpu ]]; then
  nproc=${NPROC_PER_NODE:-1}
else
  nproc=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
  [[ -n $nproc ]] || die "the job has no GPUs: request them (#SBATCH --gpus-per-node=N), or train on CPU with
trainer.device=cpu and NPROC_PER_NODE=<processes>"
  # What the trainer will see: torch honours CUDA_VISIBLE_DEVICES, nvidia-smi does not.
  visible=$("$python" -c "import torch; print(torch.cuda.device_count())") || die "could not import torch with $python"
  if ((visible < nproc)); then
    die "the job asks for $nproc GPU processes per node, but this node shows $visible GPUs to torch
(CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}); request a node that has them, lower --gpus-per-node / NPROC_PER_NODE,
or train on CPU with trainer.device=cpu"
  fi
fi

nnodes=${SLURM_JOB_NUM_NODES:-1}
if ((nproc * nnodes > 1 && !parallel_given)); then
  overrides=(parallel=ddp "${overrides[@]}")  # several processes need a strategy; parallel=<name> picks another
fi
if ((nnodes == 1)) && [[ -z ${RDZV_HOST:-} ]]; then
  rdzv=(--standalone)
else
  # The first node of the allocation hosts the rendezvous; a port derived from the job id and restart
  # count keeps two jobs sharing a node, or a requeued attempt, from meeting at the same port.
  head=${RDZV_HOST:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
  port=${RDZV_PORT:-$((20000 + (SLURM_JOB_ID * 4 + ${SLURM_RESTART_COUNT:-0}) % 40000))}
  rdzv=(--nnodes="$nnodes" --rdzv-backend=c10d --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}")
fi

echo "slurm/launch.sh on $(hostname -s): job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}), node $SLURM_NODEID of $nnodes," \
  "$nproc processes, run $out_dir/$run_name" >&2
# Slurm's --signal=USR1 reaches every process of the step. torchrun would die of it (no handler), so
# it ignores it; the training processes install their own handler (flashtrain/preemption.py), which
# checkpoints and requeues. A signal that arrives before that handler is up is ignored.
trap '' USR1
exec "$python" -m torch.distributed.run "${rdzv[@]}" --nproc-per-node="$nproc" "$root/train.py" \
  trainer.out_dir="$out_dir" trainer.run_name="$run_name" trainer.resume=auto "${overrides[@]}"
