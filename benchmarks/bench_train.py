"""End-to-end GPT training throughput: tokens/s and MFU per attention backend and context length.

Each row is one (model, seqlen, attention) configuration trained for a few steps with what a real run
uses: bf16 autocast, fused AdamW, per-block torch.compile, the chunked loss, a fixed number of tokens
per step. MFU counts 6·params + 6·L·d·T FLOPs per token (causal attention: half of 12·L·d·T) against
the bf16 matmul peak *measured in the same run*.

For SDPA, the requested backend is pinned with `sdpa_kernel` and then checked: one profiled step must
show that backend's kernels (under torch.compile a silent fallback to another backend is possible).

Besides the mean, each row keeps every timed step's host and device ms and CPU time (`step_spans`): a
short-context row is often bound by the host, whose speed varies between processes on a shared machine,
and these tell such a run from one whose device work is slow. `--gpu-clocks` adds the SM clock, power,
temperature and slowdown reasons the GPU ran at (nvidia-smi), run-wide and step by step.

An H200 training GPT-2 medium runs at its power cap (~690-700 W). After the GPU has idled for a second
the draw climbs back to the cap over ~1 s, and as it reaches it the driver pulls the SM clock from
~1900 MHz to 1400-1500 for a step or two (steps 10-20% longer). The timed steps therefore start only
after `--warmup-s` seconds of un-timed steps right before them, which come after everything that idles
the GPU (the kernel-name pass, the gc schedule's first full collection, nvidia-smi's start), and there
are 30 of them. Without that the rows of one run, same kernels, differed by up to 1.6% where the host
kept pace; with it by 0.03-0.5% (benchmarks/RESULTS.md, sessions 79-80).

    python benchmarks/bench_train.py --models gpt2_small,gpt2_medium --seqlens 1024,4096,8192,16384
    python benchmarks/bench_train.py --models gpt2_medium --seqlens 8192 --impls triton \
        --activation-checkpointing   # as experiment=gpt2_medium_8k trains
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (  # noqa: E402
    clocks_per_step,
    device_gaps,
    device_profile,
    gpu_clock_log,
    gpu_slug,
    host_profile,
    is_oom,
    markdown_table,
    run_for,
    write_results,
)
from flashtrain.gc_schedule import scheduled_gc  # noqa: E402
from flashtrain.models.gpt import GPT, GPTConfig  # noqa: E402
from flashtrain.optim import OptimConfig, build_optimizer  # noqa: E402
from flashtrain.parallelize import apply_ac, apply_compile  # noqa: E402

MODELS = {
    "gpt2_small": dict(n_layer=12, n_head=12, d_model=768),
    "gpt2_medium": dict(n_layer=24, n_head=16, d_model=1024),
    # GPT-2 medium's width in 8 heads of 128: GPT-2's heads are 64 wide, and where ours and cuDNN differ
    # most is head dim 128, where `auto` takes ours over cuDNN on sm_90 (`ours_beats_cudnn`, timed with this)
    "gpt2_medium_d128": dict(n_layer=24, n_head=8, d_model=1024),
    # the same under GQA, 4 query heads a kv head (Llama-like): where cuDNN and our deterministic
    # backward's routes under GQA meet (`kernels._flash_bwd.ORDERED_GQA_EXPANDED`)
    "gpt2_medium_d128_gqa": dict(n_layer=24, n_head=8, n_kv_head=2, d_model=1024),
}
# impl -> (model attention backend, SDPA backend to pin, substring its kernels' names must contain;
# "" records the attention kernels that ran without checking them: the unpinned rows, which show
# what PyTorch's own SDPA choice and our `auto` backend run)
IMPLS = {
    "eager": ("reference", None, None),
    # "pytorch_flash", not "flash": cuDNN's own kernels are named "..._sdpa_sm90_flash_...".
    "sdpa_flash": ("sdpa", "FLASH_ATTENTION", "pytorch_flash"),
    "sdpa_cudnn": ("sdpa", "CUDNN_ATTENTION", "cudnn"),
    "sdpa_default": ("sdpa", None, ""),
    "auto": ("auto", None, ""),
    "triton": ("triton", None, "attn"),
    # deterministic=False: checked that the one-kernel backward ran (kernels/_flash_bwd_fused_hopper.py)
    "triton_nondeterministic": ("triton_nondeterministic", None, "attn_bwd_fused"),
}


# substrings of attention kernels' names: the backends' and ours (our portable and block-sparse kernels'
# names carry no "attn": without them their time dropped out of the tallies, as the portable dq did from
# ab_train_route.py's first GPU run, results/s60/call1)
ATTENTION_HINTS = ("flash", "cudnn", "sdpa", "fmha", "attn", "attention", "mem_eff", "_bwd_dq", "_bwd_dkdv",
                   "_bwd_preprocess", "_bs_fwd", "_bs_bwd", "_decode_", "_sum_grad_groups")  # fmt: skip


def matmul_peak_tflops(n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()  # host-device sync: the timing needs the work finished
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


@contextlib.contextmanager
def sdpa_context(backend_name: str | None):
    """Pin SDPA to one backend. Compiled graphs are not reused from the caches on disk meanwhile: their
    keys do not include the pinned backend, so a cuDNN row could load the graph a flash row compiled
    (which is how an earlier run's cuDNN rows ran the flash kernel)."""
    if backend_name is None:
        yield
        return
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with (
        sdpa_kernel([getattr(SDPBackend, backend_name)]),
        inductor_config.patch(fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        yield


def kernel_names(step) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})


def chosen_attention_tiles() -> dict[str, list[str]]:
    """The tile configs our attention kernels' autotuners chose in this process, per kernel: which
    tiles a row's numbers ran (an autotuner can choose differently from one process to the next)."""
    from kernels import _flash_bwd, _flash_fwd

    tuners = {
        "fwd": _flash_fwd._attn_fwd_tuned,
        "dq": _flash_bwd._bwd_dq_tuned,
        "dkdv": _flash_bwd._bwd_dkdv_tuned,
    }
    return {name: sorted({str(c) for c in t.cache.values()}) for name, t in tuners.items() if t.cache}


def training_step(
    model_name, seqlen, backend, tokens_per_step, compile_scope="blocks", checkpointing=False, loss_chunk=None,
    attn_dropout=0.0, compile_mode=None,
):  # fmt: skip
    """(step, model, its config, batch): one training step of the model on the attention backend as a
    real run takes it (bf16 autocast, fused AdamW, compiled per compile_scope, a fixed batch of random
    tokens); step() returns the loss."""
    batch = max(1, tokens_per_step // seqlen)
    chunk = {} if loss_chunk is None else dict(loss_chunk=loss_chunk)  # None: the model's default
    cfg = GPTConfig(
        **MODELS[model_name],
        vocab_size=50304,
        max_seq_len=seqlen,
        attention=backend,
        attn_dropout=attn_dropout,
        **chunk,
    )
    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    if checkpointing:  # as the trainer does: each block's forward compiled inside its checkpoint
        apply_ac(model, compile_blocks=compile_scope == "blocks")
    elif compile_scope == "blocks":
        apply_compile(model, mode=compile_mode)
    if compile_scope == "model":  # embeddings, blocks and loss in one compiled program
        model.compile(mode=compile_mode)
    graphs = compile_mode == "reduce-overhead"
    optimizer = build_optimizer(model, OptimConfig(lr=1e-4, fused=True))
    x = torch.randint(0, 50257, (batch, seqlen), device="cuda")
    y = torch.randint(0, 50257, (batch, seqlen), device="cuda")

    def step():
        if graphs:  # the previous step's graph outputs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step, model, cfg, batch


def bench_one(
    model_name,
    seqlen,
    impl,
    tokens_per_step,
    steps,
    warmup,
    compile_scope,
    peak,
    checkpointing=False,
    loss_chunk=None,
    profile_steps=0,
    host_profile_steps=0,
    gc_every=50,
    attn_dropout=0.0,
    profile_top=12,
    gap_steps=0,
    compile_mode=None,
    profile_ops=0,
    kernel_callers=None,
    gpu_clocks=False,
    warmup_s=0.0,
):
    backend, sdpa_backend, marker = IMPLS[impl]
    step, model, cfg, batch = training_step(
        model_name, seqlen, backend, tokens_per_step, compile_scope, checkpointing, loss_chunk, attn_dropout,
        compile_mode,
    )  # fmt: skip
    graphs = compile_mode == "reduce-overhead"
    row = dict(model=model_name, impl=impl, seqlen=seqlen, batch=batch, tokens_per_step=batch * seqlen,
               activation_checkpointing=checkpointing, compile=compile_scope, compile_mode=compile_mode, loss_chunk=cfg.loss_chunk,
               attn_dropout=attn_dropout,
               gc_every=gc_every)  # fmt: skip
    with sdpa_context(sdpa_backend):
        for _ in range(warmup):
            step()
        names = kernel_names(step) if marker is not None else []
        # garbage collection on the trainer's schedule (trainer.gc_every), from a clean heap, and the GPU's
        # clock and power sampled beside the timed steps when asked: both start before the settle steps (a
        # full collection after compiling, and nvidia-smi's start, each idle the GPU for up to a second)
        clocks = gpu_clock_log() if gpu_clocks else contextlib.nullcontext({})
        with scheduled_gc(gc_every) as collect_after, clocks as clock_summary:
            # (the GPU's power and clock settled, see the top)
            row["settle_steps"] = run_for(step, warmup_s, after_step=collect_after)
            torch.cuda.reset_peak_memory_stats()
            # each step's host time and device time (events between steps), so a run that is slow overall
            # can be told apart from one step that stalled
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
            clock_summary["window_start_s"] = time.time()  # (the clock figures describe the timed steps)
            samples = [host_sample()]
            start = samples[0][0]
            marks[0].record()
            for i in range(steps):
                loss = step()
                collect_after(i + 1)
                marks[i + 1].record()
                samples.append(host_sample())
            loss.item()  # host-device sync: all steps finished
            elapsed = time.perf_counter() - start
            finished_s = time.time()  # (epoch seconds, as the clock samples' timestamps)
        row.update(step_spans(samples, marks))
        if gpu_clocks:
            row["gpu_clocks"] = clock_summary
            if "trace" in clock_summary:  # which steps ran at lower clocks
                clock_summary["per_step"] = clocks_per_step(
                    clock_summary["trace"], finished_s, row["step_ms_device"]
                )
        peak_mem = torch.cuda.max_memory_allocated() / 2**30
        if profile_steps:  # where the step's time goes: device busy vs wall, the heaviest kernels
            p = device_profile(
                step, profile_steps, top=profile_top, ops=profile_ops, callers_of=kernel_callers
            )
            keys = ("wall_ms", "busy_ms", "kernels_per_step", "kernels_ms", "top_kernels_ms", "top_ops",
                    "kernel_callers")  # fmt: skip
            row.update({k: p[k] for k in keys if k in p})
        if gap_steps:  # where in the step the device idles (the host fell behind)
            row["gaps"] = device_gaps(step, gap_steps)
        if host_profile_steps:  # when the device idles: the host functions that cost the most
            row["host_top"] = host_profile(step, host_profile_steps)
    tok_s = batch * seqlen * steps / elapsed
    row.update(
        step_ms=1000 * elapsed / steps,
        tokens_per_s=tok_s,
        mfu=model.flops_per_token(seqlen) * tok_s / (peak * 1e12),
        peak_mem_gib=peak_mem,
        params_m=model.num_params() / 1e6,
    )
    if graphs:  # Inductor falls back to plain launches, with a reason, where it cannot use graphs
        from torch._dynamo.utils import counters

        row["cudagraph_skips"] = dict(counters["inductor"]).get("cudagraph_skips", 0)
    tiles = chosen_attention_tiles()
    if tiles:
        row["attention_tiles"] = tiles
    if marker:
        row["backend_verified"] = any(marker in n.lower() for n in names)
    if marker is not None:  # every attention-looking kernel that ran: which backend a call went to
        row["attention_kernels"] = [n for n in names if any(t in n.lower() for t in ATTENTION_HINTS)][:6]
    return row


def host_sample() -> tuple:
    """(wall s, this thread's CPU s, this process's CPU s, the machine's (busy, total jiffies, CPUs) or None):
    read between timed steps, so a slow step can be charged to this thread's own work, to other threads
    of the process, or to other processes taking the CPUs."""
    try:
        with open("/proc/stat") as f:  # Linux: "cpu user nice system idle iowait irq softirq steal ...",
            lines = f.read().splitlines()  # then a "cpuN ..." line per CPU
        ticks = [int(t) for t in lines[0].split()[1:9]]
        cpus = sum(line.startswith("cpu") and line[3:4].isdigit() for line in lines)
        system = (sum(ticks) - ticks[3] - ticks[4], sum(ticks), cpus)
    except (OSError, ValueError):
        system = None
    return time.perf_counter(), time.thread_time(), time.process_time(), system


def busy_cores(before: tuple | None, after: tuple | None) -> float | None:
    """The machine's busy cores between two /proc/stat readings (busy, total jiffies, CPUs): busy share
    of all jiffies times the CPU count. None without both readings."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * after[2], 1)


def step_spans(samples: list[tuple], marks: list) -> dict:
    """Per timed step, from `host_sample`s taken before the first step and after each: wall ms on the
    host, device ms (between CUDA events recorded after each step; they must have completed), this
    thread's CPU ms, the CPU ms of the process's other threads, and the machine's busy cores (None
    without /proc/stat). When the host is the bound, host and device ms agree step by step; a stall
    shows as steps far above the median."""
    spans = [
        (b[0] - a[0], b[1] - a[1], (b[2] - a[2]) - (b[1] - a[1]), busy_cores(a[3], b[3]))
        for a, b in itertools.pairwise(samples)
    ]
    return dict(
        step_ms_host=[round(1000 * s[0], 2) for s in spans],
        step_ms_device=[round(a.elapsed_time(b), 2) for a, b in itertools.pairwise(marks)],
        step_cpu_ms_main=[round(1000 * s[1], 2) for s in spans],
        step_cpu_ms_other_threads=[round(1000 * s[2], 2) for s in spans],
        step_busy_cores=[s[3] for s in spans],
    )


def set_inductor_config(parser, setting: str) -> None:
    """KEY=VALUE -> torch._inductor.config.KEY = VALUE (a Python literal), refusing unknown keys."""
    import ast

    import torch._inductor.config as inductor_config

    key, sep, text = setting.partition("=")
    *path, name = key.split(".")
    target = inductor_config
    for part in path:
        target = getattr(target, part, None)
    if not sep or target is None or not hasattr(target, name):
        parser.error(f"--inductor {setting!r}: write KEY=VALUE with KEY a torch._inductor.config setting")
    setattr(target, name, ast.literal_eval(text))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt2_small,gpt2_medium")
    parser.add_argument("--seqlens", default="1024,4096,8192,16384")
    parser.add_argument("--impls", default="eager,sdpa_flash,sdpa_cudnn,triton")
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--warmup", type=int, default=3, help="steps before the kernel-name pass (compile, autotune)"
    )
    parser.add_argument("--warmup-s", type=float, default=2.0,
                        help="then seconds of un-timed steps right before the timed ones: the GPU's power cap "
                        "and clock settle (see the top)")  # fmt: skip
    parser.add_argument(
        "--compile", choices=("blocks", "model", "none"), default="blocks",
        help="torch.compile each block (as trainer.compile=true), the whole model, or nothing",
    )  # fmt: skip
    parser.add_argument("--compile-mode", default=None, choices=("reduce-overhead", "max-autotune-no-cudagraphs"),
                        help="torch.compile's mode (default: its default)")  # fmt: skip
    parser.add_argument("--loss-chunk", type=int, default=None,
                        help="tokens per cross-entropy chunk (default: the model's, model.loss_chunk)")  # fmt: skip
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="then profile STEPS steps: device busy time and the top kernels per row")  # fmt: skip
    parser.add_argument("--profile-top", type=int, default=12, metavar="N",
                        help="with --profile: how many of the heaviest kernels each row lists")  # fmt: skip
    parser.add_argument("--profile-ops", type=int, default=0, metavar="N",
                        help="with --profile: also the N operators with the most own device time, by input shapes")  # fmt: skip
    parser.add_argument("--kernel-callers", default=None, metavar="NAME",
                        help="with --profile: the operators that launched kernels whose names contain NAME")  # fmt: skip
    parser.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                        help="set torch._inductor.config.KEY (e.g. triton.mix_order_reduction_split_size=64); repeatable")  # fmt: skip
    parser.add_argument("--gaps", type=int, default=0, metavar="STEPS",
                        help="then find where the device idles over STEPS steps (CUDA-only profiler)")  # fmt: skip
    parser.add_argument("--gpu-clocks", action="store_true",
                        help="sample the GPU's SM clock and power draw (nvidia-smi, every 100 ms) during the "
                        "timed steps: whether a row ran at the power cap")  # fmt: skip
    parser.add_argument("--host-profile", type=int, default=0, metavar="STEPS",
                        help="then cProfile STEPS steps: the host functions with the most own time")  # fmt: skip
    parser.add_argument(
        "--gc-every", type=int, default=50, metavar="STEPS",
        help="Python's garbage collector during the timed steps as the trainer runs it (trainer.gc_every): "
        "automatic collection off, a young-generation collection every STEPS steps; 0 = Python's own schedule",
    )  # fmt: skip
    parser.add_argument(
        "--activation-checkpointing", action="store_true",
        help="recompute each block in the backward (as trainer.activation_checkpointing=true)",
    )  # fmt: skip
    parser.add_argument(
        "--attn-dropout", type=float, default=0.0,
        help="dropout on the attention probabilities (model.attn_dropout; GPT-2 as released trained with 0.1)",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/train_<gpu>.json)")
    parser.add_argument(
        "--in-process", action="store_true",
        help="run every row in this process (default: each row in a fresh child process)",
    )  # fmt: skip
    parser.add_argument("--peak", type=float, default=None, help=argparse.SUPPRESS)  # set for child processes
    args = parser.parse_args()
    unknown = sorted(set(args.impls.split(",")) - set(IMPLS))
    if unknown:
        parser.error(f"unknown --impls {', '.join(unknown)}; choose from {', '.join(IMPLS)}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_train.py measures GPU training; no CUDA device is visible")
    for setting in args.inductor:
        set_inductor_config(parser, setting)
    out = args.out or f"benchmarks/results/train_{gpu_slug()}.json"
    peak = args.peak or matmul_peak_tflops()
    print(f"measured bf16 matmul peak: {peak:.0f} TFLOP/s", flush=True)
    rows = []
    for model_name in args.models.split(","):
        for seqlen in map(int, args.seqlens.split(",")):
            for impl in args.impls.split(","):
                if args.in_process:
                    row = run_row(args, model_name, seqlen, impl, peak)
                else:
                    row = run_row_in_child(model_name, seqlen, impl, peak)
                rows.append(row)
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                # rewritten after every row, so a run stopped at its time limit keeps what it measured
                write_results(out, rows, extra={"matmul_peak_tflops": peak, "compile": args.compile, "inductor": args.inductor,
                                               "cudnn_version": torch.backends.cudnn.version(),
                                               "activation_checkpointing": args.activation_checkpointing,
                                               "row_per_process": not args.in_process})  # fmt: skip
    cols = ["model", "seqlen", "impl", "tokens_per_s", "mfu", "peak_mem_gib", "backend_verified", "error"]
    table = markdown_table(rows, cols, floatfmt="{:.3f}")
    with open(out.replace(".json", ".md"), "w") as f:
        f.write(f"bf16 matmul peak measured: {peak:.0f} TFLOP/s\n\n{table}\n")
    print(table)


def run_row(args, model_name, seqlen, impl, peak) -> dict:
    try:
        row = bench_one(
            model_name,
            seqlen,
            impl,
            args.tokens_per_step,
            args.steps,
            args.warmup,
            args.compile,
            peak,
            args.activation_checkpointing,
            args.loss_chunk,
            args.profile,
            args.host_profile,
            args.gc_every,
            args.attn_dropout,
            args.profile_top,
            args.gaps,
            args.compile_mode,
            args.profile_ops,
            args.kernel_callers,
            args.gpu_clocks,
            args.warmup_s,
        )
    except Exception as e:  # one failing row must not lose the others
        if not is_oom(e):
            import traceback

            traceback.print_exc()  # a bare assertion's message says nothing of where it came from
            print(f"{model_name} {seqlen} {impl}: {type(e).__name__}: {e}", flush=True)
        row = dict(model=model_name, impl=impl, seqlen=seqlen, error="OOM" if is_oom(e) else repr(e)[:300])
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def run_row_in_child(model_name, seqlen, impl, peak) -> dict:
    """One row in a fresh process, with this run's other options, so that no row inherits another's
    compiled graphs, autotuning, allocator state or SDPA pin. (It does not remove the run-to-run spread
    of host-bound rows: the lent machine's host runs the same step's work 1.5-2x slower in some
    processes, so GPT-2 small 1k measured 331k-507k tokens/s with our kernel and 398k-501k with SDPA
    cuDNN; benchmarks/RESULTS.md, session 56.)"""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        # this run's options, then the row's: argparse keeps the last value given for an option
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--in-process", "--models", model_name,
               "--seqlens", str(seqlen), "--impls", impl, "--peak", str(peak), "--out", out]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                return json.load(f)["rows"][0]
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return dict(
        model=model_name,
        impl=impl,
        seqlen=seqlen,
        error=f"child exit {done.returncode}: {' | '.join(tail)}"[:300],
    )


if __name__ == "__main__":
    main()
