#!/usr/bin/env bash
# Device calls on one GPU (session 23).
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 1   # does TMA pay at head dim 64? toy loops with
#       pointer vs descriptor loads (results/tma_toy/); GPT-2 medium 8k with the blocks compiled one by one
#       vs the whole model compiled (where the step's memory-bound kernels go)
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 2   # causal launches with the tile index on the grid's
#       last axis (heaviest tiles of every head first): per-kernel device time of this tree and the tree before it
#       (.carry/before, from `git archive`, carried) at the GPT-2 medium and d128 shapes; GPT-2 medium 8k
#       trained with both trees and SDPA flash
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 3   # part 2 found the kernels faster but GPT-2 medium
#       8k not: per-kernel times on the packed QKV layout (the GPT's) for both trees (.carry/before carries this
#       tree's bench_attention.py / profile_attention.py), and the training step profiled, trees alternating
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 4   # part 3 found our kernels inside the training step
#       as fast with either tree: the two trees alternating again, three profiled steps each, with the tiles
#       the autotuners chose and the GPU's clock and power logged throughout (clocks.log); the kernels alone first
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 5   # the GPU record of the tiles-last grid: bf16 kernel
#       tests, flashtrain GPU tests; GPT-2 medium 8k ours against SDPA flash, alternating, two rounds
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 6   # GPT-2 medium 1k ours and SDPA flash; the causal
#       kernel table (d64, d128; 1k-16k) for ours, SDPA flash, FlexAttention, cuDNN, and ours from the tree before
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 7   # part 6 found the tile-major order of every head
#       slower with many short heads (L2): the chunked order instead. GPU kernel tests; per-kernel times at
#       GPT-2 medium's layer; the causal kernel table (ours only, d64/d128, 1k-16k) for this tree, the tree
#       before (3fcfe11) and this tree again
#   source .whl/install.sh && bash benchmarks/run_gpu_s23.sh 8   # GPT-2 medium 8k and 1k, this tree against the
#       tree before (alternating) and SDPA flash
# Results: $OUT/results.tgz (gpu_call.sh packs $R when the script exits, a time-out included).
source "$(dirname "$0")/gpu_call.sh"
machine_info
BEFORE=${BEFORE:-.carry/before}
tree_name() { [ "$1" = . ] && echo after || echo before; }  # this tree, or the one before it
SHAPES="--shape 2,8192,16,64,causal --shape 16,1024,16,64,causal --shape 1,16384,16,128,causal
  --shape 4,4096,16,128,causal --shape 2,8192,16,128"
case "${1:?part 1 to 8}" in
1)
  timeout 240 python benchmarks/results/tma_toy/bench_tma_toy.py "$R/tma_toy.json" 2>&1 | quiet \
    > "$R/tma_toy.log"
  python - "$R/tma_toy.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
best = {}
for r in rows:
    if "ms" in r:
        key = (r["kernel"], r["d"], r["n"], r["desc"])
        best[key] = min(best.get(key, 1e9), r["ms"])
for (kind, d, n, desc), ms in sorted(best.items()):
    if not desc and (kind, d, n, True) in best:
        print(f"{kind} d{d} n{n}: best pointers {ms:.3f} ms, descriptors {best[(kind, d, n, True)]:.3f} ms")
PY
  grep -c error "$R/tma_toy.log"
  for scope in blocks model; do
    timeout 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton \
      --compile $scope --profile 1 --profile-top 40 --out "$R/train_medium8k_compile_$scope.json" 2>&1 | quiet \
      | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  done
  ;;
2)
  for tree in . "$BEFORE"; do
    name=$(tree_name "$tree")
    timeout 150 python $tree/benchmarks/profile_attention.py $SHAPES --impls triton --iters 10 \
      --out "$R/profile_$name.json" 2>&1 | quiet > "$R/profile_$name.log"
  done
  python - "$R" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/profile_{n}.json")) for n in ("after", "before"))
for ra, rb in zip(a["rows"], b["rows"]):
    ka, kb = ra.get("kernels_ms", {}), rb.get("kernels_ms", {})
    shape = {k: ra[k] for k in ("batch", "seqlen", "nheads", "headdim", "causal") if k in ra}
    print(shape, {k: f"{kb.get(k, 0):.3f}->{v:.3f}" for k, v in ka.items() if v > 0.01})
PY
  for tree in . "$BEFORE"; do
    name=$(tree_name "$tree")
    timeout 110 python $tree/benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton \
      --out "$R/train_medium8k_$name.json" 2>&1 | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  done
  timeout 110 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls sdpa_flash \
    --out "$R/train_medium8k_sdpa_flash.json" 2>&1 | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  ;;
3)
  for tree in . "$BEFORE"; do
    name=$(tree_name "$tree")
    timeout 100 python $tree/benchmarks/profile_attention.py --shape 2,8192,16,64,causal \
      --impls triton_qkvpacked triton --iters 10 --out "$R/profile_packed_$name.json" 2>&1 | quiet \
      | tee "$R/profile_packed_$name.log" | grep -v "^ *0.0"
  done
  i=0
  for tree in "$BEFORE" . "$BEFORE" .; do
    name=$(tree_name "$tree")
    i=$((i + 1))  # not inside the pipeline below, a subshell (the call on record wrote every row to _1)
    timeout 110 python $tree/benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton \
      --steps 20 --profile 1 --profile-top 6 --out "$R/train_medium8k_${name}_$i.json" 2>&1 | quiet \
      | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  done
  ;;
4)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader \
    -lms 500 > "$R/clocks.log" &
  for tree in . "$BEFORE"; do
    name=$(tree_name "$tree")
    echo "$(date +%T) profile $name" >> "$R/phases.log"
    timeout 100 python $tree/benchmarks/profile_attention.py --shape 2,8192,16,64,causal \
      --impls triton_qkvpacked --iters 30 --out "$R/profile_packed_$name.json" 2>&1 | quiet \
      | tee "$R/profile_packed_$name.log" | grep -v "^ *0.0"
  done
  i=0
  for tree in "$BEFORE" . "$BEFORE" .; do
    name=$(tree_name "$tree")
    i=$((i + 1))
    echo "$(date +%T) train $name $i" >> "$R/phases.log"
    timeout 110 python $tree/benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton \
      --steps 20 --profile 3 --profile-top 6 --out "$R/train_medium8k_${name}_$i.json" 2>&1 | quiet \
      | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  done
  kill %1
  ;;
5)
  timeout 260 python -m pytest -q -n 4 -m gpu tests/kernels -rf > "$R/kernel_gpu_tests.log" 2>&1
  tail -n 1 "$R/kernel_gpu_tests.log"
  timeout 60 python -m pytest -q -m gpu tests/flashtrain -rf > "$R/flashtrain_gpu_tests.log" 2>&1
  tail -n 1 "$R/flashtrain_gpu_tests.log"
  i=0
  for impl in triton sdpa_flash triton sdpa_flash; do
    i=$((i + 1))
    timeout 100 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls $impl \
      --steps 20 --out "$R/train_medium8k_${impl}_$i.json" 2>&1 | quiet | tee -a "$R/bench_train.log" \
      | grep "^|.*gpt2"
  done
  ;;
6)
  i=0
  for impl in triton sdpa_flash; do
    i=$((i + 1))
    timeout 100 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 --impls $impl \
      --steps 20 --out "$R/train_medium1k_${impl}_$i.json" 2>&1 | quiet | tee -a "$R/bench_train.log" \
      | grep "^|.*gpt2"
  done
  timeout 300 python benchmarks/bench_attention.py --seqlens 1024 4096 8192 16384 --headdims 64 128 \
    --causal causal --impls triton sdpa_flash flex sdpa_cudnn --out "$R/attention_causal.json" 2>&1 | quiet \
    > "$R/bench_attention.log"
  timeout 100 python "$BEFORE/benchmarks/bench_attention.py" --seqlens 1024 4096 8192 16384 --headdims 64 128 \
    --causal causal --impls triton --out "$R/attention_causal_before.json" 2>&1 | quiet \
    > "$R/bench_attention_before.log"
  python - "$R" <<'PY'
import json, sys
now = {(r["impl"], r["headdim"], r["seqlen"]): r for r in json.load(open(f"{sys.argv[1]}/attention_causal.json"))["rows"]}
old = {(r["headdim"], r["seqlen"]): r for r in json.load(open(f"{sys.argv[1]}/attention_causal_before.json"))["rows"]}
for (impl, d, n), r in sorted(now.items()):
    if impl == "triton" and "fwdbwd_ms" in r:
        ratios = {o: now[(o, d, n)]["fwdbwd_ms"] / r["fwdbwd_ms"] for o in ("sdpa_flash", "flex", "sdpa_cudnn")
                  if "fwdbwd_ms" in now.get((o, d, n), {})}
        before = old.get((d, n), {}).get("fwdbwd_ms")
        print(f"d{d} n{n}: ours {r['fwdbwd_ms']:.3f} ms (before {before:.3f})",
              " ".join(f"x{o} {v:.2f}" for o, v in ratios.items()))
PY
  ;;
7)
  timeout 200 python -m pytest -q -n 4 -m gpu tests/kernels -rf > "$R/kernel_gpu_tests.log" 2>&1
  tail -n 1 "$R/kernel_gpu_tests.log"
  for tree in . "$BEFORE"; do
    name=$(tree_name "$tree")
    timeout 100 python $tree/benchmarks/profile_attention.py --shape 2,8192,16,64,causal --shape 16,1024,16,64,causal \
      --impls triton_qkvpacked --iters 20 --out "$R/profile_packed_$name.json" 2>&1 | quiet \
      | tee "$R/profile_packed_$name.log" | grep -v "^ *0.0"
  done
  i=0
  for tree in . "$BEFORE" .; do
    name=$(tree_name "$tree")
    i=$((i + 1))
    timeout 100 python $tree/benchmarks/bench_attention.py --seqlens 1024 4096 8192 16384 --headdims 64 128 \
      --causal causal --impls triton --out "$R/attention_causal_${name}_$i.json" 2>&1 | quiet \
      > "$R/bench_attention_${name}_$i.log"
  done
  python - "$R" <<'PY'
import glob, json, sys
runs = {f.split("attention_causal_")[1][:-5]: {(r["headdim"], r["seqlen"]): r["fwdbwd_ms"]
        for r in json.load(open(f))["rows"] if "fwdbwd_ms" in r}
        for f in sorted(glob.glob(f"{sys.argv[1]}/attention_causal_*.json"))}
names = sorted(runs)
print("fwd+bwd ms", " ".join(names))
for key in sorted(runs[names[0]]):
    print(key, " ".join(f"{runs[n].get(key, float('nan')):.3f}" for n in names))
PY
  ;;
8)
  i=0
  for run in 8192:. 8192:$BEFORE 8192:. 8192:$BEFORE 1024:. 1024:$BEFORE; do
    seqlen=${run%%:*}; tree=${run#*:}
    name=$(tree_name "$tree")
    i=$((i + 1))
    timeout 100 python $tree/benchmarks/bench_train.py --models gpt2_medium --seqlens $seqlen --impls triton \
      --steps 20 --out "$R/train_medium_${seqlen}_${name}_$i.json" 2>&1 | quiet | tee -a "$R/bench_train.log" \
      | grep "^|.*gpt2"
  done
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192,1024 --impls sdpa_flash \
    --steps 20 --out "$R/train_medium_sdpa_flash.json" 2>&1 | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  ;;
esac
