"""Element types, named the way torch names them, usable without importing torch."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["DTypeLike", "dtype_name", "itemsize", "numpy_dtype"]

DTypeLike = Any  # a name ("float32"), a numpy dtype, or a torch dtype

# The element types meshcast knows, by torch's name. numpy has no bfloat16 or float8: ml_dtypes
# (the package JAX uses for the same purpose) provides them as numpy dtypes.
_NUMPY: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in {
        "bool": np.bool_,
        "uint8": np.uint8,
        "int8": np.int8,
        "int16": np.int16,
        "uint16": np.uint16,
        "int32": np.int32,
        "uint32": np.uint32,
        "int64": np.int64,
        "uint64": np.uint64,
        "float16": np.float16,
        "float32": np.float32,
        "float64": np.float64,
        "complex64": np.complex64,
        "complex128": np.complex128,
        "bfloat16": ml_dtypes.bfloat16,
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
    }.items()
}
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "bool_": "bool",
    "cfloat": "complex64",
}


def dtype_name(dtype: DTypeLike, *, argument: str = "dtype") -> str:
    """Return the canonical (torch-style) name of ``dtype``.

    Accepts a name such as ``"float32"`` or ``"bfloat16"``, a numpy dtype or scalar type, or a
    torch dtype (recognised by its repr, so torch need not be imported).
    """
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif type(dtype).__module__ == "torch":  # torch.dtype: repr is "torch.float32"
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(
                f"{argument} must be a dtype name, a numpy dtype or a torch dtype, got {dtype!r}"
            ) from None
    name = _ALIASES.get(name, name)
    if name not in _NUMPY:
        raise ValueError(
            f"{argument}={dtype!r} is not a supported element type; supported: "
            f"{', '.join(sorted(_NUMPY))}"
        )
    return name


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a canonical dtype name (bfloat16 and float8 via ml_dtypes)."""
    return _NUMPY[dtype_name(name)]


def itemsize(name: str) -> int:
    """Bytes per element of a canonical dtype name."""
    return numpy_dtype(name).itemsize
