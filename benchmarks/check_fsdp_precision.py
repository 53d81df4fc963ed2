"""FSDP2's bf16 mixed precision against fp32: how far its gradients are from exact, beside one device's autocast.

Every rank builds the same model (same seed) and the same batch, so FSDP's averaged gradients are one
device's, and computes one forward+backward in each way:

- `fp32`: the unsharded model, no autocast (the reference);
- `autocast`: the unsharded model under bf16 autocast (what one GPU and DDP train with);
- `fsdp_fp32_residual`: FSDP2, bf16 weights, `residual_dtype=float32` (the default);
- `fsdp_bf16_residual`: FSDP2, bf16 weights, `residual_dtype=bfloat16` (every unit's inputs cast).

For each: the loss's error and every parameter's relative gradient error against `fp32` (largest,
median, the worst parameters). Rank 0 prints and writes the rows.

    torchrun --nproc-per-node 2 benchmarks/check_fsdp_precision.py --model gpt2_medium --seq-len 4096 --out p.json
    torchrun --nproc-per-node 2 benchmarks/check_fsdp_precision.py --device cpu --model gpt_tiny --seq-len 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VOCAB = 50304  # GPT-2's, padded to a multiple of 64


def _model_config(a):
    """The configs/model/ entry through the project's own config path, sized for this check."""
    from dataclasses import replace

    from flashtrain.config import compose_config

    model = compose_config([f"model={a.model}"]).model
    attention = a.attention or ("sdpa" if a.device == "cuda" else "reference")
    return replace(
        model, vocab_size=VOCAB, max_seq_len=max(a.seq_len, model.max_seq_len), attention=attention
    )


def loss_and_grads(model, idx, device_type: str, autocast: bool = True) -> tuple[float, dict]:
    """One forward+backward (under bf16 autocast unless told otherwise): the loss, and every
    parameter's fp32 gradient by name (FSDP's DTensor gradients gathered whole)."""
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(idx, idx)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = g.float()
    return loss.item(), grads


def _report(variant, loss, grads, ref_loss, ref) -> dict:
    rel = {n: ((g - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)).item() for n, g in grads.items()}
    worst = sorted(rel, key=rel.get, reverse=True)[:5]
    return {
        "variant": variant,
        "loss": loss,
        "loss_abs_err": abs(loss - ref_loss),
        "max_rel_grad_err": max(rel.values()),
        "median_rel_grad_err": statistics.median(rel.values()),
        "worst": [[n, rel[n]] for n in worst],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2_medium", help="a configs/model/ name")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--attention", default=None, help="model.attention (default: sdpa on cuda, reference on cpu)"
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args()

    from torch.distributed.device_mesh import init_device_mesh

    from flashtrain.models.gpt import GPT
    from flashtrain.parallelize import apply_fsdp

    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device(a.device, int(os.environ.get("LOCAL_RANK", 0)))
        if a.device == "cuda"
        else torch.device("cpu")
    )
    if a.device == "cuda":
        torch.cuda.set_device(device)
    cfg = _model_config(a)
    torch.manual_seed(a.seed)  # the same weights and batch on every rank
    model = GPT(cfg).to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    idx = torch.randint(0, VOCAB, (a.batch_size, a.seq_len), device=device)

    ref_loss, ref = loss_and_grads(model, idx, device.type, autocast=False)
    rows = [_report("fp32", ref_loss, ref, ref_loss, ref)]
    model.zero_grad(set_to_none=True)
    rows.append(_report("autocast", *loss_and_grads(model, idx, device.type, autocast=True), ref_loss, ref))
    del model
    mesh = init_device_mesh(device.type, (world,))
    for residual in (torch.float32, torch.bfloat16):
        model = GPT(cfg).to(device)
        model.load_state_dict(state)
        apply_fsdp(
            model, mesh, reshard_after_forward=True, param_dtype=torch.bfloat16, residual_dtype=residual
        )
        name = f"fsdp_{'fp32' if residual == torch.float32 else 'bf16'}_residual"
        rows.append(_report(name, *loss_and_grads(model, idx, device.type, autocast=True), ref_loss, ref))
        del model
    if rank == 0:
        for r in rows:
            print(
                f"{r['variant']:>20}  loss {r['loss']:.6f} (err {r['loss_abs_err']:.2e})  rel grad err "
                f"max {r['max_rel_grad_err']:.2e} median {r['median_rel_grad_err']:.2e}  worst {r['worst'][0]}"
            )
        if a.out:
            meta = {
                "model": a.model, "seq_len": a.seq_len, "batch_size": a.batch_size, "world_size": world,
                "attention": cfg.attention, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                "torch": torch.__version__,
            }  # fmt: skip
            with open(a.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
