"""The one-kernel backward (`kernels._flash_bwd_fused_hopper`): which backward calls take it and in which
order (the ordered adds, key groups, the convoy orders and their settings), its sm_90 builds and their
spills, and (on an H100/H200) that its gradients match the float64 reference on every edge of its
schedules and repeat bit for bit where it adds dQ in a fixed order.
"""

from __future__ import annotations

import pytest
import torch

from kernels import _flash_bwd as flash_bwd
from kernels import _flash_bwd_fused_hopper as fused_hopper
from kernels import _flash_dkdv_hopper as dkdv_hopper
from kernels import _flash_dq_hopper as dq_hopper
from kernels import flash_attention
from kernels._flash_bwd import backward_delta
from kernels.reference import attention_reference
from tests.kernels._flash_utils import (
    MustNotLaunch,
    assert_close_rule,
    check_against_reference,
    deterministic_algorithms,
)
from tests.kernels.test_flash_bwd_hopper import (
    _assert_either_setting_gives_the_same_grads,
    _forward,
    _gpu_inputs,
    _out_and_lse,
    _ref_grads,
)
from tests.kernels.test_flash_fwd_hopper import EDGES, edge_inputs, needs_hopper, over_edges, record_calls

BF16, F16 = torch.bfloat16, torch.float16


# Spills inside the loops of the one-kernel backward's sm_90 build (Triton 3.6's ptxas): its consumers hold
# dK, dV and the dS/dQ exchange's addresses in 240 registers, where the dK/dV kernel's own build has none.
# Measured with them (results/s42/call4, call7; causal calls do not take it); a change that spills more
# fails here. The ordered builds run one loop over the query tiles instead of three sections: full
# attention spills 1 (session 44), causal 6 (its diagonal's steps masked in a branch, session 45); with the
# adds handed to a releasing warp mid-step (session 46), 4 and 11. The convoy order: full 0 (session 48),
# causal 11, as the causal ordered build (only its programs' launch order differs, session 49). Since the
# consumers only stage their dQ halves for the releasing warps to add in order (session 52), no ordered
# build spills in its loops. Keys (kernel, head dim, causal, block-sparse): the block-sparse builds
# (session 62) walk a list in one loop, and spill 1 (unordered causal, not taken by default) or none.
# The ordered builds stage their dQ halves rows paired (`dq_view`, session 84) or in row order (queries no
# multiple of 8): neither spills in its loops.
FUSED_SPILLS = {
    ("fused", 128, False, False): 21, ("fused", 128, True, False): 71, ("fused_ordered", 128, False, False): 0,
    ("fused_ordered", 128, True, False): 0, ("fused_convoy", 128, False, False): 0,
    ("fused_convoy", 128, True, False): 0, ("fused_convoy_down", 128, True, False): 0,
    ("fused", 128, False, True): 0, ("fused", 128, True, True): 1, ("fused_ordered", 128, False, True): 0,
    ("fused_ordered", 128, True, True): 0,
}  # fmt: skip


@pytest.mark.parametrize(
    "headdim, causal, seqlen_q, takes",
    [(128, False, 128, True), (128, True, 2048, False), (128, True, 4096, True), (64, False, 4096, False),
     (256, False, 4096, False)],
)  # fmt: skip
def test_fused_backward_takes_d128_where_it_measured_faster(headdim, causal, seqlen_q, takes):
    """The one-kernel backward's own rule: head dim 128, full attention, causal from 4k queries."""
    assert fused_hopper.supports(headdim, causal, seqlen_q) is takes


@pytest.mark.parametrize(
    "headdim, causal, seqlen_q, seqlen_k, group, takes",
    [(128, False, 4096, 4096, 1, True), (128, False, 8192, 8192, 1, True), (128, False, 16384, 16384, 1, True),
     (128, False, 32768, 32768, 1, True), (128, False, 2048, 16384, 1, False), (128, False, 20480, 20480, 1, True),
     (128, False, 65536, 65536, 1, True), (128, False, 4096, 32768, 1, False), (128, False, 4096, 32768, 8, True),
     (64, False, 4096, 4096, 1, False), (128, False, 1024, 2048, 1, False),
     (128, False, 1024, 2048, 2, True), (128, False, 960, 960, 1, False), (128, False, 1000, 1000, 1, True),
     (128, True, 4096, 4096, 1, True), (128, True, 4100, 4100, 1, True), (128, True, 2048, 2048, 1, True),
     (128, True, 8448, 8448, 1, True), (128, True, 4096, 4096, 2, True), (128, True, 8192, 8192, 2, True),
     (128, True, 4096, 4096, 4, False), (128, True, 8449, 8449, 1, True), (128, True, 16384, 16384, 1, True),
     (128, True, 49152, 49152, 1, True), (128, True, 49153, 49153, 1, True), (128, True, 65536, 65536, 1, True),
     (128, True, 65537, 65537, 1, False),
     (128, True, 16384, 16384, 2, True), (128, True, 12288, 12288, 4, False), (128, True, 16896, 16896, 1, True),
     (128, True, 16896, 16896, 2, True), (128, True, 16897, 16897, 1, True), (128, True, 16897, 16897, 2, False),
     (128, False, 4096, 4096, 2, True),
     (128, False, 4096, 4096, 4, False), (128, False, 16384, 16384, 4, False), (128, False, 32768, 32768, 4, True),
     (128, True, 1024, 1024, 1, False), (128, True, 4096, 8192, 1, False), (128, True, 8192, 4096, 1, False),
     (64, True, 4096, 4096, 1, False)],
)  # fmt: skip
def test_ordered_backward_takes_d128_calls_whose_programs_fit_half_the_sms(
    headdim, causal, seqlen_q, seqlen_k, group, takes
):
    """The ordered one-kernel backward's rule on a 132-SM GPU: head dim 128; full attention in at most 2
    key groups of at most 66 programs of 128 keys (16k keys: 2 groups of 64) and at most 2 query heads a
    key head (4k with 2, yes; 4k and 16k with 4, no), or past that in the convoy order with at least 2
    query tiles a program (20k keys: 160 programs, 320 tiles, yes; 32k and 64k, yes, 32k with 4 query
    heads a key head too; 4096 queries on 32k keys: 64 tiles for 256 programs, no; with 8 query heads a
    key head, 512: yes); causal from 2k queries on as many keys in at most 2 key groups (8448 keys: 66
    programs, one group; 8449, 16k and 16896: two) with at most 2 query heads a key head (4k, 8k, 16k and
    16896 with 2, yes; 4k and 12k with 4, no) or past that in the convoy order without GQA up to 64k
    queries (16897, yes; 48k, 49153 and 64k, yes; 65537, no; 16897 with 2 query heads a key head, no); and at least 2 query tiles of 64 rows (of the
    group's heads) per program of a key group with full attention (1024 queries on 2048 keys: 16 for 16
    programs, no; with 2 query heads per key head, 32: yes; 2048 on 16k: 32 for 64, no; 960: 15 for 8,
    no; 1000: 16 for 8, yes; causal 4100: 65 for 33, yes)."""
    assert fused_hopper.supports_ordered(headdim, causal, seqlen_q, seqlen_k, group, 132) is takes
    convoy = fused_hopper.ordered_convoy(seqlen_q, seqlen_k, causal, group, 132)
    if causal:
        assert convoy is (seqlen_k > 2 * 66 * 128 and group == 1 and seqlen_q <= 64 * 1024)
    else:
        assert convoy is (seqlen_k > 2 * 66 * 128)
    if takes and not convoy:
        assert fused_hopper.ordered_key_groups(seqlen_k, 132) == (2 if seqlen_k > 66 * 128 else 1)


@pytest.mark.parametrize(
    "causal, seqlen, group, faster",
    [(True, 4096, 1, True), (True, 8192, 2, True), (True, 10240, 1, True), (True, 12288, 1, True),
     (True, 16384, 1, True), (True, 20480, 1, True), (True, 65536, 1, True), (True, 16384, 2, True),
     (True, 32768, 2, False), (True, 1024, 1, False), (False, 4096, 1, True), (True, 4096, 4, False),
     (True, 2048, 1, True), (False, 2048, 1, False), (False, 4095, 1, False), (False, 8192, 2, True),
     (False, 16384, 1, True), (False, 65536, 1, True), (False, 8192, 4, False)],
)  # fmt: skip
def test_ordered_is_faster_for_causal_calls_and_full_from_4k(causal, seqlen, group, faster):
    """The rule by which a deterministic=False call runs the ordered kernel instead of the unordered one (on a
    132-SM GPU, head dim 128), where `supports_ordered` takes the call (not at 4 query heads a key head, nor
    causal past 16.9k keys with GQA or under 2k queries, which the unordered kernel or the deterministic ones
    keep): causal at every length, full attention from 4k."""
    assert fused_hopper.ordered_is_faster(128, causal, seqlen, seqlen, group, 132) is faster


@pytest.mark.parametrize(
    "seqlen, causal, group, want",
    [(8192, True, 1, 1), (16384, True, 1, 2), (16897, True, 1, 3), (24576, True, 1, 3), (65536, True, 1, 3),
     (16384, False, 1, 2), (20480, False, 1, 1), (65536, False, 1, 1), (12288, True, 2, 2)],
)  # fmt: skip
def test_ordered_calls_add_into_these_many_dq_buffers(seqlen, causal, group, want):
    """The key groups (fp32 dq buffers) of a d128 ordered call on 132 SMs: one up to 8.4k keys, two to 16.9k (the
    rotation, or causal's two groups), past that full attention's convoy in one and the causal convoy in
    CAUSAL_CONVOY_KEY_GROUPS, three (session 87: 0.975-0.981x one group's fwd+bwd time at 24k-64k)."""
    assert fused_hopper.CAUSAL_CONVOY_KEY_GROUPS == 3
    convoy = fused_hopper.ordered_convoy(seqlen, seqlen, causal, group, 132)
    assert fused_hopper.ordered_dq_groups(seqlen, causal, convoy, 132) == want


def _one_kernel_calls(
    monkeypatch, device, *, causal: bool, atomic_dq: bool, ordered_takes: bool = True
) -> list:
    """The `ordered` flag of each one-kernel backward launch of one small backward call, with the Hopper dK/dV
    kernel's checks and the kernels stubbed (so it runs anywhere; the two kernels must not run):
    `supports` takes the call, `supports_ordered` as ordered_takes says."""
    from kernels import _flash_bwd

    monkeypatch.setattr(dkdv_hopper, "supports", lambda *a, **kw: True)
    monkeypatch.setattr(dq_hopper, "supports", lambda *a, **kw: False)
    monkeypatch.setattr(fused_hopper, "supports", lambda *a: True)
    monkeypatch.setattr(fused_hopper, "supports_ordered", lambda *a: ordered_takes)
    calls = []
    monkeypatch.setattr(
        fused_hopper, "flash_attn_bwd_fused_hopper", lambda *a, ordered=False, **kw: calls.append(ordered)
    )
    monkeypatch.setattr(dkdv_hopper, "flash_attn_dkdv_hopper", lambda *a, **kw: pytest.fail("two kernels"))
    torch.manual_seed(3)
    q, k, v, do = (torch.randn(1, 40, 2, 16, device=device) for _ in range(4))
    out, lse2 = _forward(q, k, v, causal=causal)
    kw = dict(
        sm_scale=0.25,
        win_left=None,
        win_right=0 if causal else None,
        key_padding_mask=None,
        dropout_p=0.0,
        seed=0,
    )
    _flash_bwd.flash_attn_backward(do, q, k, v, out, lse2, atomic_dq=atomic_dq, **kw)
    return calls


@pytest.mark.parametrize(
    "ordered_faster, ordered_takes, want", [(True, True, True), (False, True, False), (True, False, False)]
)
def test_nondeterministic_causal_calls_take_the_ordered_kernel_where_it_is_faster(
    monkeypatch, ordered_faster, ordered_takes, want, device
):
    """deterministic=False, causal, 40 queries: the ordered kernel with ORDERED_OVER_UNORDERED_CAUSAL
    where it takes the call, else the unordered one."""
    monkeypatch.setattr(fused_hopper, "ORDERED_OVER_UNORDERED_CAUSAL", ordered_faster)
    assert _one_kernel_calls(
        monkeypatch, device, causal=True, atomic_dq=True, ordered_takes=ordered_takes
    ) == [want]


@pytest.mark.parametrize("deterministic", [True, False])
def test_deterministic_calls_take_the_ordered_one_kernel_backward_where_it_says(
    monkeypatch, deterministic, device
):
    """The backward's routing where the Hopper dK/dV kernel takes a full-attention call: deterministic, the
    one-kernel backward with ordered adds where `supports_ordered` says; deterministic=False, the unordered
    one where `supports` says."""
    assert _one_kernel_calls(monkeypatch, device, causal=False, atomic_dq=not deterministic) == [
        deterministic
    ]


def _route_gqa_as_mha(monkeypatch):
    """Stubs the Hopper kernels' support checks so that a small deterministic GQA call here is one the
    ordered one-kernel backward refuses at its group (over 2) and takes at 1 or 2 (from 32 keys)."""
    monkeypatch.setattr(dkdv_hopper, "supports", lambda *a, **kw: True)
    monkeypatch.setattr(dq_hopper, "supports", lambda *a, **kw: False)
    monkeypatch.setattr(fused_hopper, "supports", lambda *a: True)
    monkeypatch.setattr(fused_hopper, "supports_ordered", lambda d, c, sq, sk, group, sms: group <= 2)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS", 32)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS_FULL", 32)


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_calls_the_ordered_backward_refuses_take_it_as_mha_only_when_set(
    monkeypatch, expanded, causal, device
):
    """The routing of a deterministic GQA call that `supports_ordered` refuses at its group and takes at
    fewer (kernels stubbed, so it runs anywhere): the two kernels without `ORDERED_GQA_EXPANDED`; with it
    the ordered one-kernel backward on K and V as they are (4 query heads on 1), its programs at 2 query
    heads each with full attention of this length (kv_repeat 2, dK / dV a head per program), at 1 causal
    (kv_repeat 4), as `route_kernel_group` says."""
    _route_gqa_as_mha(monkeypatch)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED", expanded)
    calls = []

    def fused(q, k, v, do, lse2, delta, dq_acc, dk, dv, *, ordered=False, kv_repeat=1, **kw):
        calls.append(("ordered", ordered, k.shape[-2], kv_repeat, dk.shape[-2], dv.shape[-2]))

    monkeypatch.setattr(fused_hopper, "flash_attn_bwd_fused_hopper", fused)
    monkeypatch.setattr(
        dkdv_hopper,
        "flash_attn_dkdv_hopper",
        lambda q, k, *a, **kw: calls.append(("two kernels", k.shape[-2])),
    )
    torch.manual_seed(3)
    q, do = (torch.randn(1, 40, 4, 16, device=device) for _ in range(2))
    k, v = (torch.randn(1, 40, 1, 16, device=device) for _ in range(2))
    out, lse2 = _forward(q, k, v, causal=causal)
    kw = dict(sm_scale=0.25, win_left=None, win_right=0 if causal else None, key_padding_mask=None,
              dropout_p=0.0, seed=0)  # fmt: skip
    flash_bwd.flash_attn_backward(do, q, k, v, out, lse2, **kw)
    repeat = 4 if causal else 2
    assert calls == ([("ordered", True, 1, repeat, repeat, repeat)] if expanded else [("two kernels", 1)])


@pytest.mark.parametrize(
    "causal, seqlen_k, setting, want",
    [(False, 2048, None, 2), (False, 8191, None, 2), (False, 8192, None, 1), (True, 4096, None, 1),
     (True, 4096, 2, 2), (False, 4096, 1, 1)],
)  # fmt: skip
def test_route_takes_two_query_heads_a_program_with_full_attention_under_8k_keys(
    monkeypatch, causal, seqlen_k, setting, want
):
    """`route_kernel_group`: 2 query heads a program with full attention under ORDERED_GQA_PAIRS_BELOW keys,
    1 otherwise, or what ORDERED_GQA_KERNEL_GROUP (FLASHTRAIN_GQA_KERNEL_GROUP) fixes."""
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_PAIRS_BELOW", 8192)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_KERNEL_GROUP", setting)
    assert flash_bwd.route_kernel_group(causal, seqlen_k) == want


@pytest.mark.parametrize(
    "group, ordered_takes, want",
    [(4, (1, 2), 2), (3, (1, 2), 1), (4, (1,), 1), (2, (1, 2), 1), (4, (), None)],
)
def test_route_falls_back_to_one_query_head_a_program(monkeypatch, group, ordered_takes, want):
    """A full-attention GQA call under 8k keys whose group 2 does not divide, or at 2 query heads a program
    the ordered kernel refuses, runs its programs at 1 (a group of 2 is the ordered kernel's own); where
    the kernel refuses 1 too, the route does not run."""
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_KERNEL_GROUP", None)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS_FULL", 32)
    monkeypatch.setattr(fused_hopper, "supports_ordered", lambda d, c, sq, sk, g, sms: g in ordered_takes)
    q, k = torch.zeros(1, 64, 4 * group, 128), torch.zeros(1, 64, 4, 128)
    assert flash_bwd._route_programs_heads(q, k, False, group, 132) == want


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_k", [37, 53])
@pytest.mark.parametrize("kernel_group", [1, 2])
def test_gqa_as_mha_sums_each_programs_dk_dv_into_its_kv_head(
    monkeypatch, causal, seqlen_k, kernel_group, device
):
    """The host's side of the GQA route (8 query heads on 2; its programs at kernel_group query heads each,
    `ORDERED_GQA_KERNEL_GROUP`), the one-kernel backward emulated in float64 by its contract (each of dk /
    dv's heads j the dK / dV of query heads j * group .. attending K / V head j // kv_repeat; dQ into the
    first key group's fp32 buffer): dk and dv are each kv head's sum over its programs, dq the buffer's, all
    stored into the given buffers (views of one packed buffer, as packed QKV's), and equal to the GQA call's
    gradients, with seqlen_q != seqlen_k too."""
    _route_gqa_as_mha(monkeypatch)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_KERNEL_GROUP", kernel_group)
    seen = []

    def emulated(q, k, v, do, lse2, delta, dq_acc, dk, dv, *, sm_scale, causal, key_groups, kv_repeat, **kw):
        seen.append((k.shape[-2], kv_repeat, dk.shape[-2]))
        per_query_head = q.shape[-2] // k.shape[-2]
        k_h, v_h = (t.double().repeat_interleave(per_query_head, dim=-2).requires_grad_() for t in (k, v))
        q_h = q.double().requires_grad_()
        out = attention_reference(q_h, k_h, v_h, causal=causal, softmax_scale=sm_scale)
        dq, dk_h, dv_h = torch.autograd.grad(out, (q_h, k_h, v_h), do.double())
        per_program = (*dk.shape[:-1], -1, dk.shape[-1])  # (.., program heads, query heads each, d)
        per_group = dq_acc.view(key_groups, *q.shape)
        per_group.zero_()
        per_group[0].copy_(dq)
        dk.copy_(dk_h.view(per_program).sum(-2))
        dv.copy_(dv_h.view(per_program).sum(-2))

    monkeypatch.setattr(fused_hopper, "flash_attn_bwd_fused_hopper", emulated)
    torch.manual_seed(5 + causal + seqlen_k)
    q, do = (torch.randn(2, 37, 8, 16, device=device) for _ in range(2))
    k, v = (torch.randn(2, seqlen_k, 2, 16, device=device) for _ in range(2))
    out, lse2 = _forward(q, k, v, causal=causal)
    kw = dict(sm_scale=0.25, win_left=None, win_right=0 if causal else None, key_padding_mask=None,
              dropout_p=0.0, seed=0)  # fmt: skip
    packed = torch.empty(2, 37, 8 + 2 + 2, 16, device=device)  # (views of one buffer, as packed QKV's)
    grads = (packed[:, :, :8], packed[:, :, 8:10], packed[:, :, 10:])
    if seqlen_k != 37:  # (packed QKV has one length; these are plain buffers of k's length)
        grads = (grads[0], torch.empty_like(k), torch.empty_like(v))
    got = flash_bwd.flash_attn_backward(do, q, k, v, out, lse2, grads_out=grads, **kw)
    assert seen == [(2, 4 // kernel_group, 2 * 4 // kernel_group)]
    assert all(a is b for a, b in zip(got, grads, strict=True))
    inputs = [t.double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(
        attention_reference(*inputs, causal=causal, softmax_scale=0.25), inputs, do.double()
    )
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    "kv_repeat, dk_heads, sparse, match",
    [(0, 2, False, "kv_repeat"), (True, 2, False, "kv_repeat"), (2.0, 4, False, "kv_repeat"),
     (2, 4, True, "block-sparse"), (2, 2, False, "times kv_repeat"), (3, 6, False, "divisor")],
)  # fmt: skip
def test_kv_repeat_needs_an_int_and_dk_dv_at_k_heads_times_it(kv_repeat, dk_heads, sparse, match):
    """The one-kernel backward run as MHA over GQA K/V (kv_repeat): a count that is no int >= 1, one asked
    of a block-sparse call (its lists are per K/V head), or dk / dv without k's heads times kv_repeat (a
    divisor of q's): a ValueError before any launch."""
    q = torch.zeros(1, 64, 4, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 64, 2, 128, dtype=torch.bfloat16)
    dk = torch.zeros(1, 64, dk_heads, 128, dtype=torch.bfloat16)
    lists = (q, q, q) if sparse else None
    with pytest.raises(ValueError, match=match):
        fused_hopper.flash_attn_bwd_fused_hopper(
            q, k, k, q, None, None, None, dk, dk, sm_scale=1.0, causal=False, lists=lists, kv_repeat=kv_repeat
        )


@pytest.mark.parametrize("causal, ordered, key_groups", [(True, False, 2), (False, False, 1), (False, True, 2)])  # fmt: skip
def test_convoy_order_needs_an_ordered_call_and_full_attention_in_one_key_group(causal, ordered, key_groups):
    """The convoy order (`ordered_convoy`) asked of an unordered call, or of full attention in several key
    groups (the causal convoy takes them, `ordered_dq_groups`): a ValueError before any launch."""
    q = torch.zeros(1, 64, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="convoy"):
        fused_hopper.flash_attn_bwd_fused_hopper(
            q, q, q, q, None, None, None, q, q, sm_scale=1.0, causal=causal, ordered=ordered,
            key_groups=key_groups, convoy=True,
        )  # fmt: skip


def _stubbed_fused_launch(monkeypatch, seqlen, causal=True, convoy=True):
    """(args, meta) that an ordered d128 backward of seqlen tokens (batch 1, one head) hands its launch,
    the kernel stubbed so this runs on CPU, on a GPU's 132 SMs."""
    launches = []
    monkeypatch.setattr(
        fused_hopper, "_launch_fused", lambda grid, descs, args, kw: launches.append((args, kw))
    )
    monkeypatch.setattr(fused_hopper, "sm_count", lambda device: 132)
    q = torch.zeros(1, seqlen, 1, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 1, seqlen)
    acc = torch.zeros(q.shape, dtype=torch.float32)
    fused_hopper.flash_attn_bwd_fused_hopper(
        q, q, q, q, lse, lse, acc, q, q, sm_scale=1.0, causal=causal, ordered=True, convoy=convoy
    )
    (launch,) = launches
    return launch


@pytest.mark.parametrize("seqlen, setting, block, down", [(16384, None, 1, False), (20480, None, 1, False),
                                                         (20481, None, 1, True), (32768, None, 1, True),
                                                         (65536, None, 1, True),
                                                         (16384, 8, 8, False), (65536, 16, 16, True)])  # fmt: skip
def test_causal_convoy_walks_down_past_20k(monkeypatch, seqlen, setting, block, down):
    """The causal convoy's launch: blocks of 1 (last keys first) unless FLASHTRAIN_CAUSAL_CONVOY_BLOCK sets
    one (`causal_convoy_block`), walking each program's tiles up to 20k queries and down past it, where
    that measured faster (`causal_convoy_walks_down`). The launch gets both (the kernel stubbed, so this
    runs on CPU, on a GPU's 132 SMs)."""
    monkeypatch.setattr(fused_hopper, "CONVOY_BLOCK_SETTING", setting)
    assert fused_hopper.causal_convoy_block() == block
    assert fused_hopper.causal_convoy_walks_down(seqlen) is down
    args, kw = _stubbed_fused_launch(monkeypatch, seqlen)
    assert args[-7] == block  # (the kernel's convoy_block, before its six block-sparse list arguments)
    assert kw["DOWN"] is down


@pytest.mark.parametrize("setting, causal, convoy, down", [(None, True, True, False), (True, True, True, True),
                                                            (True, False, True, False), (True, True, False, False)])  # fmt: skip
def test_the_causal_convoy_walks_down_only_where_set(monkeypatch, setting, causal, convoy, down):
    """The kernel's DOWN (each program walking its tiles from the last) at 4k queries: off by the rule
    (`causal_convoy_walks_down`: past 20k), on where WALK_DOWN_SETTING says, and only in a causal convoy
    (the kernel stubbed, so this runs on CPU)."""
    monkeypatch.setattr(fused_hopper, "WALK_DOWN_SETTING", setting)
    _, kw = _stubbed_fused_launch(monkeypatch, 4096, causal, convoy)
    assert kw["DOWN"] is down


_SETTINGS = [("FLASHTRAIN_CAUSAL_CONVOY_BLOCK", "programs a block", None),
             ("FLASHTRAIN_CAUSAL_CONVOY_KEY_GROUPS", "key groups", 3)]  # fmt: skip


@pytest.mark.parametrize("name, unit, default", _SETTINGS)
@pytest.mark.parametrize(
    "text, value", [(None, None), ("", None), ("16", 16), (" 8 ", 8), ("2", 2), (" 4 ", 4)]
)
def test_the_convoy_settings_read_a_positive_integer(name, unit, default, text, value):
    """FLASHTRAIN_CAUSAL_CONVOY_BLOCK (unset: None, blocks of 1) and FLASHTRAIN_CAUSAL_CONVOY_KEY_GROUPS
    (unset: 3)."""
    environ = {} if text is None else {name: text}
    want = default if value is None else value
    assert fused_hopper._positive_int_setting(name, unit, default, environ) == want


@pytest.mark.parametrize("name, unit, default", _SETTINGS)
@pytest.mark.parametrize("text", ["0", "-4", "sixteen", "1.5", "-2", "two"])
def test_a_convoy_setting_that_is_no_positive_integer_is_refused(name, unit, default, text):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        fused_hopper._positive_int_setting(name, unit, default, {name: text})


_WALK_DOWN_REFUSED = "walk_down=True is the causal convoy's order"


@pytest.mark.parametrize(
    "causal, convoy, options, match",
    [(True, True, dict(convoy_block=0), "convoy_block"), (True, True, dict(convoy_block=-1), "convoy_block"),
     (True, True, dict(convoy_block=3), "convoy_block"), (False, True, dict(walk_down=True), _WALK_DOWN_REFUSED),
     (True, False, dict(walk_down=True), _WALK_DOWN_REFUSED)],
)  # fmt: skip
def test_bad_causal_convoy_launches_are_refused(causal, convoy, options, match):
    """A causal convoy's launch block holds programs that wait on each other: 0, negative or more than half
    the SMs (the interpreter counts 4) is a ValueError before any launch; so is walking down outside a
    causal convoy (full attention's convoy, or causal calls in key groups)."""
    q = torch.zeros(1, 64, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        fused_hopper.flash_attn_bwd_fused_hopper(
            q, q, q, q, None, None, None, q, q, sm_scale=1.0, causal=causal, ordered=True, convoy=convoy,
            **options,
        )  # fmt: skip


@pytest.mark.parametrize(
    "key_groups, causal, convoy",
    [(1, False, False), (2, False, False), (3, False, False), (1, True, False), (2, True, False),
     (3, True, False), (1, True, True), (2, True, True), (3, True, True)],
)  # fmt: skip
@pytest.mark.parametrize("first_stores", [True, False], ids=["first_stores", "zero_filled"])
def test_ordered_backward_sums_its_key_groups_into_dq_in_their_order(
    monkeypatch, key_groups, causal, convoy, first_stores, device
):
    """The ordered backward's dq (its kernel stubbed, so it runs anywhere) is its key groups' fp32 buffers,
    summed in group order and rounded once to q's dtype: key groups from `ordered_key_groups`, or in the
    causal convoy order CAUSAL_CONVOY_KEY_GROUPS (`ordered_dq_groups`). The buffers come zero-filled, or
    with FIRST_STORES (each item's first adder stores) unwritten as `dq_buffer` leaves them (NaN here);
    the sum reads only what the programs wrote: here, 40 keys, a single program, so every key group past the
    first has none, and dq is group 0's buffer (what the stub wrote elsewhere is never read)."""
    from kernels import _flash_bwd

    monkeypatch.setattr(dkdv_hopper, "supports", lambda *a, **kw: True)
    monkeypatch.setattr(dq_hopper, "supports", lambda *a, **kw: False)
    monkeypatch.setattr(fused_hopper, "supports_ordered", lambda *a: True)
    monkeypatch.setattr(fused_hopper, "ordered_key_groups", lambda *a: 1 if convoy else key_groups)
    monkeypatch.setattr(fused_hopper, "CAUSAL_CONVOY_KEY_GROUPS", key_groups if convoy else 1)
    monkeypatch.setattr(fused_hopper, "ordered_convoy", lambda *a: convoy)
    monkeypatch.setattr(fused_hopper, "FIRST_STORES", first_stores)
    monkeypatch.setattr(fused_hopper, "UNWRITTEN_FILL", float("nan"))
    buffers = []

    def kernel(q, k, v, do, lse2, delta, dq_acc, dk, dv, *, ordered, key_groups, convoy: bool, first_stores,
               **kw):  # fmt: skip
        assert ordered and convoy is convoy_wanted and dq_acc.shape == (key_groups * q.shape[0], *q.shape[1:])
        assert first_stores is first_stores_wanted
        filled = dq_acc.isnan().all() if first_stores else not dq_acc.any()
        dq_acc.copy_(torch.randn_like(dq_acc) * 1e3)
        buffers.append((filled, dq_acc.clone()))

    convoy_wanted, first_stores_wanted = convoy, first_stores
    monkeypatch.setattr(fused_hopper, "flash_attn_bwd_fused_hopper", kernel)
    torch.manual_seed(key_groups)
    q, k, v, do = (torch.randn(2, 40, 2, 16, dtype=torch.float16, device=device) for _ in range(4))
    out, lse2 = _forward(q.float(), k.float(), v.float(), causal=causal)
    kw = dict(
        sm_scale=0.25, win_left=None, win_right=0 if causal else None, key_padding_mask=None, dropout_p=0.0
    )
    dq, _, _ = _flash_bwd.flash_attn_backward(do, q, k, v, out.half(), lse2, seed=0, **kw)
    ((filled, acc),) = buffers
    assert filled
    assert dq.dtype == q.dtype and torch.equal(dq, acc[: q.shape[0]].to(q.dtype))


@pytest.mark.parametrize(
    "seqlen, key_groups, causal",
    [(4096, 1, False), (4096, 1, True), (16384, 2, False), (16384, 2, True), (16640, 2, True), (1000, 3, True),
     (1000, 3, False), (640, 3, True), (640, 3, False), (300, 2, True)],
)  # fmt: skip
@pytest.mark.parametrize("torch_sum", [False, True], ids=["one_pass", "torch_sum"])
def test_dq_sum_reads_exactly_the_rows_the_programs_write(monkeypatch, seqlen, key_groups, causal, torch_sum):
    """`dq_buffer` with first stores leaves the buffers unwritten (NaN here), and `sum_dq_buffers` reads
    only the rows some program of a key group adds into: program p adds into every query row with full
    attention, causal into the rows from its first key on (its diagonal, seqlen_q == seqlen_k); key group
    g holds programs g * per_group .. (some partial or empty). With random values in exactly those rows dq
    is their sum in group order, no NaN; TORCH_DQ_SUM (torch's adds of whole buffers) stores zeros in
    exactly the other rows first. Without first stores the buffers are all zeros."""
    monkeypatch.setattr(fused_hopper, "UNWRITTEN_FILL", float("nan"))
    monkeypatch.setattr(fused_hopper, "TORCH_DQ_SUM", torch_sum)
    heads, headdim = 3, 16
    q = torch.empty(1, seqlen, heads, headdim, dtype=torch.float16)
    keys = fused_hopper.CONFIGS[128].consumers * fused_hopper.CONFIGS[128].block_n
    programs = -(-seqlen // keys)
    per_group = -(-programs // key_groups)
    buffer = fused_hopper.dq_buffer(q, seqlen, causal, key_groups, True)
    assert buffer.shape == (key_groups, seqlen, heads, headdim) and buffer.dtype == torch.float32
    added = torch.zeros(key_groups, seqlen, dtype=torch.bool)
    for p in range(programs):
        added[p // per_group, p * keys if causal else 0 :] = True
    if torch_sum:
        assert (buffer[~added] == 0).all() and buffer[added].isnan().all()
    else:
        assert buffer.isnan().all()
    torch.manual_seed(seqlen + key_groups)
    values = torch.randn_like(buffer)
    buffer[added] = values[added]
    dq = fused_hopper.sum_dq_buffers(buffer, torch.empty_like(q), seqlen, causal, key_groups)
    total = torch.where(added[0, None, :, None, None], values[:1], 0.0)
    for g in range(1, key_groups):
        total = total + torch.where(added[g, None, :, None, None], values[g : g + 1], 0.0)
    assert torch.equal(dq, total.half()) and not dq.isnan().any()
    zeros = fused_hopper.dq_buffer(q, seqlen, causal, key_groups, False)
    assert zeros.shape == buffer.shape and not zeros.any()


def _staged_and_copied_out(view, tile: torch.Tensor, dq_b: int, half_head: int, row: int) -> None:
    """What the kernel does with one dQ half `tile` (block_m x D / 2, rows in query order), in torch:
    `_fused_dq_hopper.stage_dq_half` stores it into a shared tile (rows paired where the view is a TmaView),
    then TMA copies that tile's box to `dq_coord`'s coordinates of the view, clipped at the view's bounds."""
    block_m, half = tile.shape
    if not isinstance(view, fused_hopper.TmaView):  # (B', 2H, Sq, D / 2): the tile's rows in order
        rows = view.permute(0, 2, 1, 3)[dq_b, half_head, row : row + block_m]
        rows.copy_(tile[: rows.shape[0]])
        return
    assert view.block == (1, block_m // 8, 4, 2, half)
    shared = tile.reshape(block_m // 8, 2, 4, half).permute(0, 2, 1, 3).reshape(block_m, half)  # as staged
    dq = torch.as_strided(view.base, view.shape, view.strides)
    box = dq[dq_b, row // 8 : row // 8 + block_m // 8, :, :, half_head * half : (half_head + 1) * half]
    box.copy_(shared.reshape(block_m // 8, 4, 2, half)[: box.shape[0]])


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize(
    "batch, seqlen, nheads", [(2, 256, 2), (3, 1000, 1), (1, 4160, 2), (2, 300, 2), (1, 1001, 1)]
)
def test_dq_view_puts_every_staged_row_back_in_its_place(monkeypatch, ordered, paired, batch, seqlen, nheads):
    """The dq buffer's view (`dq_view`) and the shared tile's row order (`stage_dq_half`): every query tile's
    dQ halves, staged and copied out as the kernel does (`_staged_and_copied_out`), land on their own rows and
    columns of the fp32 buffer, tail tiles clipped at their sequence, nothing written past it. Rows paired
    for the ordered kernel where the queries are a multiple of 8 and PAIRED_DQ_ROWS is on, else each head's
    halves as heads (the view `descriptor` takes)."""
    monkeypatch.setattr(fused_hopper, "PAIRED_DQ_ROWS", paired)
    block_m, headdim = fused_hopper.CONFIGS[128].block_m, 128
    half = headdim // 2
    torch.manual_seed(seqlen + batch)
    want = torch.randn(batch, seqlen, nheads, headdim)
    dq = torch.full_like(want, float("nan"))
    view = fused_hopper.dq_view(dq, block_m, ordered)
    assert isinstance(view, fused_hopper.TmaView) is (ordered and paired and seqlen % 8 == 0)
    if not isinstance(view, fused_hopper.TmaView):
        assert view.shape == (batch, seqlen, 2 * nheads, half) and view.data_ptr() == dq.data_ptr()
    padded = torch.zeros(batch, -(-seqlen // block_m) * block_m, nheads, headdim)  # (rows past: never landed)
    padded[:, :seqlen] = want
    for b in range(batch):
        for h in range(nheads):
            for wg in range(2):
                for t in range(-(-seqlen // block_m)):
                    tile = padded[b, t * block_m : (t + 1) * block_m, h, wg * half : (wg + 1) * half]
                    _staged_and_copied_out(view, tile, b, 2 * h + wg, t * block_m)
    torch.testing.assert_close(dq, want, rtol=0, atol=0)


def test_first_stores_need_the_ordered_backward():
    """first_stores=True (each item's first adder stores in its turn) is refused without ordered=True."""
    q = torch.empty(1, 256, 2, 128, dtype=BF16)
    with pytest.raises(ValueError, match="first_stores=True .* needs ordered=True"):
        fused_hopper.flash_attn_bwd_fused_hopper(
            q, q, q, q, None, None, None, q, q, sm_scale=1.0, causal=False, first_stores=True
        )


@pytest.mark.parametrize("paired", [True, False], ids=["rows_paired", "rows_in_order"])
def test_fused_backward_builds_for_sm90(monkeypatch, tmp_path, paired):
    """The one-kernel backward compiles for sm_90 with Triton's own compiler on CPU (bf16 and fp16, causal
    and full, dense and block-sparse; its dQ halves staged rows paired or in row order, `dq_view`), within an
    H100's shared memory and no more spills inside its loops than FUSED_SPILLS; the
    ordered builds' semaphore counts (one per consumer half) are release adds, a GPU-wide memory barrier
    before each (a relaxed count let later adds overtake the ones it counted, results/s46/call1)."""
    from tests.kernels.test_flash_fwd_hopper import run_build_tool

    monkeypatch.setenv("FLASHTRAIN_PAIRED_DQ_ROWS", "1" if paired else "0")  # (read by the tool's process)
    rc, results = run_build_tool(tmp_path, "--fused")
    assert rc == 0, results
    assert sorted(
        (r["kernel"], r["headdim"], r["causal"], r["sparse"], r["dtype"]) for r in results
    ) == sorted(
        (kernel, d, c, sparse, t)
        for kernel, d, c, sparse in FUSED_SPILLS
        if d in fused_hopper.CONFIGS
        for t in ("bfloat16", "float16")
    )
    for r in results:
        assert r["dq_rows_paired"] is (paired and r["kernel"] != "fused"), r  # (ordered builds alone)
        assert r["spills_in_loops"] <= FUSED_SPILLS[r["kernel"], r["headdim"], r["causal"], r["sparse"]], r
        if r["kernel"] in ("fused_ordered", "fused_convoy", "fused_convoy_down"):
            assert r["semaphore_adds"] >= 2 and r["semaphore_adds_without_release"] == 0, r


@over_edges(fused_hopper.CONFIGS)
def test_gpu_fused_backward_matches_reference(case, headdim, dtype):
    """dq, dk and dv of the one-kernel backward (dQ added into an fp32 buffer per step), given the
    forward's lse and delta: every edge case, keys past the sequence and queries that see no key among them."""
    q, k, v, do, causal = edge_inputs(case, headdim, dtype)
    out, lse2 = _forward(q, k, v, causal)
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    delta = backward_delta(out, do, lse2)
    fused_hopper.flash_attn_bwd_fused_hopper(
        q, k, v, do, lse2, delta, dq, dk, dv, sm_scale=headdim**-0.5, causal=causal
    )
    ref64, ref_lp = _ref_grads(q, k, v, do, causal)
    for name, got, i in (("dq", dq.to(dtype), 0), ("dk", dk, 1), ("dv", dv, 2)):
        assert_close_rule(name, got, ref64[i], ref_lp[i], dtype)


# (the ordered causal adds count on seqlen_q == seqlen_k, `supports_ordered`)
@over_edges(fused_hopper.CONFIGS, [c for c in EDGES if not (c[5] and c[1] != c[2])])
@pytest.mark.parametrize(
    "key_groups, convoy, convoy_block, walk_down",
    [(1, False, 1, False), (2, False, 1, False), (1, True, 1, False), (1, True, 3, False), (1, True, 1, True),
     (1, True, 3, True), (2, True, 1, False), (2, True, 3, True), (3, True, 1, True)],
)  # fmt: skip
def test_gpu_ordered_fused_backward_matches_reference_and_repeats_bit_for_bit(
    case, headdim, dtype, key_groups, convoy, convoy_block, walk_down, monkeypatch
):
    """The one-kernel backward with each dq tile's adds in a fixed order, its programs in one or two key
    groups (each adding into its own dq buffer, summed after), or in the convoy order (causal: launched in
    blocks of 1 or 3 key tiles, some blocks partial, walking the tiles up or down, in one key group or in
    2 or 3, some of them partial or empty): the gradients pass the tolerance rule on every edge case it
    takes (full attention; causal on as many queries as keys; the convoy order, full or causal) and come
    out bitwise the same twice. Each item's first adder stores (`dq_buffer`'s other elements NaN
    here), and the sums equal those added into zero-filled buffers. Full attention in the convoy order
    takes one key group: more raise."""
    q, k, v, do, causal = edge_inputs(case, headdim, dtype)
    out, lse2 = _forward(q, k, v, causal)
    delta = backward_delta(out, do, lse2)
    if convoy and key_groups > 1 and not causal:
        acc = torch.zeros((key_groups * q.shape[0], *q.shape[1:]), device=q.device, dtype=torch.float32)
        with pytest.raises(ValueError, match="key_groups=1 with full attention"):
            fused_hopper.flash_attn_bwd_fused_hopper(
                q, k, v, do, lse2, delta, acc, q, q, sm_scale=1.0, causal=causal, ordered=True,
                key_groups=key_groups, convoy=True,
            )  # fmt: skip
        return
    monkeypatch.setattr(fused_hopper, "UNWRITTEN_FILL", float("nan"))
    runs = []
    for first_stores in (True, True, False):
        dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        acc = fused_hopper.dq_buffer(q, k.shape[1], causal, key_groups, first_stores)
        fused_hopper.flash_attn_bwd_fused_hopper(
            q, k, v, do, lse2, delta, acc, dk, dv, sm_scale=headdim**-0.5, causal=causal, ordered=True,
            key_groups=key_groups, convoy=convoy, convoy_block=convoy_block, walk_down=walk_down and causal,
            first_stores=first_stores,
        )  # fmt: skip
        dq = fused_hopper.sum_dq_buffers(acc, torch.empty_like(q), k.shape[1], causal, key_groups)
        runs.append((dq, dk, dv))
    ref64, ref_lp = _ref_grads(q, k, v, do, causal)
    for name, got, i in (("dq", runs[0][0], 0), ("dk", runs[0][1], 1), ("dv", runs[0][2], 2)):
        assert_close_rule(name, got, ref64[i], ref_lp[i], dtype)
    for again in runs[1:]:  # (equal values: a first store of -0.0 where the zero-filled add gives +0.0)
        for first, other in zip(runs[0], again, strict=True):
            assert torch.equal(first, other)


def _assert_bitwise_repeats_near_two_kernels(runs, two_kernels):
    """Each run's (dq, dk, dv) bitwise the first's, and the first within 1% of its largest value of the two
    deterministic kernels' gradients (the same sums in another order: at most a few bf16 roundings apart,
    never a missing or doubled tile)."""
    for again in runs[1:]:
        for first, other in zip(runs[0], again, strict=True):
            assert torch.equal(first, other)
    for name, ours, theirs in zip(("dq", "dk", "dv"), runs[0], two_kernels, strict=True):
        largest = theirs.float().abs().max().item()
        apart = (ours.float() - theirs.float()).abs().max().item()
        assert apart <= 0.01 * largest, f"{name}: {apart:.3g} apart, largest {largest:.3g}"


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, causal, kernel_group",
    [*((*shape, 1) for shape in [
        (1, 4096, 4096, 8, 2, True), (1, 4100, 4100, 8, 2, True), (2, 8192, 8192, 8, 2, True),
        (1, 4096, 4096, 8, 2, False), (1, 6000, 4100, 8, 2, False), (1, 16384, 16384, 8, 1, False),
        (1, 32768, 32768, 4, 1, True), (2, 2048, 2048, 8, 2, True), (2, 1200, 1100, 8, 1, False),
        (3, 512, 512, 12, 3, False)]),
     (1, 4096, 4096, 8, 2, True, 2), (2, 2048, 2048, 8, 2, True, 2), (1, 6000, 4100, 8, 2, False, 2),
     (1, 16384, 16384, 8, 1, False, 2)],
)  # fmt: skip
def test_gpu_gqa_expanded_takes_the_ordered_kernel_as_mha(
    monkeypatch, b, sq, sk, h, hk, causal, kernel_group
):
    """With `ORDERED_GQA_EXPANDED` (the default; here at any length) a deterministic d128 GQA call that
    `supports_ordered` refuses (4 or 8 query heads a key head, causal or full) runs the ordered one-kernel
    backward alone as MHA, each query head's program reading its kv head's K and V (kv_repeat), each kv
    head's dK / dV summed over its group: the gradients pass the tolerance rule (at the smaller sizes),
    repeat bit for bit, and stay within 1% of their largest value of the two deterministic kernels'
    (causal 32k: the ordered kernel's convoy, walking its tiles down). kernel_group 2: its programs at 2
    query heads each (`ORDERED_GQA_KERNEL_GROUP`)."""
    calls = record_calls(
        monkeypatch, (fused_hopper, "flash_attn_bwd_fused_hopper"), (dq_hopper, "flash_attn_dq_hopper"),
        (dkdv_hopper, "flash_attn_dkdv_hopper"),
    )  # fmt: skip
    monkeypatch.setattr(fused_hopper, "UNWRITTEN_FILL", float("nan"))
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, 128, seed=sq + h + causal)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert not fused_hopper.supports_ordered(128, causal, sq, sk, h // hk, sms)
    do = torch.randn_like(q)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED", False)
    two_kernels = torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
    assert calls[-1] == "flash_attn_dkdv_hopper"
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED", True)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS", 0)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS_FULL", 0)
    monkeypatch.setattr(flash_bwd, "ORDERED_GQA_KERNEL_GROUP", kernel_group)
    assert fused_hopper.supports_ordered(128, causal, sq, sk, kernel_group, sms)
    calls.clear()
    if b * h * sq <= 8 * 4160:  # (the float64 reference at these sizes)
        check_against_reference(
            lambda q, k, v: _out_and_lse(flash_attention, q, k, v, causal=causal),
            lambda q, k, v: attention_reference(q, k, v, causal=causal, return_lse=True),
            [q, k, v],
            BF16,
        )
    runs = [torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do) for _ in range(3)]
    assert calls and set(calls) == {"flash_attn_bwd_fused_hopper"}
    _assert_bitwise_repeats_near_two_kernels(runs, two_kernels)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, causal",
    [(2, 1024, 1024, 4, 4, False), (1, 2048, 1500, 8, 4, False), (1, 4096, 4096, 4, 2, False),
     (4, 4096, 4096, 16, 16, False), (2, 8192, 8192, 16, 16, False), (1, 16384, 16384, 16, 16, False),
     (1, 2048, 1024, 4, 2, False), (1, 20480, 20480, 2, 2, False), (1, 32768, 32768, 2, 1, False),
     (1, 4100, 4100, 4, 4, True), (1, 4160, 4160, 8, 8, True), (8, 2048, 2048, 16, 16, True),
     (4, 4096, 4096, 16, 16, True), (2, 8192, 8192, 16, 16, True), (1, 8448, 8448, 8, 8, True),
     (1, 16384, 16384, 4, 4, True), (1, 16640, 16640, 4, 4, True), (1, 12288, 12288, 8, 4, True),
     (1, 17000, 17000, 2, 2, True), (1, 20480, 20480, 2, 2, True), (1, 24576, 24576, 2, 2, True),
     (1, 49152, 49152, 2, 2, True), (1, 4096, 4096, 8, 4, True), (1, 8192, 8192, 16, 8, True)],
)  # fmt: skip
def test_gpu_deterministic_backward_takes_the_ordered_kernel(monkeypatch, b, sq, sk, h, hk, causal):
    """A deterministic d128 backward runs the ordered one-kernel backward alone where `supports_ordered`
    says: full attention (GQA with 2 query heads a key head; past 16.9k keys in the convoy order: 20k, and
    32k with GQA), and causal from 2k queries on as many keys in one key group (a partial last query tile
    on the last program's diagonal at 4100 and 4160 tokens, 66 programs a key head at 8448 on 132 SMs; with
    2 query heads a key head at 4k and 8k), in two key groups (16k, 16640 with a partial last program, 12k
    with 2 query heads a key head), past that in the convoy order (17000, with a partial last query tile,
    and 20480 walking up, 24k and 48k walking its tiles down); the gradients pass the
    tolerance rule (at the smaller
    sizes), repeat bit for bit and stay within 1% of their largest value of the two deterministic kernels'.
    Each item's first adder stores into a buffer whose unwritten elements are NaN (`dq_buffer`)."""
    calls = record_calls(
        monkeypatch, (fused_hopper, "flash_attn_bwd_fused_hopper"), (dq_hopper, "flash_attn_dq_hopper"),
        (dkdv_hopper, "flash_attn_dkdv_hopper"),
    )  # fmt: skip
    # (each item's first adder stores: any element of the dq buffers read before it is written shows)
    monkeypatch.setattr(fused_hopper, "UNWRITTEN_FILL", float("nan"))
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, 128, seed=sq + h if causal else sq + sk + h)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert fused_hopper.supports_ordered(128, causal, sq, sk, h // hk, sms)
    if (b * h * sq <= 8 * 4160) if causal else (sq <= 2048):  # (the float64 reference at these sizes)
        check_against_reference(
            lambda q, k, v: _out_and_lse(flash_attention, q, k, v, causal=causal),
            lambda q, k, v: attention_reference(q, k, v, causal=causal, return_lse=True),
            [q, k, v],
            BF16,
        )
    do = torch.randn_like(q)
    runs = [torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do) for _ in range(8)]
    assert calls and set(calls) == {"flash_attn_bwd_fused_hopper"}
    # (the two deterministic kernels are tested against the reference above their sizes too)
    monkeypatch.setattr(fused_hopper, "ORDERED_ENABLED", False)
    two_kernels = torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
    assert calls[-1] == "flash_attn_dkdv_hopper"
    _assert_bitwise_repeats_near_two_kernels(runs, two_kernels)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, causal",
    [(2, 1024, 1024, 4, 4, False), (1, 2048, 1500, 8, 1, False), (1, 300, 300, 2, 2, False), (1, 1000, 129, 2, 2, False),
     (1, 4096, 4096, 4, 2, True), (1, 4100, 3000, 2, 1, True), (1, 2048, 1500, 8, 1, True),
     (1, 4096, 4096, 2, 2, False), (1, 4096, 4096, 8, 2, False), (1, 16384, 16384, 2, 2, True),
     (1, 20480, 20480, 2, 2, True)],
)  # fmt: skip
def test_gpu_nondeterministic_backward_takes_the_fused_kernel(monkeypatch, b, sq, sk, h, hk, causal):
    """deterministic=False sends a d128 backward to the one-kernel backward alone where
    `_flash_bwd_fused_hopper.supports` says (full, causal from 4k queries; causal and full from 4k
    that the ordered kernel takes, to the ordered one, `ordered_is_faster`: causal 16k in two key groups, 20k in
    the convoy's three), other causal ones to the
    deterministic Gluon kernels; the gradients pass the tolerance rule (up to 8 x 4160 query rows: the float64
    reference), and two runs differ at most in dq, by the order of its fp32 additions (not at all on the ordered
    kernel, whose gradients are then the deterministic call's, bit for bit)."""
    calls = record_calls(
        monkeypatch, (fused_hopper, "flash_attn_bwd_fused_hopper"), (dq_hopper, "flash_attn_dq_hopper"),
        (dkdv_hopper, "flash_attn_dkdv_hopper"),
    )  # fmt: skip
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, 128, seed=sq + sk)
    if b * h * sq <= 8 * 4160:
        check_against_reference(
            lambda q, k, v: _out_and_lse(flash_attention, q, k, v, causal=causal, deterministic=False),
            lambda q, k, v: attention_reference(q, k, v, causal=causal, return_lse=True),
            [q, k, v],
            BF16,
        )
    do = torch.randn_like(q)
    runs = [
        torch.autograd.grad(flash_attention(q, k, v, causal=causal, deterministic=False), (q, k, v), do)
        for _ in range(2)
    ]
    fused = fused_hopper.supports(128, causal, sq)
    want = ["flash_attn_bwd_fused_hopper"] if fused else ["flash_attn_dq_hopper", "flash_attn_dkdv_hopper"]
    assert calls and calls == want * (len(calls) // len(want))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0.02, atol=0.02 * runs[0][0].abs().max().item())
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(
        runs[0][2], runs[1][2]
    )  # (summed in registers)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if fused_hopper.ordered_is_faster(128, causal, sq, sk, h // hk, sms):
        deterministic = torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
        for ours, theirs in zip(runs[0], deterministic, strict=True):
            assert torch.equal(ours, theirs)


@pytest.mark.parametrize("fused_takes", [False, True], ids=["elsewhere", "fused"])
def test_nondeterministic_calls_the_dkdv_kernel_takes_never_run_the_atomic_variant(
    monkeypatch, fused_takes, device
):
    """The backward's routing for atomic dq where the Hopper dK/dV kernel takes a call (its checks and
    kernels stubbed, so it runs anywhere): the one-kernel backward where it says so, otherwise the
    deterministic route (dq kernel, then the dK/dV kernel), as at d64, whose dq kernel is the portable
    one; never the portable atomic variant, which measured slower there (results/s43/call1)."""
    from kernels import _flash_bwd

    monkeypatch.setattr(dkdv_hopper, "supports", lambda *a, **kw: True)
    monkeypatch.setattr(dq_hopper, "supports", lambda *a, **kw: False)
    monkeypatch.setattr(fused_hopper, "supports", lambda *a: fused_takes)
    monkeypatch.setattr(
        _flash_bwd, "_bwd_dkdv_atomic_tuned", MustNotLaunch("the portable atomic dK/dV kernel")
    )
    calls = []
    monkeypatch.setattr(dkdv_hopper, "flash_attn_dkdv_hopper", lambda *a, **kw: calls.append("dkdv"))
    monkeypatch.setattr(fused_hopper, "flash_attn_bwd_fused_hopper", lambda *a, **kw: calls.append("fused"))
    torch.manual_seed(3)
    q, k, v, do = (torch.randn(1, 40, 2, 16, device=device) for _ in range(4))
    out, lse2 = _forward(q, k, v, causal=True)
    kw = dict(sm_scale=0.25, win_left=None, win_right=0, key_padding_mask=None, dropout_p=0.0, seed=0)
    dq = _flash_bwd.flash_attn_backward(do, q, k, v, out, lse2, atomic_dq=True, **kw)[0]
    assert calls == (["fused"] if fused_takes else ["dkdv"])
    if not fused_takes:  # (dq from the portable dq kernel, as a deterministic call's)
        want = _flash_bwd.flash_attn_backward(do, q, k, v, out, lse2, atomic_dq=False, **kw)[0]
        assert torch.equal(dq, want)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_torch_deterministic_mode_keeps_nondeterministic_calls_off_the_one_kernel_backward(
    monkeypatch, causal
):
    """With torch.use_deterministic_algorithms(True), a d128 call the one-kernel backward would take
    (full, causal at 4k queries) runs the one-kernel backward with ordered adds, as deterministic=True
    does; gradients bitwise deterministic=True's."""
    calls = record_calls(monkeypatch, (dkdv_hopper, "flash_attn_dkdv_hopper"))
    fused = fused_hopper.flash_attn_bwd_fused_hopper
    monkeypatch.setattr(
        fused_hopper,
        "flash_attn_bwd_fused_hopper",
        lambda *a, ordered=False, **kw: (
            calls.append(f"fused ordered={ordered}") or fused(*a, ordered=ordered, **kw)
        ),
    )
    assert fused_hopper.supports(128, causal, 4096)
    q, k, v = _gpu_inputs(1, 4096, 4096, 4, 4, 128, seed=7 + causal)
    do = torch.randn_like(q)
    with deterministic_algorithms():
        _assert_either_setting_gives_the_same_grads(q, k, v, do, causal)
    assert calls == ["fused ordered=True"] * 2


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "b, sq, sk, h, hk, d, causal",
    [(1, 4096, 4096, 4, 2, 64, True), (2, 1024, 1000, 4, 4, 64, False), (1, 2048, 1500, 2, 2, 128, True),
     (1, 1024, 1024, 2, 1, 256, False)],
)  # fmt: skip
def test_gpu_nondeterministic_backward_elsewhere_is_the_deterministic_one(
    monkeypatch, b, sq, sk, h, hk, d, causal
):
    """Where the Hopper dK/dV kernel takes a call but neither one-kernel backward does (head dims 64 and
    256, causal d128 under 4k queries on other key lengths), deterministic=False runs the deterministic
    route, measured faster there than the portable atomic variant: the Gluon dK/dV kernel, and gradients
    bitwise equal to deterministic=True's. (Causal d128 from 2k queries on as many keys takes the ordered
    one-kernel backward with either setting.)"""
    calls = record_calls(
        monkeypatch, (fused_hopper, "flash_attn_bwd_fused_hopper"), (dkdv_hopper, "flash_attn_dkdv_hopper")
    )
    assert not fused_hopper.supports(d, causal, sq)
    q, k, v = _gpu_inputs(b, sq, sk, h, hk, d, seed=sq + d)
    _assert_either_setting_gives_the_same_grads(q, k, v, torch.randn_like(q), causal)
    assert calls == ["flash_attn_dkdv_hopper"] * 2
