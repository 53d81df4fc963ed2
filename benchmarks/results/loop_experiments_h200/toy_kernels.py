"""Toy attention loops (one head per program row, unmasked, no bounds checks) used to test three ideas
on one H200 before touching the real kernels (benchmarks/NOTES_attention.md, "Loop experiments"):

- dkdv_swp / dkdv_swp2 / dq_swp2: the next tile's scores issued before this tile's softmax (manual
  software pipelining), against dkdv_base / dq_base;
- fwd(FRAC): a share of the exp2s computed as a cubic on the FMA pipe instead of MUFU;
- fwd2(MODE): the softmax scale folded into the exp2's FMA (1), and also the running output rescaled
  only when a row max grew by more than 8 (2).
"""

import triton
import triton.language as tl


@triton.jit
def dkdv_base(
    Q, K, V, DO, DK, DV, LSE, DELTA, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    Q += hoff * D
    K += hoff * D
    V += hoff * D
    DO += hoff * D
    LSE += hoff
    DELTA += hoff
    offs_n = pid * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
    v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for start in range(0, n, BM):
        offs_m = start + tl.arange(0, BM)
        q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
        lse = tl.load(LSE + offs_m)
        qkT = tl.dot(k, tl.trans(q)) * qk_scale
        pT = tl.math.exp2(qkT - lse[None, :])
        do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        delta = tl.load(DELTA + offs_m)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk)
    tl.store(DK + hoff * D + offs_n[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty))
    tl.store(DV + hoff * D + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty))


@triton.jit
def dkdv_swp(  # ptxas serialises its wgmmas (C7514): the carried scores are moved in flight
    Q, K, V, DO, DK, DV, LSE, DELTA, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    """S^T of the next query tile is issued before this tile's softmax, so the tensor cores work on it
    while the softmax runs."""
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    Q += hoff * D
    K += hoff * D
    V += hoff * D
    DO += hoff * D
    LSE += hoff
    DELTA += hoff
    offs_n = pid * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
    v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    offs_m = tl.arange(0, BM)
    q0 = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    qkT = tl.dot(k, tl.trans(q0))
    for start in range(0, n, BM):
        offs_m = start + tl.arange(0, BM)
        do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :])
        dpT = tl.dot(v, tl.trans(do))
        # next tile's scores (the last iteration computes a throwaway tile of row 0)
        nxt = (start + BM) % n + tl.arange(0, BM)
        qn = tl.load(Q + nxt[:, None] * D + offs_d[None, :])
        qkT_next = tl.dot(k, tl.trans(qn))
        lse = tl.load(LSE + offs_m)
        delta = tl.load(DELTA + offs_m)
        pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
        dsT = pT * (dpT - delta[None, :])
        q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dk = tl.dot(dsT.to(q.dtype), q, dk)
        qkT = qkT_next
    tl.store(DK + hoff * D + offs_n[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty))
    tl.store(DV + hoff * D + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty))


@triton.jit
def dkdv_swp2(
    Q, K, V, DO, DK, DV, LSE, DELTA, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    """S^T of the next query tile is issued before this tile's softmax, so the tensor cores work on it
    while the softmax runs."""
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    Q += hoff * D
    K += hoff * D
    V += hoff * D
    DO += hoff * D
    LSE += hoff
    DELTA += hoff
    offs_n = pid * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
    v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    offs_m = tl.arange(0, BM)
    q0 = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    qkT = tl.dot(k, tl.trans(q0))
    for start in range(0, n, BM):
        offs_m = start + tl.arange(0, BM)
        do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :])
        dpT = tl.dot(v, tl.trans(do))
        # next tile's scores (the last iteration computes a throwaway tile of row 0)
        lse = tl.load(LSE + offs_m)
        delta = tl.load(DELTA + offs_m)
        pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
        nxt = (start + BM) % n + tl.arange(0, BM)
        qn = tl.load(Q + nxt[:, None] * D + offs_d[None, :])
        qkT_next = tl.dot(k, tl.trans(qn))
        dsT = pT * (dpT - delta[None, :])
        q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dk = tl.dot(dsT.to(q.dtype), q, dk)
        qkT = qkT_next
    tl.store(DK + hoff * D + offs_n[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty))
    tl.store(DV + hoff * D + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty))


@triton.jit
def dq_base(Q, K, V, DO, DQ, LSE, DELTA, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    Q += hoff * D
    K += hoff * D
    V += hoff * D
    DO += hoff * D
    LSE += hoff
    DELTA += hoff
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :])
    lse = tl.load(LSE + offs_m)
    delta = tl.load(DELTA + offs_m)
    dq = tl.zeros([BM, D], tl.float32)
    for start in range(0, n, BN):
        offs_n = start + tl.arange(0, BN)
        k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
        v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.math.exp2(qk - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    tl.store(DQ + hoff * D + offs_m[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty))


@triton.jit
def dq_swp2(Q, K, V, DO, DQ, LSE, DELTA, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n
    Q += hoff * D
    K += hoff * D
    V += hoff * D
    DO += hoff * D
    LSE += hoff
    DELTA += hoff
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    do = tl.load(DO + offs_m[:, None] * D + offs_d[None, :])
    lse = tl.load(LSE + offs_m)
    delta = tl.load(DELTA + offs_m)
    dq = tl.zeros([BM, D], tl.float32)
    offs_n = tl.arange(0, BN)
    k0 = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
    qk = tl.dot(q, tl.trans(k0))
    for start in range(0, n, BN):
        offs_n = start + tl.arange(0, BN)
        v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
        dp = tl.dot(do, tl.trans(v))
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        nxt = (start + BN) % n + tl.arange(0, BN)
        kn = tl.load(K + nxt[:, None] * D + offs_d[None, :])
        qk_next = tl.dot(q, tl.trans(kn))
        ds = p * (dp - delta[:, None])
        k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
        dq = tl.dot(ds.to(k.dtype), k, dq)
        qk = qk_next
    tl.store(DQ + hoff * D + offs_m[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty))


@triton.jit
def exp2_fma(x):
    """2^x on the FMA pipe (x <= 0): round to n + f, f in [-0.5, 0.5], a cubic for 2^f, n into the exponent."""
    x = tl.maximum(x, -126.0)
    j = x + 12582912.0  # 1.5 * 2^23: n = round(x) lands in j's low mantissa bits
    f = x - (j - 12582912.0)
    p = ((0.055171653628349304 * f + 0.2426111251115799) * f + 0.6932609677314758) * f + 0.9999280571937561
    bits = p.to(tl.int32, bitcast=True) + (j.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def exp2_mixed(x, FRAC: tl.constexpr):
    """FRAC 0: all MUFU; 2: every 2nd column on the FMA pipe; 4: every 4th."""
    if FRAC == 0:
        return tl.math.exp2(x)
    elif FRAC == 2:
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        return tl.reshape(tl.join(tl.math.exp2(a), exp2_fma(b)), (x.shape[0], x.shape[1]))
    elif FRAC == 4:
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        b1, b2 = tl.split(tl.reshape(b, (b.shape[0], b.shape[1] // 2, 2)))
        b = tl.reshape(tl.join(tl.math.exp2(b1), exp2_fma(b2)), (b.shape[0], b.shape[1]))
        return tl.reshape(tl.join(tl.math.exp2(a), b), (x.shape[0], x.shape[1]))
    else:
        return exp2_fma(x)


@triton.jit
def fwd(Q, K, V, OUT, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, FRAC: tl.constexpr):
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n * D
    Q += hoff
    K += hoff
    V += hoff
    OUT += hoff
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.zeros([BM], tl.float32) - float("inf")
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, n, BN):
        offs_n = start + tl.arange(0, BN)
        k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = exp2_mixed(qk - m_new[:, None], FRAC)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(OUT + offs_m[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty))


@triton.jit
def fwd2(Q, K, V, OUT, n, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    """MODE 0: scale then max then subtract (as ours); 1: the scale folded into the exp2's FMA; 2: 1 and the
    running output rescaled only when a row max grew by more than 8 (2^8), decided per tile."""
    pid = tl.program_id(0)
    hoff = tl.program_id(1).to(tl.int64) * n * D
    Q += hoff
    K += hoff
    V += hoff
    OUT += hoff
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.zeros([BM], tl.float32) - float("inf")
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, n, BN):
        offs_n = start + tl.arange(0, BN)
        k = tl.load(K + offs_n[:, None] * D + offs_d[None, :])
        if MODE == 0:
            qk = tl.dot(q, tl.trans(k)) * qk_scale
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_new
        elif MODE == 1:
            qk = tl.dot(q, tl.trans(k))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_new
        else:
            qk = tl.dot(q, tl.trans(k))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            if tl.max(m_new - m_i, 0) > 8.0:
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            p = tl.math.exp2(qk * qk_scale - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
        v = tl.load(V + offs_n[:, None] * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    acc = acc / l_i[:, None]
    tl.store(OUT + offs_m[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty))
