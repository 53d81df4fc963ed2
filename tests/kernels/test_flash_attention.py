"""kernels.flash_attention against kernels.reference (float64), forward and backward.

On CPU these run through the Triton interpreter with small shapes (fp16/fp32); GPU-marked tests run
the same checks in bf16 at realistic sizes.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels import flash_attention
from kernels.reference import attention_reference
from tests.kernels._flash_utils import (
    FLOOR,
    MustNotLaunch,
    assert_bad_input_raises,
    assert_close_rule,
    bad_input_names,
    check_against_reference,
    check_public_api,
    deterministic_algorithms,
    randn,
)

F16, F32 = torch.float16, torch.float32

# (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, causal, window): odd lengths, head dims
# including non-powers of two, GQA/MQA, causal with seqlen_q != seqlen_k both ways, windows.
CASES = [
    (F16, 2, 1, 1, 2, 2, 64, False, None),
    (F32, 1, 17, 17, 2, 2, 16, True, None),
    (F16, 1, 127, 127, 4, 1, 40, True, None),
    (F32, 1, 129, 300, 2, 2, 80, True, None),
    (F16, 1, 300, 129, 4, 2, 64, True, None),  # top rows see no key: out 0, lse -inf
    (F16, 2, 17, 129, 2, 2, 128, False, None),
    (F32, 1, 127, 129, 2, 1, 40, False, (16, 8)),
    (F16, 1, 129, 127, 2, 1, 64, True, (32, None)),
    (F32, 1, 300, 300, 1, 1, 16, False, (None, 7)),
    (F16, 1, 1, 300, 2, 2, 80, True, None),
    (F32, 1, 300, 1, 2, 2, 64, True, None),
    (F32, 2, 64, 64, 2, 2, 24, False, (0, 0)),  # each query sees exactly one key
]


def _ids(case):
    dtype, b, sq, sk, h, hk, d, causal, window = case
    return f"{str(dtype)[6:]}-b{b}-q{sq}-k{sk}-h{h}/{hk}-d{d}-{'causal' if causal else 'full'}-w{window}"


def _check_case(dtype, device, b, sq, sk, h, hk, d, causal, window, seed, deterministic=True, lse_grad=False):
    """One shape against the float64 reference (forward, lse and gradients), the tolerance rule."""
    torch.manual_seed(seed)
    q, k, v = (
        randn(b, sq, h, d, dtype=dtype, device=device),
        *(randn(b, sk, hk, d, dtype=dtype, device=device) for _ in range(2)),
    )
    kw = dict(causal=causal, window=window, return_lse=True)
    check_against_reference(
        lambda q, k, v: flash_attention(q, k, v, deterministic=deterministic, **kw),
        lambda q, k, v: attention_reference(q, k, v, **kw),
        [q, k, v],
        dtype,
        lse_grad=lse_grad,
    )


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_matches_reference(case, device):
    dtype, b, sq, sk, h, hk, d, causal, window = case
    _check_case(dtype, device, b, sq, sk, h, hk, d, causal, window, seed=sq * 1000 + sk + d)


@pytest.mark.parametrize("case", [CASES[2], CASES[4], CASES[7]], ids=_ids)
def test_atomic_dq_matches_reference(case, device):
    """deterministic=False: dq accumulated with atomics inside the dk/dv kernel."""
    dtype, b, sq, sk, h, hk, d, causal, window = case
    _check_case(dtype, device, b, sq, sk, h, hk, d, causal, window, seed=sq + sk + d, deterministic=False)


@pytest.mark.parametrize(
    "case, deterministic",
    [(CASES[1], True), (CASES[2], True), (CASES[4], True), (CASES[6], True), (CASES[7], False)],
    ids=lambda c: _ids(c) if isinstance(c, tuple) else ("deterministic" if c else "atomic"),
)
def test_lse_gradient_matches_reference(case, deterministic, device):
    """A loss on lse as well as out (a z-loss, merging partial attentions): lse's gradient reaches q
    and k, in GQA, rows that see no key (no gradient), windows and the atomic dq."""
    dtype, b, sq, sk, h, hk, d, causal, window = case
    _check_case(
        dtype, device, b, sq, sk, h, hk, d, causal, window, seed=3 * sq + sk, deterministic=deterministic,
        lse_grad=True,
    )  # fmt: skip


def test_loss_on_lse_alone(device):
    """out unused: autograd hands the backward a zero dout, and the gradients are lse's alone."""
    torch.manual_seed(4)
    q, k, v = (randn(1, n, 2, 32, dtype=F32, device=device) for n in (33, 45, 45))
    _, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    _, lse64 = attention_reference(*ins64, causal=True, return_lse=True)
    (lse.square().sum()).backward()
    (lse64.square().sum()).backward()
    for name, got, want in zip("qk", (q, k), ins64[:2], strict=True):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert ins64[2].grad is None and torch.all(v.grad == 0)  # lse does not depend on v


def test_a_returned_lse_the_loss_ignores_sends_no_gradient(device, monkeypatch):
    """return_lse with a loss on out alone: the backward gets no lse gradient (so it computes delta
    itself, and may take the Hopper kernels, instead of the lse-gradient route a zero-filled one would
    force), and the gradients match the reference's."""
    fa = importlib.import_module("kernels.flash_attention")  # (the package's name is the function)
    seen = []
    real = fa.flash_attn_backward
    monkeypatch.setattr(
        fa, "flash_attn_backward", lambda *a, **kw: seen.append(kw["dlse2"]) or real(*a, **kw)
    )
    torch.manual_seed(5)
    q, k, v = (randn(1, n, 2, 32, dtype=F32, device=device) for n in (33, 45, 45))
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out64 = attention_reference(*ins64, causal=True)
    out.square().sum().backward()
    out64.square().sum().backward()
    assert seen == [None]
    for name, got, want in zip("qkv", (q, k, v), ins64, strict=True):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "case, deterministic",
    [(CASES[2], True), (CASES[4], True), (CASES[6], True), (CASES[7], False)],
    ids=lambda c: _ids(c) if isinstance(c, tuple) else ("deterministic" if c else "atomic"),
)
def test_split_dkdv_passes_match_reference(case, deterministic, device, monkeypatch):
    """The wide-head backward (dv, then dk, each pass with one accumulator), forced at small head dims:
    GQA, rows that see no key, a window, the atomic dq."""
    import kernels._flash_bwd as bwd

    monkeypatch.setattr(bwd, "SPLIT_DKDV_ABOVE", 0)
    dtype, b, sq, sk, h, hk, d, causal, window = case
    _check_case(
        dtype, device, b, sq, sk, h, hk, d, causal, window, seed=7 * sq + sk, deterministic=deterministic
    )


@pytest.mark.parametrize("dtype", [F16, F32])
def test_key_padding_mask(dtype, device):
    torch.manual_seed(0)
    b, sq, sk, h, d = 3, 37, 70, 2, 32
    q, k, v = (
        randn(b, sq, h, d, dtype=dtype, device=device),
        *(randn(b, sk, h, d, dtype=dtype, device=device) for _ in range(2)),
    )
    kpm = torch.rand(b, sk, device=device) > 0.4
    kpm[1] = False  # a sequence with no key at all: every row gives out 0, lse -inf
    check_public_api([q, k, v], dtype, key_padding_mask=kpm, causal=dtype == F32)


def test_fully_masked_rows_are_zero_with_finite_grads(device):
    torch.manual_seed(1)
    q, k, v = (randn(1, n, 2, 32, dtype=F32, device=device) for n in (40, 20, 20))
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)  # rows 0..19 see no key
    assert torch.all(out[:, :20] == 0) and torch.all(lse[:, :, :20] == float("-inf"))
    assert torch.isfinite(lse[:, :, 20:]).all()
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][:, :20] == 0)


def test_strided_inputs_and_custom_scale(device):
    """q/k/v as views into one packed (B, S, 3, H, D) tensor, and a k with a non-unit last stride."""
    torch.manual_seed(2)
    qkv = torch.randn(2, 65, 3, 2, 48, dtype=F16, device=device)
    q, k, v = (qkv[:, :, i].requires_grad_() if False else qkv[:, :, i] for i in range(3))
    k_t = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, last stride != 1
    assert q.stride(-1) == 1 and k_t.stride(-1) != 1
    out = flash_attention(q, k_t, v, softmax_scale=0.3, causal=True)
    ref64 = attention_reference(q.double(), k.double(), v.double(), softmax_scale=0.3, causal=True)
    ref16 = attention_reference(q, k, v, softmax_scale=0.3, causal=True)
    assert_close_rule("out", out, ref64, ref16, F16)


def test_deterministic(device):
    torch.manual_seed(3)
    q, k, v = (randn(1, 50, 4, 32, dtype=F32, device=device) for _ in range(3))
    kv = (k[:, :, :2].detach().requires_grad_(), v[:, :, :2].detach().requires_grad_())
    runs = []
    for _ in range(2):
        out = flash_attention(q, *kv, causal=True)
        runs.append((out, *torch.autograd.grad(out, (q, *kv), torch.ones_like(out))))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def _bad(device):
    q = torch.randn(1, 8, 4, 16, device=device, dtype=F16)
    kv = torch.randn(1, 8, 2, 16, device=device, dtype=F16)
    return [
        ("rank", lambda: flash_attention(q[0], kv, kv), "batch, seqlen, nheads, headdim"),
        ("batch", lambda: flash_attention(q, kv.expand(2, -1, -1, -1), kv), "batch size"),
        ("heads", lambda: flash_attention(q[:, :, :3], kv, kv), "multiple of nheads_kv"),
        ("kv heads", lambda: flash_attention(q, kv, kv[:, :, :1]), "same number of heads"),
        ("headdim", lambda: flash_attention(q, kv[..., :8], kv[..., :8]), "head dim"),
        ("big headdim", lambda: flash_attention(*(torch.zeros(1, 2, 1, 320, dtype=F16, device=device),) * 3), "1..256"),
        ("dtype mix", lambda: flash_attention(q, kv.float(), kv), "one dtype"),
        ("dtype", lambda: flash_attention(q.double(), kv.double(), kv.double()), "float16, bfloat16 or float32"),
        ("dropout", lambda: flash_attention(q, kv, kv, dropout_p=1.0), r"\[0, 1\)"),
        ("dropout neg", lambda: flash_attention(q, kv, kv, dropout_p=-0.1), r"\[0, 1\)"),
        ("window", lambda: flash_attention(q, kv, kv, window=(-1, None)), "non-negative"),
        ("window pair", lambda: flash_attention(q, kv, kv, window=(1,)), "pair"),
        ("kpm dtype", lambda: flash_attention(q, kv, kv, key_padding_mask=torch.ones(1, 8, device=device)), "bool"),
        ("kpm shape", lambda: flash_attention(q, kv, kv, key_padding_mask=torch.ones(1, 7, dtype=torch.bool, device=device)), "shape"),
        ("kv seqlen", lambda: flash_attention(q, kv, kv[:, :5]), "same seqlen"),
        ("scale neg", lambda: flash_attention(q, kv, kv, softmax_scale=-0.1), "> 0"),
        # 0 would make a masked score's scaled max 0 * -inf = NaN in the forward's folded scale
        ("scale zero", lambda: flash_attention(q, kv, kv, causal=True, softmax_scale=0.0), "> 0"),
        ("scale nan", lambda: flash_attention(q, kv, kv, softmax_scale=float("nan")), "finite"),
        ("scale type", lambda: flash_attention(q, kv, kv, softmax_scale="0.1"), "a number"),
        ("causal type", lambda: flash_attention(q, kv, kv, causal="no"), "causal must be a bool"),  # truthy
        ("return_lse type", lambda: flash_attention(q, kv, kv, return_lse="no"), "return_lse must be a bool"),
        # None would read as False and silently take the atomic backward
        ("deterministic type", lambda: flash_attention(q, kv, kv, deterministic=None), "deterministic must be a bool"),
        ("no heads", lambda: flash_attention(q[:, :, :0], kv, kv), "at least one head"),
        ("no kv heads", lambda: flash_attention(q, kv[:, :, :0], kv[:, :, :0]), "at least one head"),
        ("window bool", lambda: flash_attention(q, kv, kv, window=(True, None)), "non-negative int"),
        ("window type", lambda: flash_attention(q, kv, kv, window=4), "pair"),
        ("not a tensor", lambda: flash_attention(q.tolist(), kv, kv), "q must be a torch.Tensor"),
        ("kpm not a tensor", lambda: flash_attention(q, kv, kv, key_padding_mask=[[True] * 8]), "key_padding_mask must be a torch.Tensor"),
    ]  # fmt: skip


@pytest.mark.parametrize("name", bad_input_names(_bad))
def test_bad_inputs_raise(name, device):
    assert_bad_input_raises(_bad, name, device)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU-device error only exists without the interpreter"
)
def test_cpu_tensors_without_interpreter_say_what_to_do(monkeypatch):
    import kernels._common as common

    monkeypatch.setattr(common, "INTERPRET", False)
    x = torch.randn(1, 4, 1, 16, dtype=F16)
    with pytest.raises(ValueError, match="move tensors to CUDA or set TRITON_INTERPRET=1"):
        flash_attention(x, x, x)


# ---------------------------------------------------------------------------------------------------
# GPU: bf16 at realistic sizes, same tolerance rule (float64 reference on the GPU)
# ---------------------------------------------------------------------------------------------------

GPU_CASES = [
    (2, 2048, 2048, 16, 16, 64, True, None),
    (2, 4096, 4096, 8, 8, 128, False, None),
    (1, 4096, 4096, 8, 2, 128, True, None),
    (1, 3000, 3500, 4, 4, 96, True, (512, 0)),
    (2, 1024, 1024, 4, 4, 256, True, None),
    (1, 2048, 2048, 4, 1, 80, False, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gpu_bf16(case):
    sq, d = case[1], case[5]
    _check_case(torch.bfloat16, "cuda", *case, seed=sq + d)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [GPU_CASES[i] for i in (0, 2, 3, 5)], ids=lambda c: "-".join(map(str, c)))
def test_gpu_bf16_atomic_dq(case):
    """deterministic=False on the GPU: on Hopper the deterministic route (d64), the one-kernel backward
    (d128 causal 4k); the portable atomic variant (a window at d96, d80)."""
    sq, d = case[1], case[5]
    _check_case(torch.bfloat16, "cuda", *case, seed=sq + d + 1, deterministic=False)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_gpu_bf16_lse_gradient(deterministic):
    case = GPU_CASES[0]
    _check_case(torch.bfloat16, "cuda", *case, seed=case[1] + 3, deterministic=deterministic, lse_grad=True)


@pytest.mark.gpu
def test_gpu_key_padding_and_fp16():
    torch.manual_seed(5)
    q, k, v = (randn(2, 1500, 8, 64, dtype=F16, device="cuda") for _ in range(3))
    kpm = torch.rand(2, 1500, device="cuda") > 0.3
    check_public_api([q, k, v], F16, key_padding_mask=kpm)
    assert FLOOR[F16] > 0


@pytest.fixture
def torch_deterministic_mode():
    with deterministic_algorithms():
        yield


@pytest.mark.parametrize("packed", [False, True], ids=["qkv", "qkvpacked"])
def test_deterministic_false_under_torch_deterministic_mode_runs_the_deterministic_kernels(
    monkeypatch, torch_deterministic_mode, packed, device
):
    """torch.use_deterministic_algorithms(True) on when the backward runs: deterministic=False takes the
    deterministic kernels (torch's rule for an op that has them), so its gradients are bitwise those of
    deterministic=True, and the atomic kernel never launches."""
    from kernels import _flash_bwd, flash_attention_qkvpacked

    torch.manual_seed(11)
    qkv = randn(1, 33, 6, 16, dtype=F32, device=device)
    do = randn(1, 33, 2, 16, dtype=F32, device=device, requires_grad=False)

    def grads(deterministic):
        x = qkv.detach().clone().requires_grad_()
        if packed:
            out = flash_attention_qkvpacked(x, causal=True, deterministic=deterministic)
        else:
            q, k, v = x.split(2, dim=2)
            out = flash_attention(q, k, v, causal=True, deterministic=deterministic)
        return torch.autograd.grad(out, x, do)[0]

    want = grads(True)
    monkeypatch.setattr(
        _flash_bwd,
        "_bwd_dkdv_atomic_tuned",
        MustNotLaunch("the atomic dK/dV kernel, under torch.use_deterministic_algorithms(True),"),
    )
    assert torch.equal(grads(False), want)
