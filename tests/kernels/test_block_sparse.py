"""Block-sparse FlashAttention (kernels/block_sparse.py) against kernels.reference.block_sparse_reference.

Tolerance rule (as for the dense kernel): the kernel's error against the float64 reference must be
at most 2x the error of the reference computed in the kernel's own dtype, plus a small floor.
Dropout is checked as in test_dropout.py: the reference is given the keep-mask the dense kernel draws
for the same seed (kernels.flash_attention.dropout_mask), which the block-sparse kernel must reproduce.
On CPU these run through the Triton interpreter (fp16/fp32, small shapes); bf16 runs on the GPU.
"""

import pytest
import torch

from kernels import block_sparse_attention
from kernels._common import draw_seed
from kernels.flash_attention import dropout_mask, flash_attention
from kernels.layouts import BlockLayout, butterfly_layout, local_layout, random_layout, strided_layout
from kernels.reference import block_sparse_reference, expand_block_layout

FLOOR = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
DROPOUT_SEED = 99  # torch.manual_seed before each dropout call, so kernel and test draw one dropout seed


def _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, device):
    q = torch.randn(batch, seqlen_q, nheads, headdim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, nheads_kv, headdim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, nheads_kv, headdim, dtype=dtype, device=device)
    return q, k, v


def _run(fn, q, k, v, do, dlse=None):
    """out, lse and the gradients of (out * do).sum() (+ (lse * dlse).sum() when dlse is given)."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = fn(q, k, v)
    if dlse is None:
        out.backward(do.to(out.dtype))
    else:
        torch.autograd.backward((out, lse), (do.to(out.dtype), dlse.to(lse.dtype)))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def check_against_reference(q, k, v, layout, causal=False, tiles=None, dropout_p=0.0, lse_grad=False):
    """Compare out, lse, dq, dk, dv; returns the kernel's (out, lse) for extra checks.

    With dropout_p > 0 the kernel runs after torch.manual_seed(DROPOUT_SEED) and the reference gets
    the dense kernel's mask for the seed drawn after that same manual_seed: one mask for all five.
    lse_grad: the loss uses lse too (a random weight per row).
    """
    do = torch.randn_like(q)
    dlse = torch.randn(q.shape[0], q.shape[2], q.shape[1], device=q.device) if lse_grad else None
    keep = None
    if dropout_p > 0:
        torch.manual_seed(DROPOUT_SEED)
        keep = dropout_mask(draw_seed(), q.shape[0], q.shape[2], q.shape[1], k.shape[1], dropout_p, q.device)

    def kernel(q, k, v):
        if dropout_p > 0:
            torch.manual_seed(DROPOUT_SEED)
        return block_sparse_attention(q, k, v, layout, causal=causal, dropout_p=dropout_p, return_lse=True,
                                      _tiles=tiles)  # fmt: skip

    def reference(q, k, v):
        return block_sparse_reference(q, k, v, layout.mask, layout.block_m, layout.block_n, causal=causal,
                                      dropout_p=dropout_p, dropout_mask=keep, return_lse=True)  # fmt: skip

    got = _run(kernel, q, k, v, do, dlse)
    truth = _run(reference, q.double(), k.double(), v.double(), do.double(), dlse)
    low = _run(reference, q, k, v, do, dlse)
    floor = FLOOR[q.dtype]
    names = ("out", "lse", "dq", "dk", "dv")
    for name, g, t, lo in zip(names, got, truth, low, strict=True):
        assert torch.isfinite(g).all() or name == "lse", f"{name} has non-finite values"
        if name == "lse":
            empty = t == float("-inf")  # rows that see no key
            assert torch.equal(g == float("-inf"), empty), "lse must be -inf exactly on rows without keys"
            g, t, lo = g[~empty], t[~empty], lo[~empty]
        err, ref_err = _err(g, t), _err(lo, t)
        assert err <= 2 * ref_err + floor, (
            f"{name}: kernel err {err:.3g} vs reference-in-{q.dtype} err {ref_err:.3g}"
        )
    return got


LAYOUTS = {
    "butterfly": lambda n, b: butterfly_layout(n, b),
    "butterfly_global_local": lambda n, b: butterfly_layout(
        n, b, n_factors=1, global_blocks=1, local_blocks=1
    ),
    "local": lambda n, b: local_layout(n, b, local_blocks=1),
    "strided": lambda n, b: strided_layout(n, b, stride=3),
    "random_per_head": lambda n, b: random_layout(n, b, 0.3, nheads=4, seed=5),
}


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_layouts_match_reference(kind, causal, dtype, device):
    torch.manual_seed(0)
    seqlen, block = 113, 16  # odd length: a partial last tile on both axes
    q, k, v = _inputs(1, seqlen, seqlen, 4, 2, 32, dtype, device)
    check_against_reference(q, k, v, LAYOUTS[kind](seqlen, block).to(device), causal)


@pytest.mark.parametrize(
    "seqlen_q,seqlen_k,nheads,nheads_kv,headdim,block,causal",
    [
        (77, 131, 4, 1, 16, 16, True),  # more keys than queries, MQA
        (131, 77, 2, 2, 24, 16, True),  # more queries: top rows see no key under causal; head dim padded
        (64, 64, 3, 3, 64, 32, False),
        (50, 50, 6, 2, 40, 32, True),
    ],
)
def test_shapes_gqa_and_causal_alignment(
    seqlen_q, seqlen_k, nheads, nheads_kv, headdim, block, causal, device
):
    torch.manual_seed(1)
    q, k, v = _inputs(1, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, torch.float16, device)
    layout = random_layout(max(seqlen_q, seqlen_k), block, 0.5, nheads=nheads, seed=2).to(device)
    check_against_reference(q, k, v, layout, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_layout_blocks_split_into_smaller_kernel_tiles(causal, device):
    # the GPU splits 128-blocks into e.g. 32x128 tiles for dk/dv: same path with 32-blocks and 16-tiles
    torch.manual_seed(2)
    q, k, v = _inputs(1, 90, 90, 2, 2, 16, torch.float32, device)
    layout = butterfly_layout(90, 32, global_blocks=1).to(device)
    check_against_reference(q, k, v, layout, causal, tiles=(16, 16))


def test_rows_without_blocks_give_zero_and_finite_grads(device):
    torch.manual_seed(3)
    mask = butterfly_layout(96, 16).mask.clone()
    mask[:, 2] = False  # query block 2 sees nothing
    mask[:, :, 4] = False  # key block 4 is never seen
    layout = BlockLayout(mask, 16).to(device)
    q, k, v = _inputs(1, 96, 96, 2, 2, 16, torch.float16, device)
    out, lse, dq, dk, dv = check_against_reference(q, k, v, layout, causal=True)
    assert (out[:, 32:48] == 0).all() and (lse[:, :, 32:48] == float("-inf")).all()
    assert (dq[:, 32:48] == 0).all()
    assert (dk[:, 64:80] == 0).all() and (dv[:, 64:80] == 0).all()


@pytest.mark.parametrize("causal, dropout_p", [(False, 0.0), (True, 0.0), (True, 0.3)])
def test_lse_gradient_matches_reference(causal, dropout_p, device):
    """A loss on lse too: its gradient reaches q and k through the listed tiles only; causal on a
    seqlen_q > seqlen_k shape gives rows with no key (no gradient)."""
    torch.manual_seed(21)
    q, k, v = _inputs(1, 80, 50 if causal else 80, 4, 2, 32, torch.float32, device)
    layout = butterfly_layout(80, 16).to(device)
    check_against_reference(q, k, v, layout, causal, dropout_p=dropout_p, lse_grad=True)


@pytest.mark.parametrize("loss_on", ["out", "lse"])
def test_a_returned_output_the_loss_ignores_gets_no_gradient(loss_on, device, monkeypatch):
    """With return_lse, a loss on out alone sends no lse gradient back (the backward then computes
    delta itself, and may take the Hopper kernels); a loss on lse alone sends no out gradient (the
    backward takes zeros). Both match the reference's gradients."""
    from kernels import block_sparse

    seen = []
    real = block_sparse._block_sparse_backward
    monkeypatch.setattr(block_sparse, "_block_sparse_backward", lambda *a: seen.append(a[12]) or real(*a))
    torch.manual_seed(22)
    q, k, v = _inputs(1, 70, 70, 2, 2, 16, torch.float32, device)
    layout = butterfly_layout(70, 16).to(device)
    grads = []
    for fn, args in (
        (lambda *a: block_sparse_attention(*a, layout, causal=True, return_lse=True), (q, k, v)),
        (lambda *a: block_sparse_reference(*a, layout.mask, 16, 16, causal=True, return_lse=True),
         (q.double(), k.double(), v.double())),
    ):  # fmt: skip
        args = [x.detach().clone().requires_grad_() for x in args]
        out, lse = fn(*args)
        loss = out.square().sum() if loss_on == "out" else lse[lse.isfinite()].sum()
        loss.backward()
        grads.append([torch.zeros_like(x) if x.grad is None else x.grad for x in args])  # (lse has no dv)
    assert len(seen) == 1 and (seen[0] is None) == (loss_on == "out")  # (dlse, the 13th argument)
    for got, want in zip(*grads, strict=True):
        assert _err(got, want) < 1e-4


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_inference_calls_skip_autograd_with_the_same_results(dropout_p, device, monkeypatch):
    """Where no gradient can flow (no_grad, or no input requiring one) the forward's kernels run without
    the autograd Function: bitwise the differentiable call's out and lse (dropout from the same seed); a
    differentiable call still takes the Function."""
    from kernels import block_sparse

    torch.manual_seed(23)
    q, k, v = _inputs(2, 70, 70, 4, 2, 16, torch.float16, device)
    layout = butterfly_layout(70, 16, global_blocks=1).to(device)

    def call(*tensors):
        torch.manual_seed(DROPOUT_SEED)
        return block_sparse_attention(*tensors, layout, causal=True, dropout_p=dropout_p, return_lse=True)

    trained = call(*(x.clone().requires_grad_() for x in (q, k, v)))
    assert trained[0].grad_fn is not None

    def refuse(*args):
        raise AssertionError("an inference call went through the autograd Function")

    monkeypatch.setattr(block_sparse.BlockSparseAttnFunc, "apply", refuse)
    with torch.no_grad():
        no_grad = call(*(x.clone().requires_grad_() for x in (q, k, v)))
    for result in (no_grad, call(q, k, v)):  # (grad mode on, nothing requiring a gradient)
        assert all(torch.equal(a, b.detach()) for a, b in zip(result, trained, strict=True))
    with pytest.raises(AssertionError, match="autograd Function"):
        call(q.clone().requires_grad_(), k, v)


def test_dropped_tiles_are_never_read(device):
    # NaN in every key/value/query row that only dropped tiles touch: a kernel that read them would
    # spread the NaN (0 * NaN = NaN), so finite, correct results show the tiles are skipped
    torch.manual_seed(4)
    mask = local_layout(128, 16, local_blocks=0).mask.clone()  # block diagonal
    mask[0, 3, 3] = False  # block 3 of q and of k/v is in no kept tile
    layout = BlockLayout(mask, 16).to(device)
    q, k, v = _inputs(1, 128, 128, 2, 2, 16, torch.float32, device)
    clean = [x.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x[:, 48:64] = float("nan")
    do = torch.randn_like(q)
    got = _run(lambda q, k, v: block_sparse_attention(q, k, v, layout, return_lse=True), q, k, v, do)
    ref = _run(lambda q, k, v: block_sparse_reference(q, k, v, mask, 16, 16, return_lse=True),
               *(x.double() for x in clean), do.double())  # fmt: skip
    rows = torch.cat([torch.arange(0, 48), torch.arange(64, 128)])
    for g, t in zip(got, ref, strict=True):
        sel = g[:, :, rows] if g.dim() == 3 else g[:, rows]
        assert torch.isfinite(sel).all()
        assert _err(sel, t[:, :, rows] if t.dim() == 3 else t[:, rows]) < 1e-5


def test_softmax_scale_and_noncontiguous_inputs(device):
    torch.manual_seed(5)
    qkv = torch.randn(1, 70, 3, 2, 32, dtype=torch.float32, device=device)
    q, k, v = qkv.unbind(2)  # strided views into one packed tensor
    layout = butterfly_layout(70, 16).to(device)
    out = block_sparse_attention(q, k, v, layout, softmax_scale=0.3)
    ref = block_sparse_reference(q.double(), k.double(), v.double(), layout.mask, 16, 16, softmax_scale=0.3)
    assert _err(out, ref) < 1e-5


# ----------------------------------------------------------------------------------------------
# dropout
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,seqlen_q,seqlen_k,nheads,nheads_kv,headdim,kind,block,causal,tiles",
    [
        (torch.float16, 113, 113, 4, 2, 32, "butterfly", 16, True, None),  # GQA + causal + butterfly
        (torch.float32, 77, 131, 2, 1, 24, "random_per_head", 32, True, (16, 16)),  # MQA, split tiles
        (torch.float32, 64, 64, 2, 2, 16, "strided", 16, False, None),
    ],
)
def test_dropout_matches_reference_with_the_dense_mask(
    dtype, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, kind, block, causal, tiles, device
):
    """Forward and all three gradients against the reference given the dense kernel's mask: the
    backward kernels must regenerate exactly the mask the forward drew."""
    torch.manual_seed(8)
    q, k, v = _inputs(1, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, device)
    if kind == "random_per_head":
        layout = random_layout(max(seqlen_q, seqlen_k), block, 0.5, nheads=nheads, seed=3)
    else:
        layout = LAYOUTS[kind](max(seqlen_q, seqlen_k), block)
    check_against_reference(q, k, v, layout.to(device), causal, tiles=tiles, dropout_p=0.3)


def test_dropout_keep_mask_is_the_dense_mask_on_the_layout(device):
    """Read the forward's keep-mask off the output: with v the identity (one key per head-dim slot),
    out[i, j] = P[i, j] * keep[i, j] / (1 - p), and P > 0 wherever the layout lets i see j."""
    p, batch, seqlen_q, seqlen_k, nheads, nheads_kv = 0.2, 2, 96, 64, 4, 2
    torch.manual_seed(9)
    q = torch.randn(batch, seqlen_q, nheads, seqlen_k, device=device)
    k = torch.randn(batch, seqlen_k, nheads_kv, seqlen_k, device=device)
    # (B, Sk, Hk, Sk): key j's value is the one-hot vector e_j
    v = torch.eye(seqlen_k, device=device)[None, :, None, :].expand(batch, -1, nheads_kv, -1)
    layout = butterfly_layout(seqlen_q, 16).to(device)
    plain = block_sparse_attention(q, k, v, layout)
    torch.manual_seed(DROPOUT_SEED)
    dropped = block_sparse_attention(q, k, v, layout, dropout_p=p)
    torch.manual_seed(DROPOUT_SEED)
    dense_keep = dropout_mask(draw_seed(), batch, nheads, seqlen_q, seqlen_k, p, device)  # (B, H, Sq, Sk)

    visible = expand_block_layout(layout.mask, 16, 16, seqlen_q, seqlen_k).expand_as(dense_keep)
    probs = plain.transpose(1, 2)  # (B, H, Sq, Sk): row i of the softmax, thanks to v = identity
    assert (probs[visible] > 0).all() and (probs[~visible] == 0).all()
    kernel_keep = dropped.transpose(1, 2) != 0  # (B, H, Sq, Sk)
    assert torch.equal(kernel_keep, dense_keep & visible)
    torch.testing.assert_close(dropped.transpose(1, 2), probs * kernel_keep / (1 - p), atol=1e-6, rtol=1e-5)
    n = int(visible.sum())
    rate = kernel_keep[visible].float().mean().item()
    assert abs(rate - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5, f"keep rate {rate:.4f} over {n} draws"


def test_dropout_with_a_full_layout_equals_dense_dropout(device):
    """Every tile kept: same seed, same mask, so block-sparse and dense agree forward and backward."""
    torch.manual_seed(10)
    q, k, v = (x.requires_grad_() for x in _inputs(1, 80, 80, 4, 2, 32, torch.float32, device))
    full = BlockLayout(torch.ones(1, 5, 5, dtype=torch.bool), 16).to(device)
    do = torch.randn_like(q)
    results = []
    for fn in (lambda: block_sparse_attention(q, k, v, full, causal=True, dropout_p=0.4),
               lambda: flash_attention(q, k, v, causal=True, dropout_p=0.4)):  # fmt: skip
        torch.manual_seed(DROPOUT_SEED)
        out = fn()
        results.append((out, *torch.autograd.grad(out, (q, k, v), do)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_dropout_reproducible_and_zero_dropout_untouched(device):
    torch.manual_seed(11)
    q, k, v = _inputs(1, 64, 64, 2, 2, 16, torch.float32, device)
    layout = butterfly_layout(64, 16).to(device)
    outs = []
    for s in (5, 5, 6):
        torch.manual_seed(s)
        outs.append(block_sparse_attention(q, k, v, layout, dropout_p=0.5))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    # p = 0 takes the plain path: no seed drawn from the generator, the same output as no argument
    state = torch.get_rng_state()
    zero = block_sparse_attention(q, k, v, layout, dropout_p=0.0)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(zero, block_sparse_attention(q, k, v, layout))
    assert not torch.equal(zero, outs[0])


def _bad(device, **changes):
    args = dict(zip("qkv", _inputs(1, 64, 64, 2, 2, 16, torch.float16, device), strict=True))
    args["layout"] = butterfly_layout(64, 16).to(device)
    options = ("causal", "dropout_p", "softmax_scale", "return_lse")
    kwargs = {k: changes.pop(k) for k in list(changes) if k in options}
    args.update(changes)
    return lambda: block_sparse_attention(args["q"], args["k"], args["v"], args["layout"], **kwargs)


@pytest.mark.parametrize(
    "changes,match",
    [
        (lambda d: dict(layout=butterfly_layout(48, 16).to(d)), "covers 48x48 but the scores are 64x64"),
        (lambda d: dict(layout=butterfly_layout(64, 16).mask.to(d)), "wrap a bool tile mask as BlockLayout"),
        (lambda d: dict(layout=random_layout(64, 16, 0.5, nheads=3).to(d)), "needs 1 .shared. or nheads=2"),
        (lambda d: dict(layout=butterfly_layout(64, 16).to("meta")), "use layout.to"),
        (lambda d: dict(q=torch.randn(1, 64, 2, 16, device=d)), "share one dtype"),
        (lambda d: dict(q=torch.randn(1, 64, 2, 16, device=d).long()), "dtype"),
        (lambda d: dict(k=torch.randn(1, 64, 2, 8, dtype=torch.float16, device=d)), r"k and v must both be"),
        (lambda d: dict(q=torch.randn(64, 2, 16, dtype=torch.float16, device=d)), "4-d tensor"),
        (lambda d: dict(q=torch.randn(1, 64, 3, 16, dtype=torch.float16, device=d)), "multiple of nheads_kv"),
        (lambda d: dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
        (lambda d: dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\)"),
        (lambda d: dict(dropout_p=float("nan")), r"dropout_p must be in \[0, 1\)"),
        (lambda d: dict(softmax_scale=float("nan")), "softmax_scale"),
        (lambda d: dict(softmax_scale=-0.5), "softmax_scale must be finite and > 0"),
        (lambda d: dict(softmax_scale=0.0), "softmax_scale must be finite and > 0"),
        (lambda d: dict(causal="no"), "causal must be a bool"),
        (lambda d: dict(return_lse="no"), "return_lse must be a bool"),
    ],
)
def test_bad_inputs(changes, match, device):
    with pytest.raises(ValueError, match=match):
        _bad(device, **changes(device))()


@pytest.mark.gpu
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_bf16_realistic(headdim, causal):
    torch.manual_seed(6)
    seqlen = 2048 + 77
    q, k, v = _inputs(2, seqlen, seqlen, 8, 4, headdim, torch.bfloat16, "cuda")
    layout = butterfly_layout(seqlen, 128, global_blocks=1, causal=causal).cuda()
    # the float64 truth is affordable here on the GPU; bf16 reference sets the tolerance
    check_against_reference(q, k, v, layout, causal)


@pytest.mark.gpu
def test_gpu_per_head_random_layout_gqa():
    torch.manual_seed(7)
    q, k, v = _inputs(1, 4096, 4096, 8, 2, 64, torch.bfloat16, "cuda")
    check_against_reference(q, k, v, random_layout(4096, 64, 0.1, nheads=8, seed=1).cuda(), causal=True)


@pytest.mark.gpu
def test_gpu_bf16_dropout_matches_reference_with_the_kernels_mask():
    torch.manual_seed(8)
    q, k, v = _inputs(2, 1024 + 33, 1024 + 33, 8, 4, 64, torch.bfloat16, "cuda")
    layout = butterfly_layout(1024 + 33, 128, local_blocks=1, causal=True).cuda()
    check_against_reference(q, k, v, layout, causal=True, dropout_p=0.2)


def test_strided_views_of_a_fused_projection_forward_and_backward(device):
    """q/k/v sliced from one (B, N, 3·H·D) projection, as the model produces them, in both passes."""
    batch, seqlen, nheads, headdim = 2, 96, 2, 16
    layout = butterfly_layout(seqlen, 32, local_blocks=1).to(device)
    qkv = torch.randn(
        batch, seqlen, 3 * nheads * headdim, dtype=torch.float32, device=device, requires_grad=True
    )
    q, k, v = (t.view(batch, seqlen, nheads, headdim) for t in qkv.split(nheads * headdim, dim=-1))
    out = block_sparse_attention(q, k, v, layout)
    dout = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, qkv, dout)
    qkv64 = qkv.detach().double().requires_grad_()
    q64, k64, v64 = (t.view(batch, seqlen, nheads, headdim) for t in qkv64.split(nheads * headdim, dim=-1))
    ref = block_sparse_reference(q64, k64, v64, layout.mask, 32, 32)
    (ref_grad,) = torch.autograd.grad(ref, qkv64, dout.double())
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-5, rtol=1e-4)
