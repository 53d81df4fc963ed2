#!/usr/bin/env bash
# One device call (nvidia-h200): the forward with the softmax scale folded into the exp2's FMA, against
# the tree before it (BEFORE, default .carry/before) in the same call: the bf16 GPU kernel tests, then each
# forward tile config alone (sweep_tiles.py) in both trees, then block-sparse d128 n16k in both trees.
#   source .whl/install.sh && bash benchmarks/run_gpu_fwd_fold.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out}
BEFORE=${BEFORE:-.carry/before}
mkdir -p "$OUT"
timeout 200 python -m pytest -q -n 8 -m gpu tests/kernels -rf > "$OUT/kernel_gpu_tests.log" 2>&1
tail -2 "$OUT/kernel_gpu_tests.log"
SHAPES="--shape 2,8192,16,64,causal --shape 16,1024,16,64,causal --shape 1,16384,16,128,causal --shape 1,16384,16,128"
for tree in after before; do
  dir=.; [ $tree = before ] && dir=$BEFORE
  (cd "$dir" && timeout 150 python benchmarks/sweep_tiles.py $SHAPES --kernel fwd --jobs 16 \
    --out "$OUT/fwd_sweep_$tree.json" > "$OUT/fwd_sweep_$tree.log" 2>&1) || echo "sweep $tree failed"
done
for tree in after before; do
  dir=.; [ $tree = before ] && dir=$BEFORE
  (cd "$dir" && timeout 120 python benchmarks/bench_block_sparse.py --seqlens 16384 --headdims 128 \
    --graph-upto 0 --out "$OUT/block_sparse_d128_$tree.json" > "$OUT/block_sparse_d128_$tree.log" 2>&1) \
    || echo "block-sparse $tree failed"
done
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def best(path):
    rows = json.load(open(path))["rows"]
    b = {}
    for r in rows:
        if r.get("ms"):
            k = (r["batch"], r["seqlen"], r["headdim"], r["causal"])
            b[k] = min(b.get(k, 9e9), r["ms"])
    return b
try:
    a, b = best(f"{out}/fwd_sweep_after.json"), best(f"{out}/fwd_sweep_before.json")
    for k in sorted(a):
        print("fwd best ms", k, f"before {b.get(k, 0):.4f} after {a[k]:.4f} ratio {b.get(k, 0) / a[k]:.3f}")
except Exception as e:
    print("no sweep summary:", e)
PY
