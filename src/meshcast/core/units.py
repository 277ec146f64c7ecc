"""Units: link speeds are given in Gbit/s (as NICs are sold), the models compute in bytes/s."""

from __future__ import annotations

__all__ = ["GBIT"]

GBIT = 1e9 / 8
"""Bytes per second in one Gbit/s (10^9 bits, 8 bits a byte): ``gbps * GBIT`` is bytes/s."""
