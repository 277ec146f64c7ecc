"""Units: link speeds are given in Gbit/s (as NICs are sold), the models compute in bytes/s."""

from __future__ import annotations

__all__ = ["GBIT", "fmt_bytes"]

GBIT = 1e9 / 8
"""Bytes per second in one Gbit/s (10^9 bits, 8 bits a byte): ``gbps * GBIT`` is bytes/s."""


def fmt_bytes(n: float) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"1.50 KiB"``, ... ``"2.00 EiB"`` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
