#!/usr/bin/env bash
# Device calls on one GPU (session 31). Each part is what one call ran; the outputs are in
# benchmarks/results/s31/callN/ (each call's machine.txt names its GPU).
# Parts 3-5 ran check_bs_bwd_routes.py as it was at 731c30e (then check_bs_fused_bwd.py, with the one-launch
# backward since removed); the lines below run today's script.
#   bash benchmarks/run_gpu_s31.sh 1   # where the short block-sparse calls spend device time (ours and Flex,
#       per kernel: d128 at n16k 0.8% / 2.3% and n4k 3.1% / 6.3%); GPT-2 medium 1k from CUDA graphs, ours and
#       cuDNN, with the step's operators by input shape (which op launches the float reduce_kernel); 8k from
#       graphs, ours and SDPA flash
#   bash benchmarks/run_gpu_s31.sh 2   # (part 1, on an H200: 1k from graphs ours 192.8k tokens/s, 55.5% MFU,
#       cuDNN 191.5k; 8k ours 120.1k, 50.4%, SDPA flash 102.2k; the float reduce_kernel is 96 launches per step,
#       four per layer, from the compiled blocks) the same rows again, twice in alternation, and ours at 1k launched
#       kernel by kernel
#   bash benchmarks/run_gpu_s31.sh 3   # (part 2, on an H200: 1k from graphs ours 193.1k / 192.7k (55.2% / 54.9%),
#       cuDNN 191.3k / 190.9k; 8k ours 119.7k / 119.8k (50.3% / 50.2%), SDPA flash 102.6k / 102.6k; ours at 1k
#       without graphs 192.0k) the block-sparse backward in one launch: its GPU tests, then its device time per
#       tile config against the two kernels and the Hopper ones (check_bs_fused_bwd.py)
#   bash benchmarks/run_gpu_s31.sh 4   # (part 3: GPU tests 174 passed; the check stopped on its own bad call of
#       usable_backward) the check alone
#   bash benchmarks/run_gpu_s31.sh 5   # (part 4, d64 n4k before it stopped at a butterfly too deep for 32 blocks:
#       the fused backward slower than the two kernels at every config and 1-6 blocks per row, best 0.0625 against
#       0.0571 ms at one block) d128 at n4k and n16k, 1-6 blocks per row
#   bash benchmarks/run_gpu_s31.sh 6   # (part 5, on an H200: at d128 the Hopper backward beat the portable kernels at
#       every list length, 1-6 blocks per row, which BACKWARD_MIN_TILES had kept portable; the one-launch backward
#       lost everywhere and was removed) BACKWARD_MIN_TILES per head dim (d128 any, d64 from 6): the Hopper
#       block-sparse GPU tests, then block-sparse d128 at n4k and n16k against Flex, eager and from graphs
#   bash benchmarks/run_gpu_s31.sh 7   # (part 6, on an H200: 169 passed; d128 from graphs 1.07-1.30x Flex at n4k and
#       1.19-1.30x at n16k; eager n4k 0.72-0.93x, host-bound) host time of one eager block-sparse fwd+bwd at n4k
#       d128, ours and Flex on the same mask, with cProfile's top functions, at 1 and 3 blocks per row
#   bash benchmarks/run_gpu_s31.sh 8   # (part 7, on an H200: host time per eager fwd+bwd, ours 0.82 / 0.86 ms, Flex
#       0.77 / 0.79; with a sync after each, ours 0.76 / 0.79, Flex 0.91 / 0.97) which operators launch GPT-2 medium
#       1k's float reduce_kernel (kernel by kernel, so the launching ops are seen); block-sparse d64 at n4k and
#       n16k against Flex with d64's new backward rule
#   bash benchmarks/run_gpu_s31.sh 9   # (part 8, on an H200: the float reduce_kernel is aten::sum of (1024, 1024) fp32,
#       96 per step, 0.82 ms: Inductor's mix-order reduction of the LayerNorms' weight and bias gradients ends in
#       ws.view(nsplit, C).sum(0), with nsplit = 16384 rows / split 16; block-sparse d64 from graphs 1.11-1.33x Flex)
#       GPT-2 medium 1k from graphs at mix-order split sizes 16 (the default here), 64 and 128, and without it
#   bash benchmarks/run_gpu_s31.sh 10  # (part 9, on an H200: mix-order split 16 / 64 / 128 / off 190.7k / 191.3k /
#       190.9k / 188.5k tokens/s, within spread) the trainer reading the loss and the norm in one sync: flashtrain's
#       GPU tests (carry .whl)
#   bash benchmarks/run_gpu_s31.sh 11  # (part 10, on an H200: 11 passed) GPT-2 medium 1k from graphs with Inductor's
#       programmatic dependent launch (triton.enable_pdl) and without, alternating, twice
source benchmarks/gpu_call.sh
machine_info
# GPT-2 medium at $1 tokens with impl $2, compiled blocks replayed from CUDA graphs, as $R/train_medium$1_$2$3.json
medium() {
  local seqlen=$1 impl=$2 tag=$3; shift 3
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens "$seqlen" --impls "$impl" \
    --compile-mode reduce-overhead --in-process --out "$R/train_medium${seqlen}_$impl$tag.json" "$@" 2>&1 | quiet \
    | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
}
# per-kernel device ms of short block-sparse fwd+bwd calls (d128), ours (bs:F:L) and Flex on the same mask
bs_profile() {  # bs_profile SEQLEN NAME F:L...
  local n=$1 name=$2; shift 2
  local impls=(); for fl in "$@"; do impls+=("bs:$fl" "flexbs:$fl"); done
  timeout 120 python benchmarks/profile_attention.py --shape "1,$n,16,128" --impls "${impls[@]}" --iters 20 \
    --out "$R/profile_bs_$name.json" 2>&1 | quiet | tail -n 40
}
case "${1:?part 1}" in
1)
  head -n 2 "$R/machine.txt"
  bs_profile 16384 d128_n16k_low 0:0 0:1
  bs_profile 4096 d128_n4k_low 0:0 1:0
  medium 1024 triton "" --steps 40 --profile 2 --profile-top 40 --profile-ops 40
  medium 1024 sdpa_cudnn "" --steps 40
  medium 8192 triton "" --steps 20
  medium 8192 sdpa_flash "" --steps 20
  ;;
2)
  head -n 2 "$R/machine.txt"
  for run in 1 2; do
    medium 1024 triton _run$run --steps 40
    medium 1024 sdpa_cudnn _run$run --steps 40
    medium 8192 triton _run$run --steps 20
    medium 8192 sdpa_flash _run$run --steps 20
  done
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 --impls triton --steps 40 \
    --in-process --out "$R/train_medium1024_triton_default.json" 2>&1 | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  ;;
3)
  timeout -s INT 260 python -m pytest -q -n 4 -m gpu tests/kernels/test_block_sparse.py \
    tests/kernels/test_block_sparse_hopper.py -rf > "$R/gpu_tests_block_sparse.log" 2>&1
  tail -n 3 "$R/gpu_tests_block_sparse.log"
  timeout 300 python benchmarks/check_bs_bwd_routes.py --out "$R/check_bs_fused_bwd.json" 2>&1 | quiet \
    | tee "$R/check_bs_fused_bwd.log" | tail -n 130
  ;;
4)
  timeout 400 python benchmarks/check_bs_bwd_routes.py --out "$R/check_bs_fused_bwd.json" 2>&1 | quiet \
    | tee "$R/check_bs_fused_bwd.log" | tail -n 130
  ;;
5)
  timeout 300 python benchmarks/check_bs_bwd_routes.py --headdims 128 --layouts 0:0 1:0 0:1 5:0 \
    --out "$R/check_bs_fused_bwd_d128.json" 2>&1 | quiet | tee "$R/check_bs_fused_bwd_d128.log" | tail -n 80
  ;;
6)
  timeout -s INT 200 python -m pytest -q -n 4 -m gpu tests/kernels/test_block_sparse_hopper.py -rf \
    > "$R/gpu_tests_block_sparse_hopper.log" 2>&1; tail -n 3 "$R/gpu_tests_block_sparse_hopper.log"
  timeout 380 python benchmarks/bench_block_sparse.py --seqlens 4096 16384 --headdims 128 \
    --out "$R/block_sparse_d128.json" 2>&1 | quiet | tail -n 20
  ;;
7)
  for fl in 0:0 2:0; do
    timeout 150 python benchmarks/bench_host_overhead.py --seqlen 4096 --headdim 128 --butterfly $fl --no-parts \
      --out "$R/host_overhead_bs_d128_n4k_${fl/:/_}.json" 2>&1 | quiet | tee -a "$R/host_overhead.log" | tail -n 80
  done
  ;;
8)
  timeout 150 python benchmarks/bench_train.py --models gpt2_medium --seqlens 1024 --impls triton --steps 20 \
    --profile 2 --kernel-callers reduce_kernel --in-process --out "$R/train_medium1024_reduce_callers.json" 2>&1 \
    | quiet | tee -a "$R/bench_train.log" | grep "^|.*gpt2"
  python - "$R/train_medium1024_reduce_callers.json" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["rows"][0].get("kernel_callers", []):
    print(c)
PY
  timeout 330 python benchmarks/bench_block_sparse.py --seqlens 4096 16384 --headdims 64 \
    --out "$R/block_sparse_d64.json" 2>&1 | quiet | tail -n 16
  ;;
9)
  medium 1024 triton _split_default --steps 40 --profile 2 --profile-top 30
  for split in 64 128; do
    medium 1024 triton _split$split --steps 40 --profile 2 --profile-top 30 \
      --inductor triton.mix_order_reduction_split_size=$split
  done
  medium 1024 triton _no_mix_order --steps 40 --profile 2 --profile-top 30 --inductor triton.mix_order_reduction=False
  python - "$R" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/train_medium1024_triton_*.json")):
    r = json.load(open(f))["rows"][0]
    ln = sum(v for k, v in r["top_kernels_ms"].items() if "layer_norm" in k or "reduce_kernel" in k)
    print(f.split("/")[-1], round(r["tokens_per_s"]), round(r["mfu"] * 100, 2), "busy", round(r["busy_ms"], 2),
          "layernorm+reduce kernels", round(ln, 3))
PY
  ;;
10)
  (source .whl/install.sh && timeout -s INT 400 python -m pytest -q -n 4 -m gpu tests/flashtrain -rf \
    > "$R/gpu_tests_flashtrain.log" 2>&1); tail -n 3 "$R/gpu_tests_flashtrain.log"
  ;;
11)
  for run in 1 2; do
    medium 1024 triton _default_run$run --steps 40
    medium 1024 triton _pdl_run$run --steps 40 --inductor triton.enable_pdl=True
  done
  ;;
esac
