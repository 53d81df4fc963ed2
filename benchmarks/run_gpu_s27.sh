#!/usr/bin/env bash
# Device calls on one GPU (session 27: head dim 256 through the Gluon Hopper kernels; block-sparse d64 at
# n64k). Each part is what one call ran; the outputs are in benchmarks/results/hopper_d256_h200/.
#   bash benchmarks/run_gpu_s27.sh 1   # the Hopper kernel tests (now with d256 edges, the dK/dV kernel
#       in two passes there), then each d256 candidate config of the forward, dq and dK/dV kernels:
#       correctness on the edge shapes and speed against the portable kernels and SDPA
#   bash benchmarks/run_gpu_s27.sh 2   # with d256 dispatched to the three Hopper kernels (forward 64x32 s3,
#       dq 64x32 s3, dK/dV 32x64 s2, from part 1): d256 against the anchors, then the Hopper kernel tests
#       whole (part 1's ran out of its time after 179 passed)
#   bash benchmarks/run_gpu_s27.sh 3   # (part 2: d256 causal 1k at 1.28x SDPA flash, the rest 1.38-1.44x; the
#       tests ran out of time again, 182 passed) the dK/dV kernel's dV pass with 64-query tiles, the
#       Hopper kernel tests with more time, then block-sparse d64 at n64k against FlexAttention
#   bash benchmarks/run_gpu_s27.sh 4   # (part 3's dV-tile check ran out of its 120 s while compiling) the
#       dV-tile check again, then d256 against SDPA flash with the dK/dV config in use and with the dV
#       pass on 64-query tiles, in one process each
#   bash benchmarks/run_gpu_s27.sh 5   # with the dV pass on 64-query tiles (part 4: 1.02-1.07x the backward):
#       d256 against all anchors, then the Hopper kernel tests
#   bash benchmarks/run_gpu_s27.sh 6   # host time of one eager fwd+bwd at d128 (dense and block-sparse,
#       both on the Gluon kernels) with cProfile's top functions: the low-density block-sparse rows are
#       host-bound
#   bash benchmarks/run_gpu_s27.sh 7   # the Gluon dK/dV kernel at head dim 64 (GPT-2's), never timed alone:
#       three stage counts against the portable backward, 1k-16k causal and full and GPT-2 medium's
#       packed layer
#   source .whl/install.sh && bash benchmarks/run_gpu_s27.sh 8   # (part 7: 0.93-1.03x on contiguous
#       layouts, 1.05-1.08x on the packed layer) d64 causal interleaved calls from 8k take the Gluon
#       dK/dV kernel (64x64 s4): GPT-2 medium 8k training with it and without (FLASHTRAIN_HOPPER_DKDV=0),
#       alternating, then the Hopper backward tests of the dK/dV kernel and the packed layouts
#   source .whl/install.sh && bash benchmarks/run_gpu_s27.sh 9   # (part 8: no gain end to end; the d64
#       dispatch was backed out) the session's final tree: every GPU kernel test and the flashtrain GPU tests
#   bash benchmarks/run_gpu_s27.sh 10   # d256 causal at 1k and 2k, where eager calls varied between calls
#       (1.28-1.48x SDPA flash): eager and CUDA-graph replays (device time alone), twice
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/flashtrain-out} HANG_S=200
mkdir -p "$OUT"
case "${1:?part 1}" in
1)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/machine.txt"
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/machine.txt"
  timeout -s INT 200 python -m pytest -q -n 8 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py -rf > "$OUT/gpu_tests_call1.log" 2>&1
  tail -n 15 "$OUT/gpu_tests_call1.log"
  timeout 130 python benchmarks/check_hopper_fwd.py --headdims 256 --out "$OUT/check_fwd_d256.json" 2>&1 \
    | tee "$OUT/check_fwd_d256.log" | grep -v "^ok"
  timeout 110 python benchmarks/check_hopper_dq.py --headdims 256 --out "$OUT/check_dq_d256.json" 2>&1 \
    | tee "$OUT/check_dq_d256.log" | grep -v "^ok"
  timeout 110 python benchmarks/check_hopper_dkdv.py --headdims 256 --speed 256:causal 256:full \
    --out "$OUT/check_dkdv_d256.json" 2>&1 | tee "$OUT/check_dkdv_d256.log" | grep -v "^ok"
  ;;
2)
  timeout 320 python benchmarks/bench_attention.py --headdims 256 --seqlens 1024 2048 4096 8192 16384 \
    --impls sdpa_flash sdpa_cudnn flex triton --out "$OUT/attention_d256_hopper.json" 2>&1 \
    | grep -v "^{'impl'" | grep -v "Warning" | tail -n 30
  timeout -s INT 250 python -m pytest -q -n 12 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py -rf > "$OUT/gpu_tests_call2.log" 2>&1
  tail -n 8 "$OUT/gpu_tests_call2.log"
  ;;
3)
  timeout 120 python benchmarks/check_hopper_dkdv.py --headdims 256 --speed 256:causal 256:full \
    --out "$OUT/check_dkdv_d256_dv_tiles.json" 2>&1 | tee "$OUT/check_dkdv_d256_dv_tiles.log" | grep -v "^ok"
  timeout -s INT 280 python -m pytest -q -n 16 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py -rf --durations=8 > "$OUT/gpu_tests_call3.log" 2>&1
  tail -n 20 "$OUT/gpu_tests_call3.log"
  timeout 180 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 64 --portable \
    --graph-upto 0 --out "$OUT/block_sparse_d64_n64k.json" 2>&1 | grep -v "^{'impl'" \
    | grep -v "Warning\|create_block_mask(" | tail -n 14
  ;;
4)
  timeout 250 python benchmarks/check_hopper_dkdv.py --headdims 256 --speed 256:causal 256:full \
    --out "$OUT/check_dkdv_d256_dv_tiles.json" 2>&1 | tee "$OUT/check_dkdv_d256_dv_tiles.log" | grep -v "^ok"
  for dv in "" "64, 2"; do
    timeout 150 python - "$dv" <<'PY' 2>&1 | grep "^|" | tee -a "$OUT/attention_d256_dv_tiles.log"
import dataclasses, os, sys
from benchmarks.bench_attention import main
from kernels import _flash_dkdv_hopper as dkdv
tag = "dv_default"
if sys.argv[1]:
    block_m, stages = (int(x) for x in sys.argv[1].split(","))
    dkdv.CONFIGS[256] = dataclasses.replace(dkdv.CONFIGS[256], dv_block_m=block_m, dv_stages=stages)
    tag = f"dv{block_m}s{stages}"
print("| config", dkdv.CONFIGS[256], "|", flush=True)
main(["--headdims", "256", "--seqlens", "1024", "2048", "4096", "16384", "--impls", "sdpa_flash", "triton",
      "--out", os.path.join(os.environ["OUT"], f"attention_d256_{tag}.json")])
PY
  done
  ;;
5)
  timeout 200 python benchmarks/bench_attention.py --headdims 256 --seqlens 1024 2048 4096 8192 16384 \
    --impls sdpa_flash sdpa_cudnn flex triton --out "$OUT/attention_d256_hopper.json" 2>&1 \
    | grep "^|"
  timeout -s INT 300 python -m pytest -q -n 16 -m gpu tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_flash_bwd_hopper.py -rf > "$OUT/gpu_tests_call5.log" 2>&1
  tail -n 4 "$OUT/gpu_tests_call5.log"
  ;;
6)
  timeout 200 python benchmarks/bench_host_overhead.py --headdim 128 --seqlen 4096 \
    --out "$OUT/host_overhead_d128.json" 2>&1 | tail -n 60
  ;;
7)
  timeout 300 python benchmarks/check_hopper_dkdv.py --headdims 64 --speed 64:causal 64:full 64:packed \
    --out "$OUT/check_dkdv_d64.json" 2>&1 | tee "$OUT/check_dkdv_d64.log" | grep -v "^ok"
  ;;
8)
  for run in 1 2; do
    for dkdv in 1 0; do
      FLASHTRAIN_HOPPER_DKDV=$dkdv timeout 105 python benchmarks/bench_train.py --models gpt2_medium \
        --seqlens 8192 --impls triton --out "$OUT/train_medium8k_hopper_dkdv${dkdv}_$run.json" 2>&1 \
        | grep "^|.*gpt2" | sed "s/^/dkdv=$dkdv run $run /" | tee -a "$OUT/train_medium8k.log"
    done
  done
  timeout -s INT 150 python -m pytest -q -n 12 -m gpu tests/kernels/test_flash_bwd_hopper.py -k "dkdv or packed" \
    -rf > "$OUT/gpu_tests_call8.log" 2>&1
  tail -n 4 "$OUT/gpu_tests_call8.log"
  ;;
9)
  timeout -s INT 420 python -m pytest -q -n 12 -m gpu tests/kernels -rf > "$OUT/kernel_gpu_tests_call9.log" 2>&1
  tail -n 12 "$OUT/kernel_gpu_tests_call9.log"
  timeout -s INT 90 python -m pytest -q -m gpu tests/flashtrain -rf > "$OUT/flashtrain_gpu_tests_call9.log" 2>&1
  tail -n 4 "$OUT/flashtrain_gpu_tests_call9.log"
  ;;
10)
  for run in 1 2; do
    timeout 120 python benchmarks/bench_attention.py --headdims 256 --seqlens 1024 2048 --causal causal \
      --impls sdpa_flash triton --graphs --out "$OUT/attention_d256_short_graphs_$run.json" 2>&1 | grep "graphs\|^|"
  done
  ;;
esac
