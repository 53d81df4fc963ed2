#!/usr/bin/env bash
# Device calls on one H200 (stop 28): the GPU suites after the differentiable lse and the input
# checks, and the re-measures the README still lacks against FlexAttention compiled per shape.
#   source .whl/install.sh && bash benchmarks/run_gpu_remeasure.sh 1   # tests, dense sweep n1k-8k
#   source .whl/install.sh && bash benchmarks/run_gpu_remeasure.sh 2   # block-sparse n64k, end to end
#   source .whl/install.sh && bash benchmarks/run_gpu_remeasure.sh 3   # d128 backward against Flex, per kernel
#   source .whl/install.sh && bash benchmarks/run_gpu_remeasure.sh 4   # dq beside dk/dv on a second stream
#   source .whl/install.sh && bash benchmarks/run_gpu_remeasure.sh 5   # n1k: per kernel, and every tile config
#   source .whl/install.sh && bash benchmarks/run_gpu_remeasure.sh 6   # the trainer on CUDA: train, resume
# Results: $OUT/results.tgz (gpu_call.sh packs $R when the script exits, a time-out included).
source "$(dirname "$0")/gpu_call.sh"
machine_info
case "${1:?part 1 or 2}" in
1)
  cuda_tests 240 0 0 -
  for f in "$R"/*tests.log; do tail -n 2 "$f"; done
  timeout 320 python benchmarks/bench_attention.py --seqlens 1024 4096 8192 --headdims 64 128 --causal both \
    --impls triton flex sdpa_flash sdpa_cudnn --out "$R/attention_flex_static_n1k_8k.json" 2>&1 | quiet \
    | tee "$R/bench_attention.log" | tail -16
  ;;
2)
  timeout 130 python -m pytest -q -m gpu tests/flashtrain -rf > "$R/flashtrain_gpu_tests.log" 2>&1
  tail -2 "$R/flashtrain_gpu_tests.log"
  timeout 200 python benchmarks/bench_block_sparse.py --seqlens 65536 --headdims 64 128 --graph-upto 0 \
    --out "$R/block_sparse_n64k_flex_static.json" 2>&1 | quiet | tee "$R/bench_block_sparse.log" | tail -16
  timeout 240 python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192,1024 \
    --impls triton,sdpa_flash --out "$R/train_medium.json" 2>&1 | quiet | tee "$R/bench_train.log" | tail -8
  ;;
3)  # where the d128 backward loses to Flex: per-kernel times, Flex's generated kernels, our tile configs alone
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
  timeout 200 python benchmarks/profile_attention.py --shape 2,8192,16,128 --shape 4,4096,16,128,causal \
    --shape 2,8192,16,64,causal --impls triton flex --out "$R/profile_d128.json" 2>&1 | quiet | tee "$R/profile.log"
  mkdir -p "$R/flex_kernels"
  grep -rl "flex_attention_backward\|def triton_tem_fused" /tmp/inductor-cache --include=*.py 2>/dev/null \
    | head -12 | while read -r f; do cp "$f" "$R/flex_kernels/"; done
  for k in dkdv dq; do
    timeout 150 python benchmarks/sweep_tiles.py --shape 2,8192,16,128 --shape 4,4096,16,128,causal \
      --kernel $k --jobs 16 --out "$R/sweep_d128_$k.json" > "$R/sweep_d128_$k.log" 2>&1 || echo "sweep $k failed"
    tail -n 25 "$R/sweep_d128_$k.log"
  done
  ;;
4)  # the dq kernel on a second stream beside dk/dv: does filling the kernels' last waves pay?
  timeout 300 python benchmarks/check_bwd_overlap.py --shape 2,8192,16,128 --shape 4,4096,16,128,causal \
    --shape 1,16384,16,128,causal --shape 2,8192,16,64,causal --shape 16,1024,16,64,causal \
    --shape 8,2048,16,128 --out "$R/bwd_overlap.json" 2>&1 | quiet | tee "$R/bwd_overlap.log"
  ;;
5)  # n1k, where d128 loses to Flex: device time per kernel, and every tile config of each kernel alone
  timeout 150 python benchmarks/profile_attention.py --shape 16,1024,16,128,causal --shape 16,1024,16,128 \
    --shape 16,1024,16,64,causal --impls triton flex --out "$R/profile_n1k.json" 2>&1 | quiet | tee "$R/profile_n1k.log"
  timeout 200 python benchmarks/sweep_tiles.py --shape 16,1024,16,128,causal --shape 16,1024,16,128 \
    --kernel dkdv --kernel dq --kernel fwd --jobs 16 --out "$R/sweep_n1k_d128.json" > "$R/sweep_n1k_d128.log" 2>&1 \
    || echo "sweep failed"
  grep " ms " "$R/sweep_n1k_d128.log" | sed "s/'batch': 16, 'seqlen': 1024, 'nheads': 16, 'headdim': 128, //"
  ;;
6)  # the trainer on CUDA after the checkpoint and config changes: GPU tests, the README's default run,
    # then a resume of it that trains further (CUDA defaults: bf16 autocast, `auto` attention)
  timeout 120 python -m pytest -q -m gpu tests/flashtrain -rf 2>&1 | tail -n 3 | tee "$R/flashtrain_gpu_tests.log"
  run() { timeout 150 python train.py trainer.out_dir=/tmp/gpu-runs trainer.run_name=gpu_check logger=none trainer.progress_bar=false "$@" 2>&1 \
    | quiet | tail -n 12; }
  run trainer.max_steps=40 trainer.checkpoint_interval=20 | tee "$R/default_run.log"
  run trainer.max_steps=60 trainer.checkpoint_interval=20 trainer.resume=auto | tee "$R/default_resume.log"
  ls /tmp/gpu-runs/gpu_check/checkpoints | tee -a "$R/default_resume.log"
  ;;
esac
