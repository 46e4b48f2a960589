"""probtrackx2's connectome modes (``--omatrix2``, ``--omatrix3``, ``--network``) counted from
the streamlines of probabilistic tracking, on the GPU or with NumPy, the same code for both.

Definitions (FSL's probtrackx2, ``Counter::update_matrix2_row``, ``update_matrix3``, network
mode; Behrens et al. 2007; Hernández-Fernández 2019, ch. 6 of the thesis on probtrackx2_gpu):

- matrix2 (seed × target2): a kept streamline of seed voxel r adds one to (r, c) for every
  low-resolution target2 voxel c it visits, once per streamline however often it passes.
- matrix3 (target3 × target3): a kept streamline adds one to (a, b), a < b, for every pair of
  distinct target3 voxels it visits (both halves; FSL stores the upper triangle, as here);
  with lrtarget3 (target3 × lrtarget3) to (a, c) for every target3 voxel a and lrtarget3
  voxel c it visits. Streamlines shorter than ``distthresh3`` are left out of matrix3 only.
- network: every mask of a list is seeded; a streamline of mask i is kept only if it reaches
  another mask of the list, and adds one to (i, j) for each other mask j it reaches.
- ``distthresh``: streamlines shorter than this (both halves, mm) are discarded everywhere.
- ``pd``: each count is weighted by a path length; ``ompl``: the mean path length is kept
  beside the counts. The length is the distance along the streamline: from the seed to the
  voxel's first entry (matrix2, network, path distribution) or between the two voxels'
  first entries (matrix3). FSL's matrix2 code increments its distance once per newly counted
  low-resolution voxel instead; we use the length along the path, which is what ``--pd``
  documents.

How it is counted: streamlines are tracked in chunks with the run's random streams (same
streamline ids, so the same streamlines as a plain run); each chunk becomes the list of
(streamline, voxel) first visits — on the GPU from the kernel's visit lists (its
``VISIT_LIST`` build: each kept streamline appends its distinct voxels to a device
buffer; no lengths), or, where lengths are needed, from its step traces; with NumPy from
the host tracker's recorded steps (:func:`gpu.probabilistic_host.track_on_host`: the compiled
loop, or the NumPy reference without numba) — from which every mode emits
(row, column, value) entries on the device. Entries are reduced by key (sort, segment sums) whenever the
device buffer holds :attr:`SparseAccumulator.capacity` of them, and the reduced chunk is
spilled to host memory and merged there; no dense seed × target matrix exists anywhere.
Counts are integers summed in float64 (exact below 2**53), so NumPy and CuPy give the same
counts bit for bit.

This module runs the count (:func:`track_connectome`); the modes' entries are made in
:mod:`gpu.connectome_modes` and summed in :mod:`gpu.connectome_counts`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from . import probabilistic_host
from .backend import Cancelled, OutOfDeviceMemory, get_backend
from .connectome_counts import SparseAccumulator, SparseCounts, bincount_or_zeros, count_true
from .connectome_modes import (
    Visits,
    count_and_length,
    emit_matrix2,
    emit_matrix3,
    kept_streamlines,
    membership_csr,
    network_reached,
    visits_from_trace,
)
from .probabilistic_kernel import SET_SLOTS, KernelTracker, set_sizes
from .probabilistic_params import (
    NUMPY_BITMAP_BYTES,
    ProbParams,
    SampleField,
    streamline_ids,
)


@dataclass
class ConnectomeSpec:
    """What to count, as voxel lookups on the samples' grid (host arrays).

    matrix2_columns : (X, Y, Z) int64, each voxel's target2 column (0-based), −1 outside.
    matrix3_nodes : (X, Y, Z) int64, each target3 voxel's node number, −1 outside.
    matrix3_columns : (X, Y, Z) int64, each voxel's lrtarget3 column, −1 outside (or None).
    network_masks : (M, X, Y, Z) bool, the seed masks of network mode.
    seed_mask_of_seed : (n_seeds,) int64, the network mask each seed voxel was seeded from.
    """

    matrix2_columns: np.ndarray | None = None
    n_matrix2_columns: int = 0
    matrix3_nodes: np.ndarray | None = None
    n_matrix3_nodes: int = 0
    matrix3_columns: np.ndarray | None = None
    n_matrix3_columns: int = 0
    network_masks: np.ndarray | None = None
    seed_mask_of_seed: np.ndarray | None = None


@dataclass
class ConnectomeResult:
    """What a connectome run adds up (host arrays)."""

    paths: np.ndarray  # (X, Y, Z) int64 kept streamlines visiting each voxel
    paths_lengths_mm: np.ndarray | None  # (X, Y, Z) float64 summed seed distances (pd / ompl)
    waytotal: np.ndarray  # (M,) kept streamlines per seed mask (one entry without network mode)
    streamlines: int
    matrix2: SparseCounts | None = None
    matrix3: SparseCounts | None = None
    network: SparseCounts | None = None
    provenance: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- reduction


# --------------------------------------------------------------------------- visits


# --------------------------------------------------------------------------- the modes


# --------------------------------------------------------------------------- the run


def _trace_host(field_, bits, seeds, params, n_waypoints, first, count):
    _, halves = probabilistic_host.track_on_host(field_, bits, seeds, params, 0, n_waypoints, first, count, record=True)
    T = max(h.shape[1] for h in halves)
    padded = [np.concatenate([h, np.repeat(h[:, -1:], T - h.shape[1], axis=1)], axis=1) for h in halves]
    return np.stack(padded, 1)


def trace_bytes_per_streamline(params: ProbParams) -> int:
    """Device bytes one streamline of a chunk needs at most: its trace (float64 x, y, z,
    alive per step of both halves), the step flags and counts taken from it, and a tracking
    thread's visited-voxel sets (the trace launch's and the tracker's own)."""
    rows = 2 * (params.n_steps + 1)
    _, _, full = set_sizes(params)
    return rows * 4 * 8 + rows * (1 + 4 + 8) + full * 8 + SET_SLOTS * 8


def plan_chunk(backend, field_: SampleField, params: ProbParams, total: int) -> int:
    """Streamlines per chunk: 30 % of the free device memory on a GPU (the rest for the
    reductions, the matrix and the allocator); on the CPU the compiled loop's recorded steps
    (:func:`gpu.probabilistic_host.trace_chunk`) or the NumPy reference's visit bitmap."""
    if backend.is_gpu:
        most = int(backend.free_memory_bytes() * 0.3) // trace_bytes_per_streamline(params)
    else:
        most = (
            probabilistic_host.trace_chunk(params)
            if probabilistic_host.available()
            else NUMPY_BITMAP_BYTES // int(np.prod(field_.shape))
        )
    return int(max(1, min(total, most, 1 << 18)))


def plan_capacity(backend, n_values: int = 1) -> int:
    """Entries the device buffer holds before a reduction: 8 % of the free memory at
    ~(key, values, sort and segment temporaries) bytes each."""
    per_entry = 8 * (6 + 3 * n_values)
    return int(max(1 << 16, min(1 << 28, int(backend.free_memory_bytes() * 0.08) // per_entry)))


def plan_device_entries(backend, n_values: int = 1) -> int:
    """Reduced entries a matrix keeps on the device: 35 % of the free memory, each entry
    (key and values) counted three times for the merge's temporaries (about 450 M entries
    of counts on an 80 GB GPU). A whole-brain dense connectome's non-zeros should fit;
    spilling to the host is the fallback."""
    return int(max(1 << 16, int(backend.free_memory_bytes() * 0.35) // (3 * 8 * (1 + n_values))))


#: Visit-list slots per streamline of a chunk (mean distinct voxels of an HCP-sized run: ~250;
#: a chunk whose streamlines visit more runs again with room for all).
LIST_SLOTS = 512


class _VisitSource:
    """Each chunk's first visits and kept streamlines: from the NumPy tracker's steps, the CUDA
    kernel's step traces, or the kernel's visit lists (kept streamlines only, no lengths)."""

    CHECK_STREAMLINES = 16384  # the visit list's first chunk, checked against traces

    def __init__(self, backend, field_, bits, seeds, params, n_waypoints, listed, notes):
        self.backend, self.xp = backend, backend.xp
        self.field, self.bits, self.seeds, self.params = field_, bits, seeds, params
        self.n_waypoints, self.listed, self.notes = n_waypoints, listed, notes
        self.checked = not listed
        self.tracker = None
        self.device_field = None  # the field's arrays already on the device
        self.max_batch = 1
        host = "compiled" if probabilistic_host.available() else "numpy"
        self.engine = ("kernel visit list" if listed else "kernel trace") if backend.is_gpu else host

    def plan_chunk(self, total: int) -> int:
        if not self.listed:
            return plan_chunk(self.backend, self.field, self.params, total)
        per_streamline = LIST_SLOTS * 12 + 250 * 64 + SET_SLOTS * 12
        most = int(self.backend.free_memory_bytes() * 0.3) // per_streamline
        return int(max(1, min(total, most, 1 << 20)))

    def most_at_once(self) -> int:
        return self.CHECK_STREAMLINES if not self.checked else 1 << 62

    def visits(self, first: int, count: int, bits_flat, distthresh: float):
        xp, params = self.xp, self.params
        if not self.backend.is_gpu:
            trace = _trace_host(self.field, self.bits, self.seeds, params, self.n_waypoints, first, count)
            visits = visits_from_trace(xp, trace, self.field.shape, params.step_mm)
            return visits, kept_streamlines(xp, visits, bits_flat, self.n_waypoints, params.waycond, distthresh)
        if self.tracker is None:
            self.tracker = KernelTracker(
                self.backend, self.field, self.bits, self.seeds, params, 0, self.n_waypoints,
                max_batch=max(count, self.max_batch), visit_list=self.listed,
                **({} if self.device_field is None else {"device_field": self.device_field}),
            )  # fmt: skip
        if not self.listed:
            trace = xp.zeros((count, 2, params.n_steps + 1, 4))
            self.tracker.launch(first, count, trace)
            visits = visits_from_trace(xp, trace, self.field.shape, params.step_mm)
            return visits, kept_streamlines(xp, visits, bits_flat, self.n_waypoints, params.waycond, distthresh)
        trace = None if self.checked else xp.zeros((count, 2, params.n_steps + 1, 4))
        visits = self._listed(first, count, trace)
        kept = bincount_or_zeros(xp, visits.stream, count) > 0
        if trace is not None:
            self.checked = True
            traced = visits_from_trace(xp, trace, self.field.shape, params.step_mm)
            traced_kept = kept_streamlines(xp, traced, bits_flat, self.n_waypoints, params.waycond, distthresh)
            if not _same_visits(xp, visits, kept, traced, traced_kept, int(np.prod(self.field.shape))):
                self.notes.append("the kernel's visit lists differed from its traces; the run used the traces")
                self.listed, self.engine, self.tracker = False, "kernel trace", None
                return traced, traced_kept
        return visits, kept

    def _listed(self, first: int, count: int, trace) -> Visits:
        """The kept streamlines' voxels as the kernel lists them (its id and voxel per visit)."""
        xp, tracker = self.xp, self.tracker
        if tracker.visit_buffers is None or len(tracker.visit_buffers[0]) < count * LIST_SLOTS:
            self._buffers(count * LIST_SLOTS)
        while True:
            tracker.visit_buffers[2].fill(0)
            tracker.launch(first, count, trace)
            n = int(tracker.visit_buffers[2][0])
            if n <= len(tracker.visit_buffers[0]):
                break
            self._buffers(int(n * 1.1) + 1)  # the same streamlines again, with room for all their visits
        sid = tracker.visit_buffers[0][:n].astype(xp.int64)
        n_samples, n_seeds = self.params.n_samples, len(self.seeds)
        stream = (sid % n_samples) * n_seeds + sid // n_samples - first  # run position in the chunk
        zeros = xp.zeros(n, dtype=xp.float64)
        voxel = tracker.visit_buffers[1][:n].astype(xp.int64)
        return Visits(stream, voxel, zeros, xp.zeros(n, dtype=xp.int64), xp.zeros(count, dtype=xp.float64), count)

    def _buffers(self, capacity: int) -> None:
        xp = self.xp
        self.tracker.visit_buffers = None  # the old ones go before the new ones come
        self.tracker.set_visit_buffers(
            xp.empty(capacity, dtype=xp.uint64), xp.empty(capacity, dtype=xp.int32), xp.zeros(1, dtype=xp.uint64)
        )


def _same_visits(xp, listed: Visits, kept, traced: Visits, traced_kept, n_vox: int) -> bool:
    """Whether the visit lists name the same kept streamlines and voxels as the traces."""
    if not bool((kept == traced_kept).all()):
        return False
    on = traced_kept[traced.stream]
    a = xp.sort(listed.stream * n_vox + listed.voxel)
    b = xp.sort(traced.stream[on] * n_vox + traced.voxel[on])
    return len(a) == len(b) and bool((a == b).all())


def track_connectome(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    spec: ConnectomeSpec,
    *,
    distthresh: float,
    distthresh3: float,
    lengths: bool,
    n_waypoints: int = 0,
    device="auto",
    chunk: int | None = None,
    capacity: int | None = None,
    device_entries: int | None = None,
    gpu_visits: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    timing: bool = False,
) -> ConnectomeResult:
    """Track every streamline of every seed voxel (the run's random streams) and count the
    connectome modes ``spec`` asks for. ``distthresh`` (mm): discard shorter streamlines;
    ``distthresh3`` (mm): leave shorter ones out of matrix3; ``lengths``: also sum the path
    lengths (``pd``, ``ompl``). The options' defaults are ``app.params.ProbOutputParams``'s.
    ``chunk``: streamlines traced at once (planned from
    free memory by default); ``capacity``: entries buffered on the device per reduction;
    ``device_entries``: the most reduced entries a matrix keeps on the device before they
    are spilled to host memory (planned from free memory by default). ``gpu_visits``: how
    the GPU gives each chunk's visits — ``"list"``: the kernel lists each kept
    streamline's voxels (fast; no path lengths, so not with ``lengths`` or the thresholds),
    ``"trace"``: from its step traces, ``"auto"``: the list where it can. The list's first
    chunk is checked against the traces of the same streamlines; on a difference the run
    goes on with the traces and a note says so. ``timing``: wait for the device between the
    phases and give their seconds in ``provenance["phases_s"]`` (a benchmark's; see
    :class:`ConnectomeCounter`). :mod:`gpu.connectome_split` shares the run out over several
    GPUs."""
    backend = get_backend(device)
    counter = ConnectomeCounter(
        backend, field_, bits, seeds, params, spec, distthresh=distthresh, distthresh3=distthresh3, lengths=lengths,
        n_waypoints=n_waypoints, chunk=chunk, capacity=capacity, device_entries=device_entries, gpu_visits=gpu_visits,
        timing=timing,
    )  # fmt: skip
    t0 = time.perf_counter()
    counter.count(0, counter.total, progress, cancelled)
    result = counter.result()
    elapsed = time.perf_counter() - t0
    result.provenance |= {
        "tracking_s": elapsed,
        "streamlines_per_s": counter.total / elapsed if elapsed > 0 else None,
    }
    return result


class ConnectomeCounter:
    """One device's count of the connectome modes over the run positions it is given
    (:meth:`count`, any ranges, in any order): the visit source, the running totals and the
    sparse accumulators stay on the device until :meth:`result` (or, split over GPUs,
    :func:`gpu.connectome_split.track_connectome_split`'s merge). ``device_field``: the field's
    arrays already on the device. ``timing``: wait for the device between the phases of each
    chunk and add up their seconds (:attr:`phases_s`): ``visits`` (tracking, the kernel's
    visit lists or traces, which streamlines are kept), ``paths`` (waytotal and the path
    distribution; network mode's entries too), ``entries`` (the modes' entries: matrix3's
    pairs), ``reduce`` (the sparse accumulators' sort and merge), ``result`` (the totals to
    the host, the last reduction counted in ``reduce``)."""

    def __init__(self, backend, field_, bits, seeds, params, spec, *, distthresh, distthresh3, lengths,
                 n_waypoints=0, chunk=None, capacity=None, device_entries=None, gpu_visits="auto",
                 device_field=None, timing=False):  # fmt: skip
        if not (distthresh >= 0 and distthresh3 >= 0):
            raise ValueError("distance thresholds are lengths: give values of at least 0 mm")
        if gpu_visits not in ("auto", "list", "trace"):
            raise ValueError("gpu_visits is auto, list or trace")
        can_list = not lengths and distthresh == 0 and distthresh3 == 0
        if gpu_visits == "list" and not can_list:
            raise ValueError("the kernel's visit lists carry no path lengths: use gpu_visits='trace' with them")
        self.backend = backend
        xp = self.xp = backend.xp
        self.seeds = seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
        self.params, self.spec, self.field = params, spec, field_
        self.distthresh, self.distthresh3, self.lengths = distthresh, distthresh3, lengths
        n_seeds, self.total = len(seeds), len(seeds) * params.n_samples
        self.n_vox = n_vox = int(np.prod(field_.shape))
        listed = backend.is_gpu and gpu_visits != "trace" and can_list
        self.notes_source: list[str] = []
        self.notes: list[str] = []
        self.source = _VisitSource(backend, field_, bits, seeds, params, n_waypoints, listed, self.notes_source)
        self.source.device_field = device_field
        self.chunk = chunk or self.source.plan_chunk(self.total)
        self.source.max_batch = self.chunk
        n_values = 2 if lengths else 1
        self.capacity = capacity or plan_capacity(backend, n_values)
        self.device_entries = device_entries or plan_device_entries(backend, n_values)
        dev = backend.asarray
        self.bits_flat = dev(np.asarray(bits, dtype=np.uint32).reshape(-1))
        self.acc2 = self.acc3 = self.accn = None
        if spec.matrix2_columns is not None:
            self.columns2 = dev(spec.matrix2_columns.reshape(-1).astype(np.int64))
            self.acc2 = SparseAccumulator(backend, (n_seeds, spec.n_matrix2_columns), n_values, self.capacity,
                                          self.device_entries)  # fmt: skip
        if spec.matrix3_nodes is not None:
            self.nodes3 = dev(spec.matrix3_nodes.reshape(-1).astype(np.int64))
            lr3 = None if spec.matrix3_columns is None else dev(spec.matrix3_columns.reshape(-1).astype(np.int64))
            self.lr3 = lr3
            width = spec.n_matrix3_nodes if lr3 is None else spec.n_matrix3_columns
            self.acc3 = SparseAccumulator(backend, (spec.n_matrix3_nodes, width), n_values, self.capacity,
                                          self.device_entries)  # fmt: skip
        self.n_masks = 1
        if spec.network_masks is not None:
            self.n_masks = len(spec.network_masks)
            self.membership = tuple(dev(a) for a in membership_csr(np.asarray(spec.network_masks, dtype=bool)))
            self.mask_of_seed = dev(np.asarray(spec.seed_mask_of_seed, dtype=np.int64))
            self.accn = SparseAccumulator(backend, (self.n_masks, self.n_masks), n_values, self.capacity,
                                          self.device_entries)  # fmt: skip
        self.paths = xp.zeros(n_vox, dtype=xp.int64)
        self.paths_len = xp.zeros(n_vox, dtype=xp.float64) if lengths else None
        self.waytotal = xp.zeros(self.n_masks, dtype=xp.int64)
        self.peak_device = 0
        self.streamlines = 0
        self.phases_s = dict.fromkeys(("visits", "paths", "entries", "reduce", "result"), 0.0) if timing else None
        for acc in self.accumulators:
            if acc is not None:
                acc.timed = timing
        self._lap_t = 0.0

    def _lap(self, phase: str | None) -> None:
        """With ``timing``: wait for the device, add the seconds since the last lap to ``phase``
        (None: start), the accumulators' reductions in between moved to ``reduce``."""
        if self.phases_s is None:
            return
        self.backend.synchronize()
        now = time.perf_counter()
        reduced = sum(a.reduce_s for a in self.accumulators if a is not None)
        if phase is not None:
            self.phases_s[phase] += now - self._lap_t - (reduced - self.phases_s["reduce"])
        self.phases_s["reduce"] = reduced
        self._lap_t = now

    @property
    def accumulators(self) -> tuple:
        return self.acc2, self.acc3, self.accn

    def count(self, start: int, count: int, progress=None, cancelled=None) -> None:
        """Track and count run positions ``start .. start + count``, chunk by chunk."""
        first, end = start, start + count
        self._lap(None)
        while first < end:
            if cancelled is not None and cancelled():
                raise Cancelled()
            n = min(self.chunk, end - first, self.source.most_at_once())
            try:  # nothing is counted before the visits exist: a chunk that does not fit is retried smaller
                visits, kept = self.source.visits(first, n, self.bits_flat, self.distthresh)
            except Exception as exc:
                if not self.backend.is_out_of_memory(exc) or isinstance(exc, OutOfDeviceMemory) or n <= 1:
                    raise  # OutOfDeviceMemory: the samples themselves do not fit, smaller chunks will not help
                self.backend.free_cached_memory()
                self.chunk = max(1, n // 2)
                self.notes.append(
                    f"out of device memory for {n} streamlines at once; chunks of {self.chunk} from then on"
                )
                continue
            self._lap("visits")
            self._add(first, n, visits, kept)
            first += n
            self.streamlines += n
            if progress is not None:
                progress(first, self.total)

    def _add(self, first: int, count: int, visits, kept) -> None:
        xp, n_vox = self.xp, self.n_vox
        _, seed_np = streamline_ids(first, count, len(self.seeds), self.params.n_samples)
        seed_of = self.backend.asarray(seed_np.astype(np.int64))
        entry_kept = kept[visits.stream]
        if self.accn is not None:
            own = self.mask_of_seed[seed_of]
            s, m, d = network_reached(xp, visits, entry_kept, self.membership, own, self.n_masks)
            kept &= bincount_or_zeros(xp, s, count) > 0
            self.accn.add(own[s], m, count_and_length(xp, d))
            entry_kept = kept[visits.stream]
            self.waytotal += bincount_or_zeros(xp, own[kept], self.n_masks)
        else:
            self.waytotal += count_true(xp, kept)
        v = visits.voxel[entry_kept]
        self.paths += bincount_or_zeros(xp, v, n_vox)
        if self.lengths:
            self.paths_len += bincount_or_zeros(xp, v, n_vox, xp.abs(visits.distance_mm[entry_kept]))
        self._lap("paths")
        if self.acc2 is not None:
            emit_matrix2(xp, self.acc2, visits, entry_kept, self.columns2, seed_of)
        if self.acc3 is not None:
            long_enough = entry_kept & (visits.length_mm[visits.stream] >= self.distthresh3)
            emit_matrix3(xp, self.acc3, visits, long_enough, self.nodes3, self.lr3)
        self._lap("entries")
        if hasattr(xp, "get_default_memory_pool"):  # CuPy: what its pool holds
            self.peak_device = max(self.peak_device, int(xp.get_default_memory_pool().total_bytes()))

    def provenance(self) -> dict:
        accs = [a for a in self.accumulators if a is not None]
        return {
            "params": asdict(self.params),
            "distthresh_mm": self.distthresh,
            "distthresh3_mm": self.distthresh3,
            "backend": self.backend.name,
            "device": self.backend.device_name,
            "engine": self.source.engine,
            "chunk_streamlines": self.chunk,
            "reduce_capacity_entries": self.capacity,
            "device_entries": self.device_entries,
            "reductions": sum(a.reductions for a in accs),
            "spills": sum(a.spills for a in accs),
            "peak_device_pool_bytes": self.peak_device,
            "notes": self.notes_source + self.notes,
            **({} if self.phases_s is None else {"phases_s": {k: round(v, 4) for k, v in self.phases_s.items()}}),
        }

    def result(self) -> ConnectomeResult:
        """The totals on the host."""
        shape, to_host = self.field.shape, self.backend.to_host
        acc2, acc3, accn = self.accumulators
        self._lap(None)
        result = ConnectomeResult(
            to_host(self.paths).reshape(shape),
            None if self.paths_len is None else to_host(self.paths_len).reshape(shape),
            to_host(self.waytotal),
            self.streamlines,
            acc2.result() if acc2 else None,
            acc3.result() if acc3 else None,
            accn.result() if accn else None,
        )
        self._lap("result")
        result.provenance = self.provenance()
        return result
