"""Host time of eager attention calls with a session's host trims against without them, the two
alternating in one process (GPU only; host time varies by a third between processes, results/s35/call1
and s50/call2).

`--trims s50`: a block-sparse backward takes its forward's answer on the Hopper kernels
(`_block_sparse_hopper.usable_backward`'s forward_hopper) instead of checking q, k and v again, and
`_hopper_pipeline.tma_ready` is a plain loop. "untrimmed" puts back the full check and the all()-over-a-
generator form (the patch: results/s50/host_trim.patch; its third change, dq/dk/dv by empty_like, stays
in both ways).
`--trims s64`: host-side `cdiv` is plain integer arithmetic (`kernels._common.cdiv`) instead of Triton
3.6's `triton.cdiv`, a constexpr function, and the plain Triton kernels (the backward's delta preprocess,
the decode split and merge kernels, the portable kernels' tuned keys) launch through
`_launch.CompiledLaunch` instead of `kernel[grid](...)`; "untrimmed" puts them back.
`--trims s89`: the autotuned portable kernels' tuned launches (`_common._cached_config_run`) key their config
on the specialization of every argument, which the compiled launch then takes as its own key, and give a grid
function the arguments by name only as it reads them; "untrimmed" puts back a pass over the arguments for
their dtypes (the compiled launch specializing them again) and a dict of every argument by name.
`--trims s67`: a call no gradient can flow from (`inference`: a causal forward under no_grad) runs the
forward's launcher directly, not through the autograd Function and the op (`_common.inference_call`);
"untrimmed" sends it through them, as before session 67. `--trims s68`: the same for `block_sparse_attention`
(`block_sparse_inference`: a butterfly forward under no_grad; untrimmed, through its autograd Function;
`generate_block_sparse`: the generate path's model with block-sparse attention, which until session 69
ran the whole sequence again for each new token; since then it steps through its KV caches).

Cases as `check_launch_encoding.py`'s: (1, seqlen, 16, headdim) bf16, block-sparse (butterfly, 2 factors;
block_sparse_long: 5 factors and 8 local blocks, d128's one-kernel backward) and dense causal
(dense_window: with a window of a quarter of the sequence, the portable kernels);
`fwdbwd_ms` one eager fwd+bwd, calls issued back to back; `decode`: one token against a full cache of
seqlen entries (`flash_decode`, 16 heads), `decode_ms`; `inference` / `block_sparse_inference`: the dense /
block-sparse case's forward under no_grad, `inference_ms`; `generate`: GPT-2 medium's shape in heads of
headdim, a seqlen-token prompt and 16 greedy tokens a call, `generate_ms`.

    python benchmarks/ab_host_trims.py --trims s64 --out host_trims.json
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import types

import torch
import triton
from triton.runtime.autotuner import Autotuner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_host_overhead import alternating_host_ms  # noqa: E402
from benchmarks.check_launch_encoding import case_fns  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from kernels import (  # noqa: E402
    _block_sparse_hopper,
    _common,
    _flash_bwd,
    _flash_bwd_fused_hopper,
    _flash_dkdv_hopper,
    _flash_dq_hopper,
    _flash_fwd,
    _flash_fwd_hopper,
    _grad_sums,
    _hopper_pipeline,
    decode,
    flash_decode,
)

TRIMMED = (_hopper_pipeline.tma_ready, _block_sparse_hopper.usable_backward)


def _tma_ready_untrimmed(t) -> bool:
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all((s * size) % 16 == 0 for s in t.stride()[:-1])


def _usable_backward_untrimmed(*args, forward_hopper=None, **kwargs) -> bool:
    return TRIMMED[1](*args, **kwargs)  # (forward_hopper dropped: q, k, v checked again)


WAYS = {"trimmed": TRIMMED, "untrimmed": (_tma_ready_untrimmed, _usable_backward_untrimmed)}


def use(way: str) -> None:
    _hopper_pipeline.tma_ready, _block_sparse_hopper.usable_backward = WAYS[way]


# session 64's: the modules that call cdiv on the host (and session 78's GQA dK / dV sums), and the plain
# kernels' launches (the delta preprocess, the decode split and merge kernels)
CDIV_MODULES = (_block_sparse_hopper, _flash_bwd, _flash_bwd_fused_hopper, _flash_dkdv_hopper, _flash_dq_hopper,
                _flash_fwd, _flash_fwd_hopper, _grad_sums, decode)  # fmt: skip
LAUNCHES = (
    (_flash_bwd, "_launch_preprocess", _flash_bwd._bwd_preprocess),
    (decode, "_launch_split", decode._decode_split),
    (decode, "_launch_merge", decode._decode_merge),
    # the autotuned portable kernels' tuned keys (`_common._cached_config_run`)
    *((tuned, "compiled_launch", tuned.fn) for tuned in (_flash_fwd._attn_fwd_tuned, _flash_bwd._bwd_dq_tuned,
                                                         _flash_bwd._bwd_dkdv_tuned)),
)  # fmt: skip


def through_jit(kernel):
    """A CompiledLaunch's call signature over Triton's own `kernel[grid](...)` (as before session 64)."""

    def launch(grid, descriptors, args, kwargs) -> None:
        kernel[grid](*args, **kwargs)

    return launch


WAYS_S64 = {
    "trimmed": (_common.cdiv, *(getattr(module, name) for module, name, _ in LAUNCHES)),
    "untrimmed": (triton.cdiv, *(through_jit(kernel) for _, _, kernel in LAUNCHES)),
}


def use_s64(way: str) -> None:
    cdiv, *launches = WAYS_S64[way]
    for module in CDIV_MODULES:
        module.cdiv = cdiv
    for (module, name, _), launch in zip(LAUNCHES, launches, strict=True):
        setattr(module, name, launch)


FLASH_ATTENTION = importlib.import_module("kernels.flash_attention")  # (the package exports the function)
BLOCK_SPARSE = importlib.import_module("kernels.block_sparse")
INFERENCE_WAYS = {"trimmed": _common.inference_call, "untrimmed": lambda *tensors: False}


def routes_inference(module):
    """A trim set switching how `module` routes a call no gradient can flow from: trimmed, straight to the
    forward's launcher (`_common.inference_call`); untrimmed, through the autograd Function, as before."""

    def use_way(way: str) -> None:
        module.inference_call = INFERENCE_WAYS[way]

    return use_way


TUNED = (_flash_fwd._attn_fwd_tuned, _flash_bwd._bwd_dq_tuned, _flash_bwd._bwd_dkdv_tuned)


def run_before_s89(tuned):
    """`_common._cached_config_run(tuned)` as it was before session 89: its config key read the tensors'
    dtypes in a pass of its own (the compiled launch then specialized every argument again), and a grid
    function got a dict of every argument by name."""
    base_run, chosen = types.MethodType(Autotuner.run, tuned), {}
    positions = [(name, tuned.arg_names.index(name)) for name in tuned.keys if name in tuned.arg_names]

    def run(*args, **kwargs):
        key = tuple(
            kwargs[n] if n in kwargs else args[i] for n, i in positions if n in kwargs or i < len(args)
        )
        key += tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
        config = chosen.get(key) if len(tuned.configs) > 1 else None
        if config is None or config.pre_hook is not None:
            ret = base_run(*args, **kwargs)
            chosen[key] = tuned.best_config
            return ret
        tuned.best_config = config
        grid, meta = kwargs["grid"], {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        meta.update(config.all_kwargs())
        if callable(grid):
            grid = grid(dict(zip(tuned.arg_names, args, strict=False)) | meta)
        tuned.compiled_launch(grid, (), args, meta)

    return run


# each tuned kernel's own `run` (`_cached_config_run`'s, where it has several configs; None under the interpreter's
# one config: Triton's Autotuner.run, from the class), and the untrimmed runs, built once so that their keys stay tuned
WAYS_S89 = {
    "trimmed": tuple(t.__dict__.get("run") for t in TUNED),
    "untrimmed": tuple(map(run_before_s89, TUNED)),
}


def use_s89(way: str) -> None:
    for tuned, run in zip(TUNED, WAYS_S89[way], strict=True):
        # (None: back to the class's method; an instance attribute would hide a patch of Autotuner.run)
        if run is None:
            tuned.__dict__.pop("run", None)
        else:
            tuned.run = run


TRIM_SETS = {"s50": use, "s64": use_s64, "s67": routes_inference(FLASH_ATTENTION),
             "s68": routes_inference(BLOCK_SPARSE), "s89": use_s89}  # fmt: skip


def decode_step(seqlen: int, headdim: int):
    """One new token of (1, 1, 16, headdim) bf16 against a full cache of seqlen entries (`flash_decode`)."""
    q, k_cache, v_cache = (
        torch.randn(1, n, 16, headdim, device="cuda", dtype=torch.bfloat16) for n in (1, seqlen, seqlen)
    )
    lengths = torch.full((1,), seqlen, device="cuda", dtype=torch.int32)
    return lambda: flash_decode(q, k_cache, v_cache, lengths)


# the no_grad forwards the s67 / s68 trims route: each the forward of `check_launch_encoding.case_fns`' case
INFERENCE_CASES = {"inference": "dense", "block_sparse_inference": "block_sparse"}


NEW_TOKENS = 16  # (the generate path's tokens a call)


def generation(seqlen: int, headdim: int, attention: str = "auto"):
    """GPT-2 medium's shape (24 layers, width 1024 in heads of headdim), bf16, random weights: a prompt of
    seqlen tokens, then NEW_TOKENS greedy tokens, each attending to its layers' caches (`flash_decode`;
    with attention="block_sparse", butterfly on 128-blocks, through the layout's rows, and before session
    69 by running the whole sequence again)."""
    from flashtrain.generate import generate
    from flashtrain.models.gpt import GPT, GPTConfig

    cfg = GPTConfig(n_layer=24, n_head=1024 // headdim, d_model=1024, vocab_size=50304,
                    max_seq_len=seqlen + NEW_TOKENS, attention=attention)  # fmt: skip
    model = GPT(cfg).to("cuda", torch.bfloat16)
    prompt = torch.randint(0, cfg.vocab_size, (1, seqlen), device="cuda")
    # eager steps, as session 64 measured them: the host-bound loop these trims target (since session 65
    # `generate` replays a captured graph per token from 8 steps on)
    return lambda: generate(model, prompt, NEW_TOKENS, temperature=0, cuda_graph=False)


def timed_fn_name(path: str) -> str:
    """What a path's rows time: "decode", "inference", "generate", or an attention call's "fwdbwd"."""
    if path in INFERENCE_CASES:
        return "inference"
    if path.startswith("generate"):
        return "generate"
    return "decode" if path == "decode" else "fwdbwd"


def measure(trims: str, path: str, seqlen: int, headdim: int, batches: int, calls: int) -> dict:
    """Host time per call both ways: `{way}_{fn}_ms`, fn "fwdbwd" (attention paths), "decode" or
    "generate" (one call: a prompt's prefill and NEW_TOKENS tokens)."""
    switch = TRIM_SETS[trims]
    fn_name = timed_fn_name(path)
    if path == "decode":
        fn = decode_step(seqlen, headdim)
    elif path in INFERENCE_CASES:
        fn = case_fns(INFERENCE_CASES[path], seqlen, headdim)[1]
    elif path == "generate":
        fn = generation(seqlen, headdim)
    elif path == "generate_block_sparse":
        fn = generation(seqlen, headdim, attention="block_sparse")
    else:
        fn = case_fns(path, seqlen, headdim)[0]
    switches = {way: (lambda way=way: switch(way)) for way in ("trimmed", "untrimmed")}
    times = alternating_host_ms(switches, {fn_name: fn}, batches, calls)
    switch("trimmed")
    row = dict(trims=trims, path=path, seqlen=seqlen, headdim=headdim, nheads=16, batch=1, batches=batches,
               calls=calls)  # fmt: skip
    for (way, _), values in times.items():
        row[f"{way}_{fn_name}_ms"] = round(statistics.median(values), 4)
        row[f"{way}_{fn_name}_range"] = [round(min(values), 4), round(max(values), 4)]
    # untrimmed / trimmed: above 1 where the trims save host time
    row["ratio"] = round(row[f"untrimmed_{fn_name}_ms"] / row[f"trimmed_{fn_name}_ms"], 3)
    # the same per batch (both ways back to back): the host's pace drifts within a process by up to 2x
    # (results/s64/call4), which the medians of each way see and the pairs mostly do not
    paired = paired_ratios(times["untrimmed", fn_name], times["trimmed", fn_name])
    row["paired_ratio"] = round(statistics.median(paired), 3)
    row["paired_ratio_range"] = [round(min(paired), 3), round(max(paired), 3)]
    return row


def paired_ratios(slower: list, faster: list) -> list:
    """Per batch, slower's time ÷ faster's (the two ways timed back to back in that batch)."""
    return [a / b for a, b in zip(slower, faster, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trims", choices=list(TRIM_SETS), default="s64")
    parser.add_argument("--paths", nargs="+", default=["block_sparse", "block_sparse_long", "dense"],
                        choices=["block_sparse", "block_sparse_long", "dense", "dense_window", "decode", *INFERENCE_CASES,
                                 "generate", "generate_block_sparse"])  # fmt: skip
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for headdim in args.headdims:
        for path in args.paths:
            row = measure(args.trims, path, args.seqlen, headdim, args.batches, args.calls)
            rows.append(row)
            fn_name = timed_fn_name(path)
            print(
                f"{args.trims} {path:17s} n{args.seqlen} d{headdim}: {fn_name} {row[f'trimmed_{fn_name}_ms']:.3f} ms "
                f"trimmed, {row[f'untrimmed_{fn_name}_ms']:.3f} untrimmed ({row['ratio']:.3f}x; per batch "
                f"{row['paired_ratio']:.3f}x, {row['paired_ratio_range'][0]:.3f}-{row['paired_ratio_range'][1]:.3f})",
                flush=True,
            )
    write_results(args.out, rows, extra=dict(dtype="bfloat16"))


if __name__ == "__main__":
    main()
