"""Sparse counts for the connectome modes (:mod:`gpu.connectome`): (row, column, value) entries
reduced by key (sort, segment sums) on the device whenever the buffer fills
(:class:`SparseAccumulator`), the reduced chunks spilled to host memory and merged there
(:class:`SparseCounts`); no dense matrix anywhere. Integers summed in float64 (exact below
2**53), so NumPy and CuPy give the same counts bit for bit."""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass

import numpy as np

from .backend import get_backend


@dataclass
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


#: CuPy elementwise kernels of :func:`bincount_or_zeros` (the atomic additions of
#: ``cupy.bincount``'s own kernels): one each, whatever the size of the data.
_BINCOUNT = ("S x", "raw int64 bins", "atomicAdd(&bins[x], 1LL)", "tractlens_bincount")
_BINCOUNT_WEIGHTED = ("S x, float64 w", "raw float64 bins", "atomicAdd(&bins[x], w)", "tractlens_bincount_weighted")


@functools.cache
def _kernels(xp):
    return xp.ElementwiseKernel(*_BINCOUNT), xp.ElementwiseKernel(*_BINCOUNT_WEIGHTED)


def bincount_or_zeros(xp, x, minlength: int, weights=None):
    """``xp.bincount`` that also takes an empty ``x`` (zeros of ``minlength``).

    With CuPy the counts are added by an elementwise kernel of atomic additions (as
    ``cupy.bincount``'s), after a minimum and a maximum of ``x`` (CuPy's CUB device-wide
    reductions): ``cupy.bincount`` itself first checks ``(x < 0).any()``, a reduction with no
    device-wide CUB routine, which with CuPy's CUB *block* reductions off
    (:func:`gpu.backend.gpu_status`) runs as a single thread block over the whole input, slow
    on the billions of visits and pair entries of a dense connectome. Counts are integers
    (exact in any order of addition); weighted sums are added atomically, as
    ``cupy.bincount`` adds them."""
    if len(x) == 0:
        return xp.zeros(minlength, dtype=xp.int64 if weights is None else xp.float64)
    if xp is np or not hasattr(xp, "ElementwiseKernel"):
        return xp.bincount(x, weights=weights, minlength=minlength)
    if x.ndim != 1 or x.dtype.kind not in "iu":
        raise TypeError("bincount takes a one-dimensional array of integers")
    if weights is not None and weights.shape != x.shape:
        raise ValueError("the weights and the values differ in length")
    x = xp.ascontiguousarray(x)  # CUB's device-wide reductions take contiguous data only
    low, high = int(x.min()), int(x.max())  # CUB device-wide reductions (CuPy's routines)
    if low < 0:
        raise ValueError("bincount counts non-negative integers")
    size = max(int(minlength), high + 1)
    count, weighted = _kernels(xp)
    if weights is None:
        bins = xp.zeros(size, dtype=xp.int64)
        count(x, bins)
    else:
        bins = xp.zeros(size, dtype=xp.float64)
        weighted(x, weights.astype(xp.float64, copy=False), bins)
    return bins


def count_true(xp, mask):
    """The number of true elements of a boolean array (a 0-d array of the array's module).
    With CuPy as an int64 sum, one of its CUB device-wide reductions (a boolean sum has
    none: with CUB block reductions off it would run as one thread block)."""
    if xp is np:
        return np.asarray(np.count_nonzero(mask), dtype=np.int64)
    return mask.astype(xp.int64).sum()


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
    sums = xp.stack([bincount_or_zeros(xp, segment, len(unique), v[:, i]) for i in range(v.shape[1])], 1)
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
        #: True: each reduction waits for the device before and after, and its seconds are
        #: added to :attr:`reduce_s` (a benchmark's phase timings; off, nothing waits)
        self.timed = False
        self.reduce_s = 0.0

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
        if self.timed:
            self.backend.synchronize()
            t0 = time.perf_counter()
            self._reduce_pending()
            self.backend.synchronize()
            self.reduce_s += time.perf_counter() - t0
        else:
            self._reduce_pending()

    def _reduce_pending(self) -> None:
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
