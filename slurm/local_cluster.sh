#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, for tests and for trying the templates:
#
#   slurm/local_cluster.sh start [STATE_DIR]   # munged + slurmctld + slurmd, all state under STATE_DIR
#   export SLURM_CONF=STATE_DIR/slurm.conf     # point sbatch/squeue/scontrol at it
#   slurm/local_cluster.sh stop [STATE_DIR]    # cancel its jobs, stop the daemons by their pid files
#
# Needs root and Debian's slurm-wlm + munge (.ci/install_slurm.sh). Nothing outside STATE_DIR
# (default /tmp/flashtrain-slurm) is touched: munge gets its own key and socket, Slurm its own
# config, spool and state, so a system Slurm or munge on the machine is left alone. The node
# declares two stand-in GPUs (/dev/null and /dev/zero) so GPU templates can be scheduled and their
# "no GPUs on this node" check exercised on a CPU machine. Ports: FLASHTRAIN_SLURMCTLD_PORT and
# FLASHTRAIN_SLURMD_PORT (default 6817, 6818).
set -euo pipefail

cmd=${1:-}
state=$(realpath -m "${2:-${FLASHTRAIN_SLURM_DIR:-/tmp/flashtrain-slurm}}")
conf="$state/slurm.conf"
ctld_port=${FLASHTRAIN_SLURMCTLD_PORT:-6817}
slurmd_port=${FLASHTRAIN_SLURMD_PORT:-6818}

die() {
  echo "local_cluster.sh: $*" >&2
  exit 1
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
  echo "local_cluster.sh: $what" >&2
}

stop_pid() {  # stop_pid PIDFILE: TERM, wait up to 10 s, then KILL
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

write_config() {
  local cpus
  cpus=$(nproc)
  cat >"$conf" <<EOF
# Written by slurm/local_cluster.sh: a one-node test cluster; everything lives under $state.
ClusterName=flashtrain-local
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$state/munge/munge.socket,cred_expire=10
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
# Look at pending jobs every second (default 60 s), so a requeued job starts once it is eligible.
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
# Short waits keep a requeue quick: SIGTERM to SIGKILL, and how long finished jobs stay visible.
KillWait=5
MinJobAge=3600
InactiveLimit=0
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  # Stand-in GPUs: schedulable, but backed by /dev/null and /dev/zero, so no process on the node sees a GPU.
  cat >"$state/gres.conf" <<EOF
AutoDetect=off
NodeName=localhost Name=gpu File=/dev/null
NodeName=localhost Name=gpu File=/dev/zero
EOF
}

start() {
  [[ $(id -u) == 0 ]] || die "needs root (slurmd runs jobs as their user); run it with sudo"
  for bin in munged slurmctld slurmd sinfo; do
    command -v "$bin" >/dev/null || die "$bin not found: install Slurm with .ci/install_slurm.sh (Debian's slurm-wlm and munge)"
  done
  if [[ -f $state/slurmctld.pid ]] && kill -0 "$(cat "$state/slurmctld.pid")" 2>/dev/null; then
    die "a cluster is already running from $state; stop it first: slurm/local_cluster.sh stop $state"
  fi
  rm -rf "$state"
  mkdir -p "$state"/{munge,ctld,slurmd,log}
  chmod 700 "$state/munge"
  head -c 1024 /dev/urandom >"$state/munge/munge.key"
  chmod 400 "$state/munge/munge.key"
  write_config
  export SLURM_CONF=$conf

  munged --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
    --pid-file="$state/munged.pid" --log-file="$state/log/munged.log" --seed-file="$state/munge/munge.seed"
  wait_for 20 "munged up" test -S "$state/munge/munge.socket" || die "munged did not start; see $state/log/munged.log"

  slurmctld -f "$conf" || die "slurmctld did not start; see $state/log/slurmctld.log"
  wait_for 30 "slurmctld up" scontrol ping || die "slurmctld does not answer; see $state/log/slurmctld.log"
  slurmd -f "$conf" -N localhost || die "slurmd did not start; see $state/log/slurmd.log"
  if ! wait_for 60 "node localhost idle" bash -c "sinfo -h -n localhost -o %T | grep -qx idle"; then
    die "node localhost never became idle (state: $(sinfo -h -n localhost -o %T)); see $state/log/slurmd.log"
  fi
  echo "export SLURM_CONF=$conf"
}

stop() {
  if [[ -f $conf ]] && [[ -f $state/slurmctld.pid ]]; then
    export SLURM_CONF=$conf
    # Jobs first: their slurmstepd processes outlive slurmd, so end them while slurmd still can.
    local jobs
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null || true
      wait_for 30 "jobs ended" bash -c '[[ -z $(squeue -h -o %A) ]]' || echo "local_cluster.sh: jobs still listed" >&2
    fi
    # Any job process still alive (a stepd that missed the cancel) is ended by its pid.
    local pids
    pids=$(timeout 10 scontrol listpids 2>/dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ {print $1}' || true)
    for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
  fi
  stop_pid "$state/slurmd.pid"
  stop_pid "$state/slurmctld.pid"
  stop_pid "$state/munged.pid"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) die "usage: slurm/local_cluster.sh start|stop [STATE_DIR]" ;;
esac
