"""What a call's input agreement costs the process group's store, by number of ranks.

    .venv/bin/python benchmarks/agreement_cost.py [--ranks 8,16,32] [--calls 23] [--late-ms 0]

For each size n: n local ranks (``meshcast.launch``, gloo on loopback, 4 ranks per host) reshard a
2n-element float32 tensor from the first n/2 ranks (``S0``) to the others (``S0``), ``--calls``
times between barriers; with ``--late-ms`` the last rank starts each call that late (a straggler:
the others wait in the agreement and look around every 100 ms). Every rank's store requests are
counted (a proxy around the process group's store, installed in ``meshcast.runtime.board``) and so
are the bytes the store returned to it. Per call, after 3 warm-ups: all ranks' requests by kind and
bytes read, and the call's span (first rank in to last rank out; median and 90th percentile). The
byte count is exact and repeatable; the span is noisy (n processes share this machine's cores). A
measuring tool, not a test. To compare another version, put its ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

WARMUP = 3


def worker(rank: int, n: int, calls: int, late_s: float
           ) -> tuple[list[tuple[float, float]], list[dict]]:
    import torch
    import torch.distributed as dist

    import meshcast as mc
    import meshcast.runtime.board as board

    counts: collections.Counter[str] = collections.Counter()

    class Counting:
        """The store, each request counted with the bytes it returned."""

        def __init__(self, store: Any) -> None:
            self.store = store

        def __getattr__(self, name: str) -> Any:
            method = getattr(self.store, name)

            def counted(*args: Any, **kwargs: Any) -> Any:
                out = method(*args, **kwargs)
                counts["requests"] += 1
                counts[name] += 1
                if isinstance(out, (bytes, bytearray)):
                    counts["bytes read"] += len(out)
                return out

            return counted

    plain, wrapped = board.store_of, {}
    board.store_of = lambda group: wrapped.setdefault(id(plain(group)), Counting(plain(group)))
    half = n // 2
    task = mc.ReshardTask((2 * half,), "float32", mc.Layout(mc.Mesh.from_range(0, (half,)), "S0"),
                          mc.Layout(mc.Mesh.from_range(half, (half,)), "S0"))
    plan = mc.plan(task, mc.Topology.uniform(n // 4, 4))
    local = torch.ones(2) if rank < half else None
    spans, per_call = [], []
    for _ in range(calls):
        dist.barrier()
        before = dict(counts)
        t0 = time.monotonic()
        if rank == n - 1:
            time.sleep(late_s)
        mc.reshard(local, plan, timeout=60)
        spans.append((t0, time.monotonic()))
        per_call.append({k: v - before.get(k, 0) for k, v in counts.items()})
    return spans, per_call[WARMUP:]


def main() -> None:
    import meshcast as mc

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,16,32", help="sizes, multiples of 4 (default 8,16,32)")
    ap.add_argument("--calls", type=int, default=23, help="calls per size, 3 warm-ups first")
    ap.add_argument("--late-ms", type=float, default=0.0, help="the last rank comes this late")
    args = ap.parse_args()
    print(f"meshcast from {mc.__file__}")
    for n in (int(x) for x in args.ranks.split(",")):
        res = mc.launch(worker, n, hosts=mc.Topology.uniform(n // 4, 4),
                        args=(n, args.calls, args.late_ms / 1e3), timeout=600)
        spans = sorted(max(r[0][i][1] for r in res) - min(r[0][i][0] for r in res)
                       for i in range(WARMUP, args.calls))
        total: collections.Counter[str] = collections.Counter()
        for _, per_call in res:
            for c in per_call:
                total.update(c)
        k = args.calls - WARMUP
        kinds = ", ".join(f"{name} {v / k:.1f}" for name, v in sorted(total.items())
                          if name not in ("requests", "bytes read"))
        print(f"{n} ranks: span median {statistics.median(spans) * 1e3:.1f} ms, p90 "
              f"{spans[int(0.9 * len(spans))] * 1e3:.1f} ms; per call, all ranks: "
              f"{total['bytes read'] / k:,.0f} bytes read, {total['requests'] / k:.0f} requests "
              f"({kinds})")


if __name__ == "__main__":
    main()
