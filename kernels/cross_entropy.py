"""Fused vocabulary projection + cross-entropy whose gradients are made in the forward.

A language model's loss is `cross_entropy(hidden @ weight.T, targets)` with a vocabulary of ~50k: the
fp32 logits of 16k tokens are 3.3 GB, and autograd keeps them (or, chunked under checkpointing,
recomputes the projection) and walks them several times (cast, log-softmax, its backward, cast back).
On an H200 that eager loss took 16 of GPT-2 small's 53 ms per step at 1k context.

Here the tokens go through in chunks, and for each chunk the forward does all the work at once:

    logits = h @ W.T                      (one matmul, in the autocast dtype)
    loss_i, dlogits = softmax - onehot    (one kernel: two reads of the logits, gradient written in place)
    dh = dlogits @ W,  dW += dlogits.T @ h

so only one chunk of logits ever exists, nothing is recomputed (three projection matmuls, as without
chunking), and the backward only scales the stored dh, dW by the incoming gradient. Costs: dh (tokens x
width, compute dtype) and an fp32 dW (vocab x width) are held from forward to backward. The per-row kernel runs
through Triton on CUDA; on CPU the same arithmetic runs in torch (the kernel itself is tested through
the interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, LOG2E, check_rank, is_int, next_power_of_2

# the kernel works in base 2: exp2 of an FMA's result, where exp would add a multiply
_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _cross_entropy_rows(
    LOGITS, TARGETS, LOSSES,
    stride_row, vocab, ignore_index,
    BLOCK_V: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """One program per row: its loss (lse - logit[target]), and softmax - onehot written over the row.

    The running max and sum are kept per group of GROUP adjacent logits (one thread's vector load),
    so rescaling the sum when the max moves costs one exp2 per group instead of one per logit: the
    first pass spends 1 + 1/GROUP exp2 per logit, the second one. GROUP=1 is a per-logit online softmax.
    """
    row = tl.program_id(0).to(tl.int64)
    logits = LOGITS + row * stride_row
    target = tl.load(TARGETS + row)
    groups: tl.constexpr = BLOCK_V // GROUP
    offs = tl.arange(0, groups)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # (groups, GROUP)
    # pass 1, in log2 units: running max and sum of exp2 per group, reduced across groups at the end
    # (no -inf - -inf: the running max starts finite, masked lanes load -inf and add exp2(-inf) = 0)
    m = tl.full([groups], -1.0e30, tl.float32)
    s = tl.zeros([groups], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + offs
        x = tl.load(logits + cols, mask=cols < vocab, other=float("-inf"), eviction_policy="evict_last")
        x = x.to(tl.float32) * _LOG2E
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.math.exp2(m - m_new) + tl.sum(tl.math.exp2(x - m_new[:, None]), axis=1)
        m = m_new
    row_max = tl.max(m, axis=0)
    lse2 = row_max + tl.math.log2(tl.sum(s * tl.math.exp2(m - row_max), axis=0))
    counted = target != ignore_index
    safe_target = tl.where(counted, target, 0)
    picked = tl.load(logits + safe_target).to(tl.float32)
    tl.store(LOSSES + row, tl.where(counted, lse2 / _LOG2E - picked, 0.0))
    # pass 2: d(loss)/d(logits) = softmax - onehot(target), zero for ignored rows
    keep = tl.where(counted, 1.0, 0.0)
    for start in range(0, vocab, BLOCK_V):
        cols = start + offs
        in_row = cols < vocab
        # masked lanes: exp2(-inf) = 0, where 0 - lse2 could overflow; the row is not read again
        x = tl.load(logits + cols, mask=in_row, other=float("-inf"), eviction_policy="evict_first")
        x = x.to(tl.float32)
        grad = tl.math.exp2(x * _LOG2E - lse2) - tl.where(cols == safe_target, 1.0, 0.0)
        tl.store(logits + cols, (grad * keep).to(LOGITS.dtype.element_ty), mask=in_row)


def rows_tiling(vocab: int, dtype: torch.dtype) -> dict:
    """BLOCK_V, GROUP and num_warps of `_cross_entropy_rows` for a vocabulary (interpreter: small).

    GROUP is one 16-byte load, so each group's max is taken inside one thread. Few wide programs per
    SM (32 warps over 8192 logits) keep the rows in flight small enough for L2, so the second pass
    reads the row from there: at GPT-2's vocabulary on an H100 that took 16k rows from 1.61-1.68 ms
    (8 warps over 4096) to 1.26 (`benchmarks/check_cross_entropy.py`; bytes bound it, not exp2)."""
    if INTERPRET:
        block = min(next_power_of_2(vocab), 64)
        return dict(BLOCK_V=block, GROUP=min(block, 4), num_warps=1)
    group = 16 // dtype.itemsize
    block = min(max(next_power_of_2(vocab), group), 8192)
    return dict(BLOCK_V=block, GROUP=group, num_warps=max(1, min(32, block // 256)))


def cross_entropy_rows_(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, *, use_triton=None, tiling=None
):
    """Per-row losses (fp32, 0 where target == ignore_index) of `logits` (rows, vocab); the logits are
    overwritten by the gradient of the summed loss with respect to them (softmax - onehot).
    use_triton: None = the Triton kernel on CUDA, torch on CPU; True forces the kernel (tests, through
    the interpreter on CPU). tiling: the kernel's BLOCK_V, GROUP, num_warps (default `rows_tiling`)."""
    if use_triton is None:
        use_triton = logits.is_cuda
    if use_triton:
        rows, vocab = logits.shape
        losses = torch.empty(rows, device=logits.device, dtype=torch.float32)
        if rows:
            tiling = tiling or rows_tiling(vocab, logits.dtype)
            _cross_entropy_rows[(rows,)](
                logits, targets, losses, logits.stride(0), vocab, ignore_index, **tiling
            )
        return losses
    counted = targets != ignore_index
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(x, dim=-1)
    safe = torch.where(counted, targets, 0).long()
    losses = torch.where(counted, lse - x.gather(1, safe[:, None])[:, 0], 0.0)
    grad = torch.exp(x - lse[:, None])
    grad.scatter_add_(1, safe[:, None], torch.full_like(grad[:, :1], -1.0))
    logits.copy_(grad * counted[:, None])
    return losses


def _check(hidden, weight, targets, chunk, ignore_index):
    check_rank("hidden", hidden, 2, "(tokens, width)")
    check_rank("weight", weight, 2, "(vocab, width)")
    check_rank("targets", targets, 1, "(tokens,) of int64 or int32")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy takes hidden (tokens, width) and weight (vocab, width); got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1] or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"targets must be int64 or int32 of shape ({hidden.shape[0]},); got {targets.dtype} "
            f"{tuple(targets.shape)}"
        )
    if len({hidden.device, weight.device, targets.device}) != 1:
        raise ValueError(
            f"hidden, weight and targets must be on one device; got {hidden.device}, {weight.device}, "
            f"{targets.device}"
        )
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not t.is_floating_point():  # (an integer matmul would run, and its loss mean nothing)
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not is_int(chunk) or chunk < 1:
        raise ValueError(
            f"chunk={chunk!r} must be an int >= 1 (tokens per chunk of the vocabulary projection)"
        )
    if not is_int(ignore_index):  # (a float one would match no target, and ignore nothing)
        raise ValueError(
            f"ignore_index must be an int (the target value that counts 0), got {ignore_index!r}"
        )


def _loss_and_grads(hidden, weight, targets, chunk, ignore_index, grad_h, grad_w):
    """The summed loss and, where asked, its gradients for hidden (in the compute dtype, written by
    the matmul itself) and weight (fp32, summed over chunks)."""
    device_type = hidden.device.type
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
    h_all, w = hidden.to(dtype), weight.to(dtype)
    loss = torch.zeros((), device=hidden.device, dtype=torch.promote_types(dtype, torch.float32))
    dh = torch.empty_like(h_all) if grad_h else None
    dw = None
    with torch.autocast(device_type, enabled=False):
        for start in range(0, hidden.shape[0], chunk):
            h = h_all[start : start + chunk]
            logits = h @ w.t()  # (chunk, vocab) in the compute dtype
            loss += cross_entropy_rows_(logits, targets[start : start + chunk], ignore_index).sum()
            if grad_h:
                torch.mm(logits, w, out=dh[start : start + chunk])
            if grad_w:
                dw = _add_weight_grad(dw, logits, h, loss.dtype)
            del logits  # before the next chunk's logits exist: one chunk of logits at a time, not two
    if grad_w and dw is None:  # no tokens
        dw = torch.zeros_like(weight, dtype=loss.dtype)
    return loss, dh, dw


def _add_weight_grad(dw, dlogits, h, dtype):
    """dw + dlogits.T @ h in `dtype` (fp32, or fp64 for fp64 inputs); dw None for the first chunk.

    On CUDA in fp16/bf16, cuBLAS writes the product in fp32 and adds dw in its epilogue: no rounded
    (vocab, width) product and no separate add kernel (GPT-2 medium's step on an H100 spent 0.86 of
    its 92 ms in that add). Elsewhere: the product in the compute dtype, summed in `dtype`."""
    if dlogits.is_cuda and dlogits.dtype in (torch.float16, torch.bfloat16):
        if dw is None:
            return torch.mm(dlogits.t(), h, out_dtype=dtype)
        return torch.addmm(dw, dlogits.t(), h, out_dtype=dtype, out=dw)  # in place: no copy of dw first
    product = (dlogits.t() @ h).to(dtype)
    return product if dw is None else dw.add_(product)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, ignore_index):
        grad_h, grad_w = ctx.needs_input_grad[:2]
        loss, dh, dw = _loss_and_grads(hidden, weight, targets, chunk, ignore_index, grad_h, grad_w)
        ctx.save_for_backward(dh, dw)
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dh, dw = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        dh = (dh.to(grad_loss.dtype) * grad_loss).to(hidden_dtype) if dh is not None else None
        dw = (dw * grad_loss).to(weight_dtype) if dw is not None else None
        return dh, dw, None, None, None


# Eager under torch.compile, as the block-sparse attention: a compiled model breaks its graph here, and
# the loss is matmuls plus one kernel that compiling would not fuse further.
@torch.compiler.disable
def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk: int = 4096,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Sum over tokens of cross_entropy(hidden @ weight.T, targets), an fp32 (fp64 for fp64 inputs)
    scalar; targets equal to ignore_index count 0. hidden (tokens, width), weight (vocab, width),
    targets (tokens,).

    Matches `kernels.reference.linear_cross_entropy_reference`; under autocast the projection runs in
    the autocast dtype (as `F.linear` would), otherwise in hidden's dtype (weight cast to it), and the
    softmax in fp32.
    """
    _check(hidden, weight, targets, chunk, ignore_index)
    counted = targets != ignore_index
    if hidden.is_cuda:  # an out-of-range target would read outside its row: fail on the device instead
        in_range = (targets >= 0) & (targets < weight.shape[0])
        torch._assert_async(
            (in_range | ~counted).all(),
            "linear_cross_entropy: a target lies outside [0, vocab) and is not ignore_index",
        )
    elif ((targets[counted] < 0) | (targets[counted] >= weight.shape[0])).any():
        raise ValueError(
            f"targets must lie in [0, {weight.shape[0]}) (the vocabulary) or equal ignore_index={ignore_index}"
        )
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk, ignore_index)
    return _loss_and_grads(hidden, weight, targets, chunk, ignore_index, False, False)[0]
