"""Meeting users where they are (GitHub issue 7): DTensor across meshes, many tensors at once.

- :mod:`.plans` (numpy only): joint planning of many tensors, the plan cache, bucketed schedules;
- :mod:`.many` (torch): :func:`reshard_many` runs many plans in bounded buckets of packed messages;
- :mod:`.dtensor` (torch): ``Layout.from_dtensor`` and :func:`reshard_dtensor`;
- :mod:`.state_dict` (torch): :func:`reshard_state_dict`, a whole model in one call.

Names are loaded on first use, so ``meshcast.interop.plans`` stays free of torch.
"""

from __future__ import annotations

import importlib

# public name -> submodule
EXPORTS: dict[str, str] = {
    "DEFAULT_BUCKET_BYTES": "plans",
    "build_schedule": "plans",
    "clear_plan_cache": "plans",
    "plan_cache_info": "plans",
    "plan_many": "plans",
    "ManyStats": "many",
    "last_many_stats": "many",
    "reshard_many": "many",
    "layout_from_dtensor": "dtensor",
    "reshard_dtensor": "dtensor",
    "reshard_state_dict": "state_dict",
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    """Lazy exports (``meshcast.interop.reshard_many``, ...)."""
    if name in EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
