"""Configuration of the training loop (kept apart from trainer.py so configs import no torch code paths)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerConfig:
    """The training loop: batch geometry, schedule of evals/checkpoints, precision, failure policy."""

    run_name: str = "default"  # names the run directory and the W&B run (its id derives from it)
    out_dir: str = "runs"  # run directories go under here
    seq_len: int = 256  # tokens per training sequence
    batch_size: int = 8  # sequences per micro-batch on each data-parallel rank
    grad_accum: int = 1  # micro-batches per optimizer step
    global_batch: int | None = (
        None  # sequences per optimizer step; if set, must equal batch_size·grad_accum·dp
    )
    max_steps: int = 300  # optimizer steps
    eval_interval: int = 100  # steps between evaluations (0 = never; the last step always evaluates)
    eval_batches: int = 8  # validation micro-batches per evaluation
    log_interval: int = 10  # steps between metric logs
    checkpoint_interval: int = 100  # steps between checkpoints (0 = only at the end)
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    resume: str = "false"  # "false": start over; "true": continue (error if no checkpoint); "auto": if any
    seed: int = 1337  # model init, dropout and data order
    device: str = "auto"  # "auto" (cuda if present), "cpu" or "cuda"
    precision: str = "auto"  # "auto" (bf16 autocast on CUDA, fp32 on CPU), "bf16" or "fp32"
    compile: bool = False  # torch.compile each block
    # with compile: replay each compiled block's kernels from CUDA graphs (torch.compile's
    # "reduce-overhead" mode), so the host launches one graph per block instead of each kernel. One GPU,
    # no activation checkpointing, no attention dropout. GPT-2 medium 1k on an H100: 183.0k tokens/s
    # twice, against 168k-183k without (benchmarks/NOTES_attention.md, session 30).
    cuda_graphs: bool = False
    activation_checkpointing: bool = False  # recompute block activations in the backward
    nan_policy: str = "stop"  # non-finite loss: "stop" the run, or "skip" the step
    max_skipped_steps: int = 10  # with nan_policy=skip: stop after this many consecutive skips
    peak_tflops: float | None = None  # per-device peak for MFU; None = known bf16 peak of the GPU, or no MFU
    progress_bar: bool = True  # tqdm bar on rank 0
    # Wall-clock seconds this process may train, counted from the trainer's construction (data set-up
    # included): then it checkpoints and stops as on a preemption signal, to resume with resume=auto.
    # For fixed-length leases; None = no limit.
    time_limit_s: float | None = None
    # Python's garbage collector: automatic collection off during fit() and a young-generation
    # collection every gc_every steps (0 = Python's own schedule), so that no full collection lands
    # inside a step (flashtrain/gc_schedule.py).
    gc_every: int = 50

    def __post_init__(self):
        counts = ("seq_len", "batch_size", "grad_accum", "max_steps", "keep_checkpoints", "log_interval")
        for name in (*counts, "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name}={getattr(self, name)} must be >= 1")
        # 0 means never (evaluations, periodic checkpoints) or no tolerance (skipped steps) for these
        for name in ("eval_interval", "checkpoint_interval", "max_skipped_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name}={getattr(self, name)} must be >= 0")
        if self.global_batch is not None and self.global_batch < 1:
            raise ValueError(f"trainer.global_batch={self.global_batch} must be >= 1, or null (not checked)")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(
                f"trainer.peak_tflops={self.peak_tflops} must be > 0, or null (the GPU's known bf16 peak)"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"trainer.device={self.device!r}; choose auto, cpu or cuda")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"trainer.precision={self.precision!r}; choose auto, bf16 or fp32")
        # Hydra hands `trainer.resume=true` to this str field as "True".
        self.resume = str(self.resume).lower()
        if self.resume not in ("false", "true", "auto"):
            raise ValueError(
                f"trainer.resume={self.resume!r}; choose false (start over), true (continue from the latest "
                "checkpoint) or auto (continue if there is one, else start: what requeued Slurm jobs use)"
            )
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(
                f"trainer.time_limit_s={self.time_limit_s} must be > 0 seconds, or null for no limit"
            )
        if self.gc_every < 0:
            raise ValueError(
                f"trainer.gc_every={self.gc_every} must be >= 0 (0 = Python's automatic collection)"
            )
        if self.cuda_graphs and not self.compile:
            raise ValueError(
                "trainer.cuda_graphs=true replays the compiled blocks: set trainer.compile=true too"
            )
        if self.cuda_graphs and self.activation_checkpointing:
            raise ValueError(
                "trainer.cuda_graphs=true cannot replay blocks recomputed by activation checkpointing; "
                "set one of trainer.cuda_graphs and trainer.activation_checkpointing to false"
            )
        if self.nan_policy not in ("stop", "skip"):
            raise ValueError(f"trainer.nan_policy={self.nan_policy!r}; choose stop or skip")
        if not self.run_name or "/" in self.run_name:
            raise ValueError(f"trainer.run_name={self.run_name!r} must be a non-empty name without '/'")
