"""Autotune pruning: what survives for a shape, and that a fallback candidate always survives."""

import pytest
import torch
import triton

from kernels._flash_fwd import _prune_fwd, prune_configs


def _config(m, n, warps=4, stages=2):
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)


@triton.jit
def _noop(x_ptr):  # a kernel to wrap in an autotuner; never launched
    pass


_CONFIGS = [_config(128, 128, 8, 3), _config(128, 64), _config(64, 64), _config(64, 32), _config(32, 32)]


def _prune(seqlen_q, seqlen_k, block_d=64, configs=_CONFIGS):
    args = dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, BLOCK_D=block_d, DOT_PREC="tf32x3")
    return prune_configs(configs, args, "seqlen_q", "seqlen_k", "BLOCK_M", 1)


def _tiles(configs):
    return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in configs]


def test_long_sequences_keep_every_config_that_fits():
    assert _tiles(_prune(4096, 4096)) == _tiles(_CONFIGS)


@pytest.mark.parametrize("seqlen", [1, 16, 31])
def test_short_sequences_keep_a_second_candidate(seqlen):
    """Tiles far larger than the sequence are dropped, but never down to one: a lone config is
    compiled outside the autotuner's guard, so a compiler crash on it would be fatal."""
    assert _tiles(_prune(seqlen, seqlen)) == [(64, 32), (32, 32)]  # both fit: rows <= 64, cols <= 32
    # only (64, 32) fits; the smallest of the rest comes along as the fallback
    assert _tiles(_prune(seqlen, seqlen, configs=_CONFIGS[:4])) == [(64, 32), (64, 64)]


@pytest.mark.parametrize("block_d", [16, 32])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(128, 8), (128, 32), (4096, 4096), (8, 8)])
def test_forward_drops_the_key_tiles_ptxas_cannot_build_at_small_head_dims(block_d, seqlen_q, seqlen_k):
    """ptxas (Triton 3.6, sm_90) crashes on the forward's 32-wide key tiles at head dims <= 32; with <= 32
    keys they were the only two candidates left, so the call failed. `check_kernel_builds.py` builds them."""
    gpu_configs = [_config(128, 64, 8, 3), _config(128, 128, 8, 3), _config(64, 64, 4, 3), _config(64, 32),
                   _config(128, 32, 8, 2)]  # fmt: skip
    args = dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, BLOCK_D=block_d, DOT_PREC="bf16")
    kept = _tiles(_prune_fwd(gpu_configs, args))
    assert kept and all(n > 32 for _, n in kept)
    # head dims from 40 up keep them, and the interpreter's lone 32x32 config stays at any head dim
    assert (64, 32) in _tiles(_prune_fwd(gpu_configs, {**args, "BLOCK_D": 64, "seqlen_k": 32}))
    assert _tiles(_prune_fwd([_config(32, 32)], args)) == [(32, 32)]


def test_nothing_fits_still_gives_the_two_smallest():
    kept = _tiles(_prune(4096, 4096, block_d=1 << 20))  # shared memory overflows for every tile
    assert kept == [(32, 32), (64, 32)]


@pytest.mark.parametrize("seqlen", [16, 129, 4096])
def test_fp32_tunes_over_the_two_smallest_tiles_that_fit(seqlen):
    """Exact fp32 dots (tests' inputs) are slow to build: only two candidates, the smallest tiles, fewer
    pipeline stages first; other precisions keep every config that fits."""
    configs = [_config(128, 128, 8, 3), _config(64, 32, 4, 3), _config(128, 64), _config(32, 64, 8, 2),
               _config(64, 64)]  # fmt: skip
    args = dict(seqlen_q=seqlen, seqlen_k=seqlen, BLOCK_D=64, DOT_PREC="ieee")
    got = _tiles(prune_configs(configs, args, "seqlen_q", "seqlen_k", "BLOCK_M", 1))
    assert sorted(got) == [(32, 64), (64, 32)]  # at 16 tokens (64, 32) fits, (32, 64) is the fallback
    tf32 = _tiles(prune_configs(configs, {**args, "DOT_PREC": "tf32"}, "seqlen_q", "seqlen_k", "BLOCK_M", 1))
    assert set(got) <= set(tf32) and len(tf32) == (2 if seqlen < 64 else 5)


def test_a_single_config_list_is_returned_whole():
    assert _tiles(_prune(16, 16, configs=[_config(128, 128)])) == [(128, 128)]


@pytest.mark.parametrize(
    "message, skipped", [("PassManager::run failed", True), ("illegal memory access", False)]
)
def test_a_config_that_fails_to_compile_is_skipped_not_fatal(monkeypatch, message, skipped):
    """Triton's autotuner stops on a compile error from an MLIR pass; ours times that config as inf."""
    import triton.runtime.autotuner as autotuner

    from kernels._common import autotune

    def failing_bench(self, *args, config, **meta):
        raise RuntimeError(message)

    monkeypatch.setattr(autotuner.Autotuner, "_bench", failing_bench)
    tuned = autotune(_noop, configs=[_config(64, 64), _config(32, 32)], key=[])
    if skipped:
        assert tuned._bench(config=_config(64, 64)) == [float("inf")] * 3
    else:
        with pytest.raises(RuntimeError, match=message):
            tuned._bench(config=_config(64, 64))


def test_every_flash_autotuner_skips_configs_that_fail_to_compile():
    from kernels import _flash_bwd, _flash_fwd

    tuned = [getattr(m, n) for m in (_flash_fwd, _flash_bwd) for n in dir(m) if n.endswith("_tuned")]
    assert len(tuned) == 4  # forward, dk/dv, dk/dv with atomic dq, dq
    assert all(t._bench.__name__ == "bench_or_skip" for t in tuned)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the interpreter's launch path, every launch through Autotuner.run (runs in CI, on the CPU); on "
    "an H200 these calls never reached Autotuner.run (benchmarks/results/s68/call6)",
)
@pytest.mark.parametrize("route", ["dense", "varlen", "in_place"])
def test_every_buffer_the_autotuner_restores_can_be_written_back(monkeypatch, route):
    """While tuning, the autotuner copies its `restore_value` buffers back after each trial run
    (`buf.copy_(saved)`): a buffer handed over as an expanded view (varlen's batch-stride-0 views)
    made that copy raise on the GPU. The interpreter never tunes, so do the copy at every launch."""
    import torch
    from triton.runtime.autotuner import Autotuner

    from kernels import flash_attention, flash_attention_varlen
    from kernels._flash_bwd import flash_attn_backward
    from kernels._flash_fwd import flash_attn_forward

    restored = []
    launch = Autotuner.run

    def run_after_a_write_back(self, *args, **kwargs):
        named = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        for name in self.restore_value:
            named[name].copy_(named[name].clone())  # the post-hook's write-back, with the same values
            restored.append(name)
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", run_after_a_write_back)
    torch.manual_seed(0)
    heads, dim = 2, 16
    if route == "varlen":
        cu = torch.tensor([0, 5, 12], dtype=torch.int32)
        q, k, v = (torch.randn(12, heads, dim, requires_grad=True) for _ in range(3))
        flash_attention_varlen(q, k, v, cu, cu, 7, 7, causal=True).sum().backward()
    elif route == "dense":
        q, k, v = (torch.randn(2, 9, heads, dim, requires_grad=True) for _ in range(3))
        flash_attention(q, k, v, causal=True).sum().backward()
    else:  # the ring's step updates, which write into caller-owned fp32 buffers
        q, k, v = (torch.randn(1, 9, heads, dim) for _ in range(3))
        out_acc, lse_acc = torch.zeros(1, 9, heads, dim), torch.full((1, heads, 9), float("-inf"))
        flash_attn_forward(q, k, v, sm_scale=dim**-0.5, win_left=None, win_right=None, key_padding_mask=None,
                           dropout_p=0.0, seed=0, merge_into=(out_acc, lse_acc))  # fmt: skip
        out, lse2 = flash_attn_forward(q, k, v, sm_scale=dim**-0.5, win_left=None, win_right=None,
                                       key_padding_mask=None, dropout_p=0.0, seed=0)  # fmt: skip
        grads = tuple(torch.zeros_like(t) for t in (q, k, v))
        flash_attn_backward(torch.randn_like(q), q, k, v, out, lse2, sm_scale=dim**-0.5, win_left=None,
                            win_right=None, key_padding_mask=None, dropout_p=0.0, seed=0, grads_into=grads)  # fmt: skip
    assert {"O", "LSE", "DK", "DV", "DQ"} <= set(restored)


def test_a_slow_config_is_timed_from_one_run_after_its_warm_up():
    """A ring step at 1M tokens runs for seconds; Triton's benchmarker would run it ~8 times."""
    from kernels._common import SLOW_KERNEL_MS, bench_config

    runs = []

    def timed(fn):
        fn()
        return SLOW_KERNEL_MS * 5

    def full_bench(fn, quantiles):
        raise AssertionError("a slow launch must not get the full benchmark")

    quantiles = (0.5, 0.2, 0.8)
    ms = bench_config(
        lambda: runs.append(1), quantiles, time_ms=timed, full_bench=full_bench, sync=lambda: None
    )
    assert ms == [SLOW_KERNEL_MS * 5] * 3
    assert len(runs) == 2  # the warm-up (and compile) run, then the timed one


def test_a_fast_config_gets_the_full_benchmark():
    from kernels._common import SLOW_KERNEL_MS, bench_config

    def timed(fn):
        fn()
        return SLOW_KERNEL_MS / 10

    full = []
    ms = bench_config(lambda: None, (0.5, 0.2, 0.8), time_ms=timed, sync=lambda: None,
                      full_bench=lambda fn, quantiles: full.append(quantiles) or [0.1, 0.09, 0.11])  # fmt: skip
    assert ms == [0.1, 0.09, 0.11] and full == [(0.5, 0.2, 0.8)]


def test_a_split_dkdv_pass_keeps_the_tiles_one_accumulator_allows():
    """At head dim 256 two fp32 accumulators of 128 keys x 256 need 256 registers a thread (pruned);
    the split passes hold one, so the same tile survives (the reason for SPLIT_DKDV_ABOVE)."""
    from kernels._flash_bwd import _prune_dkdv

    wide = [_config(64, 128, 8, 1), _config(32, 64, 8, 2), _config(16, 32, 4, 1)]
    args = dict(seqlen_q=4096, seqlen_k=4096, BLOCK_D=256, DOT_PREC="tf32", DROPOUT=False)
    assert (64, 128) not in _tiles(_prune_dkdv(wide, {**args, "PART": 0}))
    assert (64, 128) in _tiles(_prune_dkdv(wide, {**args, "PART": 1}))


@triton.jit
def _write_block(x_ptr, n, BLOCK: triton.language.constexpr):  # noqa: N803 (Triton constexpr)
    triton.language.store(x_ptr, BLOCK + n * 0)


def test_a_tuned_key_launches_its_config_without_retuning(monkeypatch, device):
    """The fast path of our autotuners: a key tuned once launches its recorded config without Triton's
    `Autotuner.run` (its per-launch host cost); a new key value or a new dtype tunes again."""
    import torch
    from triton.runtime.autotuner import Autotuner

    from kernels._common import autotune

    through_triton = []
    triton_run = Autotuner.run

    def counted_run(self, *args, **kwargs):
        through_triton.append(kwargs.get("n", args[1] if len(args) > 1 else None))
        return triton_run(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", counted_run)
    configs = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})]
    tuned = autotune(_write_block, configs=configs, key=["n"])
    timed = []

    def bench(*args, config, **meta):  # 32 wins
        timed.append(config.kwargs["BLOCK"])
        return [1.0 if config.kwargs["BLOCK"] == 32 else 2.0] * 3

    tuned._bench = bench
    x = torch.zeros(1, dtype=torch.int32, device=device)
    for n in (5, 5, 6, 5):
        tuned[(1,)](x, n)
        assert int(x[0]) == 32
        x.zero_()
    assert timed == [16, 32, 16, 32]  # tuned for n=5 and n=6, once each
    tuned[(1,)](torch.zeros(1, dtype=torch.int64, device=device), 5)  # another dtype: another key
    assert timed == [16, 32, 16, 32, 16, 32]
    assert through_triton == [5, 6, 5]  # five launches, three of them tuning
    assert tuned.best_config.kwargs["BLOCK"] == 32
    # a tuned key's launch through `tuned.compiled_launch` evaluates a grid function as jit.py does: every
    # argument by name, the config's meta-parameters beside them (0 programs if either were missing), read
    # by key, by get() and by `in`; a name that is neither raises KeyError, as in jit.py's dict
    for grid in (
        lambda meta: (int(meta["n"] == 5 and meta["BLOCK"] == 32),),
        lambda meta: (int(meta.get("n") == 5 and "x_ptr" in meta and meta.get("BLOCK") == 32),),
        lambda meta: (int("nothing" not in meta and meta.get("nothing", 1) == 1),),
    ):
        x = torch.zeros(1, dtype=torch.int32, device=device)
        tuned[grid](x, 5)
        assert int(x[0]) == 32 and through_triton == [5, 6, 5]
    with pytest.raises(KeyError, match="nothing"):
        tuned[lambda meta: (meta["nothing"],)](x, 5)
