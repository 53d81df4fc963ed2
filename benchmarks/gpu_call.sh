# Sourced by the run_gpu_*.sh scripts whose results come back as one archive: $OUT brings back only a
# few files, so everything goes to $R and is packed into $OUT/results.tgz when the script exits (also on
# a time-out inside it). $R starts empty, so a warm machine's earlier call does not leak into this one.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
R=/tmp/flashtrain-results
rm -rf "$R"
mkdir -p "$OUT" "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
trap pack EXIT
quiet() { grep -v -e Warning -e warn -e '^W1' -e '\*\*\*\*' -e USDT; }  # launcher and library noise
machine_info() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvidia-smi topo -m
    python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    > "$R/machine.txt" 2>&1
}
