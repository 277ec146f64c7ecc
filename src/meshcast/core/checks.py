"""Argument checks shared by the public constructors: each error names the argument and the rule."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np


def as_index(value: Any, argument: str) -> int:
    """``value`` as a non-negative Python int, or a clear error naming ``argument``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argument} must be an integer, got {value!r}")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{argument} must be an integer, got {value!r}") from None
    if result < 0:
        raise ValueError(f"{argument} must be non-negative, got {result}")
    return result


def as_shape(shape: Any, argument: str = "shape") -> tuple[int, ...]:
    """A tensor shape as a tuple of non-negative ints."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (Sequence, np.ndarray)) or isinstance(shape, str):
        raise TypeError(f"{argument} must be a sequence of integers, got {shape!r}")
    return tuple(as_index(s, f"{argument}[{i}]") for i, s in enumerate(shape))
