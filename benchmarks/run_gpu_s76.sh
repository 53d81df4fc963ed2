#!/usr/bin/env bash
# Session 76's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s76.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s76/callN/.
#   1: the d128 forward is 0.90-0.97x cuDNN's at 1k-2k queries, where it runs the persistent variant on 64-key
#      tiles in one K/V ring (the row-tile kernel's 128-key tiles in K and V rings of their own were never built
#      persistent). That variant, with and without turns: its GPU tests, then the forward's configs against
#      cuDNN's at 512-4k (full) and 512-8k (causal), five alternating rounds
#   2: call 1: the 128-key persistent variant 0.956-1.054x cuDNN's forward at 512-8k (the kernels in use 0.916-1.042x),
#      turns no help; it now takes d128 below 8k queries (`PERSISTENT_BELOW_128`). The forward's GPU tests on that
#      rule (and the block-sparse forward's, whose launch now passes V_STAGES), then it against the row-tile kernel
#      at full 8k-32k and causal 8k-16k (does it pay past 8k?)
#   3: call 2: 205 GPU tests passed; past 8k the variant 1.053 / 1.047 / 1.042x at full 8k / 16k / 32k against the row-tile
#      kernel's 1.043 / 1.045 / 1.056, causal 8k / 16k 1.055 / 1.017 against 1.058 / 1.072: full calls now take it below
#      16k. fwd+bwd against cuDNN on the new rule: d128 MHA at 512-4k causal, 1k-8k full, then GQA (32 on 8) at 1k-4k
#   4: call 3: MHA fwd+bwd 1.031-1.057x cuDNN at 1k-8k (forward alone 0.956-1.048x), causal 512 host-bound (0.83x); GQA
#      0.97-1.16x. End to end on the new forward: GPT-2 medium's width in 8 heads of 128 at 1k, 2k and 4k, and in 8 heads
#      on 2 kv heads at 1k and 2k, cuDNN and ours (fresh processes)
#   5: call 4: MHA 1.021 / 1.029 / 1.027x cuDNN's tokens/s at 1k / 2k / 4k, GQA 1.030 / 1.028x at 1k / 2k. The dense public
#      API's and packed QKV's GPU tests on the new rule; the block-sparse d128 forward (still 64-key persistent tiles
#      on short lists) on the 128-key persistent variant, A/B at n4k and n16k, and the d128 block-sparse GPU tests
#      (bf16) with it on
#   6: call 5: 14 dense GPU tests passed; on block-sparse lists the 128-key variant 0.97-0.98x at n4k 3-9%, 0.97-1.02x
#      elsewhere: not taken there (52 d128 block-sparse GPU tests passed with it). A second run of d128 MHA at 2k and
#      4k (seven rounds: is full 4k's 1.05x aim met now?), and the GQA model at 1k in one more process
#   7: call 6: causal 2k / 4k 1.043 / 1.044x, full 1.045 / 1.038x (the aim still missed at full 4k); GQA model 1k 1.031x.
#      The GQA model at 4k (level with cuDNN in session 75, 0.994x; its causal forward now the persistent variant)
#      (call 7: 0.979x; `auto` keeps GQA under 8k keys with cuDNN)
#   8: the session's input checks on CUDA: generate's (its CUDA-graph and prefill tests) and linear_cross_entropy's
#      GPU tests, and the model's fused loss in the trainer's GPU tests (call 8: 31 passed)
#   9: d64's persistent forward (one K/V ring of three stages) on K and V rings of their own, 3 + 3 and 4 + 3 tiles,
#      with and without turns, against cuDNN's forward at full 1k / 4k / 16k (the session's last ~240 s of device time)
#      (call 9: split rings 0.935-0.991x cuDNN against one ring's 0.991-1.000 with turns: d64 keeps one ring)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  gpu_tests 220 4 tests/kernels/test_flash_fwd_hopper.py -k "split_kv_rings or walks_many"
  fwd_ab 160 d128_full --headdim 128 --seqlens 512 1024 2048 4096
  fwd_ab 180 d128_causal --headdim 128 --causal --seqlens 512 1024 2048 4096 8192
  ;;
2)
  gpu_tests 230 6 tests/kernels/test_flash_fwd_hopper.py tests/kernels/test_launch.py \
    tests/kernels/test_block_sparse_hopper.py -k "not backward and not bwd and not grad and not hopper_path_matches"
  fwd_ab 150 d128_full_long --headdim 128 --seqlens 8192 16384 32768 --only persistent_128key_rings2 rows_128key_rings2
  fwd_ab 110 d128_causal_long --headdim 128 --causal --seqlens 8192 16384 --only persistent_128key_rings2 rows_128key_rings2
  ;;
3)
  for causal in yes no; do
    timeout -s KILL 140 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --rounds 5 \
      --seqlens $([ $causal = yes ] && echo 512 1024 2048 4096 || echo 1024 2048 4096 8192) \
      --out "$R/ab_cudnn_d128_causal_$causal.json" 2>&1 | quiet | ratios
  done
  gqa_cudnn 110 ab_cudnn_gqa_32_8 "1024 2048 4096" "1024 2048 4096" --rounds 4
  ;;
4)
  timeout 300 python benchmarks/bench_train.py --models gpt2_medium_d128 --seqlens 1024,2048,4096 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128.json" 2>&1 | quiet | grep "^|" | tail -n 8
  timeout 230 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 1024,2048 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa.json" 2>&1 | quiet | grep "^|" | tail -n 6
  ;;
5)
  timeout -s KILL 120 python -m pytest -q -n 4 -rf -m gpu tests/kernels/test_flash_attention.py tests/kernels/test_qkvpacked.py \
    > "$R/gpu_tests_dense.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_dense.log"
  bs_ab 200 d128_persistent_128key_forward --variants d128_persistent_128key_forward --seqlens 4096 16384 \
    --headdims 128 --max-density 0.5 --no-flex
  timeout -s KILL 150 python -c "
import sys, pytest
from kernels import _block_sparse_hopper as bs
bs.PERSISTENT_FORWARD[128] = (bs.fwd_hopper.PERSISTENT_CONFIGS[128], 10)
sys.exit(pytest.main(['-q', '-rf', '-m', 'gpu', 'tests/kernels/test_block_sparse_hopper.py', '-k',
                      'hopper_path_matches and 128 and bf16 or persistent_and_row_tile']))
" > "$R/gpu_tests_bs_128key.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$R/gpu_tests_bs_128key.log"
  ;;
6)
  for causal in yes no; do
    timeout -s KILL 110 python benchmarks/ab_cudnn.py --headdims 128 --causal $causal --rounds 7 --seqlens 2048 4096 \
      --out "$R/ab_cudnn_d128_causal_${causal}_again.json" 2>&1 | quiet | ratios
  done
  timeout 160 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 1024 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_1k.json" 2>&1 | quiet | grep "^|" | tail -n 3
  ;;
7)
  timeout 200 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 4096 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_4k.json" 2>&1 | quiet | grep "^|" | tail -n 3
  ;;
8)
  gpu_tests 200 4 tests/flashtrain/test_generate.py tests/kernels/test_cross_entropy.py tests/flashtrain/test_gpt.py
  ;;
9)
  fwd_ab 150 d64_full_rings --headdim 64 --seqlens 1024 4096 16384 --only persistent persistent_rings3 persistent_rings4_3
  ;;
esac
