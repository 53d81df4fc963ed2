"""The GPT model: backends agree, the chunked loss equals the plain one, bad configs fail clearly."""

import pytest
import torch
import torch.nn.functional as F

from flashtrain.models.attention import auto_picks_triton, get_backend, reference_attention, sdpa_attention
from flashtrain.models.gpt import GPT, GPTConfig, chunked_cross_entropy


def tiny(**kw) -> GPTConfig:
    base = dict(n_layer=2, n_head=4, d_model=32, vocab_size=97, max_seq_len=64, attention="reference")
    base.update(kw)
    return GPTConfig(**base)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, (5, 0), (3, 2)])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("lengths", [(17, 17), (9, 23)])
def test_sdpa_backend_matches_reference(causal, window, heads, lengths):
    nheads, nheads_kv = heads
    seqlen_q, seqlen_k = lengths
    q = torch.randn(2, seqlen_q, nheads, 16, dtype=torch.float64)
    k = torch.randn(2, seqlen_k, nheads_kv, 16, dtype=torch.float64)
    v = torch.randn(2, seqlen_k, nheads_kv, 16, dtype=torch.float64)
    kw = dict(causal=causal, softmax_scale=None, dropout_p=0.0, window=window)
    torch.testing.assert_close(sdpa_attention(q, k, v, **kw), reference_attention(q, k, v, **kw))


def test_reference_backend_matches_kernel_reference():
    from kernels.reference import attention_reference

    q, k, v = (torch.randn(2, 11, 2, 8, dtype=torch.float64) for _ in range(3))
    ours = reference_attention(q, k, v, causal=True, window=(4, 0))
    torch.testing.assert_close(ours, attention_reference(q, k, v, causal=True, window=(4, 0)))


@pytest.mark.parametrize("pos", ["learned", "rotary"])
@pytest.mark.parametrize("n_kv_head", [None, 2])
def test_backends_give_same_loss_and_grads(pos, n_kv_head):
    torch.manual_seed(0)
    ref = GPT(tiny(pos_embedding=pos, n_kv_head=n_kv_head)).double()
    other = GPT(tiny(pos_embedding=pos, n_kv_head=n_kv_head, attention="sdpa")).double()
    other.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 97, (3, 40))
    tgt = torch.randint(0, 97, (3, 40))
    losses = []
    for model in (ref, other):
        loss = model(idx, tgt)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for (name, a), b in zip(ref.named_parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.parametrize(
    "pos,n_kv_head,packed", [("learned", None, True), ("learned", 2, True), ("rotary", 2, False)]
)
@pytest.mark.parametrize("attention", ["triton", "triton_nondeterministic"])
def test_triton_backend_packed_qkv_matches_reference(pos, n_kv_head, packed, attention, monkeypatch, device):
    """With learned positions the triton backends get the projection's output packed (one gradient
    buffer, kernels.flash_attention_qkvpacked); with rotary embeddings q and k are rotated copies, so
    they get the three tensors. Both match the reference backend; triton_nondeterministic asks the
    kernels for deterministic=False (atomic dq), triton for the default."""
    import kernels

    calls = []
    for name in ("flash_attention", "flash_attention_qkvpacked"):
        real = getattr(kernels, name)
        monkeypatch.setattr(
            kernels,
            name,
            lambda *a, _n=name, _r=real, **kw: calls.append((_n, kw.get("deterministic"))) or _r(*a, **kw),
        )
    torch.manual_seed(0)
    ref = GPT(tiny(pos_embedding=pos, n_kv_head=n_kv_head)).to(device)
    ours = GPT(tiny(pos_embedding=pos, n_kv_head=n_kv_head, attention=attention)).to(device)
    ours.load_state_dict(ref.state_dict())
    idx, tgt = (torch.randint(0, 97, (2, 24), device=device) for _ in range(2))
    losses = []
    for model in (ref, ours):
        loss = model(idx, tgt)
        loss.backward()
        losses.append(loss)
    called = "flash_attention_qkvpacked" if packed else "flash_attention"
    deterministic = None if attention == "triton" else False  # (None: the kernels' default, True)
    assert calls == [(called, deterministic)] * 2  # one call per layer
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_cross_entropy_equals_full(chunk):
    hidden = torch.randn(3, 21, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 21))
    targets[0, :4] = -100  # ignored positions
    total, count = chunked_cross_entropy(hidden, weight, targets, chunk)
    (total / count).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    full = F.cross_entropy((hidden @ weight.T).reshape(-1, 50), targets.reshape(-1), ignore_index=-100)
    full.backward()
    torch.testing.assert_close(total / count, full)
    assert int(count) == 3 * 21 - 4
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], weight.grad)


def test_positions_shift_learned_embeddings():
    """A shard of a longer sequence (sequence parallelism) passes its global positions."""
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    idx = torch.randint(0, 97, (1, 30))
    with torch.no_grad():
        hidden_full = model.transformer.wpe(torch.arange(30))
        hidden_shard = model.transformer.wpe(torch.arange(10, 20))
    torch.testing.assert_close(hidden_full[10:20], hidden_shard)
    with torch.no_grad():
        a = model(idx[:, 10:20], positions=torch.arange(10, 20))
        b = model(idx[:, 10:20])
    assert not torch.allclose(a, b)


def test_tied_embeddings_and_init():
    model = GPT(tiny())
    assert model.lm_head.weight is model.transformer.wte.weight
    std = model.transformer.h[0].attn.c_proj.weight.std().item()
    assert std < 0.02  # residual projections are scaled down by 1/sqrt(2·n_layer)


def test_flops_per_token_formula():
    model = GPT(tiny())
    n = model.num_params()
    assert model.flops_per_token(64) == 6 * n + 6 * 2 * 32 * 64
    assert n == sum(p.numel() for p in model.parameters()) - 64 * 32  # position table excluded


def test_sequence_longer_than_positions_fails():
    model = GPT(tiny(max_seq_len=16))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=30), "divisible by model.n_head"),
        (dict(n_kv_head=3), "divisible by model.n_kv_head"),
        (dict(pos_embedding="alibi"), "pos_embedding"),
        (dict(dropout=1.0), "dropout"),
        (dict(n_layer=0), r"model.n_layer=0 must be >= 1"),
        (dict(n_head=0), r"model.n_head=0 must be >= 1"),  # was a ZeroDivisionError
        # 0 read as "unset" before: n_kv_head=0 gave plain MHA, window=0 full attention
        (dict(n_kv_head=0), r"model.n_kv_head=0 must be >= 1, or null"),
        (dict(window=0), r"model.window=0 must be >= 1, or null"),
        (dict(window=-4), r"model.window=-4 must be >= 1, or null"),
        (dict(vocab_size=0), r"model.vocab_size=0 must be >= 1, or null"),
        (dict(loss_chunk=0), r"model.loss_chunk=0 must be >= 1"),
        (dict(init_std=0.0), r"model.init_std=0.0 must be > 0"),
        (dict(rope_theta=-1.0), r"model.rope_theta=-1.0 must be > 0"),
    ],
)
def test_bad_model_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown attention backend 'flash3'"):
        get_backend("flash3")
    with pytest.raises(ValueError, match="unknown attention backend"):
        GPT(tiny(attention="flash3"))


@pytest.mark.parametrize(
    "on_cuda, seqlen, head_dim, dropout_p, masked, cudnn, ours",
    [
        (False, 65536, 128, 0.0, True, False, False),  # CPU: SDPA always
        (True, 1024, 64, 0.0, False, False, False),  # short: SDPA (as fast, less host time)
        (True, 4096, 64, 0.0, False, False, True),
        (True, 1024, 64, 0.0, True, False, True),  # windows / key padding: ours at any length
        (
            True,
            8192,
            64,
            0.1,
            False,
            False,
            False,
        ),  # attention dropout at head dim <= 64: SDPA measured faster
        (True, 8192, 128, 0.1, False, False, True),
        (True, 8192, 64, 0.1, True, False, True),
        (True, 8192, 64, 0.0, False, True, False),  # SDPA would run cuDNN: measured faster than ours
        (True, 8192, 128, 0.0, True, True, True),  # ... but not with a window or padding (a dense mask)
    ],
)
def test_auto_backend_picks_what_measured_faster(on_cuda, seqlen, head_dim, dropout_p, masked, cudnn, ours):
    assert auto_picks_triton(on_cuda, seqlen, head_dim, dropout_p, masked, cudnn) is ours


@pytest.mark.parametrize(
    "on_cuda, seqlen, head_dim, dropout_p, ours",
    [
        (True, 512, 64, 0.0, True),  # SDPA's deterministic variants measured slower from 512
        (True, 1024, 128, 0.0, True),
        (True, 256, 64, 0.0, False),  # not timed: SDPA, as without the switch
        (True, 8192, 64, 0.1, False),  # attention dropout at head dim <= 64: SDPA, as without the switch
        (False, 8192, 128, 0.0, False),
    ],
)
def test_auto_under_torch_deterministic_mode_takes_ours_from_512(on_cuda, seqlen, head_dim, dropout_p, ours):
    """With torch.use_deterministic_algorithms(True) SDPA runs no cuDNN kernel and its backwards switch to
    slower deterministic variants, so `auto` takes ours from 512 tokens, not 4k."""
    assert auto_picks_triton(on_cuda, seqlen, head_dim, dropout_p, False, False, deterministic=True) is ours
    assert auto_picks_triton(on_cuda, seqlen, head_dim, dropout_p, False, False) is (ours and seqlen >= 4096)


@pytest.mark.parametrize(
    "nheads, nheads_kv, seqlen_q, seqlen_k, causal, dropout_p, window, padded, probe",
    [
        (4, 4, 16, 16, True, 0.0, None, False, (4, 4, 8, False, False, True, False)),
        (6, 2, 1, 16, False, 0.1, None, False, (6, 2, 8, True, False, False, True)),  # GQA, one query
        (4, 1, 16, 1, False, 0.0, None, False, (4, 1, 8, False, True, False, False)),
        (4, 4, 8, 16, True, 0.0, None, False, None),  # causal, seqlen_q != seqlen_k: a dense mask in SDPA
        (4, 4, 16, 16, True, 0.0, (4, 0), False, None),  # window: a dense mask
        (4, 4, 16, 16, False, 0.0, None, True, None),  # key padding: a dense mask
    ],
)
def test_auto_asks_pytorch_whether_sdpa_runs_cudnn(
    nheads, nheads_kv, seqlen_q, seqlen_k, causal, dropout_p, window, padded, probe, monkeypatch
):
    """`auto` asks `sdpa_runs_cudnn` for unmasked calls only, with the call's head counts, head dim,
    length-1 sequences, causality and dropout, and hands the answer to `auto_picks_triton`, with whether
    torch's determinism switch is on."""
    import flashtrain.models.attention as attention

    asked, decided = [], []

    def runs_cudnn(device, dtype, *args):
        asked.append(args)
        return True

    def picks(on_cuda, seqlen_k, head_dim, dropout_p, masked, cudnn, deterministic, cudnn_wrong):
        assert deterministic is False and cudnn_wrong is False
        decided.append(cudnn)
        return False

    monkeypatch.setattr(attention, "sdpa_runs_cudnn", runs_cudnn)
    monkeypatch.setattr(attention, "auto_picks_triton", picks)
    q = torch.randn(2, seqlen_q, nheads, 8)
    k, v = (torch.randn(2, seqlen_k, nheads_kv, 8) for _ in range(2))
    mask = torch.ones(2, seqlen_k, dtype=torch.bool) if padded else None
    attention.auto_attention(
        q, k, v, causal=causal, dropout_p=dropout_p, window=window, key_padding_mask=mask
    )
    assert asked == ([] if probe is None else [probe])
    assert decided == [probe is not None]


@pytest.mark.parametrize(
    "device, capability, head_dim, nheads_kv, one_query, same_length, dropout, keys_timed, beats",
    [
        ("cuda", (9, 0), 128, 4, False, True, False, True, True),
        ("cuda", (9, 0), 128, 4, False, True, False, False, False),  # MHA under 1k keys: not timed
        ("cuda", (9, 0), 64, 4, False, True, False, True, False),  # head dim 64: level with cuDNN or slower
        ("cuda", (9, 0), 256, 4, False, True, False, True, False),
        ("cuda", (9, 0), 128, 2, False, True, False, False, False),  # GQA elsewhere: the two kernels
        ("cuda", (9, 0), 128, 2, False, True, False, True, True),  # GQA at 2k-64k keys: the ordered kernel
        ("cuda", (9, 0), 128, 4, True, False, False, True, False),  # one query: not timed
        ("cuda", (9, 0), 128, 4, False, False, False, True, False),  # fewer queries than keys: not timed
        ("cuda", (9, 0), 128, 4, False, True, True, True, False),  # dropout: the portable backward
        ("cuda", (9, 0), 128, 2, False, True, True, True, False),
        ("cuda", (10, 0), 128, 4, False, True, False, True, False),  # no Gluon kernels off sm_90
        ("cpu", None, 128, 4, False, True, False, True, False),
    ],
)
def test_ours_beats_cudnn_at_head_dim_128_on_hopper(
    device, capability, head_dim, nheads_kv, one_query, same_length, dropout, keys_timed, beats, monkeypatch
):
    """Where `auto` takes ours although SDPA would run cuDNN: head dim 128 on sm_90 (H100/H200), as many
    queries as keys (more than one), no dropout, its keys in the timed range (the GPU's capability faked, so
    this runs on CPU)."""
    import flashtrain.models.attention as attention

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    dev = torch.device(device)
    args = (dev, head_dim, 4, nheads_kv, one_query, same_length, dropout, keys_timed)
    assert attention.ours_beats_cudnn(*args) is beats


@pytest.mark.parametrize(
    "seqlen_k, causal, gqa, expanded, timed",
    [(2048, False, True, True, False), (4095, True, True, True, False), (4096, True, True, True, True),
     (4096, False, True, True, True), (16384, True, True, True, True), (16385, True, True, True, False),
     (8192, True, True, False, False), (1023, True, False, True, False), (1024, True, False, True, True),
     (1 << 20, False, False, False, True)],
)  # fmt: skip
def test_keys_are_timed_from_1k_without_gqa_and_in_the_expanded_routes_range_under_it(
    seqlen_k, causal, gqa, expanded, timed, monkeypatch
):
    """A call counts as one where ours beats cuDNN from AUTO_MHA_MIN_KEYS keys without GQA (here 1k); a GQA
    call from AUTO_GQA_MIN_KEYS (here 4k; under that, end to end at 1k the host paced ours), within the range
    of the backward's route run as MHA (from its floor, here 4k causal or 2k full, to
    `kernels._flash_bwd.ORDERED_GQA_EXPANDED_MAX_KEYS`), and not at all with that route off."""
    import flashtrain.models.attention as attention
    from kernels import _flash_bwd

    monkeypatch.setattr(attention, "AUTO_MHA_MIN_KEYS", 1024)
    monkeypatch.setattr(attention, "AUTO_GQA_MIN_KEYS", 4096)
    monkeypatch.setattr(_flash_bwd, "ORDERED_GQA_EXPANDED", expanded)
    monkeypatch.setattr(_flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS", 4096)
    monkeypatch.setattr(_flash_bwd, "ORDERED_GQA_EXPANDED_MIN_KEYS_FULL", 2048)
    monkeypatch.setattr(_flash_bwd, "ORDERED_GQA_EXPANDED_MAX_KEYS", 16384)
    assert attention._keys_timed(seqlen_k, causal, gqa) is timed


@pytest.mark.parametrize("beats", [True, False])
def test_auto_takes_ours_over_cudnn_where_ours_beats_it(beats, monkeypatch):
    """Where SDPA would run cuDNN, `auto` runs ours when `ours_beats_cudnn` says so, without asking
    `auto_picks_triton` (whose shortest length was set against SDPA flash), and otherwise hands it
    sdpa_runs_cudnn=True; `ours_beats_cudnn` is asked with the call's device, head dim, head counts, one query
    or not, as many queries as keys or not, dropout, and whether its keys are in the range timed
    (`_keys_timed`; AUTO_MHA_MIN_KEYS here 20)."""
    import flashtrain.models.attention as attention

    asked, decided, ran = [], [], []
    monkeypatch.setattr(attention, "AUTO_MHA_MIN_KEYS", 20)
    monkeypatch.setattr(attention, "sdpa_runs_cudnn", lambda *args: True)
    monkeypatch.setattr(attention, "ours_beats_cudnn", lambda *args: asked.append(args[1:]) or beats)
    monkeypatch.setattr(attention, "auto_picks_triton", lambda *args: decided.append(args[5]) or False)
    monkeypatch.setattr(attention, "triton_attention", lambda *args, **kw: ran.append("ours"))
    monkeypatch.setattr(attention, "sdpa_attention", lambda *args, **kw: ran.append("sdpa"))
    q = torch.randn(1, 16, 4, 8)
    attention.auto_attention(q, q, q, causal=True)
    k = torch.randn(1, 24, 4, 8)
    attention.auto_attention(q, k, k, causal=False)
    assert asked == [(8, 4, 4, False, True, False, False), (8, 4, 4, False, False, False, True)]
    assert decided == ([] if beats else [True, True])
    assert ran == ["ours" if beats else "sdpa"] * 2


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="ours beats cuDNN at head dim 128 on sm_90 (H100/H200) only",
)
@pytest.mark.parametrize(
    "seqlen, nheads_kv, head_dim, ours",
    [(4096, 8, 128, True), (1024, 8, 128, True), (512, 8, 128, False), (8192, 2, 128, True), (32768, 2, 128, True),
     (81920, 2, 128, False), (4096, 2, 128, True), (2048, 2, 128, True), (1024, 2, 128, False), (4096, 8, 64, False)],
)  # fmt: skip
def test_gpu_auto_takes_ours_over_cudnn_at_head_dim_128(seqlen, nheads_kv, head_dim, ours, monkeypatch):
    """On an H100/H200 where SDPA would run cuDNN, `auto` runs ours at head dim 128 without GQA from 1k
    tokens and with GQA at 2k-64k keys, and SDPA under those, past them or at head dim 64 (the backends
    recorded, still run)."""
    import flashtrain.models.attention as attention

    q = torch.randn(1, seqlen, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, seqlen, nheads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    if not attention.sdpa_runs_cudnn(q.device, q.dtype, 8, nheads_kv, head_dim, False, False, True, False):
        pytest.skip("SDPA would not run cuDNN here (cuDNN older than 9.15.1, or not first)")
    ran = []
    for name in ("triton_attention", "sdpa_attention"):
        real = getattr(attention, name)
        monkeypatch.setattr(
            attention, name, lambda *a, _n=name, _r=real, **kw: ran.append(_n) or _r(*a, **kw)
        )
    attention.auto_attention(q, k, k, causal=True)
    assert ran == ["triton_attention" if ours else "sdpa_attention"]


@pytest.mark.parametrize(
    "on_cuda, masked, cudnn, dropout_p", [(True, False, True, 0.0), (True, False, False, 0.1)]
)
def test_auto_takes_ours_past_the_size_where_cudnn_was_wrong(on_cuda, masked, cudnn, dropout_p):
    """A call SDPA would give cuDNN, or one whose dropout SDPA takes, goes to ours when a tensor spans
    past 2**31 elements (cuDNN's dq was wrong there); on CPU still SDPA."""
    args = (on_cuda, 1 << 20, 64, dropout_p, masked, cudnn)
    assert auto_picks_triton(*args, False, False) is False
    assert auto_picks_triton(*args, False, True) is True
    assert auto_picks_triton(False, *args[1:], False, True) is False


def test_sdpa_cudnn_wrong_counts_whole_tensors_with_their_strides(monkeypatch):
    """The batch counts (9 sequences of 131k were wrong, each far under the limit), and so do a view's
    strides (a packed qkv's q spans three times its elements)."""
    import flashtrain.models.attention as attention

    monkeypatch.setattr(attention, "SDPA_CUDNN_MAX_ELEMENTS", 4 * 16 * 2 * 8)
    q = torch.randn(4, 16, 2, 8)
    assert not attention.sdpa_cudnn_wrong(q, q[:, :8], q[:1])
    assert attention.sdpa_cudnn_wrong(q[:1], torch.randn(5, 16, 2, 8))
    qkv = torch.randn(2, 16, 6, 8)  # its q view: 512 elements spanning 768 + 15 x 48 + 16 = 1504
    assert q[:2].numel() == qkv[:, :, :2].numel() and attention.sdpa_cudnn_wrong(qkv[:, :, :2])
    monkeypatch.setattr(attention, "SDPA_CUDNN_MAX_ELEMENTS", 2**31)
    assert not attention.sdpa_cudnn_wrong(q, qkv)


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_sdpa_leaves_cudnn_out_past_that_size(backend, monkeypatch):
    """`sdpa` (and `auto` where it gives SDPA the call: here on CPU) pins SDPA to its other backends for
    such a call, and leaves the choice to PyTorch otherwise; the output is the same."""
    import flashtrain.models.attention as attention

    enabled, real = [], attention.F.scaled_dot_product_attention

    def sdpa(*args, **kw):
        enabled.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", sdpa)
    q, k, v = (torch.randn(2, 16, 2, 8) for _ in range(3))
    fn = get_backend(backend)
    want = fn(q, k, v, causal=True)
    monkeypatch.setattr(attention, "SDPA_CUDNN_MAX_ELEMENTS", q.numel() - 1)
    torch.testing.assert_close(fn(q, k, v, causal=True), want)
    assert enabled == [True, False] and torch.backends.cuda.cudnn_sdp_enabled()


def test_auto_tells_its_rule_when_torch_deterministic_mode_is_on(monkeypatch):
    import flashtrain.models.attention as attention

    seen = []
    monkeypatch.setattr(attention, "auto_picks_triton", lambda *args: seen.append(args[6]) or False)
    q = torch.randn(1, 16, 2, 8)
    torch.use_deterministic_algorithms(True)
    try:
        attention.auto_attention(q, q, q, causal=True)
    finally:
        torch.use_deterministic_algorithms(False)
    attention.auto_attention(q, q, q, causal=True)
    assert seen == [True, False]


def test_sdpa_runs_cudnn_is_false_off_cuda_and_without_the_selector(monkeypatch):
    import flashtrain.models.attention as attention

    args = (torch.bfloat16, 16, 16, 64, False, False, True, False)
    assert attention.sdpa_runs_cudnn(torch.device("cpu"), *args) is False
    # a torch build without the private selector functions: no probe (which would need CUDA here)
    monkeypatch.setattr(attention, "_CAN_ASK_SDPA", False)
    assert attention.sdpa_runs_cudnn(torch.device("cuda", 0), *args) is False


@pytest.mark.parametrize("dynamic", [False, True, None])
def test_auto_compiles_without_graph_breaks(dynamic):
    """The cuDNN probe folds to a constant under torch.compile, symbolic shapes included
    (assume_constant_result refuses symbolic arguments; `auto` hands it plain ints and bools)."""
    from flashtrain.models.attention import auto_attention, qkvpacked_backend

    packed = torch.compile(qkvpacked_backend(auto_attention), fullgraph=True, dynamic=dynamic)
    views = torch.compile(auto_attention, fullgraph=True, dynamic=dynamic)
    for seqlen in (16, 24, 1):
        qkv = torch.randn(2, seqlen, 4 + 2 * 2, 16)
        expected = sdpa_attention(*qkv.split([4, 2, 2], dim=2), causal=True)
        torch.testing.assert_close(packed(qkv, nheads_kv=2, causal=True), expected)
        torch.testing.assert_close(views(*qkv.split([4, 2, 2], dim=2), causal=True), expected)


@pytest.mark.parametrize("dynamic", [False, True])
def test_auto_compiles_its_gqa_key_range_without_graph_breaks(dynamic, monkeypatch):
    """Where SDPA would run cuDNN, `auto` asks `ours_beats_cudnn` (a trace-time constant) with whether a
    GQA call's keys are in the timed range: under torch.compile, symbolic lengths included, that is a plain
    bool (the probe faked to say cuDNN, so this runs on CPU; ours_beats_cudnn then says no off CUDA)."""
    import flashtrain.models.attention as attention

    monkeypatch.setattr(attention, "sdpa_runs_cudnn", lambda *args: True)
    torch._dynamo.reset()  # (other tests' compilations of auto_attention count toward its recompile limit)
    views = torch.compile(attention.auto_attention, fullgraph=True, dynamic=dynamic)
    for seqlen in (16, 24):
        q, k, v = torch.randn(2, seqlen, 4 + 2 * 2, 16).split([4, 2, 2], dim=2)
        torch.testing.assert_close(views(q, k, v, causal=True), sdpa_attention(q, k, v, causal=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, causal, dropout_p",
    [
        (2, 8192, 8192, 16, 16, 64, True, 0.0),
        (16, 1024, 1024, 12, 12, 64, True, 0.1),
        (1, 4096, 4096, 32, 8, 128, True, 0.0),
        (1, 2048, 2048, 8, 8, 256, False, 0.0),
        (1, 2048, 2048, 8, 8, 40, True, 0.0),
        (4, 1, 4096, 16, 4, 128, False, 0.0),
        (4, 1, 4096, 16, 4, 128, False, 0.1),
    ],
)
def test_sdpa_probe_matches_pytorchs_choice_on_the_real_call(
    batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, causal, dropout_p
):
    """The batch-1, short-sequence probe gives the backend PyTorch picks for the full-size call."""
    from flashtrain.models.attention import _sdpa_choice

    def views(seqlen, heads):  # (B, H, T, D) views of (B, T, H, D), as sdpa_attention passes them
        return torch.empty(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16).transpose(
            1, 2
        )

    q, k, v = views(seqlen_q, nheads), views(seqlen_k, nheads_kv), views(seqlen_k, nheads_kv)
    gqa = nheads != nheads_kv
    real = int(torch._fused_sdp_choice(q, k, v, None, dropout_p, causal, scale=None, enable_gqa=gqa))
    probe = _sdpa_choice(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16, nheads, nheads_kv,
                         head_dim, seqlen_q == 1, seqlen_k == 1, causal, dropout_p > 0, None)  # fmt: skip
    assert probe == real


@pytest.mark.parametrize("ours", [False, True], ids=["sdpa", "triton"])
@pytest.mark.parametrize("padded", [False, True])
def test_auto_packed_form_matches_the_views(ours, padded, monkeypatch, device):
    """`auto` on a packed qkv runs what it runs on the views (SDPA there, or our packed kernel where
    auto_picks_triton says so): same outputs and the same gradient of qkv."""
    import flashtrain.models.attention as attention

    monkeypatch.setattr(attention, "auto_picks_triton", lambda *args: ours)
    torch.manual_seed(0)
    qkv = torch.randn(2, 19, 4 + 2 * 2, 16, device=device, requires_grad=True)
    mask = None
    if padded:
        mask = torch.ones(2, 19, dtype=torch.bool, device=device)
        mask[1, -5:] = False
    kw = dict(causal=not padded, key_padding_mask=mask)
    packed = attention.qkvpacked_backend(attention.auto_attention)(qkv, nheads_kv=2, **kw)
    (g_packed,) = torch.autograd.grad(packed.square().sum(), qkv)
    views = attention.auto_attention(*qkv.split([4, 2, 2], dim=2), **kw)
    (g_views,) = torch.autograd.grad(views.square().sum(), qkv)
    torch.testing.assert_close(packed, views)
    torch.testing.assert_close(g_packed, g_views)


@pytest.mark.gpu
def test_sdpa_runs_cudnn_follows_pytorchs_settings():
    """The probe's cache is keyed by SDPA's settings: pinning another backend or deterministic mode
    (cuDNN's attention backward is not deterministic) turns the answer off; restoring them turns it back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtrain.models.attention import sdpa_runs_cudnn

    args = (
        torch.device("cuda", torch.cuda.current_device()),
        torch.bfloat16,
        16,
        16,
        64,
        False,
        False,
        True,
        False,
    )
    q = torch.empty(2, 16, 256, 64, device="cuda", dtype=torch.bfloat16)
    real = int(torch._fused_sdp_choice(q, q, q, None, 0.0, True)) == int(SDPBackend.CUDNN_ATTENTION)
    assert sdpa_runs_cudnn(*args) is real
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert sdpa_runs_cudnn(*args) is False
    torch.use_deterministic_algorithms(True)
    try:
        assert sdpa_runs_cudnn(*args) is False
    finally:
        torch.use_deterministic_algorithms(False)
    assert sdpa_runs_cudnn(*args) is real
