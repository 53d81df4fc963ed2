"""AdamW on local shards (`adamw_step_on_shards`, FSDP's step) against torch's own `optimizer.step()`.
On plain tensors the shard is the tensor, so both must agree bit for bit; the DTensor case is covered
by the FSDP runs of tests/distributed/test_data_parallel.py, which match a single process."""

import pytest
import torch

from flashtrain.optim import OptimConfig, adamw_step_on_shards, build_optimizer


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_step_on_shards_equals_optimizer_step(weight_decay):
    seed = int(torch.randint(0, 2**31 - 1, ()))
    cfg = OptimConfig(lr=1e-2, weight_decay=weight_decay)
    models = [_model(seed), _model(seed)]
    optims = [build_optimizer(m, cfg) for m in models]
    optims[1].state[models[1][0].weight]  # a lookup leaves an empty entry (state is a defaultdict)
    for step in range(4):
        x = torch.randn(5, 8)
        for i, (model, opt) in enumerate(zip(models, optims, strict=True)):
            model(x).square().mean().backward()
            if step == 2:  # a parameter without a gradient is skipped by both
                model[1].bias.grad = None
            if i == 0:
                opt.step()
            elif not adamw_step_on_shards(opt):
                assert step == 0, "only the first step (no state yet) falls back to optimizer.step()"
                opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    for pa, pb in zip(models[0].parameters(), models[1].parameters(), strict=True):
        sa, sb = optims[0].state[pa], optims[1].state[pb]
        assert torch.equal(sa["step"], sb["step"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_step_on_shards_rejects_differentiable_groups():
    model = _model(0)
    opt = build_optimizer(model, OptimConfig())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    opt.param_groups[0]["differentiable"] = True  # what torch.optim.AdamW(..., differentiable=True) sets
    with pytest.raises(ValueError, match="differentiable"):
        adamw_step_on_shards(opt)
