#!/usr/bin/env bash
# Session 89's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s89.sh PART, results in $OUT/results.tgz
# (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s89/callN/.
#   1: the dependent dK/dV launch's GPU tests again (their helper's CUDA graph now goes through
#      benchmarks.common.capture_graph, changed after session 88's last GPU run); the host time of one GPT-2 small
#      layer's attention calls, ours against SDPA cuDNN (profile_layer_host.py, new: GPT-2 small 1k is host-bound
#      with ours, README ‡), at batch 2 (the GPU never the pace) and at the model's batch 16; then session 87's
#      open convoy point: the causal convoy in 1 / 3 (default) / 4 key groups with 8 heads at 32k and 48k
#   2: call 1: 7 passed. Host ms a call, ours / cuDNN's: forward op 0.050 / 0.024, backward through autograd
#      0.197-0.200 / 0.060-0.068 (our backward op alone 0.147), public fwd+bwd 0.350-0.357 / 0.118-0.125, at batch 2
#      and 16 alike. Convoy, 8 heads: three key groups ÷ one 0.977 / 0.979 (32k / 48k), four level (1.004 / 0.997).
#      Change: the tuned portable launches key their config on every argument's specialization, which the compiled
#      launch takes as its own key (no second pass), and hand the grid the arguments by name only as it reads them
#      (`_common._cached_config_run`, `_GridMeta`). Their GPU tests (test_launch / test_tuning); the host A/B in one
#      process (ab_host_trims.py --trims s89: d64 / d128 at 1k, the dense route with the portable dq kernel and the
#      windowed one on three portable kernels); the layer's host time again; GPT-2 small 1k, ours and cuDNN
#   3: call 2 (a slower host: the layer's calls took 1.6-1.8x call 1's, both ways): 10 passed; s89 untrimmed ÷
#      trimmed at d64 1.053 (dense) / 1.090 (window), per-batch medians 1.056 / 1.031, batches 0.82-1.39; d128 (no
#      portable launch on the dense route) 1.024 / 1.005. GPT-2 small 1k ours 382.9k tokens/s, cuDNN 398.1k. The
#      d64 A/B again, twice the batches, to tell its ~3-5% from the host's drift
#   4: call 3: d64 1.093 / 1.077 (per batch 1.054 / 1.037, batches 0.66-1.58). The GPU tests of the files whose calls
#      take the portable kernels (windows, key padding, varlen, dropout, packed QKV at d64)
#   5: call 4: 16 passed. GPT-2 small 1k on another machine's host, ours and cuDNN in both orders (a fresh process a
#      row), beside that host's per-layer host times. Outcome (call 5): ours then cuDNN 377.0k / 418.0k tokens/s,
#      cuDNN then ours 484.0k / 492.5k; the host's per-layer times moved by 1.7x between rounds
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  gpu_tests 200 8 tests/kernels/test_flash_bwd_hopper.py tests/kernels/test_block_sparse_hopper.py -k dependent_dkdv
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  for batch in 2 16; do
    timeout -s KILL 90 python benchmarks/profile_layer_host.py --batch $batch --out "$R/layer_host_b$batch.json" \
      2>&1 | quiet > "$R/layer_host_b$batch.log"
    head -n 7 "$R/layer_host_b$batch.log"
  done
  settled_cudnn 190 convoy_groups_8_heads yes "32768 49152" --nheads 8 --deterministic-only --also-convoy-key-groups 1 4
  clock_medians "$R/convoy_groups_8_heads_causal_yes.json"
  ;;
2)
  gpu_tests 200 8 tests/kernels/test_launch.py tests/kernels/test_tuning.py
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  timeout -s KILL 200 python benchmarks/ab_host_trims.py --trims s89 --paths dense dense_window --seqlen 1024 \
    --headdims 64 128 --out "$R/ab_host_trims_s89.json" 2>&1 | quiet | grep "^s89"
  timeout -s KILL 90 python benchmarks/profile_layer_host.py --batch 2 --out "$R/layer_host_b2.json" 2>&1 | quiet \
    > "$R/layer_host_b2.log"
  head -n 7 "$R/layer_host_b2.log"
  timeout 220 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 --impls triton,sdpa_cudnn \
    --out "$R/train_small_1k.json" 2>&1 | quiet | tail -n 12
  ;;
3)
  timeout -s KILL 200 python benchmarks/ab_host_trims.py --trims s89 --paths dense dense_window --seqlen 1024 \
    --headdims 64 --batches 40 --out "$R/ab_host_trims_s89.json" 2>&1 | quiet | grep "^s89"
  ;;
4)
  gpu_tests 420 8 tests/kernels/test_flash_attention.py tests/kernels/test_qkvpacked.py tests/kernels/test_varlen.py \
    tests/kernels/test_dropout.py
  grep -e "^FAILED" -e "^ERROR" "$R/gpu_tests.log" | head -n 20
  ;;
5)
  timeout -s KILL 80 python benchmarks/profile_layer_host.py --batch 2 --out "$R/layer_host_b2.json" 2>&1 | quiet \
    > "$R/layer_host_b2.log"
  head -n 7 "$R/layer_host_b2.log"
  for order in triton,sdpa_cudnn sdpa_cudnn,triton; do
    timeout 230 python benchmarks/bench_train.py --models gpt2_small --seqlens 1024 --impls $order \
      --out "$R/train_small_1k_${order%%,*}_first.json" 2>&1 | quiet | grep "^| gpt2"
  done
  ;;
esac
