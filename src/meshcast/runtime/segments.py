"""Shared-memory segments of the intra-host path (shm.py): anonymous (``memfd``) segments a
producer makes and its consumers map through ``/proc/<pid>/fd/<fd>``, and the two bounded caches
that keep them for reuse (``runtime.shm_segments``, ``runtime.shm_mappings``).

Nothing has a name in ``/dev/shm`` or on disk: the kernel frees a segment's memory when the last
process holding its fd or a mapping closes it or dies.
"""

from __future__ import annotations

import os
import secrets
import threading

import torch

from ..core.cache import BoundedCache

__all__ = [
    "HEADER",
    "INTRA_ENV",
    "KEEP_BYTES",
    "Segment",
    "give_back",
    "map_segment",
    "release_segments",
    "take_segment",
]

INTRA_ENV = "MESHCAST_INTRA"
"""Environment variable choosing the intra-host path of the ``"p2p"`` transport."""
KEEP_BYTES = 64 << 20
"""Bytes of free segments a process keeps for reuse, and of other processes' segments it keeps
mapped (each cache)."""
HEADER = 64
"""Bytes before a segment's data (its token)."""
_NAME = "meshcast-segment"


class Segment:
    """An anonymous shared segment: ``data`` (uint8) after a header holding ``token``."""

    def __init__(self, storage: torch.UntypedStorage, fd: int | None, size: int, token: int):
        self.fd, self.size, self.token = fd, size, token
        whole = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.data = whole[HEADER:]
        self._head = whole[:8].view(torch.int64)

    @classmethod
    def create(cls, nbytes: int) -> Segment:
        """A new segment of ``nbytes`` usable bytes, owned by this process until :meth:`close`."""
        fd = os.memfd_create(_NAME, os.MFD_CLOEXEC)
        try:
            size = HEADER + nbytes
            os.ftruncate(fd, size)
            storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=True,
                                                     nbytes=size)
        except BaseException:
            os.close(fd)
            raise
        seg = cls(storage, fd, size, secrets.randbits(62))
        seg._head[0] = seg.token
        return seg

    def handle(self, slots: int = 1) -> torch.Tensor:
        """What a consumer needs to :meth:`attach`: ``int64 [pid, fd, size, token, slots]``
        (``slots``: how many of the producer's slots this operation uses)."""
        return torch.tensor([os.getpid(), self.fd, self.size, self.token, slots],
                            dtype=torch.int64)

    @classmethod
    def attach(cls, handle: torch.Tensor) -> Segment:
        """Map the producer's segment; raises ``OSError`` saying why it is not reachable (another
        machine or PID namespace: use ``MESHCAST_INTRA=socket`` there)."""
        pid, fd, size, token = (int(x) for x in handle.tolist()[:4])
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
        except OSError as exc:
            raise OSError(f"the producer's segment {path} is not reachable ({exc}); ranks that "
                          f"do not share a machine need ${INTRA_ENV}=socket") from None
        if not target.startswith(f"/memfd:{_NAME}"):
            raise OSError(f"{path} is {target!r}, not the producer's segment; ranks that do not "
                          f"share a machine need ${INTRA_ENV}=socket")
        seg = cls(torch.UntypedStorage.from_file(path, shared=True, nbytes=size), None, size,
                  token)
        if int(seg._head[0]) != token:
            raise OSError(f"{path} holds another segment (token mismatch); ranks that do not "
                          f"share a machine need ${INTRA_ENV}=socket")
        return seg

    def close(self) -> None:
        """Close the fd (the mapping goes when the last view of ``data`` does)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.close()


# Segments are kept for reuse: a fresh one costs a page fault (and zeroing) per page on both
# sides, about as much as the copies themselves. Both caches are bounded by bytes, emptied by
# meshcast.clear_caches() and by release_segments() after a failed call.
_FREE: BoundedCache[int, Segment] = BoundedCache(
    "runtime.shm_segments", 64, "free shared-memory segments this process made, for reuse",
    weight=lambda seg: seg.size, max_weight=KEEP_BYTES)
_MAPPED: BoundedCache[tuple[int, int, int], Segment] = BoundedCache(
    "runtime.shm_mappings", 64, "other processes' segments this process has mapped",
    weight=lambda seg: seg.size, max_weight=KEEP_BYTES)
_free_lock = threading.Lock()


def take_segment(nbytes: int) -> Segment:
    """A free segment of at least ``nbytes`` usable bytes (a kept one, else a new one)."""
    with _free_lock:
        for seg in _FREE.values():
            if seg.size - HEADER >= nbytes and _FREE.pop(seg.token) is not None:
                return seg
    return Segment.create(nbytes)


def give_back(seg: Segment) -> None:
    """Keep ``seg`` for reuse (the cache drops, and so closes, the least recently used beyond
    its bound)."""
    with _free_lock:
        _FREE.put(seg.token, seg)


def map_segment(handle: torch.Tensor) -> Segment:
    """The producer's segment of ``handle``, mapped once per process and kept."""
    pid, fd, _, token = (int(x) for x in handle.tolist()[:4])
    key = (pid, fd, token)
    seg = _MAPPED.get(key)
    if seg is None:
        seg = _MAPPED.put(key, Segment.attach(handle))
    return seg


def release_segments() -> None:
    """Drop every kept segment and mapping (after a failed call: a dead producer's memory is
    freed as soon as no survivor maps it)."""
    with _free_lock:
        _FREE.clear()
    _MAPPED.clear()
