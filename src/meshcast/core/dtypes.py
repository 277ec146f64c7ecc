"""Element types, named the way torch names them, usable without importing torch.

Every torch dtype that has an element size is known by its torch name (``"float32"``,
``"complex32"``, ``"float8_e8m0fnu"``, ``"uint4"``, ...), with its size in bytes. Where numpy can
hold the same values (numpy itself, or ml_dtypes, the package JAX uses for bfloat16 and the
float8 types), :func:`numpy_dtype` gives that numpy dtype; :func:`meshcast.execute_local` needs
it. The runtime moves every type alike, as bytes. Quantized dtypes (``qint8``, ...) are refused:
their scale and zero point live outside the data.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np

__all__ = ["DTypeLike", "dtype_name", "itemsize", "known_dtypes", "numpy_dtype"]

DTypeLike = Any  # a name ("float32"), a numpy dtype, or a torch dtype

_ML_DTYPES = "ml_dtypes"
"""Marks a type whose numpy equivalent is ml_dtypes' type of the same name. ml_dtypes is imported
only when such a numpy dtype is needed: its import takes most of a second (0.8 s on the 2-core
machine, against 0.05 s for the rest of ``import meshcast``), and planning needs only sizes."""

# torch name -> (bytes per element, its numpy type, _ML_DTYPES or None: none)
_TYPES: dict[str, tuple[int, Any]] = {
    "bool": (1, np.bool_),
    "uint8": (1, np.uint8),
    "int8": (1, np.int8),
    "uint16": (2, np.uint16),
    "int16": (2, np.int16),
    "uint32": (4, np.uint32),
    "int32": (4, np.int32),
    "uint64": (8, np.uint64),
    "int64": (8, np.int64),
    "float16": (2, np.float16),
    "float32": (4, np.float32),
    "float64": (8, np.float64),
    "bfloat16": (2, _ML_DTYPES),
    "complex32": (4, _ML_DTYPES),  # two float16, as torch's chalf
    "complex64": (8, np.complex64),
    "complex128": (16, np.complex128),
    "float8_e4m3fn": (1, _ML_DTYPES),
    "float8_e4m3fnuz": (1, _ML_DTYPES),
    "float8_e5m2": (1, _ML_DTYPES),
    "float8_e5m2fnuz": (1, _ML_DTYPES),
    "float8_e8m0fnu": (1, _ML_DTYPES),
    # no numpy equivalent with the same bytes: packed fp4 pairs, raw bit types, and torch's
    # sub-byte integers (one element per byte, but torch has no copy for them)
    "float4_e2m1fn_x2": (1, None),
    "bits1x8": (1, None),
    "bits2x4": (1, None),
    "bits4x2": (1, None),
    "bits8": (1, None),
    "bits16": (2, None),
    **{f"{sign}int{n}": (1, None) for sign in ("", "u") for n in range(1, 8)},
}
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "bool_": "bool",
    "bit": "uint1",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
}
_QUANTIZED = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")


def known_dtypes() -> list[str]:
    """Every dtype name meshcast accepts (torch's names), sorted."""
    return sorted(_TYPES)


def dtype_name(dtype: DTypeLike, *, argument: str = "dtype") -> str:
    """Return the canonical (torch-style) name of ``dtype``.

    Accepts a name such as ``"float32"`` or ``"bfloat16"`` (torch's names and aliases:
    ``"float"`` is float32, ``"int"`` int32, as ``torch.float`` and ``torch.int``), a numpy type
    code such as ``"<f4"`` or ``"i8"``, a numpy dtype or scalar type, or a torch dtype
    (recognised by its repr, so torch need not be imported).
    """
    if dtype is None:  # numpy would read it as float64
        raise TypeError(f"{argument} must be a dtype name, a numpy dtype or a torch dtype, got "
                        f"None")
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif type(dtype).__module__ == "torch":  # torch.dtype: repr is "torch.float32"
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = _numpy_name(np.dtype(dtype), argument)
        except TypeError:
            raise TypeError(
                f"{argument} must be a dtype name, a numpy dtype or a torch dtype, got {dtype!r}"
            ) from None
    name = _ALIASES.get(name, name)
    if isinstance(dtype, str) and name not in _TYPES and name not in _QUANTIZED:
        with contextlib.suppress(TypeError):  # a numpy type code: "<f4", "i8"
            name = _numpy_name(np.dtype(name), argument)
    if name in _QUANTIZED:
        raise ValueError(
            f"{argument}={dtype!r} is a quantized type: its scale and zero point are not part of "
            f"the data meshcast moves; reshard t.int_repr() and quantize the result again"
        )
    if name not in _TYPES:
        raise ValueError(
            f"{argument}={dtype!r} is not a supported element type; supported: "
            f"{', '.join(known_dtypes())}"
        )
    return name


def _numpy_name(dtype: np.dtype, argument: str) -> str:
    """The name of numpy ``dtype``; ``ValueError`` for a byte order other than this machine's
    (the runtime moves tensors' bytes as they are)."""
    if not dtype.isnative:
        raise ValueError(f"{argument}={dtype.str!r} has a byte order other than this machine's: "
                         f"convert it to {dtype.newbyteorder('=').name} first")
    return dtype.name


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a dtype name (bfloat16, complex32 and float8 via ml_dtypes); a
    ``ValueError`` for the types numpy cannot hold (packed fp4, bit and sub-byte types)."""
    canonical = dtype_name(name)
    if _TYPES[canonical][1] is None:
        raise ValueError(
            f"dtype {canonical!r} has no numpy equivalent (numpy and ml_dtypes cannot hold its "
            f"bytes as the same values), so it cannot be used with numpy arrays "
            f"(meshcast.execute_local, scatter); meshcast.reshard moves it as bytes"
        )
    return _numpy_dtype(canonical)


@functools.cache
def _numpy_dtype(canonical: str) -> np.dtype:
    kind = _TYPES[canonical][1]
    if kind == _ML_DTYPES:
        import ml_dtypes  # slow to import (_ML_DTYPES): only where it is needed

        return np.dtype(getattr(ml_dtypes, canonical))
    return np.dtype(kind)


def itemsize(name: str) -> int:
    """Bytes per element of a dtype name."""
    return _TYPES[dtype_name(name)][0]
