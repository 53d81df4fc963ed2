"""The training loop: AdamW with warmup + cosine, gradient accumulation, clipping, mixed precision,
periodic evaluation, atomic checkpoints with exact resume, tokens/s and MFU, W&B tracking."""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import math
import os
import random
import sys
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from flashtrain import checkpoint as ckpt
from flashtrain.config import TrainConfig
from flashtrain.distributed.context import sequence_parallel
from flashtrain.distributed.parallel_dims import ParallelDims
from flashtrain.gc_schedule import GCSchedule
from flashtrain.log import get_logger
from flashtrain.models.attention import attention_override, check_backend_device
from flashtrain.models.block_sparse import unused_layout_settings
from flashtrain.optim import lr_at
from flashtrain.parallelize import ParallelConfig
from flashtrain.preemption import PreemptionHandler, requeue_slurm_job
from flashtrain.strategy import build_strategy, import_deepspeed
from flashtrain.tasks import build_task
from flashtrain.tracking import Tracker

log = get_logger()

# Dense bf16 peaks from the vendors' datasheets (TFLOP/s per GPU), used for MFU unless
# trainer.peak_tflops gives a measured one.
KNOWN_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


class NonFiniteLossError(RuntimeError):
    pass


def _peak_tflops(cfg_peak: float | None, device: torch.device) -> float | None:
    if cfg_peak is not None:
        return cfg_peak
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in KNOWN_PEAK_TFLOPS.items() if k in name), None)


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def check_parallel_degrees(cfg: TrainConfig, world_size: int) -> None:
    """The parallel degrees against the number of processes (torchrun's WORLD_SIZE)."""
    par = cfg.parallel
    if par.sp > 1 and world_size == 1:  # before the divisibility check, which would also catch it
        raise ValueError(
            f"parallel.sp={par.sp} needs {par.sp} processes or a multiple of it; launch with torchrun "
            "--nproc_per_node, or set parallel.sp=1"
        )
    if world_size % par.sp:
        raise ValueError(
            f"parallel.sp={par.sp} does not divide the world size {world_size}; launch a multiple of "
            f"{par.sp} processes or choose a parallel.sp that divides {world_size}"
        )
    if world_size > 1 and par.strategy == "none":
        raise ValueError(
            f"launched with {world_size} processes but parallel.strategy=none: gradients must be averaged "
            "over the data- and sequence-parallel ranks; use parallel=ddp or parallel=fsdp, or launch one process"
        )
    reshard = par.reshard_after_forward
    if world_size > 1 and type(reshard) is int and world_size % reshard:  # bool is an int too
        raise ValueError(
            f"parallel.reshard_after_forward={reshard} must divide the {world_size} processes FSDP shards over "
            f"(all data- and sequence-parallel ranks); choose a divisor of {world_size} (e.g. the GPUs per "
            "node), or true / false"
        )


def check_sequence_split(cfg: TrainConfig) -> None:
    """Under sequence parallelism the heads (Ulysses) and the sequence (every mode) must split evenly
    over the ranks. The attention checks both too, but only inside the first step, after data, model
    and wrapping, and with a message that names no setting."""
    par, model = cfg.parallel, cfg.model
    if par.sp == 1 or cfg.task.kind != "lm":  # the LRA tasks refuse sequence parallelism themselves
        return
    ulysses = {"ring": 1, "ulysses": par.sp, "hybrid": par.ulysses}[par.sp_mode]
    # only the query heads: K/V heads that do not split are repeated until they do (replicate_kv_heads)
    if model.n_head % ulysses:
        degree = f"parallel.sp={par.sp}" if par.sp_mode == "ulysses" else f"parallel.ulysses={par.ulysses}"
        raise ValueError(
            f"model.n_head={model.n_head} is not divisible by the Ulysses degree ({degree} with parallel.sp_mode="
            f"{par.sp_mode}): each Ulysses rank attends with n_head / degree heads; choose a degree that "
            f"divides {model.n_head}, or parallel.sp_mode=ring"
        )
    layout_ranks = par.sp // ulysses if par.sp_mode == "hybrid" else par.sp  # what the layout cuts over
    chunks = 2 * layout_ranks if par.sp_layout == "zigzag" else layout_ranks  # zigzag: 2 chunks per rank
    multiple = math.lcm(chunks, par.sp)  # hybrid: each ring shard is then cut over its Ulysses ranks
    seq_len = cfg.trainer.seq_len
    if seq_len % multiple:
        raise ValueError(
            f"trainer.seq_len={seq_len} does not split evenly over parallel.sp={par.sp} (sp_mode={par.sp_mode}, "
            f"sp_layout={par.sp_layout}): it must be a multiple of {multiple}; set trainer.seq_len="
            f"{multiple * max(1, seq_len // multiple)} (or another multiple of {multiple})"
        )


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        # Installed first, so a preemption signal that arrives while data and model are being set up
        # (Slurm's --signal can come early in a short allocation) is acted on at the first step.
        self.preemption = PreemptionHandler(time_limit_s=cfg.trainer.time_limit_s)
        try:
            self._setup(cfg)
        except BaseException:
            self.preemption.restore()  # a failed set-up leaves no signal handler behind
            raise

    def _setup(self, cfg: TrainConfig) -> None:
        tc = cfg.trainer
        self.rank, self.world_size = self._init_distributed()
        self.dp = self.world_size // cfg.parallel.sp
        self._check_global_batch()
        self.device = self._pick_device(tc.device)
        check_backend_device(cfg.model.attention, self.device)
        self._check_cuda_graphs()
        self.autocast_dtype = self._pick_precision(tc.precision)
        self.run_dir = os.path.join(tc.out_dir, tc.run_name)
        self._check_writable(self.run_dir)
        self._check_fresh_start(self.run_dir, tc.resume)
        # before the data are built: generating a changed LRA task's data takes minutes at full size
        self.resume_from = self._checkpoint_to_resume(tc.resume)
        torch.manual_seed(tc.seed)
        random.seed(tc.seed)

        self.dp_rank = self.rank // cfg.parallel.sp  # sp is the inner mesh dim: sp ranks share one data slice
        self.task = build_task(
            cfg, rank=self.rank, world_size=self.world_size, dp_rank=self.dp_rank, dp=self.dp
        )
        # Built and initialised on the device itself: a multi-billion-parameter model initialised on
        # the CPU takes minutes (and its full size in host memory per process). Every rank seeds alike,
        # so every rank starts from the same weights (FSDP2 keeps each rank's own shard of them).
        with torch.device(self.device):
            self.model = self.task.build_model()
        self.model.to(self.device)  # anything the task built on purpose elsewhere
        self.flops_per_token = self.task.flops_per_token(self.model)
        # counted before sharding: ZeRO-3 leaves empty local parameters
        self.n_params = sum(p.numel() for p in self.model.parameters())
        # ParallelDims checks dp·sp = world size and owns the mesh; the strategy wraps the model from outside
        self.parallel_dims = None
        if self.world_size > 1:
            self.parallel_dims = ParallelDims(
                dp=self.dp, sp=cfg.parallel.sp, world_size=self.world_size, ulysses=cfg.parallel.ulysses
            )
            self.parallel_dims.build_mesh(self.device.type)
        self.strategy = build_strategy(cfg, self.parallel_dims, self.device, self.autocast_dtype)
        self.train_model, self.optimizer = self.strategy.setup(self.model)
        self.sampler = self.task.sampler
        self.step = 0
        self.saved_step: int | None = None  # the step of the last checkpoint this run wrote
        self.skipped_in_a_row = 0
        self.history: list[float] = []  # training loss per optimizer step (what resume must reproduce)
        self.step_hooks: list = []  # callables(trainer, step) run after each step (tests use them)
        # (sampler state before it, the next micro-batch already on the device): see _fetch_ahead
        self._ahead: tuple[dict, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._resume_if_asked()
        self.tracker = Tracker(
            cfg.logger, tc.run_name, self.run_dir, self._config_dict(), enabled=self.rank == 0
        )
        self.peak = _peak_tflops(tc.peak_tflops, self.device)

    # ---- set-up ---------------------------------------------------------------------------------

    def _init_distributed(self) -> tuple[int, int]:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        # Before the process group and any collective: every rank reads the same config and world size,
        # so all raise the same error at once instead of one failing while the others wait for it.
        check_parallel_degrees(self.cfg, world_size)
        check_sequence_split(self.cfg)
        if world_size > 1 and not dist.is_initialized():
            if self.cfg.parallel.strategy == "deepspeed":
                # before the group exists: DeepSpeed's barrier binds the default group as a default
                # argument at import, as torch.distributed.nn does (see flashtrain/distributed/__init__.py)
                import_deepspeed()

            backend = "nccl" if torch.cuda.is_available() and self.cfg.trainer.device != "cpu" else "gloo"
            dist.init_process_group(backend)
        return (dist.get_rank(), world_size) if world_size > 1 else (0, 1)

    def _check_cuda_graphs(self) -> None:
        cfg = self.cfg
        if not cfg.trainer.cuda_graphs:
            return
        if self.device.type != "cuda":
            raise ValueError(
                f"trainer.cuda_graphs=true needs a CUDA device, not {self.device}; set it to false"
            )
        if self.world_size > 1:
            raise ValueError(
                f"trainer.cuda_graphs=true runs on one GPU, not {self.world_size} processes (their gradient "
                "collectives run between the blocks' graphs); set trainer.cuda_graphs=false"
            )
        if cfg.parallel.strategy == "deepspeed":
            raise ValueError(
                "trainer.cuda_graphs=true does not run under DeepSpeed's engine; set trainer.cuda_graphs=false "
                "or choose another parallel.strategy"
            )
        if cfg.model.attn_dropout > 0:
            # the attention's dropout seed is a CPU tensor, where torch 2.11's graph partitions fail
            raise ValueError(
                f"trainer.cuda_graphs=true with model.attn_dropout={cfg.model.attn_dropout}: set one of them off"
            )

    def _check_global_batch(self) -> None:
        tc = self.cfg.trainer
        if tc.global_batch is None or tc.global_batch == tc.batch_size * tc.grad_accum * self.dp:
            return
        per_micro = tc.batch_size * self.dp  # sequences per micro-batch over all data-parallel ranks
        hint = (
            f"set trainer.grad_accum={tc.global_batch // per_micro}"
            if tc.global_batch % per_micro == 0
            else f"batch_size·dp = {tc.batch_size}·{self.dp} = {per_micro} does not divide it; change "
            "trainer.batch_size or the number of processes"
        )
        raise ValueError(
            f"trainer.global_batch={tc.global_batch} must equal batch_size·grad_accum·dp = "
            f"{tc.batch_size}·{tc.grad_accum}·{self.dp} = {tc.batch_size * tc.grad_accum * self.dp}; {hint}"
        )

    def _pick_device(self, name: str) -> torch.device:
        if name == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu or auto"
            )
        if name == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"local rank {local_rank} has no GPU: this node shows {torch.cuda.device_count()}; "
                "launch at most that many processes per node"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)

    def _pick_precision(self, precision: str) -> torch.dtype | None:
        if precision == "fp32" or (precision == "auto" and self.device.type != "cuda"):
            return None
        return torch.bfloat16

    @staticmethod
    def _check_writable(run_dir: str) -> None:
        try:
            os.makedirs(run_dir, exist_ok=True)
            probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:  # the run name, not the place: moving out_dir would not help
                raise ValueError(
                    f"the run directory {run_dir} has a name the file system refuses ({e.strerror}); give a "
                    f"shorter trainer.run_name (this one has {len(os.path.basename(run_dir))} characters)"
                ) from None
            raise ValueError(
                f"cannot write to the run directory {run_dir} ({e.strerror}); set trainer.out_dir to a writable path"
            ) from None

    @staticmethod
    def _check_fresh_start(run_dir: str, resume: str) -> None:
        """A run that starts over must not write into another run's checkpoints: its own would mix with
        them, and pruning would delete one or the other (the same W&B id would mix the histories too)."""
        steps = ckpt.saved_steps(run_dir)
        if resume == "false" and steps:
            raise ValueError(
                f"{run_dir} already holds checkpoints of a run (latest {steps[-1]}); continue it with "
                "trainer.resume=true (or auto), give this run another trainer.run_name, or remove "
                f"{ckpt.checkpoint_root(run_dir)} to start this one over"
            )

    def _config_dict(self) -> dict:
        return asdict(self.cfg)

    # ---- checkpoints ----------------------------------------------------------------------------

    def _checkpoint_to_resume(self, mode: str) -> str | None:
        """The checkpoint this run continues from (None: it starts at step 0), checked to be of the same
        task. Never None over existing step directories: starting over would overwrite and prune them."""
        if mode == "false":
            return None
        path = ckpt.latest_checkpoint(self.run_dir)
        steps = ckpt.saved_steps(self.run_dir)
        if path is None and steps:  # only step directories without their meta.json
            raise ValueError(
                f"{ckpt.checkpoint_root(self.run_dir)} holds step directories but no complete checkpoint "
                f"({', '.join(steps)}: no meta.json); remove them to start this run over, or give this run "
                "another trainer.run_name"
            )
        if path is None and mode == "auto":
            log.info(f"trainer.resume=auto: {self.run_dir} has no checkpoint yet, starting at step 0")
            return None
        if path is None:
            raise ValueError(
                f"trainer.resume=true but {self.run_dir} has no checkpoint yet; drop resume=true to start the run"
            )
        ckpt.check_same_task(ckpt.read_meta(path)["config"].get("task"), self.cfg.task, path)
        return path

    def _resume_if_asked(self) -> None:
        path = self.resume_from
        if path is None:
            return
        meta = ckpt.read_meta(path)
        ckpt.check_same_model(meta["model"], self.cfg.model, path)
        state = self.strategy.load(path)  # collective: weights and optimizer into the (sharded) model
        self.step = state["step"]
        self.history = list(state["history"])
        samplers, rngs = state["sampler"], state["rng"]
        written_sp = meta["config"]["parallel"]["sp"]
        if len(samplers) == self.world_size and written_sp == self.cfg.parallel.sp:
            self.sampler.load_state_dict(samplers[self.rank])
            _set_rng_state(rngs[self.rank], self.device)
        else:
            self._resume_on_other_layout(path, meta, samplers)
        self._warn_if_global_batch_changed(meta, len(samplers))
        log.info(f"resumed from {path} at step {self.step}")
        max_steps = self.cfg.trainer.max_steps
        if self.step >= max_steps:
            log.warning(
                f"the run is already at step {self.step} >= trainer.max_steps={max_steps}: nothing is trained; "
                "raise trainer.max_steps to continue it"
            )

    def _resume_on_other_layout(self, path: str, meta: dict, samplers: list[dict]) -> None:
        """A checkpoint written by another number of processes or sequence-parallel degree (weights and
        optimizer are full tensors, so any strategy and world size reads them). The data position is
        global, the same on every rank, so it carries over. Random streams (dropout) are per process
        and cannot be split or merged, so each data-parallel rank starts a fresh one from (seed, step,
        dp rank): the sp ranks of one sequence must share it, as they do from a fresh start, because
        they draw the same attention-dropout seeds (its masks are keyed by global position, so they
        do not depend on sp)."""
        if any(s != samplers[0] for s in samplers):
            raise ValueError(
                f"{path}: its ranks' data positions differ ({samplers}); the checkpoint is damaged"
            )
        self.sampler.load_state_dict(samplers[0])
        seed = np.random.SeedSequence([self.cfg.trainer.seed, self.step, self.dp_rank]).generate_state(1)[0]
        torch.manual_seed(int(seed))  # CPU and every CUDA device
        random.seed(int(seed))
        written = meta["config"]
        log.info(
            f"{path} was written by {len(samplers)} process(es), resumed on {self.world_size} (parallel.sp "
            f"{written['parallel']['sp']} -> {self.cfg.parallel.sp}): same data position, fresh random streams "
            "per data-parallel rank"
        )

    def _warn_if_global_batch_changed(self, meta: dict, processes: int) -> None:
        """A changed global batch (batch_size x grad_accum x dp) changes the run's optimisation: said
        whether or not the layout changed too (the checkpoint holds one data position per process)."""
        written = meta["config"]
        old_dp = processes // written["parallel"]["sp"]
        old_batch = written["trainer"]["batch_size"] * written["trainer"]["grad_accum"] * old_dp
        tc = self.cfg.trainer
        new_batch = tc.batch_size * tc.grad_accum * self.dp
        if old_batch != new_batch:
            log.warning(
                f"the global batch changes from {old_batch} to {new_batch} sequences per step; to continue the "
                f"run unchanged make trainer.batch_size x trainer.grad_accum x {self.dp} data-parallel ranks = {old_batch}"
            )

    def save(self) -> None:
        """Write a checkpoint of the current step (collective: every rank must call it)."""
        # the position of the next batch to train on, not of one fetched ahead
        sampler = self.sampler.state_dict() if self._ahead is None else self._ahead[0]
        samplers, rngs = [sampler], [_rng_state(self.device)]
        if self.world_size > 1:
            samplers, rngs = [None] * self.world_size, [None] * self.world_size
            dist.all_gather_object(samplers, sampler)  # blocks: every rank's data position
            dist.all_gather_object(rngs, _rng_state(self.device))
        # collective: full weights and optimizer state gathered to rank 0 (DeepSpeed writes its own files)
        model = self.strategy.model_to_save()
        optimizer_state = self.strategy.optimizer_state(ckpt.checkpoint_root(self.run_dir), self.step)
        if self.rank == 0:
            state = {
                "optimizer": optimizer_state,
                "strategy": self.strategy.name,
                "scheduler": {"step": self.step},  # the LR is a pure function of the step (optim.lr_at)
                "step": self.step,
                "history": self.history,
                "sampler": samplers,
                "rng": rngs,
            }
            meta = {
                "step": self.step,
                "model": asdict(self.cfg.model),
                "tokenizer": self.task.tokenizer_name,
                "config": self._config_dict(),
            }
            keep = self.cfg.trainer.keep_checkpoints
            path = ckpt.save_checkpoint(self.run_dir, self.step, model, state, meta, keep)
            self.strategy.prune(ckpt.checkpoint_root(self.run_dir))
            log.info(f"checkpoint written: {path}")
        if self.world_size > 1:
            dist.barrier()
        self.saved_step = self.step

    # ---- the loop -------------------------------------------------------------------------------

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _sp_context(self):
        """Sequence parallelism around a step: batches are sharded along the sequence and every
        attention call of the model goes to the ring / Ulysses version (the model is unchanged)."""
        par = self.cfg.parallel
        stack = contextlib.ExitStack()
        if par.sp > 1:
            # the model's block_sparse backend is replaced by the ring: hand it the same layout
            block_layout = self._sp_block_mask if self.cfg.model.attention == "block_sparse" else None
            sp = stack.enter_context(
                sequence_parallel(
                    self.parallel_dims, mode=par.sp_mode, layout=par.sp_layout, block_layout=block_layout
                )
            )
            stack.enter_context(attention_override(sp.attention_fn))
        return stack

    def _attention_summary(self) -> str:
        """What computes attention: the model's backend, or under sp the ring/Ulysses that replaces it,
        and the settings for it that this run does not read. Those are said, not refused: a sweep over
        sp keeps its sp_mode, one over the backend keeps its layout (parallel.strategy on one process is
        treated alike)."""
        par, model = self.cfg.parallel, self.cfg.model
        # block_sparse_* settings a dense backend or another layout kind takes nothing from
        said, unused_layout = "", unused_layout_settings(model)
        if unused_layout:
            kind = f", {model.block_sparse_kind} layout" if model.attention == "block_sparse" else ""
            said = f" ({', '.join(unused_layout)} unused by {model.attention}{kind})"
        if par.sp == 1:
            # sp_mode and sp_layout have nothing to split with one rank per sequence
            unused = [
                f"parallel.{key}={getattr(par, key)}"
                for key in ("sp_mode", "sp_layout")
                if getattr(par, key) != getattr(ParallelConfig, key)
            ]
            return model.attention + (f" ({', '.join(unused)} unused at sp=1)" if unused else "") + said
        kernel = "triton" if self.device.type == "cuda" else "reference"
        layout = ", block-sparse layout" if model.attention == "block_sparse" else ""
        return f"{par.sp_mode} over sp={par.sp} ({par.sp_layout}, {kernel} per step{layout})" + said

    @functools.cache  # noqa: B019 - one trainer per run; the masks are built once per sequence length
    def _sp_block_mask(self, seqlen: int, device) -> tuple[torch.Tensor, int]:
        from flashtrain.models.block_sparse import global_block_mask

        return global_block_mask(self.cfg.model, seqlen, device)

    def _micro_batch_loss(self, x, y):
        if self.cfg.trainer.cuda_graphs:  # the last micro-batch's graph outputs may be overwritten now
            torch.compiler.cudagraph_mark_step_begin()
        with self._autocast():
            return self.task.loss(self.train_model, x, y)

    def _fetch_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.task.next_batch()
        if self.device.type == "cuda":  # page-locked, so the copies below return at once
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next micro-batch on the device: the one fetched ahead during the last backward, if any."""
        if self._ahead is None:
            return self._fetch_batch()
        (_, batch), self._ahead = self._ahead, None
        return batch

    def _fetch_ahead(self) -> None:
        """Build and send the next micro-batch while the device still runs this one's backward: the
        step ends on a host-device sync, so batch time spent after it is the device's idle time (with
        the uint8 pixels and the per-epoch permutation, it took a Pathfinder-32 step on an H200 from
        38.9 to 29.4 ms). The sampler's position before it is what a checkpoint records, so a resumed
        run reads the same batches."""
        before = self.sampler.state_dict()
        self._ahead = (before, self._fetch_batch())

    def train_step(self) -> float:
        tc = self.cfg.trainer
        lr = lr_at(self.step, self.cfg.optim, tc.max_steps)
        self.strategy.set_lr(lr)
        total = torch.zeros((), device=self.device)
        for micro in range(tc.grad_accum):
            x, y = self._next_batch()
            last = micro == tc.grad_accum - 1
            # gradients are reduced over the ranks on the last micro-batch only
            with self.strategy.grad_sync(last), self._sp_context():
                loss = self._micro_batch_loss(x, y) / tc.grad_accum
                self.strategy.backward(loss, last)
            total += loss.detach()
            if not (last and self.step + 1 >= tc.max_steps):  # the run's last batch has no successor
                self._fetch_ahead()
        if self.world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)  # blocks: the logged loss is the global mean
        # Both values are global (the loss all-reduced, the norm over all shards), so every rank takes
        # the same branch: all skip or none.
        found = self.strategy.grad_norm()  # None: the engine clips in step
        if found is None:
            loss_value, grad_norm = total.item(), None  # host-device sync: once per step
        else:
            grads, norm = found
            # one host-device sync per step for both values the branch below reads
            loss_value, grad_norm = torch.stack([total, norm.to(total.dtype)]).tolist()
            self.strategy.clip_grads(grads, norm, grad_norm, self.cfg.optim.grad_clip)
        if not math.isfinite(loss_value) or (grad_norm is not None and not math.isfinite(grad_norm)):
            self._handle_non_finite(loss_value, grad_norm)
            self.strategy.skip_step()
            self.step += 1
            return loss_value
        self.skipped_in_a_row = 0
        norm_in_step = self.strategy.step()  # DeepSpeed reports the norm it clipped with
        self.step += 1
        self.last_grad_norm, self.last_lr = grad_norm if grad_norm is not None else norm_in_step, lr
        return loss_value

    def _handle_non_finite(self, loss_value: float, grad_norm: float | None) -> None:
        tc = self.cfg.trainer
        what = f"loss is {loss_value}"
        if math.isfinite(loss_value):  # the loss is fine: the gradients are not
            what = (f"gradient norm is {grad_norm} (loss {loss_value:.4f}); on rank {self.rank}: "
                    f"{self.strategy.gradient_report()}")  # fmt: skip
        if tc.nan_policy == "stop":
            raise NonFiniteLossError(
                f"{what} at step {self.step} (lr {lr_at(self.step, self.cfg.optim, tc.max_steps):.2e}); "
                "the run stopped without updating weights. Lower optim.lr, raise optim.warmup_steps, check the data, "
                f"or set trainer.nan_policy=skip. The last checkpoint is in {self.run_dir}/checkpoints"
            )
        self.skipped_in_a_row += 1
        log.warning(
            f"non-finite step ({what}) at step {self.step}: skipped ({self.skipped_in_a_row} in a row)"
        )
        if self.skipped_in_a_row > tc.max_skipped_steps:
            raise NonFiniteLossError(
                f"{self.skipped_in_a_row} consecutive non-finite steps (limit trainer.max_skipped_steps="
                f"{tc.max_skipped_steps}); lower optim.lr or check the data"
            )

    @torch.no_grad()
    def evaluate(self, final: bool = False) -> dict:
        """The task's validation metrics (collective); at the end of a run, over the whole held-out splits."""
        self.train_model.eval()
        if self.cfg.trainer.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self._sp_context():
            metrics = self.task.evaluate(
                self.train_model,
                self.device,
                self._autocast,
                self.cfg.trainer.eval_batches,
                self.world_size,
                final=final,
            )
        self.train_model.train()
        return metrics

    def fit(self) -> list[float]:
        tc = self.cfg.trainer
        tokens_per_step = self.task.tokens_per_batch() * tc.grad_accum * self.dp
        n_gpus = self.world_size if self.device.type == "cuda" else 0
        log.info(
            f"model {self.n_params / 1e6:.2f}M params, {tokens_per_step} tokens/step, device {self.device}, "
            f"task {self.cfg.task.kind}, attention {self._attention_summary()}, run dir {self.run_dir}"
        )
        # Redrawn 10 times a second on a terminal; in a log file (Slurm, CI) once every 30 s.
        bar = tqdm(
            total=tc.max_steps,
            initial=self.step,
            disable=self.rank != 0 or not tc.progress_bar,
            dynamic_ncols=True,
            mininterval=0.1 if sys.stderr.isatty() else 30.0,
        )
        self.train_model.train()
        self.preempted = False
        t0 = time.perf_counter()
        gc_schedule = GCSchedule(tc.gc_every)
        try:
            while self.step < tc.max_steps:
                loss = self.train_step()
                gc_schedule.after_step(self.step)
                self.history.append(loss)
                dt = time.perf_counter() - t0  # the step's loss.item() synchronised the device
                t0 = time.perf_counter()
                tok_s = tokens_per_step / dt
                mfu = (
                    self.flops_per_token * tok_s / (self.peak * 1e12 * n_gpus)
                    if self.peak and n_gpus
                    else None
                )
                metrics = {
                    "train/loss": loss,
                    "train/tokens_per_s": tok_s,
                    "train/lr": getattr(self, "last_lr", 0.0),
                }
                if mfu is not None:
                    metrics["train/mfu"] = mfu
                if getattr(self, "last_grad_norm", None) is not None:
                    metrics["train/grad_norm"] = self.last_grad_norm
                if self.device.type == "cuda":
                    metrics["train/max_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
                bar.set_postfix(
                    loss=f"{loss:.4f}",
                    tok_s=f"{tok_s:,.0f}",
                    mfu="n/a" if mfu is None else f"{mfu:.1%}",
                    refresh=False,
                )
                bar.update(1)  # after the postfix, so the redraw shows this step
                last = self.step == tc.max_steps
                # before evaluating: an evaluation that fails must not cost the step's checkpoint (the
                # evaluation draws no random numbers, so the saved RNG state is the same either way)
                if (tc.checkpoint_interval and self.step % tc.checkpoint_interval == 0) or last:
                    self.save()
                if tc.eval_interval and (self.step % tc.eval_interval == 0) or last:
                    evaluation = self.evaluate(final=last)
                    metrics.update(evaluation)
                    shown = ", ".join(f"{k} {v:.4f}" for k, v in evaluation.items())
                    log.info(f"step {self.step}: train loss {loss:.4f}, {shown}")
                if self.step % tc.log_interval == 0 or last or "val/loss" in metrics:
                    self.tracker.log(metrics, step=self.step)
                if not tc.progress_bar and self.step % tc.log_interval == 0:  # batch logs (Slurm) get lines
                    shown = "n/a" if mfu is None else f"{mfu:.1%}"
                    log.info(
                        f"step {self.step}: loss {loss:.4f}, {1000 * dt:.1f} ms/step, {tok_s:,.0f} tok/s, MFU {shown}"
                    )
                for hook in self.step_hooks:
                    hook(self, self.step)
                if not last and self.preemption.should_stop(self.device):
                    if self.preemption.reason == "signal":
                        log.info(
                            f"preemption signal received: checkpointing at step {self.step} and requeueing"
                        )
                    else:
                        log.info(
                            f"trainer.time_limit_s={tc.time_limit_s} reached: checkpointing at step {self.step}; "
                            "continue with trainer.resume=auto"
                        )
                    if self.saved_step != self.step:  # a checkpoint step was saved above already
                        self.save()
                    self.preempted = True
                    break
                t0 = time.perf_counter() if (last or "val/loss" in metrics) else t0
        finally:
            gc_schedule.close()
            self.preemption.restore()
            bar.close()
            self.tracker.finish()
        if self.preempted and self.preemption.reason == "signal" and self.rank == 0:
            requeue_slurm_job()  # last: Slurm kills the job as soon as it is requeued, so flush W&B first
        return self.history

    def close(self) -> None:
        """Restore the signal handlers and, when distributed, tear down the process groups. The trainer
        cannot train after this; its results (history, run_dir, preempted) stay readable."""
        self.preemption.restore()
        if self.world_size > 1 and dist.is_initialized():
            # destroy_process_group joins gloo's worker threads only when nothing else holds the groups;
            # a thread left running into interpreter shutdown can abort the process after the last
            # checkpoint ("terminate called without an active exception", SIGABRT). The model, its
            # optimizer, the device meshes and library caches all hold them, so drop those first.
            self.strategy.release()
            self.model = self.train_model = self.optimizer = self.strategy = self.parallel_dims = None
            gc.collect()  # the model's reference cycles (hooks, tied weights)
            dist.destroy_process_group()
