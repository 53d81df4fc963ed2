"""Sequence-parallel gradients against one device: where a sequence-parallel step goes wrong.

Inside torchrun, every rank builds the real trainer (configuration below), takes one batch and
computes the gradients of that batch's loss in several ways:

- `reference`: the bare model on the whole sequence on this rank alone (its own attention backend),
  through `torch.autograd.grad`, so no data-parallel hook fires;
- `sp`: the trainer's own sequence-parallel step (sharded batch, ring, DDP averaging);
- `sp_sync`: the same with a device-wide synchronize after every wait of the ring's transfers, which
  removes any race between the transfers and the kernels;
- `sp_no_ac`: the same without activation checkpointing (blocks run their plain forward).

and prints / writes each variant's loss, gradient norm and relative error against the reference,
with the parameters that differ most.

    torchrun --nproc-per-node 2 benchmarks/check_sp_gradients.py --context 65536 --out grads.json
    torchrun --nproc-per-node 2 benchmarks/check_sp_gradients.py --device cpu --model gpt_tiny --context 256

The configuration is bench_long_context's (GPT-2 small, rotary, activation checkpointing, chunked
loss, the sequence over every rank by the ring), so the check covers exactly what that benchmark trains.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _sync_after_waits():
    """Patch the ring's wait so every wait ends in a device-wide synchronize; returns the undo."""
    from flashtrain.distributed import ring

    original = ring._wait

    def wait_and_sync(works):
        original(works)
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    ring._wait = wait_and_sync
    return lambda: setattr(ring, "_wait", original)


def _without_ac(model):
    """Drop the in-place checkpoint wrappers of `apply_ac`; returns the undo."""
    saved = {i: b.__dict__.pop("forward") for i, b in enumerate(model.blocks) if "forward" in b.__dict__}
    return lambda: [setattr(model.blocks[i], "forward", f) for i, f in saved.items()]


def _sp_grads(trainer, x, y) -> tuple[float, list[torch.Tensor]]:
    trainer.optimizer.zero_grad(set_to_none=True)
    with trainer._sp_context():
        loss = trainer._micro_batch_loss(x, y)
        trainer.strategy.backward(loss, True)
    loss = loss.detach().clone()
    torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG)
    params = list(trainer.model.parameters())
    return loss.item(), [p.grad.detach().float().clone() for p in params]


def _report(name, loss, grads, ref, names) -> dict:
    norms = torch.stack([g.norm() for g in grads])
    rel = torch.stack([(g - r).norm() / r.norm().clamp_min(1e-30) for g, r in zip(grads, ref, strict=True)])
    peaks = torch.stack([g.abs().max() for g in grads])
    rel_l, peaks_l = rel.tolist(), peaks.tolist()  # one host-device sync per list
    order = sorted(range(len(names)), key=lambda i: -rel_l[i] if math.isfinite(rel_l[i]) else -math.inf)
    return {
        "variant": name, "loss": loss, "grad_norm": norms.norm().item(),
        "ref_grad_norm": torch.stack([r.norm() for r in ref]).norm().item(), "max_rel_err": max(rel_l),
        "worst": [[names[i], rel_l[i], peaks_l[i]] for i in order[:6]],
        "non_finite": [n for n, v in zip(names, peaks_l, strict=True) if not math.isfinite(v)][:6],
    }  # fmt: skip


def _overrides(a, world: int) -> list[str]:
    """bench_long_context's configuration of a run at --context tokens over `world` ranks (sp = world:
    rotary, activation checkpointing, chunked loss, ring), then --override."""
    from benchmarks.bench_long_context import run_args
    from benchmarks.bench_scaling import _overrides as scaling_overrides

    bench = argparse.Namespace(
        sp_mode="ring", loss_chunk=a.loss_chunk, override=a.override, model=a.model, device=a.device,
        attention=a.attention or ("triton" if a.device == "cuda" else "reference"), steps=1, warmup=0,
        run_root=a.run_root, timeout=0,
    )  # fmt: skip
    return scaling_overrides(run_args(bench, a.context, world))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=65536, help="tokens of the one sequence")
    p.add_argument("--model", default="gpt2_small")
    p.add_argument(
        "--attention", default=None, help="model.attention (default: triton on cuda, reference on cpu)"
    )
    p.add_argument("--loss-chunk", type=int, default=8192)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--run-root", default=os.path.join(tempfile.gettempdir(), "flashtrain-sp-gradients"))
    p.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    p.add_argument("--variants", default="sp,sp_sync,sp_no_ac")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    from flashtrain.config import compose_config
    from flashtrain.trainer import Trainer

    trainer = Trainer(compose_config(_overrides(a, int(os.environ.get("WORLD_SIZE", "1")))))
    rank = trainer.rank
    x, y = trainer.task.next_batch()
    x, y = x.to(trainer.device), y.to(trainer.device)
    names = [n for n, _ in trainer.model.named_parameters()]
    params = list(trainer.model.parameters())

    with trainer._autocast():  # no sp context: the model's own attention on the whole sequence
        ref_loss = trainer.task.loss(trainer.model, x, y)
    ref = [g.float() for g in torch.autograd.grad(ref_loss, params)]
    rows = [_report("reference", ref_loss.item(), ref, ref, names)]
    # each variant's set-up returns what undoes it (None: nothing to undo)
    set_up = {
        "sp": lambda: None,
        "sp_sync": _sync_after_waits,
        "sp_no_ac": lambda: _without_ac(trainer.model),
    }
    for variant in a.variants.split(","):
        if variant not in set_up:
            raise ValueError(f"unknown variant {variant!r}; choose from {sorted(set_up)}")
        restore = set_up[variant]()
        try:
            loss, grads = _sp_grads(trainer, x, y)
        finally:
            if restore is not None:
                restore()
        rows.append(_report(variant, loss, grads, ref, names))
        if rank == 0:
            print(json.dumps(rows[-1]), flush=True)
    if rank == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump({"overrides": a.override, "rows": rows}, f, indent=1)
    trainer.close()


if __name__ == "__main__":
    main()
