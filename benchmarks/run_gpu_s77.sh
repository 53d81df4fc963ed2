#!/usr/bin/env bash
# Session 77's GPU calls (one H200 each; `device`): bash benchmarks/run_gpu_s77.sh PART, results in
# $OUT/results.tgz (benchmarks/gpu_call.sh), unpacked into benchmarks/results/s77/callN/. ab_base/ (carried,
# not committed) holds main's kernels/ before the session's change (git archive 8da76ff kernels).
#   1: GQA calls the ordered backward takes as MHA (from 4k keys) repeated K and V per query head in memory
#      first (repeat_interleave: at 32 on 8 heads, 4k tokens x 4, 320 MiB of traffic before the kernel); now
#      each program reads its kv head's K / V (kv_repeat). The route's and the ordered kernel's GPU tests, then
#      fwd+bwd before / after (ab_trees.py, alternating processes) at GQA 32 on 8, causal and full 4k, causal 16k
#   2: call 1: 178 GPU tests passed; fwd+bwd after / before 0.916 / 0.964 / 0.982 at causal 4k / full 4k / causal
#      16k. The route against SDPA cuDNN at 1k-8k (32 on 8, alternating rounds): does it now pay under 4k keys,
#      where session 75's --gqa-expanded run never took it (its 4096-key floor stayed in force)?
#   3: call 2 (cuDNN ÷ ours, fwd+bwd): causal 2k / 4k / 8k 1.057 (two kernels; the route 1.044) / 1.069 / 1.080, full
#      1k / 2k / 4k / 8k 1.064 (the route 1.019) / 0.993 (the route 1.027) / 1.059 / 1.037 (session 76: causal 4k
#      0.966, full 4k 1.001). The GQA model (8 heads of 128 on 2) at 4k end to end, in two processes (0.979x
#      cuDNN's tokens/s in session 76: `auto` keeps GQA under 8k keys with cuDNN), and the route at full 2k / 3k
#      again, six rounds, on 8 and on 4 kv heads (a full-attention floor of 2k keys?)
#   4: call 3: the GQA model at 4k 1.026x and 1.017x cuDNN's tokens/s (58.2% MFU); the route at full 2k / 3k 1.017 /
#      1.067x (8 kv heads), 1.019 / 1.060x (4) the two kernels. So the route from 2k keys with full attention (still
#      4k causal), and `auto` takes GQA from 4k keys. The GPU tests of `auto` and of the route, then GQA 32 on 8
#      against cuDNN at 16k and 32k (the route's longer calls, on the in-place K / V)
#   5: call 4: 17 GPU tests passed; GQA 32 on 8 against cuDNN at causal 16k / 32k 1.042 / 1.050, full 1.043 / 1.054.
#      The route's programs at 2 query heads each (ORDERED_GQA_KERNEL_GROUP 2: K / V read once for two heads, half
#      the per-head dK / dV to write and sum) against 1: its GPU tests, then fwd+bwd at 32 on 8, causal 4k / 8k,
#      full 2k / 4k / 8k
#   6: call 5: 14 GPU tests passed; 2 query heads a program ÷ 1, fwd+bwd: causal 4k / 8k 0.984 / 1.009, full 2k / 4k /
#      8k 0.973 / 0.976 / 1.000 (cuDNN ÷ ours with 2: 1.073 / 1.086, 1.049 / 1.091 / 1.042). Again, five rounds, at
#      causal 4k / 6k and full 2k / 3k / 4k / 6k (below 8k keys only?), then the GQA model at 4k with 2 (end to end)
#   7: call 6: 2 ÷ 1 query heads a program, five rounds: causal 4k / 6k 0.999 / 1.000, full 2k / 3k / 4k / 6k 0.980 /
#      0.973 / 0.972 / 0.985; the GQA model at 4k with 2 1.006x cuDNN (one process). So the route takes 2 with full
#      attention under 8k keys (`route_kernel_group`), 1 causal. Its GPU tests and `auto`'s on that rule, then GQA
#      32 on 8 against cuDNN on it at full 2k / 4k and causal 4k (the session's last device time)
#   8: call 7: 21 GPU tests passed; on the final rule causal 4k 1.043, full 2k / 4k 1.028 / 1.035 (a machine just
#      started). How near copy bandwidth do the route's dK / dV sums run (torch.sum over a middle dim of 2 or 4,
#      against a clone of the same bytes)? Then the GQA model at 8k end to end on the in-place route (1.015x in
#      session 74, K/V repeated)
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part}" in
1)
  gpu_tests 230 4 tests/kernels/test_flash_bwd_fused_hopper.py -k "gqa_expanded or fused_backward_matches_reference"
  timeout -s KILL 300 python benchmarks/ab_trees.py --trees ab_base . --rounds 4 --reps 20 \
    --shapes 4,4096,32,8,128,1 4,4096,32,8,128,0 1,16384,32,8,128,1 --out "$R/ab_trees_gqa_as_mha.json" 2>&1 | quiet
  ;;
2)
  gqa_cudnn 200 ab_cudnn_gqa_as_mha "2048 4096 8192" "1024 2048 4096 8192" --gqa-expanded --rounds 4
  ;;
3)
  for run in 1 2; do
    timeout 170 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 4096 \
      --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_4k_$run.json" 2>&1 | quiet | grep "^|" | tail -n 3
  done
  for kv in 8 4; do
    timeout -s KILL 120 python benchmarks/ab_cudnn.py --gqa-expanded --headdims 128 --nheads 32 --nheads-kv $kv \
      --causal no --seqlens 2048 3072 --rounds 6 --out "$R/ab_cudnn_gqa_as_mha_32_${kv}_full_short.json" 2>&1 | quiet | ratios
  done
  ;;
4)
  gpu_tests 240 4 tests/flashtrain/test_gpt.py tests/kernels/test_flash_bwd_fused_hopper.py -k "auto or gqa_expanded"
  gqa_cudnn 150 ab_cudnn_gqa_32_8_long "16384 32768" "16384 32768" --rounds 3
  ;;
5)
  gpu_tests 200 4 tests/kernels/test_flash_bwd_fused_hopper.py -k "gqa_expanded"
  gqa_cudnn 170 ab_cudnn_gqa_kernel_group "4096 8192" "2048 4096 8192" --gqa-kernel-group 2 --rounds 4
  ;;
6)
  gqa_cudnn 170 ab_cudnn_gqa_kernel_group_short "4096 6144" "2048 3072 4096 6144" --gqa-kernel-group 2 --rounds 5
  FLASHTRAIN_GQA_KERNEL_GROUP=2 timeout 120 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa \
    --seqlens 4096 --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_4k_kernel_group_2.json" 2>&1 | quiet \
    | grep "^|" | tail -n 3
  ;;
7)
  gpu_tests 200 4 tests/flashtrain/test_gpt.py tests/kernels/test_flash_bwd_fused_hopper.py -k "auto or gqa_expanded"
  gqa_cudnn 120 ab_cudnn_gqa_32_8_final "4096" "2048 4096" --rounds 4
  ;;
8)
  python - "$R/gqa_sums.json" <<'PY'
import sys
import torch
from benchmarks.common import mean_ms, write_results
rows = []
for batch, seqlen, kv, rep in [(4, 4096, 8, 4), (4, 4096, 8, 2), (2, 8192, 8, 4), (1, 16384, 8, 4)]:
    heads = torch.randn(batch, seqlen, kv * rep, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(batch, seqlen, kv, 128, device="cuda", dtype=torch.bfloat16)
    view = heads.view(batch, seqlen, kv, rep, 128)
    sum_ms = mean_ms(lambda: torch.sum(view, dim=-2, out=out), 50, warmup=3)
    clone_ms = mean_ms(lambda: heads.clone(), 50, warmup=3)
    moved = (heads.numel() + out.numel()) * 2
    rows.append(dict(batch=batch, seqlen=seqlen, kv_heads=kv, repeat=rep, sum_ms=sum_ms, clone_ms=clone_ms,
                     sum_gbps=moved / sum_ms / 1e6, clone_gbps=2 * heads.numel() * 2 / clone_ms / 1e6))
    print(rows[-1])
write_results(sys.argv[1], rows)
PY
  timeout 200 python benchmarks/bench_train.py --models gpt2_medium_d128_gqa --seqlens 8192 \
    --impls sdpa_cudnn,triton --out "$R/train_medium_d128_gqa_8k.json" 2>&1 | quiet | grep "^|" | tail -n 3
  ;;
esac
