"""benchmarks/ab_short_dense.py's variants (the timing itself needs a GPU): each one reaches the rules the
dense Hopper kernels are dispatched by, below 1k queries only, and the imported rules come back after."""

from __future__ import annotations

import pytest

from benchmarks import ab_short_dense as ab
from kernels import _flash_dkdv_hopper, _flash_dq_hopper, _flash_fwd_hopper


def _answers(headdim: int, seqlen_q: int) -> tuple[bool, bool, bool]:
    """(forward, dq, dK/dV) take their Gluon kernel, as the dispatch reads the rules."""
    fwd_rule = _flash_fwd_hopper.usable.__kwdefaults__["rule"]
    return tuple(
        rule(headdim, seqlen_q, True)
        for rule in (fwd_rule, _flash_dq_hopper.faster_here, _flash_dkdv_hopper.faster_here)
    )


@pytest.mark.parametrize(
    "variant, d128_512, d64_512",
    [
        ("portable", (False, False, False), (False, False, False)),
        ("gluon_fwd", (True, False, False), (True, False, False)),
        ("gluon_all", (True, True, True), (True, False, True)),  # no Gluon dq at d64
    ],
)
def test_variants_change_the_rules_below_1k_only(variant, d128_512, d64_512):
    try:
        ab.set_variant(variant)
        assert _answers(128, 512) == d128_512
        assert _answers(64, 512) == d64_512
        assert _answers(128, 2048) == (True, True, True)  # from 1k the kernels' own rules
        assert _answers(96, 2048) == (False, False, False)  # no Gluon config at d96
    finally:
        ab.install_rules(ab.RULES)
    assert _flash_fwd_hopper.usable.__kwdefaults__["rule"] is ab.RULES["fwd"]
    assert _flash_dq_hopper.faster_here is ab.RULES["dq"]
    assert _flash_dkdv_hopper.faster_here is ab.RULES["dkdv"]
