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
:func:`gpu.probabilistic.track_numpy`'s recorded steps — from which every mode emits
(row, column, value) entries on the device. Entries are reduced by key (sort, segment sums) whenever the
device buffer holds :attr:`SparseAccumulator.capacity` of them, and the reduced chunk is
spilled to host memory and merged there; no dense seed × target matrix exists anywhere.
Counts are integers summed in float64 (exact below 2**53), so NumPy and CuPy give the same
counts bit for bit.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from .backend import Cancelled, OutOfDeviceMemory, get_backend
from .probabilistic_kernel import SET_SLOTS, KernelTracker, set_sizes
from .probabilistic_numpy import track_numpy
from .probabilistic_params import (
    BIT_EXCLUDE,
    NUMPY_BITMAP_BYTES,
    WAYPOINT_SHIFT,
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
class SparseCounts:
    """A sparse matrix as coordinates (0-based), with counts and, when asked, summed lengths."""

    rows: np.ndarray
    cols: np.ndarray
    counts: np.ndarray  # int64
    lengths_mm: np.ndarray | None  # float64 sums of path lengths (pd / ompl)
    shape: tuple[int, int]

    @property
    def nnz(self) -> int:
        return len(self.rows)

    def to_scipy(self, values: str = "counts"):
        """A ``scipy.sparse.coo_matrix`` of ``counts``, ``lengths`` (the sums) or ``mean_lengths``."""
        import scipy.sparse

        data = {
            "counts": lambda: self.counts,
            "lengths": lambda: self.lengths_mm,
            "mean_lengths": lambda: self.lengths_mm / np.maximum(self.counts, 1),
        }[values]()
        return scipy.sparse.coo_matrix((data, (self.rows, self.cols)), shape=self.shape)

    def dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.int64)
        np.add.at(out, (self.rows, self.cols), self.counts)
        return out


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


def _bincount(xp, x, minlength: int, weights=None):
    """``xp.bincount`` that also takes an empty ``x`` (zeros of ``minlength``)."""
    if len(x) == 0:
        return xp.zeros(minlength, dtype=xp.int64 if weights is None else xp.float64)
    return xp.bincount(x, weights=weights, minlength=minlength)


def reduce_by_key(xp, keys, values):
    """(unique keys, (U, k) float64 sums of ``values`` (E, k) per key), keys sorted."""
    if len(keys) == 0:
        return keys, values.reshape(0, values.shape[1])
    order = xp.argsort(keys)
    k = keys[order]
    new = xp.concatenate([xp.ones(1, dtype=bool), k[1:] != k[:-1]])
    segment = xp.cumsum(new) - 1
    unique = k[new]
    v = values[order]
    sums = xp.stack([_bincount(xp, segment, len(unique), v[:, i]) for i in range(v.shape[1])], 1)
    return unique, sums


def merge_sorted(xp, keys_a, sums_a, keys_b, sums_b):
    """Two key-sorted, key-unique (keys, sums) as one: B's keys found in A add to A's sums,
    the others are placed among A's in order (a merge by ``searchsorted``, no re-sort of A)."""
    if len(keys_a) == 0:
        return keys_b, sums_b
    if len(keys_b) == 0:
        return keys_a, sums_a
    at = xp.minimum(xp.searchsorted(keys_a, keys_b), len(keys_a) - 1)
    found = keys_a[at] == keys_b
    sums_a = sums_a.copy()
    sums_a[at[found]] += sums_b[found]  # keys are unique in B: no two updates of one row
    new_keys, new_sums = keys_b[~found], sums_b[~found]
    if len(new_keys) == 0:
        return keys_a, sums_a
    n = len(keys_a) + len(new_keys)
    place_a = xp.arange(len(keys_a), dtype=xp.int64) + xp.searchsorted(new_keys, keys_a)
    place_b = xp.arange(len(new_keys), dtype=xp.int64) + xp.searchsorted(keys_a, new_keys)
    keys = xp.empty(n, dtype=keys_a.dtype)
    sums = xp.empty((n, sums_a.shape[1]), dtype=sums_a.dtype)
    keys[place_a], sums[place_a] = keys_a, sums_a
    keys[place_b], sums[place_b] = new_keys, new_sums
    return keys, sums


class SparseAccumulator:
    """Sums (row, col, values) entries into a sparse matrix without a dense one.

    Entries wait in a device buffer; at ``capacity`` they are reduced by key (sort, segment
    sums) and merged into the device-resident total (key-sorted). When that total outgrows
    ``device_entries`` it is spilled to host memory as a sorted chunk and the device total
    starts again. :meth:`result` merges the host chunks range by range of keys on the
    device (each range small enough for it), so the host never sorts.
    """

    def __init__(self, backend, shape, n_values: int, capacity: int, device_entries: int | None = None):
        self.backend, self.xp = backend, backend.xp
        self.shape, self.n_values, self.capacity = (int(shape[0]), int(shape[1])), n_values, max(1, int(capacity))
        self.device_entries = max(self.capacity, int(device_entries or 4 * self.capacity))
        self._pending: list = []
        self._pending_n = 0
        self._keys = self.xp.zeros(0, dtype=self.xp.int64)
        self._sums = self.xp.zeros((0, n_values), dtype=self.xp.float64)
        self._host: list[tuple[np.ndarray, np.ndarray]] = []
        self.reductions = self.spills = self.host_merges = 0

    def add(self, rows, cols, values) -> None:
        """Entries (device arrays); ``values`` (E, n_values)."""
        if len(rows) == 0:
            return
        keys = rows.astype(self.xp.int64) * self.shape[1] + cols.astype(self.xp.int64)
        self._pending.append((keys, values.reshape(len(keys), -1)[:, : self.n_values].astype(self.xp.float64)))
        self._pending_n += len(keys)
        if self._pending_n >= self.capacity:
            self._reduce()

    def _reduce(self) -> None:
        if not self._pending:
            return
        xp = self.xp
        keys = xp.concatenate([k for k, _ in self._pending])
        values = xp.concatenate([v for _, v in self._pending])
        self._pending, self._pending_n = [], 0
        unique, sums = reduce_by_key(xp, keys, values)
        del keys, values
        self._keys, self._sums = merge_sorted(xp, self._keys, self._sums, unique, sums)
        self.reductions += 1
        if len(self._keys) > self.device_entries:
            self._spill()

    def _spill(self) -> None:
        if len(self._keys):
            self._host.append((self.backend.to_host(self._keys), self.backend.to_host(self._sums)))
            self._keys = self.xp.zeros(0, dtype=self.xp.int64)
            self._sums = self.xp.zeros((0, self.n_values), dtype=self.xp.float64)
            self.spills += 1
            self.backend.free_cached_memory()  # the next total grows again: no fragments left behind
            held = sum(k.nbytes + v.nbytes for k, v in self._host)
            if len(self._host) > 1 and held > 0.3 * get_backend("cpu").free_memory_bytes():
                self._host = [self._merge_host_chunks()]  # spilled chunks repeat keys: keep the host bounded
                self.host_merges += 1

    def _merged(self) -> tuple[np.ndarray, np.ndarray]:
        self._reduce()
        if not self._host:
            return self.backend.to_host(self._keys), self.backend.to_host(self._sums)
        self._spill()
        merged = self._merge_host_chunks()
        self._host = []
        return merged

    def _merge_host_chunks(self) -> tuple[np.ndarray, np.ndarray]:
        """The host chunks summed, key range by key range on the device: the ranges are cut
        at keys sampled from every chunk, so each holds about ``device_entries`` / 2 entries."""
        chunks, xp = self._host, self.xp
        if len(chunks) == 1:
            return chunks[0]
        step = max(1, self.device_entries // (4 * len(chunks)))
        samples = np.unique(np.concatenate([k[step::step] for k, _ in chunks]))
        bounds = [None, *(int(k) for k in samples[len(chunks) :: len(chunks)]), None]
        keys_out, sums_out = [], []
        for lo, hi in itertools.pairwise(bounds):
            part_k, part_s = [], []
            for k, v in chunks:
                a = 0 if lo is None else int(np.searchsorted(k, lo))
                b = len(k) if hi is None else int(np.searchsorted(k, hi))
                part_k.append(k[a:b])
                part_s.append(v[a:b])
            unique, sums = reduce_by_key(xp, xp.asarray(np.concatenate(part_k)), xp.asarray(np.concatenate(part_s)))
            keys_out.append(self.backend.to_host(unique))
            sums_out.append(self.backend.to_host(sums))
        return np.concatenate(keys_out), np.concatenate(sums_out)

    def result(self) -> SparseCounts:
        """The totals (host), row-major sorted: counts, and the summed lengths when kept."""
        keys, sums = self._merged()
        rows, cols = np.divmod(keys, self.shape[1])
        counts = np.rint(sums[:, 0]).astype(np.int64)
        return SparseCounts(rows, cols, counts, sums[:, 1].copy() if self.n_values > 1 else None, self.shape)


# --------------------------------------------------------------------------- visits


@dataclass
class Visits:
    """The first visit of each (streamline, voxel) of a chunk (device arrays), sorted by
    streamline then voxel: ``distance_mm`` is signed (the second half negative) so that the
    length between two visits is the absolute difference; ``order`` is the tracking order."""

    stream: object
    voxel: object
    distance_mm: object
    order: object
    length_mm: object  # (n,) each streamline's length, both halves
    n: int


def visits_from_trace(xp, trace, shape, step_mm: float) -> Visits:
    """The voxels each streamline visits, from its recorded steps ``trace`` (n, 2, T, ≥3:
    x, y, z per step of each half; a stopped half repeats its last position). A voxel is
    visited where a position lies in it (rounded), as the tracker counts it: the start, and
    each step that moved."""
    n, _, T = trace.shape[:3]
    P = trace[..., :3]
    shape_a = xp.asarray(np.array(shape, dtype=np.int64))
    moved = xp.any(P[:, :, 1:] != P[:, :, :-1], axis=3)  # (n, 2, T - 1)
    moves = xp.cumsum(moved, axis=2, dtype=xp.int32)
    length = (moves[:, :, -1].sum(1) if T > 1 else xp.zeros(n, xp.int32)).astype(xp.float64) * step_mm
    s1, h1, t1 = xp.nonzero(moved)
    stream = xp.concatenate([xp.arange(n, dtype=xp.int64), s1.astype(xp.int64)])
    half = xp.concatenate([xp.zeros(n, dtype=xp.int64), h1.astype(xp.int64)])
    t = xp.concatenate([xp.zeros(n, dtype=xp.int64), t1.astype(xp.int64) + 1])
    travelled = xp.concatenate([xp.zeros(n, dtype=xp.float64), moves[s1, h1, t1].astype(xp.float64)])
    distance = travelled * step_mm * (1.0 - 2.0 * half)
    order = half * T + t
    v = xp.rint(P[stream, half, t]).astype(xp.int64)
    inside = xp.all((v >= 0) & (v < shape_a), axis=1)
    flat = (v[:, 0] * int(shape[1]) + v[:, 1]) * int(shape[2]) + v[:, 2]
    stream, flat, distance, order = stream[inside], flat[inside], distance[inside], order[inside]
    # The first visit of each (streamline, voxel): one sort on a combined key.
    n_vox = int(np.prod(shape))
    if n * n_vox * 2 * T >= 2**62:
        raise ValueError("too many streamlines in one chunk for this grid; use smaller chunks")
    key = (stream * n_vox + flat) * (2 * T) + order
    idx = xp.argsort(key)
    pair = key[idx] // (2 * T)
    first = xp.concatenate([xp.ones(min(1, len(pair)), dtype=bool), pair[1:] != pair[:-1]])
    idx = idx[first]
    return Visits(stream[idx], flat[idx], distance[idx], order[idx], length, n)


def _repeat(xp, counts):
    """(source index, rank within its repeat) of ``np.repeat(arange(len(counts)), counts)``,
    without array-valued repeats (CuPy lacks them)."""
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    k = xp.arange(total, dtype=xp.int64)
    src = xp.searchsorted(ends, k, side="right")
    return src, k - (ends - counts)[src]


def _first_per_key(xp, key_hi, order, *columns):
    """Keep, per ``key_hi`` value, the entry of least ``order`` (columns filtered alike),
    sorted by ``key_hi``."""
    if len(key_hi) == 0:
        return columns
    span = int(order.max()) + 1
    idx = xp.argsort(key_hi * span + order)  # one key: CuPy's lexsort takes no int64 pairs
    k = key_hi[idx]
    first = xp.concatenate([xp.ones(1, dtype=bool), k[1:] != k[:-1]])
    idx = idx[first]
    return tuple(c[idx] for c in columns)


def _groups(xp, stream):
    """(start of its group, group size) of each entry of entries sorted by ``stream``."""
    new = xp.concatenate([xp.ones(min(1, len(stream)), dtype=bool), stream[1:] != stream[:-1]])
    starts = xp.flatnonzero(new)
    group = xp.cumsum(new) - 1
    sizes = xp.diff(xp.concatenate([starts, xp.asarray([len(stream)], dtype=starts.dtype)]))
    return starts[group], sizes[group]


# --------------------------------------------------------------------------- the modes


def _values(xp, lengths):
    return xp.stack([xp.ones(len(lengths), dtype=xp.float64), xp.abs(lengths)], 1)


def emit_matrix2(xp, acc: SparseAccumulator, visits: Visits, entry_kept, columns, seed_of):
    """Seed voxel × target2 column, once per streamline and column."""
    col = columns[visits.voxel]
    sel = entry_kept & (col >= 0)
    s, c, d, o = visits.stream[sel], col[sel], visits.distance_mm[sel], visits.order[sel]
    s, c, d = _first_per_key(xp, s * acc.shape[1] + c, o, s, c, d)
    acc.add(seed_of[s], c, _values(xp, d))


def emit_matrix3(xp, acc: SparseAccumulator, visits: Visits, entry_kept, nodes, columns=None, most: int = 1 << 24):
    """Every pair of distinct target3 voxels a streamline visits (a < b), or with
    ``columns`` (lrtarget3) every target3 voxel × lrtarget3 column; in pieces of at most
    ``most`` pairs."""
    node = nodes[visits.voxel]
    sel = entry_kept & (node >= 0)
    s, a, da = visits.stream[sel], node[sel], visits.distance_mm[sel]  # sorted by streamline
    if columns is None:
        start, size = _groups(xp, s)
        rank = xp.arange(len(s), dtype=xp.int64) - start
        partners = size - 1 - rank  # the later entries of its streamline
        other_node, other_d, other_start = a, da, None
    else:
        col = columns[visits.voxel]
        csel = entry_kept & (col >= 0)
        cs, cc, cd, co = visits.stream[csel], col[csel], visits.distance_mm[csel], visits.order[csel]
        cs, cc, cd = _first_per_key(xp, cs * acc.shape[1] + cc, co, cs, cc, cd)  # sorted by streamline
        first = xp.searchsorted(cs, s, side="left")
        partners = xp.searchsorted(cs, s, side="right") - first
        other_node, other_d, other_start = cc, cd, first
    _emit_pairs(xp, acc, a, da, partners, other_node, other_d, other_start, columns is None, most)


def _emit_pairs(xp, acc, a, da, partners, other_node, other_d, other_start, triangle: bool, most: int):
    ends = xp.cumsum(partners)
    total = int(ends[-1]) if len(ends) else 0
    for lo in range(0, total, most):
        k = xp.arange(lo, min(total, lo + most), dtype=xp.int64)
        src = xp.searchsorted(ends, k, side="right")
        within = k - (ends - partners)[src]
        partner = src + 1 + within if triangle else other_start[src] + within
        x, y = a[src], other_node[partner]
        rows, cols = (xp.minimum(x, y), xp.maximum(x, y)) if triangle else (x, y)
        acc.add(rows, cols, _values(xp, da[src] - other_d[partner]))


def network_reached(xp, visits: Visits, entry_kept, membership, own_mask, n_masks: int):
    """(streamline, mask, |distance| at first entry) of every other network mask each kept
    streamline enters; ``membership``: (indptr over voxels, mask numbers), CSR."""
    indptr, masks = membership
    sel = entry_kept
    s, v, d, o = visits.stream[sel], visits.voxel[sel], visits.distance_mm[sel], visits.order[sel]
    src, rank = _repeat(xp, indptr[v + 1] - indptr[v])
    m = masks[indptr[v[src]] + rank]
    s, d, o = s[src], d[src], o[src]
    other = m != own_mask[s]
    s, m, d, o = s[other], m[other], d[other], o[other]
    return _first_per_key(xp, s * n_masks + m, o, s, m, xp.abs(d))


def membership_csr(masks: np.ndarray):
    """(indptr over flat voxels, mask numbers): which masks hold each voxel."""
    m = masks.shape[0]
    per_voxel = masks.reshape(m, -1).T  # (n_vox, m)
    vox, mask = np.nonzero(per_voxel)
    indptr = np.zeros(per_voxel.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(vox, minlength=per_voxel.shape[0]), out=indptr[1:])
    return indptr, mask.astype(np.int64)


# --------------------------------------------------------------------------- the run


def _trace_numpy(field_, bits, seeds, params, n_waypoints, first, count):
    _, halves = track_numpy(field_, bits, seeds, params, 0, n_waypoints, first, count, record=True)
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
    reductions, the matrix and the allocator), the NumPy tracker's visit bitmap on the CPU."""
    if backend.is_gpu:
        most = int(backend.free_memory_bytes() * 0.3) // trace_bytes_per_streamline(params)
    else:
        most = NUMPY_BITMAP_BYTES // int(np.prod(field_.shape))
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
        self.max_batch = 1
        self.engine = ("kernel visit list" if listed else "kernel trace") if backend.is_gpu else "numpy"

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
            trace = _trace_numpy(self.field, self.bits, self.seeds, params, self.n_waypoints, first, count)
            visits = visits_from_trace(xp, trace, self.field.shape, params.step_mm)
            return visits, _kept(xp, visits, bits_flat, self.n_waypoints, params.waycond, distthresh)
        if self.tracker is None:
            self.tracker = KernelTracker(
                self.backend, self.field, self.bits, self.seeds, params, 0, self.n_waypoints,
                max_batch=max(count, self.max_batch), visit_list=self.listed,
            )  # fmt: skip
        if not self.listed:
            trace = xp.zeros((count, 2, params.n_steps + 1, 4))
            self.tracker.launch(first, count, trace)
            visits = visits_from_trace(xp, trace, self.field.shape, params.step_mm)
            return visits, _kept(xp, visits, bits_flat, self.n_waypoints, params.waycond, distthresh)
        trace = None if self.checked else xp.zeros((count, 2, params.n_steps + 1, 4))
        visits = self._listed(first, count, trace)
        kept = _bincount(xp, visits.stream, count) > 0
        if trace is not None:
            self.checked = True
            traced = visits_from_trace(xp, trace, self.field.shape, params.step_mm)
            traced_kept = _kept(xp, traced, bits_flat, self.n_waypoints, params.waycond, distthresh)
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
    goes on with the traces and a note says so."""
    if not (distthresh >= 0 and distthresh3 >= 0):
        raise ValueError("distance thresholds are lengths: give values of at least 0 mm")
    backend = get_backend(device)
    xp = backend.xp
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    n_seeds, total = len(seeds), len(seeds) * params.n_samples
    shape = field_.shape
    n_vox = int(np.prod(shape))
    if gpu_visits not in ("auto", "list", "trace"):
        raise ValueError("gpu_visits is auto, list or trace")
    can_list = not lengths and distthresh == 0 and distthresh3 == 0
    if gpu_visits == "list" and not can_list:
        raise ValueError("the kernel's visit lists carry no path lengths: use gpu_visits='trace' with them")
    listed = backend.is_gpu and gpu_visits != "trace" and can_list
    notes_source: list[str] = []
    source = _VisitSource(backend, field_, bits, seeds, params, n_waypoints, listed, notes_source)
    chunk = chunk or source.plan_chunk(total)
    source.max_batch = chunk
    n_values = 2 if lengths else 1
    capacity = capacity or plan_capacity(backend, n_values)
    device_entries = device_entries or plan_device_entries(backend, n_values)
    dev = backend.asarray
    bits_flat = dev(np.asarray(bits, dtype=np.uint32).reshape(-1))
    acc2 = acc3 = accn = None
    if spec.matrix2_columns is not None:
        columns2 = dev(spec.matrix2_columns.reshape(-1).astype(np.int64))
        acc2 = SparseAccumulator(backend, (n_seeds, spec.n_matrix2_columns), n_values, capacity, device_entries)
    if spec.matrix3_nodes is not None:
        nodes3 = dev(spec.matrix3_nodes.reshape(-1).astype(np.int64))
        lr3 = None if spec.matrix3_columns is None else dev(spec.matrix3_columns.reshape(-1).astype(np.int64))
        width = spec.n_matrix3_nodes if lr3 is None else spec.n_matrix3_columns
        acc3 = SparseAccumulator(backend, (spec.n_matrix3_nodes, width), n_values, capacity, device_entries)
    n_masks = 1
    if spec.network_masks is not None:
        n_masks = len(spec.network_masks)
        membership = tuple(dev(a) for a in membership_csr(np.asarray(spec.network_masks, dtype=bool)))
        mask_of_seed = dev(np.asarray(spec.seed_mask_of_seed, dtype=np.int64))
        accn = SparseAccumulator(backend, (n_masks, n_masks), n_values, capacity, device_entries)
    paths = xp.zeros(n_vox, dtype=xp.int64)
    paths_len = xp.zeros(n_vox, dtype=xp.float64) if lengths else None
    waytotal = xp.zeros(n_masks, dtype=xp.int64)
    peak_device = 0
    t0 = time.perf_counter()
    notes: list[str] = []
    first = 0
    while first < total:
        if cancelled is not None and cancelled():
            raise Cancelled()
        count = min(chunk, total - first, source.most_at_once())
        try:  # nothing is counted before the visits exist: a chunk that does not fit is retried smaller
            visits, kept = source.visits(first, count, bits_flat, distthresh)
        except Exception as exc:
            if not backend.is_out_of_memory(exc) or isinstance(exc, OutOfDeviceMemory) or count <= 1:
                raise  # OutOfDeviceMemory: the samples themselves do not fit, smaller chunks will not help
            backend.free_cached_memory()
            chunk = max(1, count // 2)
            notes.append(f"out of device memory for {count} streamlines at once; chunks of {chunk} from then on")
            continue
        _, seed_np = streamline_ids(first, count, n_seeds, params.n_samples)
        seed_of = dev(seed_np.astype(np.int64))
        entry_kept = kept[visits.stream]
        if accn is not None:
            own = mask_of_seed[seed_of]
            s, m, d = network_reached(xp, visits, entry_kept, membership, own, n_masks)
            kept &= _bincount(xp, s, count) > 0
            accn.add(own[s], m, _values(xp, d))
            entry_kept = kept[visits.stream]
            waytotal += _bincount(xp, own[kept], n_masks)
        else:
            waytotal += kept.sum()
        v = visits.voxel[entry_kept]
        paths += _bincount(xp, v, n_vox)
        if lengths:
            paths_len += _bincount(xp, v, n_vox, xp.abs(visits.distance_mm[entry_kept]))
        if acc2 is not None:
            emit_matrix2(xp, acc2, visits, entry_kept, columns2, seed_of)
        if acc3 is not None:
            long_enough = entry_kept & (visits.length_mm[visits.stream] >= distthresh3)
            emit_matrix3(xp, acc3, visits, long_enough, nodes3, lr3)
        if hasattr(xp, "get_default_memory_pool"):  # CuPy: what its pool holds
            peak_device = max(peak_device, int(xp.get_default_memory_pool().total_bytes()))
        first += count
        if progress is not None:
            progress(first, total)
    elapsed = time.perf_counter() - t0
    result = ConnectomeResult(
        backend.to_host(paths).reshape(shape),
        None if paths_len is None else backend.to_host(paths_len).reshape(shape),
        backend.to_host(waytotal),
        total,
        acc2.result() if acc2 else None,
        acc3.result() if acc3 else None,
        accn.result() if accn else None,
    )
    result.provenance = {
        "params": asdict(params),
        "distthresh_mm": distthresh,
        "distthresh3_mm": distthresh3,
        "backend": backend.name,
        "device": backend.device_name,
        "engine": source.engine,
        "chunk_streamlines": chunk,
        "reduce_capacity_entries": capacity,
        "device_entries": device_entries,
        "reductions": sum(a.reductions for a in (acc2, acc3, accn) if a is not None),
        "spills": sum(a.spills for a in (acc2, acc3, accn) if a is not None),
        "peak_device_pool_bytes": peak_device,
        "tracking_s": elapsed,
        "streamlines_per_s": total / elapsed if elapsed > 0 else None,
        "notes": notes_source + notes,
    }
    return result


def _kept(xp, visits: Visits, bits_flat, n_waypoints, waycond, distthresh):
    """Kept streamlines: no exclusion voxel, the waypoint condition, at least ``distthresh`` long."""
    n = visits.n
    b = bits_flat[visits.voxel]
    excluded = _bincount(xp, visits.stream[(b & BIT_EXCLUDE) != 0], n) > 0
    kept = ~excluded & (visits.length_mm >= distthresh)
    if n_waypoints:
        met = xp.zeros(n, dtype=xp.int64)
        for i in range(n_waypoints):
            hit = _bincount(xp, visits.stream[((b >> (WAYPOINT_SHIFT + i)) & 1) != 0], n) > 0
            met += hit
        kept &= (met == n_waypoints) if waycond == "AND" else (met > 0)
    return kept
