"""Host-aware broadcast from point-to-point messages (gloo's own broadcast crosses a host link
once per receiver on that link's far side).

The route is :func:`meshcast.plan.broadcast_chain`: the sender feeds its local receivers and the
leader of the next receiving host; each leader receives chunk by chunk from the previous leader
and, as soon as a chunk is in, forwards it to the next leader and to its own host's receivers.
Chunks pipeline along the chain, so it runs at link speed and the data enters each host once.
A leader's relay runs in its own thread so that the rank's other operations are not held up.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import torch

from ..layout import Box, box_size
from ..plan import Broadcast
from .chunks import chunk_boxes, relative
from .p2p import Budget, Pending, Transport

__all__ = ["chain_role", "relay"]


def chain_role(
    chain: Sequence[tuple[int, Sequence[int]]], me: int
) -> tuple[str, int | None, list[int]]:
    """This rank's part in a broadcast chain: ``(role, feeder, targets)``.

    role is ``"sender"`` (feeds ``targets``), ``"leader"`` (receives from ``feeder``, forwards to
    ``targets``: next leader first, then its host's receivers) or ``"member"`` (receives from its
    host's leader ``feeder``).
    """
    for k, (leader, members) in enumerate(chain):
        nxt = [chain[k + 1][0]] if k + 1 < len(chain) else []
        if me == leader:
            role = "sender" if k == 0 else "leader"
            return role, (None if k == 0 else chain[k - 1][0]), [*nxt, *members]
        if me in members:
            return "member", leader, []
    raise ValueError(f"rank {me} is not in the broadcast chain {chain}")


def relay(
    transport: Transport,
    budget: Budget,
    out: torch.Tensor,
    out_box: Box,
    op: Broadcast,
    index: int,
    feeder: int,
    targets: list[int],
    chunk_bytes: int,
    window: int,
    errors: list[BaseException],
    failed: threading.Event,
    done: Pending,
) -> None:
    """Body of a leader's relay thread: receive ``op.box`` from ``feeder`` into ``out`` chunk by
    chunk and forward every chunk to ``targets``. At most ``window`` chunks are being received
    and ``window`` being forwarded; packed buffers (only where a chunk is not contiguous in
    ``out``) count against ``budget``.

    The relay never waits for memory while it has messages of its own in flight (only this thread
    completes them): when the budget is full it first finishes what it has in flight, then takes
    one chunk's buffer even over the limit. So it depends only on its feeder and its targets,
    which keeps small budgets deadlock-free (docs/runtime.md, "small budget")."""
    ranks = op.ranks()
    try:
        itemsize = out.element_size()
        chunks = chunk_boxes(op.box, itemsize, chunk_bytes)
        receiving: deque = deque()
        forwarding: deque = deque()

        def post(k: int) -> bool:
            """Post the receive of chunk ``k``; False (nothing posted) if its buffer does not
            fit the budget now while this relay has messages in flight."""
            view = out[relative(chunks[k], out_box)]
            extra = 0
            if view.is_contiguous():
                buf = view
            else:
                extra = box_size(chunks[k]) * itemsize
                if receiving or forwarding:
                    if not budget.try_acquire(extra):
                        return False
                else:
                    budget.acquire(extra, alone=True)
                buf = torch.empty(view.shape, dtype=view.dtype, device=view.device)
            work = transport.irecv(buf, feeder, index)
            receiving.append((k, view, buf, work, extra))
            return True

        def finish_forward() -> None:
            k, sends, extra = forwarding.popleft()
            for t, w in zip(targets, sends):
                what = f"op {index} (broadcast from {op.src}): forwarding chunk {k + 1} to {t}"
                transport.wait(w, what, ranks)
            budget.release(extra)

        nxt = 0
        while nxt < len(chunks) or receiving or forwarding:
            while nxt < len(chunks) and len(receiving) < window and post(nxt):
                nxt += 1
            if not receiving:  # the budget refused a chunk: free what this relay holds
                finish_forward()
                continue
            k, view, buf, work, extra = receiving.popleft()
            what = (
                f"op {index} (broadcast from {op.src}): chunk {k + 1}/{len(chunks)} from {feeder}"
            )
            transport.wait(work, what, ranks)
            if buf is not view:
                view.copy_(buf)
            forwarding.append((k, [transport.isend(buf, t, index) for t in targets], extra))
            while len(forwarding) > window or (forwarding and not receiving and nxt == len(chunks)):
                finish_forward()
    except BaseException as exc:
        errors.append(exc)
        failed.set()
        budget.wake()
    finally:
        done.done.set()
