"""``reshard``: run a plan on ``torch.distributed``, every rank doing only its own operations."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..layout import Box, box_shape, box_size
from ..plan import AllGather, Broadcast, Copy, Plan, Send, broadcast_chain
from .broadcast import chain_role, relay
from .chunks import boxes_overlap, chunk_boxes, relative
from .detect import real_host_map
from .errors import ReshardError
from .p2p import Budget, Pending, Reaper, Transport

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_TIMEOUT",
    "agree_inputs",
    "reshard",
]

DEFAULT_CHUNK_BYTES = 1 << 20
"""Message size of chunked transfers (measured, see docs/runtime.md)."""
DEFAULT_MAX_INFLIGHT_BYTES = 64 << 20
"""Pack/unpack buffer bytes a rank may have in flight."""
DEFAULT_TIMEOUT = 300.0
"""Seconds any single wait may take before the runtime raises."""
RELAY_WINDOW = 4
"""Chunks a broadcast leader keeps in flight on each side of its relay."""


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"the plan's dtype {name!r} has no torch equivalent")
    return dtype


def _check_local(
    local: object, plan: Plan, me: int, dtype: torch.dtype, device: torch.device
) -> str | None:
    """Why ``local`` does not fit the plan on plan rank ``me`` (None: it fits)."""
    box = plan.task.src_box(me)
    if box is None:
        if local is not None:
            return (
                f"local must be None on rank {me}: it is not in the source mesh "
                f"{plan.task.src.mesh.notation()} and holds nothing, got {type(local).__name__}"
            )
        return None
    if not isinstance(local, torch.Tensor):
        return (
            f"local must be a torch.Tensor on rank {me} (it holds part of the source layout "
            f"{plan.task.src.notation()}), got {type(local).__name__}"
        )
    want = box_shape(box)
    if tuple(local.shape) != want:
        return f"local has shape {tuple(local.shape)} on rank {me}; the plan gives it {want}"
    if local.dtype != dtype:
        return f"local has dtype {local.dtype} on rank {me}; the plan moves {dtype}"
    if local.device != device:
        return f"local is on device {local.device} on rank {me}; expected {device}"
    return None


def _pick_device(local: object, backend: str, device: object) -> torch.device:
    if device is not None:
        return torch.device(device)
    if isinstance(local, torch.Tensor):
        return local.device
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reshard(
    local: torch.Tensor | None,
    plan: Plan,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    device: torch.device | str | None = None,
    ordered: bool = True,
) -> torch.Tensor | None:
    """Run ``plan`` and return this rank's destination shard (None if it holds none).

    Call it on every rank of the default process group (or of ``group``) that the plan involves,
    with the same plan; plan ranks are ranks of ``group``. ``local`` is this rank's source shard
    (any strides; None where the rank holds nothing). Ranks outside the plan may call it too and
    get None at once. The plan's topology decides the broadcast routes.

    The plan is checked first (:meth:`meshcast.Plan.check`, once per plan object): one that does
    not deliver every destination element exactly once raises ``ValueError`` on every rank.
    Before any data moves, the plan's ranks agree that every ``local`` fits the plan (shape,
    dtype, device); if one does not, every rank raises ``ValueError`` naming the bad ranks.
    Any wait longer than ``timeout`` seconds, or a peer that dies, raises :class:`ReshardError`
    naming the ranks involved. ``chunk_bytes`` is the message size of chunked transfers;
    ``max_inflight_bytes`` bounds the pack/unpack buffers in flight on this rank. ``device`` is
    where the result goes on a rank without ``local`` (default: CPU, or the current CUDA device
    on NCCL). With ``ordered`` (the default) a rank runs its operations one after another in plan
    order, so an operation starts when all its ranks are free: the model of
    :func:`meshcast.simulate`, which the planner optimises for. ``ordered=False`` posts all of a
    rank's operations at once and lets them share the links (the plan's order is then only the
    posting order).
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    plan.check()  # once per plan object: every destination element delivered exactly once
    for argument, value in (
        ("timeout", timeout),
        ("chunk_bytes", chunk_bytes),
        ("max_inflight_bytes", max_inflight_bytes),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{argument} must be a positive number, got {value!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "meshcast.reshard needs torch.distributed: call init_process_group first "
            "(or run under meshcast.launch / torchrun)"
        )
    task = plan.task
    me = dist.get_rank(group)
    size = dist.get_world_size(group)
    ranks = plan.ranks
    if ranks[-1] >= size:
        raise ValueError(
            f"plan uses rank {ranks[-1]}, but the process group has {size} ranks (0..{size - 1})"
        )
    if me not in ranks:
        if local is not None:
            raise ValueError(f"local must be None on rank {me}: the plan does not involve it")
        return None

    def to_global(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    backend = str(dist.get_backend(group))
    dev = _pick_device(local, backend, device)
    dtype = _torch_dtype(task.dtype)
    error = _check_local(local, plan, me, dtype, dev)

    # Agree on validity before any data moves: every rank's error flag, gathered and shared.
    p2p_group = group if group is not None else dist.group.WORLD
    hosts = real_host_map(ranks, plan.topology._host_of, to_global)  # counters: real hosts
    transport = Transport(p2p_group, me, to_global, hosts, timeout)
    agree_inputs(transport, ranks, error, _fingerprint(plan), dev, "meshcast.reshard")

    dst_box = task.dst_box(me)
    out = None
    if dst_box is not None:
        out = torch.zeros(box_shape(dst_box), dtype=dtype, device=dev)
    if dev.type == "cuda":
        from .nccl import run_nccl

        run_nccl(
            plan, me, local, out, p2p_group, to_global, timeout, chunk_bytes, max_inflight_bytes
        )
    else:
        _Runner(plan, me, local, out, transport, chunk_bytes, max_inflight_bytes, ordered).run()
    return out


AGREE_TAG = 2**31 - 2
"""Message tag of the validity check (plan operations use their index as tag)."""


def _fingerprint(plan: Plan) -> int:
    """A 31-bit digest of the plan, equal on every rank that holds the same plan."""
    return int.from_bytes(hashlib.sha1(plan.to_json().encode()).digest()[:4], "little") >> 1


def agree_inputs(
    transport: Transport,
    ranks: list[int],
    error: str | None,
    digest: int,
    device: torch.device,
    caller: str,
) -> None:
    """Before any data moves, every plan rank learns whether all inputs fit and all ranks hold
    the same plans (``digest``); if not, every rank raises ``ValueError`` naming the ranks."""
    table = _agree(transport, ranks, error is not None, digest, device)
    if error is not None:
        raise ValueError(f"{caller} on rank {transport.me}: {error}")
    differ = [r for r, (_, d) in zip(ranks, table) if d != digest]
    if differ:
        raise ValueError(
            f"{caller}: ranks {differ} called with different plans than rank {transport.me} "
            f"(every rank must pass the same plans in the same order); nothing was sent"
        )
    bad = [r for r, (f, _) in zip(ranks, table) if f]
    if bad:
        raise ValueError(
            f"{caller}: ranks {bad} passed inputs that do not fit the plans (see their errors); "
            f"nothing was sent"
        )


def _agree(
    transport: Transport, ranks: list[int], bad: bool, digest: int, device: torch.device
) -> list[tuple[int, int]]:
    """Every plan rank's (error flag, plan digest), known to all of them: gathered by the first
    plan rank with point-to-point messages and sent back (no group creation, ranks outside the
    plan idle)."""
    me, root = transport.me, ranks[0]
    what = "the input check before any transfer"
    table = torch.zeros(len(ranks), 2, dtype=torch.int32, device=device)
    mine = torch.tensor([int(bad), digest], dtype=torch.int32, device=device)
    if me == root:
        table[0] = mine
        works = [
            (r, transport.irecv(table[k], r, AGREE_TAG)) for k, r in enumerate(ranks) if r != root
        ]
        for r, w in works:
            transport.wait(w, f"{what} (waiting for rank {r})", tuple(ranks))
        others = [r for r in ranks if r != root]
        sends = [transport.isend(table, r, AGREE_TAG, count=False) for r in others]
        for r, w in zip(others, sends):
            transport.wait(w, f"{what} (answering rank {r})", tuple(ranks))
    else:
        send = transport.isend(mine, root, AGREE_TAG, count=False)
        recv = transport.irecv(table, root, AGREE_TAG)
        transport.wait(send, f"{what} (rank {root} collects it)", tuple(ranks))
        transport.wait(recv, f"{what} (rank {root} collects it)", tuple(ranks))
    return [(int(a), int(b)) for a, b in table.tolist()]


class _Runner:
    """One rank's execution of a plan with tagged point-to-point messages (gloo)."""

    def __init__(
        self,
        plan: Plan,
        me: int,
        local: torch.Tensor | None,
        out: torch.Tensor | None,
        transport: Transport,
        chunk_bytes: int,
        max_inflight_bytes: int,
        ordered: bool = True,
    ) -> None:
        timeout = transport.timeout
        self.ordered = ordered
        self.op_items: list[Pending] = []  # what the current operation posted (ordered mode)
        self.plan = plan
        self.task = plan.task
        self.me = me
        self.local = local
        self.out = out
        self.src_box = plan.task.src_box(me)
        self.dst_box = plan.task.dst_box(me)
        self.itemsize = plan.task.itemsize
        self.chunk_bytes = int(chunk_bytes)
        self.timeout = timeout
        self.failed = threading.Event()
        self.transport = transport
        self.budget = Budget(int(max_inflight_bytes), self.failed, timeout)
        self.reaper = Reaper(self.transport, self.budget, self.failed)
        self.errors: list[BaseException] = []
        self.relays: list[threading.Thread] = []
        self.writes: list[Pending] = []  # pending writes into `out`, for AllGather dependencies

    # -- posting ----------------------------------------------------------------------------
    def _send(
        self,
        shard: torch.Tensor,
        shard_box: Box,
        box: Box,
        targets: list[int],
        index: int,
        what: str,
        ranks: tuple[int, ...],
    ) -> None:
        for chunk in chunk_boxes(box, self.itemsize, self.chunk_bytes):
            view = shard[relative(chunk, shard_box)]
            extra = 0
            if view.is_contiguous():
                buf = view
            else:
                extra = box_size(chunk) * self.itemsize
                self._acquire(extra)
                buf = view.contiguous()
            works = [self.transport.isend(buf, t, index) for t in targets]
            item = Pending(works, f"{what}: send to {targets}", ranks, extra)
            self.reaper.add(item)
            self.op_items.append(item)

    def _recv(self, box: Box, peer: int, index: int, what: str, ranks: tuple[int, ...]) -> None:
        assert self.out is not None and self.dst_box is not None
        for chunk in chunk_boxes(box, self.itemsize, self.chunk_bytes):
            view = self.out[relative(chunk, self.dst_box)]
            extra, finish = 0, None
            if view.is_contiguous():
                buf = view
            else:
                extra = box_size(chunk) * self.itemsize
                self._acquire(extra)
                buf = torch.empty(view.shape, dtype=view.dtype, device=view.device)
                finish = _copier(view, buf)
            work = self.transport.irecv(buf, peer, index)
            item = Pending([work], f"{what}: receive from {peer}", ranks, extra, finish, chunk)
            self.reaper.add(item)
            self.writes.append(item)
            self.op_items.append(item)

    def _acquire(self, nbytes: int) -> None:
        self.budget.acquire(nbytes)
        self._check()

    def _check(self) -> None:
        if self.failed.is_set():
            raise self._first_error()

    def _first_error(self) -> BaseException:
        errors = self.reaper.errors + self.errors
        return errors[0] if errors else ReshardError("meshcast.reshard: aborted")

    def _finish_op(self) -> None:
        """Ordered mode: wait until everything the current operation posted has completed."""
        for item in self.op_items:
            if not item.done.wait(self.timeout):
                raise ReshardError(
                    f"meshcast.reshard on rank {self.me}: {item.what} did not complete in "
                    f"{self.timeout:g} s (ranks involved: {list(item.ranks)})",
                    item.ranks,
                )
            self._check()
        self.op_items.clear()

    def _wait_writes(self, box: Box, what: str) -> None:
        """Wait for the pending writes into ``box`` of ``out`` (data this rank must pass on)."""
        for item in self.writes:
            if item.box is not None and boxes_overlap(item.box, box):
                if not item.done.wait(self.timeout):
                    raise ReshardError(
                        f"meshcast.reshard on rank {self.me}: {what} waited more than "
                        f"{self.timeout:g} s for {item.what} (ranks involved: {list(item.ranks)})",
                        item.ranks,
                    )
                self._check()

    # -- operations -------------------------------------------------------------------------
    def run(self) -> None:
        """Post every operation of this rank in plan order, then wait for all of them."""
        try:
            ops = self.plan.ops
            for i in self.plan.ops_of(self.me):
                self._check()
                op = ops[i]
                if isinstance(op, Copy):
                    assert self.out is not None and self.local is not None
                    self.out[relative(op.box, self.dst_box)].copy_(
                        self.local[relative(op.box, self.src_box)]
                    )
                elif isinstance(op, Send):
                    what = f"op {i} (send {op.src}->{op.dst})"
                    if op.src == self.me:
                        self._send(self.local, self.src_box, op.box, [op.dst], i, what, op.ranks())
                    if op.dst == self.me:
                        self._recv(op.box, op.src, i, what, op.ranks())
                elif isinstance(op, Broadcast):
                    self._broadcast(i, op)
                elif isinstance(op, AllGather):
                    self._allgather(i, op)
                else:
                    raise TypeError(f"plan has an operation of unknown type {type(op).__name__}")
                if self.ordered:
                    self._finish_op()
                else:
                    self.op_items.clear()
        finally:
            self.reaper.close(self.timeout * 2)
            for t in self.relays:
                t.join(self.timeout * 2)
        self._check()
        if any(t.is_alive() for t in self.relays):
            raise ReshardError(
                f"meshcast.reshard on rank {self.me}: a broadcast relay is still running after "
                f"{2 * self.timeout:g} s"
            )

    def _broadcast(self, i: int, op: Broadcast) -> None:
        chain = broadcast_chain(op, self.plan.topology._host_of)
        role, feeder, targets = chain_role(chain, self.me)
        what = f"op {i} (broadcast from {op.src})"
        if role == "sender":
            self._send(self.local, self.src_box, op.box, targets, i, what, op.ranks())
        elif role == "member":
            self._recv(op.box, feeder, i, what, op.ranks())
        else:
            done = Pending([], f"{what}: relay", op.ranks(), box=op.box)
            self.writes.append(done)
            self.op_items.append(done)
            thread = threading.Thread(
                target=relay,
                args=(
                    self.transport,
                    self.budget,
                    self.out,
                    self.dst_box,
                    op,
                    i,
                    feeder,
                    targets,
                    self.chunk_bytes,
                    RELAY_WINDOW,
                    self.errors,
                    self.failed,
                    done,
                ),
                name=f"meshcast-relay-{i}",
                daemon=True,
            )
            thread.start()
            self.relays.append(thread)

    def _allgather(self, i: int, op: AllGather) -> None:
        """Post this member's messages of an all-gather in the order every member agrees on:
        part by part in group order (receive the parts of the members before it, send its own,
        receive the parts after it), chunk by chunk. A common order is what keeps a small
        ``max_inflight_bytes`` deadlock-free (docs/runtime.md, "small budget"): were every member to
        post its own sends first, each could fill its budget with sends that wait for receives
        the others only post after their own sends."""
        assert self.out is not None
        what = f"op {i} (all-gather among {list(op.group)})"
        others = [r for r in op.group if r != self.me]
        for r, part in zip(op.group, op.parts):
            if r != self.me:
                self._recv(part, r, i, what, op.group)
                continue
            self._wait_writes(part, what)
            self._send(self.out, self.dst_box, part, others, i, what, op.group)


def _copier(view: torch.Tensor, buf: torch.Tensor) -> Callable[[], None]:
    def finish() -> None:
        view.copy_(buf)

    return finish
