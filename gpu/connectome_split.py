"""The connectome modes (``--omatrix2``, ``--omatrix3``, ``--network``) counted on several GPUs
of one host (or simulated GPUs on the CPU, :func:`gpu.multidevice.simulated_backends`).

Each device counts the chunks of run positions it asks for (:func:`gpu.multidevice.run_shared`)
with its own :class:`gpu.connectome.ConnectomeCounter`, the samples field broadcast once
(:class:`gpu.multidevice_copy.Broadcast`). At the end each device reduces its pending entries
(in parallel), and the first GPU merges the key-sorted sparse totals of the others, copied to it
peer to peer (:func:`gpu.connectome_counts.merge_sorted`: a search and a scatter, no sort);
where that does not fit in its memory, or a device has spilled to host memory, the parts are
merged on the host range of keys by range of keys (the accumulator's own spill merge). The
path distribution and waytotal are summed on the first GPU. Counts are integers summed in
float64, so the result equals one device's to the last count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .backend import Backend
from .connectome import ConnectomeCounter, ConnectomeResult, ConnectomeSpec
from .connectome_counts import SparseAccumulator, SparseCounts, merge_sorted
from .multidevice import ShareReport, memory_peaks, run_shared
from .multidevice_copy import Broadcast, peer_copy, reduce_to_first
from .probabilistic_params import ProbParams, SampleField

#: The largest chunk of run positions a device takes at once (the counter cuts it into the
#: chunks its memory allows); the smallest, towards the end of the run.
LARGEST_CHUNK, SMALLEST_CHUNK = 1 << 24, 1 << 18


class _CounterShare:
    def __init__(self, backend: Backend, report: ShareReport, broadcast: Broadcast, kwargs: dict):
        t0 = time.perf_counter()
        if backend.is_gpu:
            backend.xp.zeros(1)  # the device's context
            backend.synchronize()
        t1 = time.perf_counter()
        arrays = broadcast.get(backend) if backend.is_gpu else None
        t2 = time.perf_counter()
        self.counter = ConnectomeCounter(backend, device_field=arrays, **kwargs)
        report.add("start", t1 - t0)
        report.add("upload", t2 - t1)
        report.add("setup", time.perf_counter() - t2)
        self.backend = backend

    def launch(self, start: int, count: int) -> None:
        self.counter.count(start, count)

    def finish(self) -> ConnectomeCounter:
        for acc in self.counter.accumulators:
            if acc is not None:
                acc._reduce()  # each device's pending entries, at once on every device
        # The tracker (visited-voxel sets, visit buffers) is not needed for the merge: its memory
        # goes back, so the first GPU has room to merge the others' totals (a later chunk, after
        # another device failed, makes a new one).
        self.counter.source.tracker = None
        self.backend.synchronize()
        self.backend.free_cached_memory()
        return self.counter


def counts_from(keys: np.ndarray, sums: np.ndarray, shape, n_values: int) -> SparseCounts:
    """A :class:`SparseCounts` from key-sorted (row × width + column) keys and their sums."""
    rows, cols = np.divmod(keys, shape[1])
    counts = np.rint(sums[:, 0]).astype(np.int64)
    return SparseCounts(rows, cols, counts, sums[:, 1].copy() if n_values > 1 else None, tuple(shape))


def merge_accumulators(backends: Sequence[Backend], accs: Sequence[SparseAccumulator]) -> tuple[SparseCounts, str]:
    """The sum of each device's accumulator (reduced), and how it was merged (``device`` or
    ``host``)."""
    first = accs[0]
    if not any(a._host for a in accs):
        try:
            return _merge_on_first(backends, accs), "device"
        except Exception as exc:
            if not backends[0].is_out_of_memory(exc):
                raise
            backends[0].free_cached_memory()
    chunks = []
    for backend, acc in zip(backends, accs, strict=True):
        with backend.activate():
            acc._spill()
        chunks.extend(acc._host)
        acc._host = []
    merger = SparseAccumulator(backends[0], first.shape, first.n_values, first.capacity, first.device_entries)
    merger._host = [c for c in chunks if len(c[0])]
    with backends[0].activate():
        if merger._host:
            keys, sums = merger._merge_host_chunks()
        else:
            keys, sums = np.zeros(0, np.int64), np.zeros((0, first.n_values))
    return counts_from(keys, sums, first.shape, first.n_values), "host"


def _merge_on_first(backends, accs) -> SparseCounts:
    b0, first = backends[0], accs[0]
    with b0.activate():
        keys, sums = first._keys, first._sums
        for backend, acc in zip(backends[1:], accs[1:], strict=True):
            k, s = (acc._keys, acc._sums) if not b0.is_gpu else peer_copy((acc._keys, acc._sums), backend.device_id)
            keys, sums = merge_sorted(b0.xp, keys, sums, k, s)
            del k, s
        return counts_from(b0.to_host(keys), b0.to_host(sums), first.shape, first.n_values)


def track_connectome_split(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    spec: ConnectomeSpec,
    backends: Sequence[Backend],
    *,
    distthresh: float,
    distthresh3: float,
    lengths: bool,
    n_waypoints: int = 0,
    chunk: int | None = None,
    largest: int = LARGEST_CHUNK,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    keep_going: bool = True,
) -> ConnectomeResult:
    """:func:`gpu.connectome.track_connectome` shared out over ``backends`` (same options;
    ``chunk``: the streamlines each device traces at once). The same counts as one device; a
    failing device is named and its share counted on the others (``keep_going``; a note says so)
    or the run stops with :class:`gpu.multidevice.DeviceFailure`."""
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    total = len(seeds) * params.n_samples
    kwargs = dict(field_=field_, bits=bits, seeds=seeds, params=params, spec=spec, distthresh=distthresh,
                  distthresh3=distthresh3, lengths=lengths, n_waypoints=n_waypoints, chunk=chunk)  # fmt: skip
    broadcast = Broadcast((field_.dirs, field_.f, field_.index))
    if not backends[0].is_gpu:  # simulated: chunks small enough to be shared
        largest = max(1, min(largest, total // (4 * len(backends)) or 1))
    t0 = time.perf_counter()
    shared = run_shared(
        backends, total, lambda b, r: _CounterShare(b, r, broadcast, kwargs), largest=largest,
        smallest=min(largest, SMALLEST_CHUNK), cancelled=cancelled, progress=progress, keep_going=keep_going,
    )  # fmt: skip
    broadcast.release()
    tracking_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    counters: list[ConnectomeCounter] = shared.totals
    live = shared.backends
    paths, paths_len, waytotal = reduce_to_first(live, [(c.paths, c.paths_len, c.waytotal) for c in counters])
    b0 = live[0]
    with b0.activate():
        paths, waytotal = b0.to_host(paths), b0.to_host(waytotal)
        paths_len = None if paths_len is None else b0.to_host(paths_len)
    matrices, merged_on = [], []
    for k in range(3):
        accs = [c.accumulators[k] for c in counters]
        if accs[0] is None:
            matrices.append(None)
            continue
        counts, where = merge_accumulators(live, accs)
        matrices.append(counts)
        merged_on.append(where)
    merge_s = time.perf_counter() - t1
    shape = field_.shape
    result = ConnectomeResult(paths.reshape(shape), None if paths_len is None else paths_len.reshape(shape),
                              waytotal, sum(c.streamlines for c in counters), *matrices)  # fmt: skip
    provenance = counters[0].provenance()
    provenance.update(
        device=f"{len(backends)} × " + ", ".join(sorted({b.device_name for b in backends})),
        gpus=len(backends),
        reductions=sum(c.provenance()["reductions"] for c in counters),
        spills=sum(c.provenance()["spills"] for c in counters),
        peak_device_pool_bytes=max(c.peak_device for c in counters),
        device_pool_peak_bytes=memory_peaks(backends),
        devices=[vars(r) for r in shared.reports],
        tracking_s=tracking_s + (time.perf_counter() - t1),
        shared_tracking_s=round(tracking_s, 4),
        merge_s=round(merge_s, 4),
        merged_on=merged_on,
        streamlines_per_s=total / (time.perf_counter() - t0),
        notes=sorted({n for c in counters for n in c.provenance()["notes"]}) + shared.notes,
    )
    result.provenance = provenance
    return result


__all__ = ["counts_from", "merge_accumulators", "track_connectome_split"]
