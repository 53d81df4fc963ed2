"""Our attention's fwd+bwd inside a CUDA graph (GPU only): captured by PyTorch's recipe (warm-up on a
side stream, then `torch.cuda.graph`: `benchmarks.common.capture_graph`) and replayed on new values
copied into the captured inputs, it gives the gradients of an eager call on those values. Dense calls on
the Gluon kernels (the ordered one-kernel backward among them) and on the portable ones, and
block-sparse; also after an eager call on the default stream (a user's eager steps before the capture)
whose outputs are dropped. (An eager call whose autograd graph stays alive through the capture makes any
op's capture fail, SDPA's too: pytorch/pytorch#164302; benchmarks/check_graph_capture.py.)
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import capture_graph
from kernels import block_sparse_attention, flash_attention
from kernels.layouts import butterfly_layout

pytestmark = pytest.mark.gpu

CASES = {  # name -> (batch, seqlen, nheads, nheads_kv, headdim, causal, block-sparse)
    "dense_d128_causal_512": (2, 512, 4, 4, 128, True, False),  # the Gluon kernels on an H100/H200
    # the ordered one-kernel backward (its semaphores and fp32 dq buffer allocated inside the capture):
    # full attention in key groups, causal in one key group and in two, the causal convoy walking down
    "dense_d128_full_1024_ordered": (2, 1024, 4, 4, 128, False, False),
    "dense_d128_causal_4096_ordered": (1, 4096, 2, 2, 128, True, False),
    "dense_d128_causal_12288_ordered_key_groups": (1, 12288, 1, 1, 128, True, False),
    "dense_d128_causal_24576_convoy": (1, 24576, 1, 1, 128, True, False),
    "dense_d64_full_1024_gqa": (1, 1024, 4, 2, 64, False, False),
    "dense_d80_causal_200_gqa": (2, 200, 4, 1, 80, True, False),  # the portable kernels
    "block_sparse_d128_2048": (1, 2048, 4, 4, 128, False, True),
}


def _fwdbwd(case: str):
    batch, seqlen, nheads, nheads_kv, headdim, causal, sparse = CASES[case]

    def new(heads, requires_grad=True):
        t = torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16)
        return t.requires_grad_(requires_grad)

    q, k, v, dout = new(nheads), new(nheads_kv), new(nheads_kv), new(nheads, requires_grad=False)
    layout = butterfly_layout(seqlen, 128).to("cuda") if sparse else None

    def fwdbwd():
        if sparse:
            out = block_sparse_attention(q, k, v, layout)
        else:
            out = flash_attention(q, k, v, causal=causal)
        return torch.autograd.grad(out, (q, k, v), dout)

    return fwdbwd, (q, k, v, dout)


@pytest.mark.parametrize("eager_first", [False, True], ids=["recipe", "after_eager_call"])
@pytest.mark.parametrize("case", list(CASES))
def test_replay_gives_eager_gradients(case, eager_first):
    _, seqlen, nheads, nheads_kv, headdim, causal, _ = CASES[case]
    if "ordered" in case or "convoy" in case:
        from kernels import _flash_bwd_fused_hopper as fused_hopper

        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("the ordered one-kernel backward runs on sm_90 (H100/H200) only")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert fused_hopper.supports_ordered(headdim, causal, seqlen, seqlen, nheads // nheads_kv, sms)
    torch.manual_seed(0)
    fwdbwd, inputs = _fwdbwd(case)
    if eager_first:
        fwdbwd()  # on the default stream; its outputs dropped
    graph, captured = capture_graph(fwdbwd)
    for _ in range(2):  # twice: each replay reads the inputs' current values
        with torch.no_grad():
            for t in inputs:
                t.copy_(torch.randn_like(t))
        graph.replay()
        eager = fwdbwd()
        for name, got, want in zip(("dq", "dk", "dv"), captured, eager, strict=True):
            assert torch.isfinite(want).all()
            diff = (got.float() - want.float()).abs().max().item()
            assert diff <= 1e-3 * want.float().abs().max().item(), f"{case} {name}: replay differs by {diff}"
