"""Toy attention loops (one head per program row, unmasked, full tiles) with the streamed tiles read
either through pointers (DESC=False, as our kernels) or through host-built TMA tensor descriptors
(DESC=True): Q and dO in dk/dv, K and V in dq and the forward. The question (session 23,
benchmarks/NOTES_attention.md): does TMA pay at head dim 64, where the loops carry twice the address
work per matmul flop of head dim 128 (the only head dim the 2026-11-22 descriptor trial measured)?
"""

import triton
import triton.language as tl


@triton.jit
def dkdv(
    Q, K, V, DO, DK, DV, LSE, DELTA, q_desc, do_desc, n, qk_scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DESC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    hoff = head * n
    offs_n = pid * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = tl.load(K + (hoff + offs_n[:, None]) * D + offs_d[None, :])
    v = tl.load(V + (hoff + offs_n[:, None]) * D + offs_d[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for start in range(0, n, BM):
        offs_m = start + tl.arange(0, BM)
        if DESC:
            q = q_desc.load([(hoff + start).to(tl.int32), 0])
        else:
            q = tl.load(Q + (hoff + offs_m[:, None]) * D + offs_d[None, :])
        lse = tl.load(LSE + hoff + offs_m)
        qkT = tl.dot(k, tl.trans(q)) * qk_scale
        pT = tl.math.exp2(qkT - lse[None, :])
        if DESC:
            do = do_desc.load([(hoff + start).to(tl.int32), 0])
        else:
            do = tl.load(DO + (hoff + offs_m[:, None]) * D + offs_d[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        delta = tl.load(DELTA + hoff + offs_m)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk)
    tl.store(DK + (hoff + offs_n[:, None]) * D + offs_d[None, :], dk.to(DK.dtype.element_ty))
    tl.store(DV + (hoff + offs_n[:, None]) * D + offs_d[None, :], dv.to(DV.dtype.element_ty))


@triton.jit
def dq(
    Q, K, V, DO, DQ, LSE, DELTA, k_desc, v_desc, n, qk_scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DESC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + (hoff + offs_m[:, None]) * D + offs_d[None, :])
    do = tl.load(DO + (hoff + offs_m[:, None]) * D + offs_d[None, :])
    lse = tl.load(LSE + hoff + offs_m)
    delta = tl.load(DELTA + hoff + offs_m)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, n, BN):
        offs_n = start + tl.arange(0, BN)
        if DESC:
            k = k_desc.load([(hoff + start).to(tl.int32), 0])
            v = v_desc.load([(hoff + start).to(tl.int32), 0])
        else:
            k = tl.load(K + (hoff + offs_n[:, None]) * D + offs_d[None, :])
            v = tl.load(V + (hoff + offs_n[:, None]) * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.math.exp2(qk - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        acc = tl.dot(ds.to(k.dtype), k, acc)
    tl.store(DQ + (hoff + offs_m[:, None]) * D + offs_d[None, :], acc.to(DQ.dtype.element_ty))


@triton.jit
def fwd(
    Q, K, V, OUT, k_desc, v_desc, n, qk_scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DESC: tl.constexpr,
):  # fmt: skip
    """Our forward's loop (scale folded into the exp2's FMA)."""
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + (hoff + offs_m[:, None]) * D + offs_d[None, :])
    m_i = tl.zeros([BM], tl.float32) - float("inf")
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, n, BN):
        offs_n = start + tl.arange(0, BN)
        if DESC:
            k = k_desc.load([(hoff + start).to(tl.int32), 0])
        else:
            k = tl.load(K + (hoff + offs_n[:, None]) * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
        if DESC:
            v = v_desc.load([(hoff + start).to(tl.int32), 0])
        else:
            v = tl.load(V + (hoff + offs_n[:, None]) * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    acc = acc / l_i[:, None]
    tl.store(OUT + (hoff + offs_m[:, None]) * D + offs_d[None, :], acc.to(OUT.dtype.element_ty))
