"""Copies between the GPUs of a shared run (:mod:`gpu.multidevice`): the large inputs go from the
host to one GPU and from it to the others by peer copies (NVLink on the H100 machines, hundreds
of GB/s), and the totals come back to the first GPU by peer copies and are added there, so the
host copies the inputs once and reads one set of totals.

Uploading the bedpostX field (2.4 GB for an HCP-sized subject) from the host to every GPU at once
made the host's copy threads and memory bandwidth the bottleneck: four GPUs took about four
times as long as one to start tracking. A broadcast takes one host upload plus a peer copy.

On CPU backends (the simulated GPUs of the tests) the same calls give the host arrays, summed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from .backend import Backend
from .transfer import to_device

#: Seconds a GPU waits for the first one's upload before copying from the host itself (a stuck
#: device must not hold up the others).
BROADCAST_WAIT_S = 120.0

_peers: set[tuple[int, int]] = set()
_peers_lock = threading.Lock()


def enable_peer_access(cupy, device: int, peer: int) -> bool:
    """Let ``device`` (current) read ``peer``'s memory directly where the hardware allows;
    whether it does. Without it a peer copy still works (the driver stages it)."""
    if device == peer:
        return True
    with _peers_lock:
        if (device, peer) in _peers:
            return True
        if not cupy.cuda.runtime.deviceCanAccessPeer(device, peer):
            return False
        try:
            cupy.cuda.runtime.deviceEnablePeerAccess(peer)
        except cupy.cuda.runtime.CUDARuntimeError as exc:  # already enabled: fine
            if "PeerAccessAlreadyEnabled" not in str(exc):
                raise
        _peers.add((device, peer))
        return True


def peer_copy(arrays: Sequence, source_device: int) -> tuple:
    """``arrays`` (CuPy, on ``source_device``, complete) copied onto the current device."""
    import cupy

    device = int(cupy.cuda.Device().id)
    if device == source_device:
        return tuple(arrays)
    enable_peer_access(cupy, device, source_device)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = []
    for a in arrays:
        if a is None:
            out.append(None)
            continue
        a = cupy.ascontiguousarray(a) if not a.flags.c_contiguous else a
        d = cupy.empty(a.shape, a.dtype)
        cupy.cuda.runtime.memcpyPeerAsync(d.data.ptr, device, a.data.ptr, source_device, a.nbytes, stream.ptr)
        out.append(d)
    stream.synchronize()
    return tuple(out)


class Broadcast:
    """Host arrays on every device that asks (:meth:`get`, from that device's thread): the first
    GPU to ask copies them from the host, the others wait and copy them from it. If that first
    upload fails (or takes longer than :data:`BROADCAST_WAIT_S`), the others copy from the host
    themselves. ``seconds``: per device label, the
    time :meth:`get` took and how (``host`` or ``peer``)."""

    def __init__(self, arrays: Sequence[np.ndarray]):
        self.host = tuple(arrays)
        self._lock = threading.Lock()
        self._claimed = False
        self._ready = threading.Event()
        self._source: tuple[int, tuple] | None = None

    def get(self, backend: Backend) -> tuple:
        if not backend.is_gpu:
            return tuple(np.ascontiguousarray(a) for a in self.host)
        with self._lock:
            first, self._claimed = not self._claimed, True
        if first:
            try:
                arrays = tuple(to_device(a) for a in self.host)
                backend.synchronize()
                self._source = (backend.device_id, arrays)
                return arrays
            finally:
                self._ready.set()
        if not self._ready.wait(BROADCAST_WAIT_S) or self._source is None:  # stuck or failed: from the host
            return tuple(to_device(a) for a in self.host)
        return peer_copy(self._source[1], self._source[0])

    def release(self) -> None:
        """Drop the reference to the first device's arrays (they stay while a share uses them)."""
        self._source = None


def reduce_to_first(backends: Sequence[Backend], totals: Sequence[Sequence]) -> tuple:
    """The element-wise sums of each share's totals (tuples of arrays of equal shapes, None
    entries skipped), on the first backend's device: the other GPUs' arrays come by peer copy
    and are added there. On CPU backends, NumPy sums."""
    first = backends[0]
    if not first.is_gpu:
        sums = [None if a is None else np.array(a, copy=True) for a in totals[0]]
        for part in totals[1:]:
            for k, a in enumerate(part):
                if a is not None:
                    sums[k] += a
        return tuple(sums)
    with first.activate():
        sums = list(totals[0])
        for backend, part in zip(backends[1:], totals[1:], strict=True):
            copied = peer_copy(part, backend.device_id)
            for k, a in enumerate(copied):
                if a is not None:
                    sums[k] += a
        first.synchronize()
        return tuple(sums)
