#!/usr/bin/env bash
# Device calls on one GPU (session 58). Each part is what one call ran; the outputs are in
# benchmarks/results/s58/callN/ (each call's machine.txt names its GPU).
#   bash benchmarks/run_gpu_s58.sh 1   # the forward's turns given and taken once a program (strict alternation,
#       session 57's last change, not yet run): the forward's and packed-QKV GPU tests; d64 forward alone with and
#       without turns (ab_fwd_configs.py --pingpong, five rounds, full 1k-16k, causal 1k-8k); then the branch
#       experiment fwd-causal-turns (results/s58/unmasked_turns.patch, applied for the run and reverted): d128 causal
#       row-tile kernel without turns, with turns in every step, with turns only in the unmasked steps, 4k-16k
#   bash benchmarks/run_gpu_s58.sh 2   # the unmasked-turns branch again at causal 8k-32k (patch applied and reverted);
#       block-sparse d128 n4k and n16k up to 50% density with the forward's turns off and on, row-tile and persistent
#       kernels each (ab_block_sparse.py, new variants row_tile_forward_turns, persistent_forward_turns)
#   bash benchmarks/run_gpu_s58.sh 3   # block-sparse d128 at n4k / n16k up to 20% density: the dq kernel's persistent
#       variant everywhere against nowhere (new variant d128_persistent_dq; the rule takes it up to 2 tiles), and the
#       dK/dV kernel's (persistent_dkdv); then the Hopper backward, dense and Hopper block-sparse GPU tests on the
#       strict-alternation forward (the slow portable-autotune test left out)
#   bash benchmarks/run_gpu_s58.sh 4   # with the d128 persistent dq kernel up to 4 tiles (was 2): its A/B again at n4k,
#       the issue's block-sparse benchmark at n4k (d128, d64), the Hopper block-sparse GPU tests
# Call 5 ran part 5 of this script as branch dkdv-turns has it (the dK/dV kernel's consumers taking turns): its
# default configs failed their first launch there (the branch left the TURNS constexpr out of their launch), the
# turn configs passed the edge-shape checks, nothing was timed; run it again from the branch (fixed there).
source "$(dirname "$0")/gpu_call.sh"
machine_info
head -n 2 "$R/machine.txt"
unmasked_turns_ab() {  # unmasked_turns_ab SECONDS NAME SEQLEN...: the d128 causal row-tile kernel three ways
  local secs=$1 name=$2
  shift 2
  patch -s -p1 < benchmarks/results/s58/unmasked_turns.patch && echo "patch applied"
  PYTHONPATH=. timeout -s KILL "$secs" python -c "
import sys
import benchmarks.ab_fwd_configs as ab
ab.CANDIDATES[128] = {'rows_128key_rings2': ab.CANDIDATES[128]['rows_128key_rings2']}
sys.argv = ['ab_fwd_configs.py', '--headdim', '128', '--causal', '--seqlens', *'$*'.split(), '--rounds', '5',
            '--pingpong', '--out', '$R/ab_fwd_d128_causal_$name.json']
ab.main()
" 2>&1 | quiet | fwd_ratios
  patch -s -R -p1 < benchmarks/results/s58/unmasked_turns.patch && echo "patch reverted"
}
case "$1" in
1)
  timeout -s KILL 240 python -m pytest -q -n 4 -m gpu -rf tests/kernels/test_flash_fwd_hopper.py \
    tests/kernels/test_qkvpacked.py > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  fwd_ab 80 d64 --headdim 64 --seqlens 1024 4096 16384
  fwd_ab 80 d64_causal --headdim 64 --causal --seqlens 1024 4096 8192
  unmasked_turns_ab 150 unmasked_turns 4096 8192 16384
  ;;
2)
  unmasked_turns_ab 170 unmasked_turns_again 8192 16384 32768
  bs_ab 380 d128 --variants persistent_forward_turns row_tile_forward_turns --seqlens 4096 16384 --headdims 128 \
    --max-density 0.5
  ;;
3)
  bs_ab 150 d128_persistent_bwd --variants d128_persistent_dq persistent_dkdv --seqlens 4096 16384 --headdims 128 \
    --max-density 0.2
  T=tests/kernels
  timeout -s KILL 400 python -m pytest -q -n 5 -m gpu -rf $T/test_flash_bwd_hopper.py $T/test_flash_attention.py \
    $T/test_block_sparse_hopper.py --deselect $T/test_flash_bwd_hopper.py::test_gpu_other_backwards_keep_the_portable_kernels \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 4 "$R/gpu_tests.log"
  ;;
4)
  bs_ab 100 d128_persistent_dq_n4k --variants d128_persistent_dq --seqlens 4096 --headdims 128 --max-density 0.1
  timeout 250 python benchmarks/bench_block_sparse.py --seqlens 4096 --headdims 128 64 \
    --out "$R/block_sparse_n4k.json" 2>&1 | quiet | grep "^|"
  timeout -s KILL 200 python -m pytest -q -n 5 -m gpu -rf tests/kernels/test_block_sparse_hopper.py \
    > "$R/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 3 "$R/gpu_tests.log"
  ;;
esac
