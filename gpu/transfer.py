"""Large device ↔ host copies through pinned staging buffers.

A plain ``cupy.asnumpy`` of a large array copies into pageable host memory, which the driver
stages through a small pinned buffer of its own, one piece after the other: about 3 GB/s
measured on the H100 machine for a whole-brain batch of streamline points (1.75 GB in 0.6 s).
:func:`to_host` pipelines the copy instead: the device copies piece ``i + 1`` into one of two
pinned buffers (:data:`STAGE_BYTES` each, made once per device) while host threads copy piece
``i`` out of the other into the result. The result is an ordinary NumPy array with the same
bytes as ``cupy.asnumpy`` gives; small arrays take ``asnumpy`` itself.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: Bytes of each of the two pinned staging buffers of a device.
STAGE_BYTES = 32 << 20
#: Arrays smaller than this are copied by ``cupy.asnumpy`` (nothing to pipeline).
STAGED_MIN_BYTES = 64 << 20
#: Host threads copying each staged piece into the result (NumPy's copies release the GIL).
COPY_THREADS = 4

_stages: dict[int, tuple] = {}  # device id -> (lock, stream, (buffer, buffer), host copy threads)
_stages_lock = threading.Lock()


def _staging(cupy, device_id: int):
    """The device's staging set: a lock, a copy stream, two pinned buffers and its own host copy
    threads (several devices copying at once each keep their threads: a shared pool would make
    the host's copies the bottleneck of a multi-GPU upload)."""
    with _stages_lock:
        if device_id not in _stages:
            with cupy.cuda.Device(device_id):
                buffers = tuple(
                    np.frombuffer(cupy.cuda.alloc_pinned_memory(STAGE_BYTES), np.uint8, STAGE_BYTES) for _ in range(2)
                )
                pool = ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix=f"tractlens-copy{device_id}")
                _stages[device_id] = (threading.Lock(), cupy.cuda.Stream(non_blocking=True), buffers, pool)
        return _stages[device_id]


def prepare_staging(device_id: int) -> None:
    """Make ``device_id``'s pinned staging buffers and copy threads now (pinning 64 MB of host
    memory is not free), e.g. while a command still reads its files."""
    import cupy

    _staging(cupy, int(device_id))


def _copy(destination: np.ndarray, source: np.ndarray, pool: ThreadPoolExecutor) -> None:
    """``destination[:] = source`` (1-D bytes) in :data:`COPY_THREADS` parts at once."""
    n = source.size
    if n < (4 << 20):
        destination[:] = source
        return
    bounds = np.linspace(0, n, COPY_THREADS + 1).astype(np.int64)
    parts = [pool.submit(np.copyto, destination[a:b], source[a:b]) for a, b in itertools.pairwise(bounds)]
    for part in parts:
        part.result()


def to_host(array) -> np.ndarray:
    """``array`` (NumPy or CuPy) as a NumPy array: large device arrays through the pinned staging
    buffers, pipelined; anything else as ``cupy.asnumpy``/``numpy.asarray`` give it."""
    if not hasattr(array, "__cuda_array_interface__"):
        return np.asarray(array)
    if array.nbytes < STAGED_MIN_BYTES:
        return array.get()
    import cupy

    device_id = int(array.device.id)
    lock, stream, buffers, pool = _staging(cupy, device_id)
    with cupy.cuda.Device(device_id), lock:
        source = cupy.ascontiguousarray(array)
        out = np.empty(source.shape, source.dtype)
        source_bytes = source.reshape(-1).view(np.uint8)
        out_bytes = out.reshape(-1).view(np.uint8)
        n = int(source_bytes.size)
        starts = list(range(0, n, STAGE_BYTES))
        stream.wait_event(cupy.cuda.get_current_stream().record())  # the array is complete first
        events = [None, None]

        def issue(i: int) -> None:
            a = starts[i]
            b = min(n, a + STAGE_BYTES)
            source_bytes[a:b].get(stream=stream, out=buffers[i % 2][: b - a])
            events[i % 2] = stream.record()

        issue(0)
        for i, a in enumerate(starts):
            if i + 1 < len(starts):
                issue(i + 1)  # into the other buffer, whose piece (i - 1) was copied out last round
            events[i % 2].synchronize()
            b = min(n, a + STAGE_BYTES)
            _copy(out_bytes[a:b], buffers[i % 2][: b - a], pool)
        return out


def to_device(array):
    """``array`` (host) as a CuPy array on the current device: a large one through the pinned
    staging buffers, host threads copying piece ``i + 1`` in while the device takes piece ``i``.
    A memory-mapped array (the bedpostX cache) is read by those threads, so its pages are faulted
    in on several cores at once, not by one ``cudaMemcpy`` from pageable memory (2.4 GB of
    sample field: 1.9 s on the H100 machine that way)."""
    import cupy

    source = np.asarray(array)
    if source.nbytes < STAGED_MIN_BYTES:
        return cupy.asarray(source)
    source = np.ascontiguousarray(source)
    out = cupy.empty(source.shape, source.dtype)
    upload_bytes(out.reshape(-1).view(np.uint8), source.reshape(-1).view(np.uint8))
    return out


def upload_bytes(destination, source: np.ndarray) -> None:
    """Host bytes ``source`` (1-D uint8, e.g. a slice of a memory map) into ``destination`` (a 1-D
    uint8 CuPy array of the same size on the current device), through the device's pinned
    staging buffers and copy threads; returns once the device holds them. Part of an array (a
    multi-GPU upload's share, :class:`gpu.multidevice_copy.ShardedUpload`) as well as a whole one."""
    import cupy

    n = int(source.size)
    if n != int(destination.size):
        raise ValueError(f"{n} bytes cannot go into {int(destination.size)}")
    if n == 0:
        return
    device_id = int(cupy.cuda.Device().id)
    lock, stream, buffers, pool = _staging(cupy, device_id)
    with lock:
        stream.wait_event(cupy.cuda.get_current_stream().record())  # ``destination`` is allocated first
        events = [None, None]
        for i, a in enumerate(range(0, n, STAGE_BYTES)):
            b = min(n, a + STAGE_BYTES)
            stage = buffers[i % 2]
            if events[i % 2] is not None:
                events[i % 2].synchronize()  # the device has taken this buffer's previous piece
            _copy(stage[: b - a], source[a:b], pool)
            destination[a:b].set(stage[: b - a], stream=stream)
            events[i % 2] = stream.record()
        stream.synchronize()


def empty_pinned(shape, dtype) -> np.ndarray:
    """A NumPy array in pinned (page-locked) host memory, for asynchronous copies: what
    ``cupyx.empty_pinned`` gives, without importing ``cupyx`` (which imports cupyx.scipy: 0.3 s of
    every probabilistic command's start on the H100 machine)."""
    import cupy

    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    memory = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
    return np.frombuffer(memory, dtype, int(np.prod(shape, dtype=np.int64))).reshape(shape)
