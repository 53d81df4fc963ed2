"""What the trainer asks of a data-parallel engine, one small object per `parallel.strategy`.

The trainer's loop is the same for every engine; a strategy answers how to: wrap the model and build
the optimizer (`setup`), accumulate gradients without syncing on all but the last micro-batch
(`grad_sync`, `backward`), clip and step, and read/write *full* (unsharded) state for checkpoints.

Checkpoints on disk are the same for every strategy: `model.safetensors` holds the full fp32 weights and
`train_state.pt["optimizer"]` the full optimizer state keyed by parameter name (torch's
`get_optimizer_state_dict` format), so a run saved under DDP resumes under FSDP and vice versa, and
`load_model_for_inference` reads any of them. DeepSpeed is the exception for the optimizer: its
ZeRO partitions are written by DeepSpeed itself, collectively, into `checkpoints/deepspeed/step_N/`
before the step's checkpoint is published (so `latest` never names a step whose DeepSpeed state is
incomplete); such a checkpoint resumes under DeepSpeed with the same world size, and its weights load
anywhere.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil

import torch
import torch.distributed as dist
import torch.nn as nn

from flashtrain.checkpoint import checkpoint_name, read_train_state, read_weights
from flashtrain.log import get_logger
from flashtrain.optim import adamw_step_on_shards, build_optimizer, local_shard
from flashtrain.parallelize import clear_dtensor_caches, clear_function_caches, parallelize_gpt

log = get_logger()


def _aliases(model: nn.Module) -> dict[str, str]:
    """Tied parameters: {alias name: name kept in state dicts} (the GPT's head shares the embedding)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _full_model_shell(model_cfg, state: dict[str, torch.Tensor], aliases: dict[str, str]) -> nn.Module:
    """A plain GPT around the full state dict (no copy, no init), re-tied, for `save_checkpoint`."""
    from flashtrain.models.gpt import GPT

    with torch.device("meta"):
        shell = GPT(model_cfg)
    shell.load_state_dict({**state, **{a: state[p] for a, p in aliases.items()}}, assign=True)
    for alias, primary in aliases.items():  # assign=True made two Parameters of the tied pair
        owner, _, attr = alias.rpartition(".")
        setattr(shell.get_submodule(owner), attr, shell.get_parameter(primary))
    return shell


class Strategy:
    """One process ("none") and DDP; FSDP and DeepSpeed override what differs."""

    name = "none"

    def __init__(self, cfg, parallel_dims, device: torch.device, autocast_dtype: torch.dtype | None):
        self.cfg = cfg
        self.dims = parallel_dims  # None for one process
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.distributed = parallel_dims is not None
        # blocks replayed from CUDA graphs return each gradient in their graph's memory, which the next
        # micro-batch's replay overwrites; under accumulation the gradients are tensors of their own,
        # zero-filled once and added to in place ("accessing tensor output of CUDAGraphs that has been
        # overwritten" otherwise)
        self.keep_grads = cfg.trainer.cuda_graphs and cfg.trainer.grad_accum > 1

    # ---- set-up and the step --------------------------------------------------------------------

    def setup(self, model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Wrap `model` (the single-device GPT) and build its optimizer; returns (module to call, optimizer)."""
        self.model = model
        self.aliases = _aliases(model)
        tc = self.cfg.trainer
        self.train_model = parallelize_gpt(
            model,
            self.dims,
            self.cfg.parallel if self.distributed else _single(self.cfg.parallel),
            device=self.device,
            activation_checkpointing=tc.activation_checkpointing,
            compile=tc.compile,
            compile_mode="reduce-overhead" if tc.cuda_graphs else None,
            param_dtype=self.autocast_dtype,
        )
        self.optimizer = build_optimizer(self.model, self.cfg.optim)
        if self.keep_grads:
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
        return self.train_model, self.optimizer

    def grad_sync(self, last: bool):
        """Context for one micro-batch's forward+backward: skip the gradient all-reduce unless `last`."""
        if last or not hasattr(self.train_model, "no_sync"):
            return contextlib.nullcontext()
        return self.train_model.no_sync()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def clip_grads(
        self, grads: list[torch.Tensor], norm: torch.Tensor, value: float, max_norm: float
    ) -> None:
        """Scale grads by min(1, max_norm / norm), as torch.nn.utils.clip_grads_with_norm_; value is the
        norm read on the host. A non-finite norm skips the step, so the gradients are left as they are
        for its report."""
        if grads and max_norm > 0 and math.isfinite(value):
            torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))

    def grad_norm(self) -> tuple[list[torch.Tensor], torch.Tensor] | None:
        """The gradients `clip_grads` scales and their global 2-norm, still on the device (no sync), or
        None when the engine clips inside `step` (DeepSpeed)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return grads, torch.nn.utils.get_total_norm(grads)

    def gradient_report(self, limit: int = 4) -> str:
        """What a non-finite gradient norm reports, from this rank's gradients: the parameters whose
        gradient holds inf or NaN, or, when none does (the norm itself overflowed), the largest
        gradients. DeepSpeed keeps its own gradient buffers, so nothing is found there."""
        local = ((n, local_shard(p.grad)) for n, p in self.model.named_parameters() if p.grad is not None)
        named = [(n, g) for n, g in local if g.numel()]  # FSDP: this rank's shards
        if not named:
            return "no gradient on this rank"
        # one host-device sync: |grad|.max() is inf or NaN exactly when the gradient holds one
        peaks = torch.stack([g.detach().abs().amax().float() for _, g in named]).tolist()
        bad = [n for (n, _), v in zip(named, peaks, strict=True) if not math.isfinite(v)]
        largest = [(v, n) for (n, _), v in zip(named, peaks, strict=True) if math.isfinite(v)]
        if bad:
            return f"non-finite gradients in {', '.join(bad[:limit])}" + (" ..." if len(bad) > limit else "")
        top = sorted(largest, reverse=True)[:limit]
        return "no inf/NaN gradient; largest |gradient|: " + ", ".join(f"{n} {v:.3g}" for v, n in top)

    def step(self) -> float | None:
        """Apply the update and clear the gradients; returns the grad norm if only known now."""
        self.optimizer.step()
        self.clear_grads()
        return None

    def skip_step(self) -> None:
        """Drop this step's gradients (non-finite loss with nan_policy=skip)."""
        self.clear_grads()

    def clear_grads(self) -> None:
        """Gradients to None, or to zero in place where they are kept (`keep_grads`): one foreach kernel."""
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)

    # ---- checkpoints (every method here is collective: every rank must call it) -------------------

    def _state_options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # Full (unsharded) tensors, gathered to rank 0's CPU; one process uses the plain format, which
        # is the same dict (torch's full_state_dict loader insists on a process group).
        return StateDictOptions(full_state_dict=self.distributed, cpu_offload=self.distributed, **kw)

    def model_to_save(self) -> nn.Module | None:
        """A plain module holding the full weights on rank 0 (None elsewhere), for `save_checkpoint`."""
        if not isinstance(self.model, _fsdp_module_type()):
            return self.model if _rank() == 0 else None
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.model, options=self._state_options())  # blocks: gathers shards
        if _rank() != 0:
            return None
        return _full_model_shell(
            self.model.cfg, {k: v for k, v in state.items() if k not in self.aliases}, self.aliases
        )

    def optimizer_state(self, root: str, step: int) -> dict | None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = get_optimizer_state_dict(self.model, self.optimizer, options=self._state_options())
        return state if _rank() == 0 else None

    def load(self, path: str) -> dict:
        """Load weights and optimizer from checkpoint `path`; returns its train_state."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        state = read_train_state(path)  # a damaged file: one error naming the checkpoint
        if state.get("optimizer") is None:
            raise ValueError(
                f"{path} was written by parallel.strategy={state.get('strategy')}, whose optimizer state is in "
                "DeepSpeed's own format; resume it with parallel=deepspeed (same number of processes)"
            )
        weights = read_weights(path)
        for alias, primary in self.aliases.items():  # safetensors stores a tied pair under one of its names
            weights.setdefault(alias, weights.get(primary))
            weights.setdefault(primary, weights[alias])
        set_model_state_dict(self.model, weights, options=self._state_options(strict=True))
        set_optimizer_state_dict(
            self.model, self.optimizer, state["optimizer"], options=self._state_options()
        )
        return state

    def prune(self, checkpoint_root: str) -> None:
        """Remove engine files of checkpoints the rotation deleted (rank 0, after save_checkpoint)."""

    # ---- the end ------------------------------------------------------------------------------------

    def release(self) -> None:
        """Drop every reference this strategy (and the libraries it drives) keeps to the model and the
        process groups, so that `destroy_process_group` can join the groups' threads."""
        self.model = self.train_model = self.optimizer = None


class FSDPStrategy(Strategy):
    """FSDP2. Gradient sync is switched off on the root module for all but the last micro-batch, so the
    reduce-scatter runs once per step (gradients of the skipped ones accumulate unsharded)."""

    name = "fsdp"

    def grad_sync(self, last: bool):
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def grad_norm(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """This rank's gradient shards, and the global norm as one all-reduce of their squared norm over
        the data-parallel mesh: every parameter is sharded along dim 0 of that 1-D mesh (`apply_fsdp`),
        so each element lives on exactly one rank. DTensor's own norm and scaling dispatch per gradient,
        which costs host time while the GPU waits."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        local = [local_shard(g) for g in grads]
        squared = torch.nn.utils.get_total_norm(local).float() ** 2
        if grads:  # alike on every rank: each holds a shard of every parameter
            dist.all_reduce(squared, group=grads[0].device_mesh.get_group())
        return local, squared.sqrt()

    def step(self) -> float | None:
        if not adamw_step_on_shards(self.optimizer):  # the first step creates the state
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return None

    def release(self) -> None:
        super().release()
        clear_dtensor_caches()  # their entries hold the meshes of the sharded parameters


class DeepSpeedStrategy(Strategy):
    """DeepSpeed ZeRO 1/2/3. The engine owns accumulation, gradient reduction, clipping and the
    optimizer; its config is generated from ours (`deepspeed_config`), the LR schedule stays ours."""

    name = "deepspeed"

    def setup(self, model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer]:
        self.model = model
        self.aliases = _aliases(model)
        tc = self.cfg.trainer
        parallelize_gpt(
            model,
            self.dims,
            self.cfg.parallel,
            device=self.device,
            activation_checkpointing=tc.activation_checkpointing,
            compile=tc.compile,
        )
        self.engine = apply_deepspeed(model, self.cfg, self.dims.world_size, self.autocast_dtype)
        self.train_model, self.optimizer = self.engine, self.engine.optimizer
        return self.train_model, self.optimizer

    def grad_sync(self, last: bool):
        return contextlib.nullcontext()  # the engine's micro-step counter decides when to reduce

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the trainer already divided by grad_accum
        if not last:
            self.engine.step()  # not a boundary: only advances the engine's micro-step counter

    def grad_norm(self) -> None:
        return None  # the engine clips inside step (gradient_clipping)

    def step(self) -> float | None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    def skip_step(self) -> None:
        raise AssertionError("unreachable: nan_policy=skip is rejected at set-up for deepspeed")

    def model_to_save(self) -> nn.Module | None:
        from deepspeed.utils import safe_get_full_fp32_param

        # The fp32 master weights (not the engine's bf16 copies), gathered param by param; collective
        # for ZeRO-3, so every rank walks the parameters in the same order.
        state = {}
        for name, p in self.model.named_parameters():
            full = safe_get_full_fp32_param(p)
            state[name] = (full if full is not None else p.detach()).float().cpu()
        if _rank() != 0:
            return None
        return _full_model_shell(self.model.cfg, state, self.aliases)

    def optimizer_state(self, root: str, step: int) -> dict | None:
        # Each rank writes its own ZeRO partition: one file per rank, no gather to rank 0.
        self.engine.save_checkpoint(_deepspeed_dir(root), tag=checkpoint_name(step), save_latest=False)
        return None

    def load(self, path: str) -> dict:
        state = read_train_state(path)  # a damaged file: one error naming the checkpoint
        root, tag = os.path.split(os.path.normpath(path))
        ds_dir = _deepspeed_dir(root)
        if not os.path.isdir(os.path.join(ds_dir, tag)):
            raise ValueError(
                f"{path} has no DeepSpeed state in {ds_dir}/{tag} (it was written by parallel.strategy="
                f"{state.get('strategy')}); resume it with that strategy"
            )
        check_same_world_size(path, state, self.dims.world_size)
        loaded, _ = self.engine.load_checkpoint(ds_dir, tag=tag, load_lr_scheduler_states=False)
        if loaded is None:
            raise ValueError(
                f"DeepSpeed could not load {ds_dir}/{tag}; resume with the world size that wrote it"
            )
        return state

    def release(self) -> None:
        from deepspeed.runtime.zero import parameter_offload
        from deepspeed.utils import groups

        super().release()
        self.engine.destroy()  # removes the gradient hooks, whose closures hold the ZeRO optimizer
        self.engine = None
        clear_function_caches("deepspeed")  # ZeRO-3's coordinator memoizes per (itself, module)
        parameter_offload.FWD_MODULE_STACK.clear()  # ZeRO-3 leaves the model on its forward stack
        # DeepSpeed keeps its groups in module globals; it fills them again on its next initialize
        groups._WORLD_GROUP = None
        for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP", "_ALL_TO_ALL_GROUP"):
            getattr(groups, name, {}).clear()

    def prune(self, checkpoint_root: str) -> None:
        ds_dir = _deepspeed_dir(checkpoint_root)
        for tag in os.listdir(ds_dir) if os.path.isdir(ds_dir) else []:  # DeepSpeed also adds its own scripts
            if tag.startswith("step_") and not os.path.isdir(os.path.join(checkpoint_root, tag)):
                shutil.rmtree(os.path.join(ds_dir, tag), ignore_errors=True)


def check_same_world_size(path: str, state: dict, world_size: int) -> None:
    """DeepSpeed's ZeRO partitions load only on the number of processes that wrote them; said before
    the engine tries (it fails with a ZeRORuntimeException that names no setting). The train state
    holds one data position per rank that wrote it."""
    written = len(state["sampler"])
    if written != world_size:
        raise ValueError(
            f"{path} was written by {written} DeepSpeed process(es) and this run has {world_size}: its ZeRO "
            f"partitions load only on the world size that wrote them; resume it on {written} processes with "
            "parallel=deepspeed (its weights, model.safetensors, load for inference anywhere)"
        )


def deepspeed_config(cfg, dp: int, autocast_dtype: torch.dtype | None) -> dict:
    """DeepSpeed's JSON config from ours. The LR is set on the param groups each step (our schedule),
    so the scheduler section is absent and `lr` here is only the initial value."""
    tc, oc = cfg.trainer, cfg.optim
    stage = 2 if cfg.parallel.zero_stage is None else cfg.parallel.zero_stage
    on_cuda = torch.cuda.is_available() and tc.device != "cpu"
    return {
        "train_batch_size": tc.batch_size * tc.grad_accum * dp,
        "train_micro_batch_size_per_gpu": tc.batch_size,
        "gradient_accumulation_steps": tc.grad_accum,
        "gradient_clipping": oc.grad_clip,  # 0 disables, as optim.grad_clip=0 does
        "bf16": {"enabled": autocast_dtype == torch.bfloat16},
        "zero_optimization": {"stage": stage},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": oc.lr,
                "betas": [oc.beta1, oc.beta2],
                "eps": oc.eps,
                "weight_decay": oc.weight_decay,  # per-group values (none on biases/norms) override it
                # torch's AdamW rather than DeepSpeed's FusedAdam: no op to JIT-compile, and the same
                # update as the other strategies
                "torch_adam": True,
                **({"fused": True} if on_cuda and oc.fused is not False else {}),
            },
        },
        "steps_per_print": 2**31 - 1,  # our logger reports; DeepSpeed's would repeat it on every rank
        "wall_clock_breakdown": False,
    }


def import_deepspeed():
    """The deepspeed module, or a ValueError that says how to install it."""
    try:
        import deepspeed
    except ImportError:
        raise ValueError(
            "parallel.strategy=deepspeed needs DeepSpeed: pip install -e '.[deepspeed]' "
            "(on CPU: DS_BUILD_OPS=0 pip install deepspeed)"
        ) from None
    return deepspeed


def apply_deepspeed(model: nn.Module, cfg, dp: int, autocast_dtype: torch.dtype | None):
    """The DeepSpeed engine around `model` (the data-parallel step of parallelize_gpt for deepspeed)."""
    deepspeed = import_deepspeed()
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=_param_groups(model, cfg.optim),
        config=deepspeed_config(cfg, dp, autocast_dtype),
        dist_init_required=False,
    )
    return engine


def build_strategy(cfg, parallel_dims, device: torch.device, autocast_dtype: torch.dtype | None) -> Strategy:
    """The strategy `parallel.strategy` names; one process runs every strategy as plain single-device."""
    if cfg.parallel.strategy == "deepspeed" and cfg.trainer.nan_policy == "skip":
        raise ValueError(
            "trainer.nan_policy=skip is not supported with parallel.strategy=deepspeed: the engine applies "
            "the update inside its step and cannot drop one; use nan_policy=stop, or parallel=ddp/fsdp"
        )
    if cfg.parallel.residual_dtype == "bfloat16" and autocast_dtype != torch.bfloat16:
        raise ValueError(
            "parallel.residual_dtype=bfloat16 casts the residual stream of a bf16 run, and this run computes in "
            "fp32 (trainer.precision is fp32, or auto on CPU); set trainer.precision=bf16 or drop the option"
        )
    if parallel_dims is None:
        if cfg.parallel.strategy not in ("none",):
            log.info(
                f"one process: parallel.strategy={cfg.parallel.strategy} has nothing to split; single-device run"
            )
        return Strategy(cfg, None, device, autocast_dtype)
    return {"fsdp": FSDPStrategy, "deepspeed": DeepSpeedStrategy}.get(cfg.parallel.strategy, Strategy)(
        cfg, parallel_dims, device, autocast_dtype
    )


def _param_groups(model: nn.Module, oc) -> list[dict]:
    """build_optimizer's groups (weight decay on matrices and embeddings only), for DeepSpeed to build from."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": oc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def _single(parallel_cfg):
    from dataclasses import replace

    return replace(
        parallel_cfg,
        strategy="none",
        reshard_after_forward=None,
        reduce_dtype=None,
        blocks_per_unit=None,
        residual_dtype=None,
        zero_stage=None,
    )


def _fsdp_module_type():
    from torch.distributed.fsdp import FSDPModule

    return FSDPModule


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _deepspeed_dir(checkpoint_root: str) -> str:
    return os.path.join(checkpoint_root, "deepspeed")
