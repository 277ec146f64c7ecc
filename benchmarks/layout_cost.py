"""What a shard of several boxes costs: plan time, and bytes the runtime packs.

    .venv/bin/python benchmarks/layout_cost.py [--ks 1,2,4,8] [--repeat 3] [--cases small,large]
                                               [--no-runtime] [--no-patterns]

(a) Plan time, and the time of the plan's first check. The same task with each source rank
holding k boxes: ``S01[k]R`` (mesh axis 0 halves dimension 0, then axis 1 splits each half into k
pieces, each chunked over the axis: k runs per rank; ``S01[1]R`` is the one-box ``S01R``) to
``RS01`` on a disjoint mesh of the same shape: k times the unit slices of k = 1. For
``balance="auto"`` (the default) and ``strategy="broadcast", balance="none"`` it prints the best
of --repeat times (CPU seconds; a fresh task each time, so nothing is cached) and the ratio to
k = 1: "at most about k" is the aim.

(b) Packing. One 8-rank gloo job (``meshcast.launch``) runs each k's plan with ``reshard`` (p2p
transport) and with ``reshard_many``, and counts per rank the bytes packed into (or unpacked
from) staging buffers, by wrapping the runtime's staging points (benchmark instrumentation):
for ``reshard`` the runner's ``send_buffer`` / ``recv_buffer`` (their packed-bytes results), for
``reshard_many`` the staging buffers of the messages it posts (a message of several segments is
staged whole, on both sides; one contiguous segment travels zero-copy). Beside them: the bytes
of the operations' boxes that are not contiguous in the rank's local tensor (numpy views of the
same shapes). ``reshard`` packing exactly those bytes, and ``reshard_many`` staging each of them
once, means each non-contiguous part is packed at most once.

(c) Other patterns: ``balance="auto"`` plan time (best of --repeat, CPU) of a 4096x1024 float32
tensor from a source of k boxes per rank to a one-box destination, on the default topology of
the two meshes (hosts of 4 ranks, one 10 Gbit/s NIC each), its ratio to k = 1 and its sim/bound;
then two fused QKV tensors. A timing and counting tool, not a test.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import meshcast as mc

CASES = {
    "small": ("2x4", "2x4@8", (4096, 1024)),
    "large": ("8x8", "8x8@64", (8192, 8192)),
}
PLANNERS = {
    "auto": {},
    "broadcast/none": {"strategy": "broadcast", "balance": "none"},
}


def task_for(src_mesh: str, dst_mesh: str, shape: tuple[int, ...], k: int,
             dtype: str = "float32") -> mc.ReshardTask:
    """The benchmark task with ``k`` boxes per source rank."""
    spec = "S01R" if k == 1 else f"S01[{k}]R"
    return mc.ReshardTask(shape, dtype, mc.Layout.parse(f"{src_mesh}:{spec}"),
                          mc.Layout.parse(f"{dst_mesh}:RS01"))


def plan_seconds(case: tuple, k: int, kwargs: dict, repeat: int) -> tuple[float, float, float]:
    """Best of ``repeat`` plan times and first-check times (:meth:`Plan.check`, which every
    runtime call runs once per plan) of a fresh task of ``case`` (source mesh, destination mesh,
    shape) with ``k`` boxes, CPU seconds of this process (the machine may be loaded); and the
    plan's simulated time over the lower bound."""
    best_plan = best_check = math.inf
    quality = math.nan
    for _ in range(repeat):
        task = task_for(*case, k)
        topology = mc.Topology.from_meshes(task.src.mesh, task.dst.mesh)
        t0 = time.process_time()
        plan = mc.plan(task, topology, **kwargs, cache=False)
        t1 = time.process_time()
        plan.check()
        t2 = time.process_time()
        best_plan, best_check = min(best_plan, t1 - t0), min(best_check, t2 - t1)
        quality = mc.simulate(plan).time_s / mc.lower_bound(task, topology)
    return best_plan, best_check, quality


def plan_table(cases: list[str], ks: list[int], repeat: int) -> None:
    print("(a) plan and plan-check time (CPU seconds), best of", repeat)
    print(f"{'case':<24} {'planner':<15} {'k':>2} {'slices':>7} {'plan s':>9} {'x k=1':>6} "
          f"{'check s':>8} {'x k=1':>6} {'sim/bound':>9}")
    for name in cases:
        src, dst, shape = CASES[name]
        for planner, kwargs in PLANNERS.items():
            base = None
            for k in ks:
                seconds = plan_seconds((src, dst, shape), k, kwargs, repeat)
                base = seconds if base is None else base
                slices = len(task_for(src, dst, shape, k).decomposition)
                label = f"{src} -> {dst} {shape[0]}x{shape[1]}"
                print(f"{label:<24} {planner:<15} {k:>2} {slices:>7} {seconds[0]:>9.4f} "
                      f"{seconds[0] / base[0]:>6.2f} {seconds[1]:>8.4f} "
                      f"{seconds[1] / base[1]:>6.2f} {seconds[2]:>9.3f}", flush=True)


# -- (b) packing -----------------------------------------------------------------------------
def noncontiguous_bytes(plan: mc.Plan, rank: int) -> int:
    """Bytes of the boxes ``rank`` sends or receives (not copies) whose view of its local tensor
    is not contiguous."""
    from meshcast.core.plan import Send

    task = plan.task
    total = 0
    for side, region in (("src", task.src_region(rank)), ("dst", task.dst_region(rank))):
        if region is None:
            continue
        local = np.empty(region.shape, dtype=np.uint8)
        for op in plan.ops:
            if isinstance(op, Send) and rank == (op.src if side == "src" else op.dst):
                view = local[region.local(op.box)]
                if not view.flags.c_contiguous:
                    total += view.size * task.itemsize
    return total


def _count_packing(packed: dict) -> None:
    """Wrap the runtime's staging points to add up what they pack (benchmark instrumentation):
    the runner's ``send_buffer`` / ``recv_buffer`` (their packed-bytes results) and
    ``reshard_many``'s message posting (bytes of the messages staged to send and to receive,
    and of their segments those not contiguous in the tensor)."""
    import meshcast.runtime.many as many
    import meshcast.runtime.runner as runner

    send_buffer, recv_buffer = runner.Runner.send_buffer, runner.Runner.recv_buffer
    exchange = many._Exchange  # the private class: instrumentation only
    post = {side: getattr(exchange, f"_post_{side}") for side in ("send", "recv")}

    def counted_send(self, *args, **kwargs):
        buf, extra = send_buffer(self, *args, **kwargs)
        packed["reshard"] += extra
        return buf, extra

    def counted_recv(self, *args, **kwargs):
        out = recv_buffer(self, *args, **kwargs)
        packed["reshard"] += out[1]
        return out

    def counted_post(side: str):
        def posted(self, peer, segs, *args):
            out = post[side](self, peer, segs, *args)
            if out[2] is not None:  # a staging buffer
                packed[f"many_{side}"] += int(out[2].numel())
                packed["many_noncontiguous"] += sum(
                    sg.nbytes for sg in segs
                    if not self.view(sg, "src" if side == "send" else "dst").is_contiguous())
            return out
        return posted

    runner.Runner.send_buffer, runner.Runner.recv_buffer = counted_send, counted_recv
    for side in ("send", "recv"):
        setattr(exchange, f"_post_{side}", counted_post(side))


def pack_worker(rank: int, ks: list[int]) -> list[dict]:
    import torch

    keys = ("reshard", "many_send", "many_recv", "many_noncontiguous")
    packed = dict.fromkeys(keys, 0)
    _count_packing(packed)
    rows = []
    topology = mc.Topology.uniform(4, 2)
    for k in ks:
        task = task_for("2x2", "2x2@4", (64, 48), k)
        plan = mc.plan(task, topology, strategy="send_recv", balance="none")
        region = task.src_region(rank)
        x = torch.arange(math.prod(task.shape), dtype=torch.float32).reshape(task.shape)
        local = None
        if region is not None:
            local = x[np.ix_(*region.indices())] if region.box is None else x[region.box]
            local = local.contiguous()
        packed.update(dict.fromkeys(keys, 0))
        mc.reshard(local, plan, transport="p2p")
        mc.reshard_many([local], [plan])
        rows.append({"noncontiguous": noncontiguous_bytes(plan, rank), **packed})
    return rows


def pack_table(ks: list[int]) -> None:
    print("\n(b) bytes packed (all 8 ranks), 64x48 float32, 2x2:S01[k]R -> 2x2@4:RS01, send_recv")
    per_rank = mc.launch(pack_worker, 8, args=(ks,), hosts=mc.Topology.uniform(4, 2),
                         timeout=600)
    heads = ("k", "op boxes not contiguous", "reshard packed", "many packed (send)",
             "many staged (recv)", "many staged, not contiguous")
    print("  ".join(heads))
    for i, k in enumerate(ks):
        rows = [r[i] for r in per_rank]
        cells = [sum(r[key] for r in rows) for key in
                 ("noncontiguous", "reshard", "many_send", "many_recv", "many_noncontiguous")]
        print("  ".join(f"{v:>{len(h)}}" for v, h in zip([k, *cells], heads)))


# -- (c) other patterns: source spec with {k} -> destination ----------------------------------
PATTERNS = (
    ("2x4:S01{k}R", "2x4@8:S01R"),
    ("2x4:S01{k}R", "4@8:S0R"),
    ("2x4:S01{k}R", "2x4@8:S0R"),
    ("2x4:S01{k}R", "2x4@8:RS1"),
    ("4:S0{k}R", "2x4@4:S01R"),
    ("2x4:S01{k}R", "2x4@4:RS01"),
)
FUSED = (  # grouped-query attention's fused QKV, and the same tensor with every part S01
    ("2x4:{q=2048:S01+k=1024:S0+v=1024:S0}R", "2x4@8:RS01"),
    ("2x4:{q=2048:S01+k=1024:S01+v=1024:S01}R", "2x4@8:RS01"),
)


def auto_seconds(src: str, dst: str, repeat: int) -> tuple[float, float]:
    """Best of ``repeat`` CPU seconds of ``meshcast.plan(task, cache=False)`` (the default
    topology of the two meshes) for a 4096x1024 float32 tensor, and its sim/bound."""
    best, quality = math.inf, math.nan
    for _ in range(repeat):
        task = mc.ReshardTask((4096, 1024), "float32", mc.Layout.parse(src),
                              mc.Layout.parse(dst))
        t0 = time.process_time()
        plan = mc.plan(task, cache=False)
        best = min(best, time.process_time() - t0)
        quality = mc.simulate(plan).time_s / mc.lower_bound(task, plan.topology)
    return best, quality


def pattern_table(ks: list[int], repeat: int) -> None:
    print(f"\n(c) auto plan time (CPU ms, best of {repeat}) and sim/bound, 4096x1024 float32")
    print(f"{'source -> destination':<44} " + " ".join(f"{'k=' + str(k):>15}" for k in ks))
    for src, dst in PATTERNS:
        cells, base = [], None
        for k in ks:
            seconds, quality = auto_seconds(src.format(k="" if k == 1 else f"[{k}]"), dst, repeat)
            base = seconds if base is None else base
            cells.append(f"{seconds * 1e3:6.1f} {seconds / base:4.1f}x {quality:.3f}")
        print(f"{src.format(k='[k]') + ' -> ' + dst:<44} " + " ".join(f"{c:>15}" for c in cells),
              flush=True)
    for src, dst in FUSED:
        seconds, quality = auto_seconds(src, dst, repeat)
        print(f"{src} -> {dst}: {seconds * 1e3:.1f} ms, {quality:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="1,2,4,8", help="boxes per source rank (comma list)")
    parser.add_argument("--repeat", type=int, default=3, help="plan timings per figure (best)")
    parser.add_argument("--cases", default="small,large", help=f"of {', '.join(CASES)}")
    parser.add_argument("--no-runtime", action="store_true", help="skip (b), the gloo job")
    parser.add_argument("--no-patterns", action="store_true", help="skip (c)")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    plan_table(args.cases.split(","), ks, args.repeat)
    if not args.no_runtime:
        pack_table(ks)
    if not args.no_patterns:
        pattern_table(ks, args.repeat)


if __name__ == "__main__":
    main()
