"""Reusable parts of the benchmarks (``meshcast bench ...``).

- :mod:`meshcast.bench.resharding`: the resharding suites (1-to-m, the paper's n-to-m cases), the
  methods (meshcast's strategies x balances and two baselines users write today), the per-rank
  worker that times and checks every run, and the simulator / bandwidth-model side;
- :mod:`meshcast.bench.plots`: figures in the style of the paper's.

Nothing here imports torch at import time: the worker imports it when it runs.
"""

from __future__ import annotations
