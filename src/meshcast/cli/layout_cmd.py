"""``meshcast layout``: draw which rank holds which indices of one dimension of a layout."""

from __future__ import annotations

import argparse

from ..core.picture import layout_picture
from .common import UsageError, integer, layout_arg, shape_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``meshcast layout``."""
    parser.add_argument("layout", type=layout_arg, help="e.g. 4:S0[2]R or '2x2:{q=8:S01+k=4:S0}R'")
    parser.add_argument("--shape", type=shape_arg, required=True, help="e.g. 13,4")
    parser.add_argument("--dim", type=integer(0), default=0, help="the dimension drawn (default 0)")


def run(args: argparse.Namespace) -> int:
    """Print the picture."""
    try:
        args.layout.check_shape(args.shape, "--shape")
        print(layout_picture(args.layout, args.shape, args.dim))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 0
