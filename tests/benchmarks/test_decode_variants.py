"""The decode A/Bs' variants name settings `kernels.decode` has: a variant left naming a setting that a later
change removed fails here, on the CPU, rather than at its first timed call on a GPU."""

from __future__ import annotations

import pytest

from benchmarks import ab_decode_launch, bench_generate
from kernels import decode


@pytest.mark.parametrize(
    "name,settings", [*ab_decode_launch.VARIANTS.items(), *bench_generate.DECODE_AB.items()]
)
def test_variant_settings_exist_and_change_something(name, settings):
    for setting, value in settings.items():
        assert hasattr(decode, setting), (name, setting)
        if decode.INTERPRET and setting == "DECODE_PDL":
            continue  # (off under the interpreter, which runs no inline PTX; on by default on a GPU)
        assert getattr(decode, setting) != value, (name, setting)  # (else the variant times the default)
    assert bool(settings) == (name != "pdl")  # `pdl` is the defaults themselves
