"""Copies between the GPUs of a shared run (:mod:`gpu.multidevice`): the large inputs go from the
host to the GPUs once, in parts, and the GPUs exchange the parts by peer copies (NVLink on the
H100 machines, hundreds of GB/s); the totals come back and are added as each GPU finishes.

:class:`ShardedUpload` (the probabilistic split's field): share k of n copies part k of every
array from the host, through its own device's pinned staging buffers and host threads, while the
other shares copy theirs, so the n parts cross n PCIe links at once; then each takes the parts it
lacks from the shares that copied them. A GPU's copy of the field is complete after about 1/n of
the host upload plus the peer copies, instead of a whole host upload (or waiting for the first
GPU's). :class:`HostSums` adds each share's totals on the host as that share finishes, while the
others still compute, so only the last share's copy and addition remain after the tracking.

Uploading the bedpostX field (2.4 GB for an HCP-sized subject) from the host to every GPU at once
made the host's copy threads and memory bandwidth the bottleneck: four GPUs took about four
times as long as one to start tracking. A broadcast takes one host upload plus a peer copy.

On CPU backends (the simulated GPUs of the tests) the same calls give the host arrays, summed.
"""

from __future__ import annotations

import threading
import time
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


def part_bounds(nbytes: int, parts: int, align: int = 256) -> list[tuple[int, int]]:
    """``nbytes`` as ``parts`` contiguous byte ranges ``(start, stop)`` in order, the starts on
    multiples of ``align`` (some may be empty when there are few bytes); they cover every byte once."""
    if parts < 1:
        raise ValueError(f"at least one part is needed, got {parts}")
    cuts = [min(nbytes, (nbytes * k // parts) // align * align) for k in range(parts)] + [nbytes]
    return [(cuts[k], max(cuts[k], cuts[k + 1])) for k in range(parts)]


class ShardedUpload:
    """Host arrays onto the devices of ``parts`` shares, each share uploading one part.

    A share calls :meth:`allocate` (its empty device arrays) and then :meth:`fill` (from any
    thread, with its device current): it copies part ``index`` of every array from the host,
    says so, and copies every other part from the share that has it (a peer copy; from the host
    itself when that share failed, or did not say so within :data:`BROADCAST_WAIT_S`). A share
    that fails still says so (its part marked failed), so nobody waits for it. ``seconds``: per
    share, the stages of its fill (``upload``: its part from the host; ``gather_wait``: waiting
    for the others' parts; ``gather``: copying them).

    On CPU backends (simulated GPUs) the arrays are host copies, filled the same way, part by
    part, so the scheduling is tested without a GPU."""

    def __init__(self, arrays: Sequence[np.ndarray], parts: int):
        self.host = tuple(np.ascontiguousarray(a) for a in arrays)
        self.parts = max(1, int(parts))
        self.bounds = [part_bounds(a.nbytes, self.parts) for a in self.host]
        self._ready = [threading.Event() for _ in range(self.parts)]
        self._held: list[tuple[Backend, tuple] | None] = [None] * self.parts
        self.seconds: list[dict] = [{} for _ in range(self.parts)]

    def allocate(self, backend: Backend) -> tuple:
        """Empty arrays like the host's on ``backend``'s device (current)."""
        xp = backend.xp
        arrays = tuple(xp.empty(a.shape, a.dtype) for a in self.host)
        if backend.is_gpu:  # the copies run on other streams: the memory is this one's from here on
            xp.cuda.get_current_stream().synchronize()
        return arrays

    def fill(self, backend: Backend, index: int, arrays: tuple) -> None:
        """Fill ``arrays`` (from :meth:`allocate`) as share ``index``; returns once they are complete."""
        t0 = time.perf_counter()
        try:
            for a, host, bounds in zip(arrays, self.host, self.bounds, strict=True):
                start, stop = bounds[index]
                _from_host(backend, _bytes(a), _bytes(host), start, stop)  # returns once copied
            self._held[index] = (backend, arrays)
        finally:
            self._ready[index].set()  # failed or not: nobody waits for this part any longer
        t1 = time.perf_counter()
        waited = 0.0
        for k in (k for k in range(self.parts) if k != index):
            w0 = time.perf_counter()
            ready = self._ready[k].wait(BROADCAST_WAIT_S)
            waited += time.perf_counter() - w0
            held = self._held[k] if ready else None
            for j, (a, host, bounds) in enumerate(zip(arrays, self.host, self.bounds, strict=True)):
                start, stop = bounds[k]
                if held is not None:
                    try:
                        _from_peer(backend, _bytes(a), held[0], _bytes(held[1][j]), start, stop)
                        continue
                    except Exception:  # that device is lost: the host still has the bytes
                        held = None
                _from_host(backend, _bytes(a), _bytes(host), start, stop)
        if backend.is_gpu:
            _copy_stream(backend.xp).synchronize()
        t2 = time.perf_counter()
        self.seconds[index] = {"upload": round(t1 - t0, 4), "gather_wait": round(waited, 4),
                               "gather": round(t2 - t1 - waited, 4)}  # fmt: skip

    def give_up(self, index: int) -> None:
        """Share ``index`` will not fill (it failed before): the others take its part from the host."""
        self._ready[index].set()

    def release(self) -> None:
        """Drop the references to the shares' arrays (each stays while its share uses it)."""
        self._held = [None] * self.parts


def _bytes(a):
    return a.reshape(-1).view(np.uint8)


def _from_host(backend: Backend, destination, source: np.ndarray, start: int, stop: int) -> None:
    if stop <= start:
        return
    if not backend.is_gpu:
        destination[start:stop] = source[start:stop]
        return
    from .transfer import upload_bytes

    upload_bytes(destination[start:stop], source[start:stop])


def _from_peer(backend: Backend, destination, peer: Backend, source, start: int, stop: int) -> None:
    """Bytes ``start:stop`` of ``source`` (on ``peer``'s device, complete) into ``destination``
    (on ``backend``'s, current), queued on a stream of this thread's (see :meth:`ShardedUpload.fill`,
    which waits for the device at the end)."""
    if stop <= start:
        return
    if not backend.is_gpu:
        destination[start:stop] = source[start:stop]
        return
    cupy = backend.xp
    stream = _copy_stream(cupy)
    dst, src, n = destination.data.ptr + start, source.data.ptr + start, stop - start
    if peer.device_id == backend.device_id:  # two shares of one device
        cupy.cuda.runtime.memcpyAsync(dst, src, n, 3, stream.ptr)  # 3: device to device
    else:
        enable_peer_access(cupy, backend.device_id, peer.device_id)
        cupy.cuda.runtime.memcpyPeerAsync(dst, backend.device_id, src, peer.device_id, n, stream.ptr)


_streams = threading.local()


def _copy_stream(cupy):
    """A non-blocking stream of this thread for its current device (made once)."""
    device = int(cupy.cuda.Device().id)
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    if device not in streams:
        streams[device] = cupy.cuda.Stream(non_blocking=True)
    return streams[device]


class HostSums:
    """Totals of several shares added on the host as each share hands its own in (:meth:`add`,
    from that share's thread while the others still compute). The arrays keep their dtypes, so
    an unsigned total wraps as the device's would have: the sums are the single-device totals
    bit for bit. ``count`` adds up a number handed in with them (the streamlines)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.sums: list | None = None
        self.count = 0
        self.added = 0

    def add(self, arrays: Sequence, count: int = 0) -> None:
        arrays = [None if a is None else np.asarray(a) for a in arrays]
        with self._lock:
            if self.sums is None:
                self.sums = [None if a is None else a.copy() for a in arrays]
            else:
                if len(arrays) != len(self.sums):
                    raise ValueError("every share hands in the same totals")
                for k, a in enumerate(arrays):
                    if a is None:
                        continue
                    if self.sums[k] is None:
                        self.sums[k] = a.copy()
                    else:
                        np.add(self.sums[k], a, out=self.sums[k], casting="no")
            self.count += int(count)
            self.added += 1


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
