"""The generators' argument checks: counts, seeds and indices are ints (numpy's too), never bools."""

from __future__ import annotations

import numbers


def check_int(name: str, value, minimum: int = 0) -> None:
    """A ValueError unless value is an int >= minimum (a bool is refused: True would read as 1)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
