"""Plans: plain data, an ordered list of operations (:mod:`meshcast.core.ops`, re-exported
here) that any backend can run, checked by :mod:`meshcast.core.plan_check` before it runs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .boxes import box_size
from .ops import (
    OP_KINDS,
    AllGather,
    Broadcast,
    Copy,
    Op,
    Send,
    Transfer,
    broadcast_chain,
    op_to_json,
    ops_from_json,
    transfers,
)
from .plan_check import plan_error
from .task import ReshardTask
from .topology import Topology
from .units import fmt_bytes

__all__ = [
    "AllGather",
    "Broadcast",
    "Copy",
    "Op",
    "Plan",
    "Send",
    "Transfer",
    "broadcast_chain",
    "check_plan",
    "transfers",
]


@dataclass(frozen=True)
class Plan:
    """A resharding plan: the task, the ordered operations, and how they were chosen.

    ``fallbacks`` records, for the ``"allgather"`` strategy, the unit slices (by index into
    ``task.unit_slices()``) sent point-to-point instead, and why.
    """

    task: ReshardTask
    ops: tuple[Op, ...]
    strategy: str
    balance: str
    topology: Topology
    fallbacks: tuple[tuple[int, str], ...] = ()
    _by_rank: dict[int, list[int]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _verdict: dict[str, str | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def check(self) -> None:
        """Raise ``ValueError`` naming the first missing or wrong region (rank, box, operation
        index) unless the plan delivers every destination element of every rank exactly once and
        every operation reads only data its sender holds or has received earlier
        (:mod:`meshcast.core.plan_check`). Checked once per plan object; the verdict is kept."""
        if "error" not in self._verdict:
            self._verdict["error"] = plan_error(self.task, self.topology, self.ops)
        error = self._verdict["error"]
        if error is not None:
            raise ValueError(f"plan check failed: {error}")

    # -- queries ----------------------------------------------------------------------------
    def ops_of(self, rank: int) -> list[int]:
        """Indices (in plan order) of the operations ``rank`` takes part in."""
        if not self._by_rank:
            index: dict[int, list[int]] = defaultdict(list)
            for i, op in enumerate(self.ops):
                for r in op.ranks():
                    index[r].append(i)
            self._by_rank.update(index)
            self._by_rank.setdefault(-1, [])  # marks the index as built
        return self._by_rank.get(rank, [])

    @property
    def ranks(self) -> list[int]:
        """Every rank of the source or destination mesh, sorted."""
        return sorted(set(self.task.src.mesh.devices) | set(self.task.dst.mesh.devices))

    def transfers(self) -> Iterator[Transfer]:
        """All rank-to-rank movements of the host-aware realisation, in plan order."""
        host_of = self.topology.hosts_by_rank
        for op in self.ops:
            yield from transfers(op, self.task.itemsize, host_of)

    def bytes_by_kind(self) -> dict[str, tuple[int, int]]:
        """``{kind: (number of ops, bytes of the boxes they move)}``."""
        out: dict[str, list[int]] = {k: [0, 0] for k in OP_KINDS}
        size = self.task.itemsize
        for op in self.ops:
            entry = out[op.kind]
            entry[0] += 1
            entry[1] += box_size(op.box) * size
        return {k: (v[0], v[1]) for k, v in out.items() if v[0]}

    def bytes_per_rank(self) -> dict[int, tuple[int, int]]:
        """``{rank: (bytes sent, bytes received)}`` over the network (local copies excluded)."""
        sent: dict[int, int] = defaultdict(int)
        received: dict[int, int] = defaultdict(int)
        for t in self.transfers():
            sent[t.src] += t.nbytes
            received[t.dst] += t.nbytes
        return {r: (sent[r], received[r]) for r in sorted(set(sent) | set(received))}

    def bytes_per_host(self) -> dict[int, tuple[int, int]]:
        """``{host: (bytes out, bytes in)}`` across host boundaries."""
        host_of = self.topology.hosts_by_rank
        out: dict[int, int] = defaultdict(int)
        inn: dict[int, int] = defaultdict(int)
        for t in self.transfers():
            a, b = host_of[t.src], host_of[t.dst]
            if a != b:
                out[a] += t.nbytes
                inn[b] += t.nbytes
        return {h: (out[h], inn[h]) for h in range(self.topology.num_hosts)}

    def cross_host_bytes(self) -> int:
        """Total bytes crossing host boundaries."""
        return sum(o for o, _ in self.bytes_per_host().values())

    def summary(self, max_rows: int = 32) -> str:
        """A printable report: bytes per operation kind, per rank and per host."""
        lines = [
            f"plan: {self.task.describe()}",
            f"strategy={self.strategy} balance={self.balance} ops={len(self.ops)} "
            f"tensor={fmt_bytes(self.task.nbytes)} topology={self.topology.num_hosts} hosts"
            + (f" ({self.topology.name})" if self.topology.name else ""),
            "",
            f"{'operation':<10} {'count':>8} {'bytes':>12}",
        ]
        for kind, (count, nbytes) in self.bytes_by_kind().items():
            lines.append(f"{kind:<10} {count:>8} {fmt_bytes(nbytes):>12}")
        if self.fallbacks:
            reasons: dict[str, int] = defaultdict(int)
            for _, why in self.fallbacks:
                reasons[why] += 1
            lines += ["", "point-to-point fallbacks:"]
            lines += [f"  {n} x {why}" for why, n in sorted(reasons.items())]
        per_rank = self.bytes_per_rank()
        lines += ["", f"{'rank':>6} {'host':>5} {'sent':>12} {'received':>12}"]
        for i, (r, (s, v)) in enumerate(per_rank.items()):
            if i == max_rows:
                lines.append(f"   ... {len(per_rank) - max_rows} more ranks")
                break
            lines.append(
                f"{r:>6} {self.topology.host_of(r):>5} {fmt_bytes(s):>12} {fmt_bytes(v):>12}"
            )
        lines += ["", f"{'host':>5} {'out':>12} {'in':>12}"]
        for h, (o, v) in self.bytes_per_host().items():
            if h == max_rows:
                lines.append(f"  ... {self.topology.num_hosts - max_rows} more hosts")
                break
            lines.append(f"{h:>5} {fmt_bytes(o):>12} {fmt_bytes(v):>12}")
        lines.append(f"across hosts: {fmt_bytes(self.cross_host_bytes())}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # -- serialisation ----------------------------------------------------------------------
    def to_json(self, indent: int | None = None) -> str:
        """The plan as a JSON string; :meth:`from_json` restores an equal plan."""
        return json.dumps(
            {
                "format": "meshcast.plan/1",
                "task": self.task.to_json(),
                "strategy": self.strategy,
                "balance": self.balance,
                "topology": self.topology.to_json(),
                "fallbacks": [list(f) for f in self.fallbacks],
                "ops": [op_to_json(op) for op in self.ops],
            },
            indent=indent,
        )

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_json` (accepts the string or the parsed dict). The plan is
        checked (:meth:`check`): one that does not deliver its destination layout exactly raises
        ``ValueError`` naming the first missing or wrong region."""
        if not isinstance(text, (str, bytes, bytearray, dict)):
            raise TypeError(f"Plan.from_json takes a JSON string or its parsed dict, got "
                            f"{type(text).__name__}")
        try:
            data = text if isinstance(text, dict) else json.loads(text)
        except ValueError as exc:  # (json's error says where, not what)
            raise ValueError(f"not a meshcast plan: the text is not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != "meshcast.plan/1":
            raise ValueError("not a meshcast plan: no \"format\": \"meshcast.plan/1\" field")
        try:
            for name in ("strategy", "balance"):
                if not isinstance(data[name], str):
                    raise TypeError(f"{name} must be a string, got {data[name]!r}")
            plan = cls(
                task=ReshardTask.from_json(data["task"]),
                ops=ops_from_json(data["ops"]),
                strategy=data["strategy"],
                balance=data["balance"],
                topology=Topology.from_json(data["topology"]),
                fallbacks=tuple((int(i), str(why)) for i, why in data["fallbacks"]),
            )
            slices = len(plan.task.decomposition)
            bad = [i for i, _ in plan.fallbacks if not 0 <= i < slices]
            if bad:
                raise IndexError(f"fallbacks name unit slice {bad[0]}, but the task has "
                                 f"{slices}")
        except KeyError as exc:
            raise ValueError(f"not a complete meshcast plan: the field {exc} is missing") from None
        except (TypeError, AttributeError, IndexError, ValueError) as exc:
            raise ValueError(f"not a valid meshcast plan: {exc}") from None
        plan.check()
        return plan


def check_plan(plan: Plan) -> None:
    """Raise ``ValueError`` naming the first missing or wrong region (rank, box, operation index)
    if ``plan`` does not deliver its destination layout exactly (:mod:`meshcast.core.plan_check`).
    The verdict is kept on the plan, so a plan is checked once however often it runs."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a meshcast.Plan, got {type(plan).__name__}")
    plan.check()
