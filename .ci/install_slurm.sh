#!/usr/bin/env bash
# Installs what tests/slurm/test_slurm.py needs to start its one-node test cluster: Debian's Slurm
# (slurmctld, slurmd, the client commands) and munge. Does nothing when they are already there.
# CI runs it as root on a fresh Debian machine, before pytest.
set -euo pipefail

if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
  command -v munged >/dev/null; then
  echo "install_slurm.sh: $(slurmd -V) and munge are installed"
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "install_slurm.sh: needs root to apt-get install slurm-wlm and munge (run it with sudo)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends keeps out the docs and the MySQL accounting stack the tests do not use.
apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
echo "install_slurm.sh: installed $(slurmd -V) and munge"
