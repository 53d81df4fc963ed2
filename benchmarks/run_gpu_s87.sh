#!/usr/bin/env bash
# Session 87's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s87.sh PART, results in $OUT/results.tgz
# (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s87/callN/.
#   1: causal 64k (cuDNN ÷ ours 1.034, our SM clock 1590 MHz against cuDNN's 1665 at the same ~690 W): does the
#      ordered backward's releasing warps' spin on their counts draw power? Their waits with a nanosleep between
#      reads (`SPIN_SLEEP_NS`, 100 and 1000 ns), and the causal convoy in two key groups (its dq sum now one pass at
#      copy bandwidth), against the default and cuDNN, settled at the power cap, clocks sampled; then the
#      200 ns sleep at causal 16k and 32k
#   2: call 1: the sleeps within the spread (÷ the default 1.002 / 1.005 at 64k, 0.996 / 0.997 at 16k / 32k at 200 ns;
#      the same clocks); the causal convoy in two key groups 0.992 at 64k (cuDNN ÷ it 1.056, ÷ the default 1.047),
#      faster in every round. The convoy's lengths (24k-64k) in two and three key groups against one and cuDNN
source "$(dirname "$0")/gpu_call.sh"
machine_info
# each impl's median SM clock (MHz) and power (W) over its timed fwd+bwd windows, from the JSONs named
clocks() {
  python - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    for row in json.load(open(path))["rows"]:
        c = row.get("gpu_clocks", {})
        print(row["seqlen"], {k: v["median_mhz_w"] for k, v in c.items() if k.endswith("fwdbwd") and isinstance(v, dict)})
PY
}
case "${1:?part}" in
1)
  settled_cudnn 240 spin_64k yes 65536 --deterministic-only --spin-sleep 100 1000 --also-convoy-key-groups 2
  clocks "$R/spin_64k_causal_yes.json"
  settled_cudnn 200 spin_16k_32k yes "16384 32768" --deterministic-only --spin-sleep 200
  clocks "$R/spin_16k_32k_causal_yes.json"
  ;;
2)
  settled_cudnn 330 convoy_groups yes "24576 32768 49152 65536" --deterministic-only --also-convoy-key-groups 2 3
  clocks "$R/convoy_groups_causal_yes.json"
  ;;
esac
