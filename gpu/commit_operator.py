"""COMMIT's linear operator A (Daducci et al. 2015; :mod:`gpu.commit`): the problem it is made of
and its NumPy reference.

A :class:`Problem` holds the segments sorted by voxel row, the EC compartments and the look-up
tables. A·x sums, per voxel row, the responses of its segments, compartments and isotropic
columns (row blocks, no atomics); Aᵀ·y takes the per-segment dot products and sums them per
streamline, in float64. :func:`apply_a_numpy` and :func:`apply_at_numpy` are the reference,
:func:`sparse_matrix` the explicit SciPy matrix for small problems, :class:`NumpyOperator` the
reference behind the operator interface (``a``, ``at``, ``column_norms``) that the solver
(:mod:`gpu.commit_solver`) and the device operators (:mod:`gpu.commit_device`) share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .commit import N_ORIENTATIONS
from .commit_segments import Segments, array_module, host_array, row_parts


# ------------------------------------------------------------------------------- the problem
@dataclass
class Problem:
    """Everything A is made of (host arrays): segments sorted by row, EC compartments (row,
    orientation; sorted by row), the look-up tables (``lut_ic`` (n_ic, 32761, M)), and column
    scales (A's columns divided by ``scale`` have unit norm; the fit works on those). Columns:
    IC response j of streamline f at ``j · n_fibers + f``, then EC, then ISO (row-major)."""

    n_rows: int
    segments: Segments
    ec_row: np.ndarray
    ec_orient: np.ndarray
    lut_ic: np.ndarray
    lut_ec: np.ndarray
    lut_iso: np.ndarray
    scale: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        if self.lut_ic.ndim == 2:  # one IC response
            self.lut_ic = self.lut_ic[None]
        seg = self.segments
        if not seg.has_row_array:  # sorted by construction: the starts must rise and cover all
            starts = seg.row_start
            if len(starts) - 1 > self.n_rows or starts[0] != 0 or starts[-1] != len(seg) or (np.diff(starts) < 0).any():
                raise ValueError(f"the segments' row starts do not describe {len(seg)} segments in {self.n_rows} rows")
        for rows in (seg.row, self.ec_row) if seg.has_row_array else (self.ec_row,):
            xp = array_module(rows)
            if len(rows) > 1 and bool(xp.any(rows[1:] < rows[:-1])):
                raise ValueError("segments and EC compartments must be sorted by voxel row")

    @property
    def n_meas(self) -> int:
        return int(self.lut_ic.shape[2])

    @property
    def n_ic(self) -> int:
        return int(self.lut_ic.shape[0])

    @property
    def n_fibers(self) -> int:
        return self.segments.n_fibers

    @property
    def n_ec(self) -> int:
        return len(self.ec_row)

    @property
    def n_iso(self) -> int:
        return int(self.lut_iso.shape[0])

    @property
    def n_cols(self) -> int:
        return self.n_ic * self.n_fibers + self.n_ec + self.n_rows * self.n_iso

    @property
    def n_ic_cols(self) -> int:
        return self.n_ic * self.n_fibers

    def split(self, x: np.ndarray):
        """(IC (n_ic, n_fibers), EC (n_ec,), ISO (n_rows, n_iso)) parts of a column vector."""
        a, b = self.n_ic_cols, self.n_ic_cols + self.n_ec
        return x[:a].reshape(self.n_ic, self.n_fibers), x[a:b], x[b:].reshape(self.n_rows, self.n_iso)


CHUNK = 1 << 18  # segments per step of the NumPy reference and of row-sorted passes (bounded memory)
DEVICE_CHUNK = 1 << 26  # segments per step of row-sorted passes over segments on the device


def ec_compartments(row: np.ndarray, orient: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """EC compartments (row, orientation), one per distinct pair, sorted by row (as
    :class:`Problem` needs)."""
    key = np.unique(np.asarray(row, dtype=np.int64) * N_ORIENTATIONS + orient)
    return (key // N_ORIENTATIONS).astype(np.int32), (key % N_ORIENTATIONS).astype(np.int32)


def row_chunks(row: np.ndarray, size: int | None = None):
    """Slices of about ``size`` (default :data:`CHUNK`) of row-sorted ``row`` that never split a
    row (``row`` on the host or the device)."""
    size = CHUNK if size is None else size
    xp = array_module(row)
    start, n = 0, len(row)
    while start < n:
        stop = min(start + size, n)
        if stop < n:  # extend to the end of the row it stops in
            stop = int(xp.searchsorted(row, row[stop - 1 : stop], side="right")[0])
        yield slice(start, stop)
        start = stop


def ec_from_segments(seg: Segments) -> tuple[np.ndarray, np.ndarray]:
    """EC compartments where no peaks file is given: one per (voxel, orientation) among the
    segments there (row by row in chunks: no per-segment int64 key of the whole), host arrays.
    Segments on the device are reduced there, in chunks of many rows, and only the distinct
    pairs come to the host."""
    if seg.on_device:
        xp = array_module(seg.fiber)
        keys = []
        for part in row_chunks(seg.row, DEVICE_CHUNK):
            keys.append(host_array(xp.unique(seg.row[part].astype(xp.int64) * N_ORIENTATIONS + seg.orient[part])))
        key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        return (key // N_ORIENTATIONS).astype(np.int32), (key % N_ORIENTATIONS).astype(np.int32)
    pairs = [ec_compartments(rows, seg.orient[part]) for part, rows in row_parts(seg, CHUNK)]
    if not pairs:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def ic_per_row(seg: Segments, fiber_weight: np.ndarray, n_rows: int) -> np.ndarray:
    """Σ length × weight of the segment's streamline, per voxel row (in chunks of whole rows: the
    same sums, in the same order, as one ``bincount``). Each chunk adds only to its own rows: a
    chunk never splits a row, so every row is one chunk's sum, as when each chunk's ``bincount``
    of all rows was added (0 + s is s), without an ``n_rows`` temporary per chunk."""
    if seg.on_device:
        return _device_ic_per_row(seg, fiber_weight, n_rows)
    out = np.zeros(n_rows)
    for part, rows in row_parts(seg, CHUNK):
        rows = host_array(rows)
        first, last = int(rows[0]), int(rows[-1]) + 1
        weights = host_array(seg.length[part]) * fiber_weight[host_array(seg.fiber[part])]
        out[first:last] += np.bincount(rows - first, weights=weights, minlength=last - first)
    return out


#: One thread per voxel row adds its segments' length × weight in their order, from 0: the
#: additions ``bincount`` makes, in the same order (the product rounded on its own: no FMA).
_ROW_SUMS = (
    "raw int64 start, raw float64 length, raw int32 fiber, raw float64 weight",
    "float64 out",
    "double s = 0.0; for (long long k = start[i]; k < start[i + 1]; ++k) s += __dmul_rn(length[k], weight[fiber[k]]);"
    " out = s;",
    "tractlens_commit_ic_per_row",
)


def _device_ic_per_row(seg: Segments, fiber_weight: np.ndarray, n_rows: int) -> np.ndarray:
    """:func:`ic_per_row` of segments on the device, computed there, bit for bit the host's."""
    xp = array_module(seg.fiber)
    start = seg.starts(n_rows)
    out = xp.empty(n_rows, dtype=xp.float64)
    if n_rows:
        kernel = xp.ElementwiseKernel(*_ROW_SUMS)
        weight = xp.asarray(np.asarray(fiber_weight, dtype=np.float64))
        kernel(start, seg.length, seg.fiber.astype(xp.int32, copy=False), weight, out)
    return host_array(out)


def _add_sorted(y: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """y[rows] += values for ``rows`` sorted ascending (summed per row with ``reduceat``, many
    times faster than ``np.add.at``)."""
    if not len(rows):
        return
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    y[rows[starts]] += np.add.reduceat(values, starts, axis=0)


def apply_a_numpy(problem: Problem, x: np.ndarray) -> np.ndarray:
    """y = A x, (n_rows, M) float64 (the reference)."""
    ic, ec, iso = problem.split(np.asarray(x, dtype=np.float64))
    seg = problem.segments
    row = seg.row  # made once from its starts when the segments have those
    y = iso @ problem.lut_iso.astype(np.float64)
    _add_sorted(y, problem.ec_row, ec[:, None] * problem.lut_ec[problem.ec_orient])
    for j in range(problem.n_ic):
        weight = seg.length * ic[j, seg.fiber]
        for s in range(0, len(seg), CHUNK):
            part = slice(s, s + CHUNK)
            _add_sorted(y, row[part], weight[part, None] * problem.lut_ic[j, seg.orient[part]])
    return y


def apply_at_numpy(problem: Problem, y: np.ndarray) -> np.ndarray:
    """x = Aᵀ y for y (n_rows, M), float64 (the reference)."""
    y = np.asarray(y, dtype=np.float64).reshape(problem.n_rows, problem.n_meas)
    seg = problem.segments
    row = seg.row
    dots = np.empty((problem.n_ic, len(seg)))
    for s in range(0, len(seg), CHUNK):
        part = slice(s, s + CHUNK)
        y_rows = y[row[part]]
        for j in range(problem.n_ic):
            dots[j, part] = np.einsum("ij,ij->i", problem.lut_ic[j, seg.orient[part]], y_rows)
    ic = np.concatenate([np.bincount(seg.fiber, weights=seg.length * d, minlength=problem.n_fibers) for d in dots])
    ec = np.einsum("ij,ij->i", problem.lut_ec[problem.ec_orient], y[problem.ec_row])
    iso = y @ problem.lut_iso.T.astype(np.float64)
    return np.concatenate([ic, ec, iso.ravel()])


def sparse_matrix(problem: Problem):
    """A as an explicit SciPy CSR matrix (rows: voxel × measurement), for small problems and tests."""
    from scipy import sparse

    m = problem.n_meas
    seg = problem.segments
    meas = np.arange(m)
    rows, cols, vals = [], [], []
    seg_row = seg.row
    for j in range(problem.n_ic):
        rows.append((seg_row[:, None] * m + meas).ravel())
        cols.append(np.repeat(j * problem.n_fibers + seg.fiber.astype(np.int64), m))
        vals.append((seg.length[:, None].astype(np.float64) * problem.lut_ic[j, seg.orient]).ravel())
    rows.append((problem.ec_row[:, None] * m + meas).ravel())
    cols.append(np.repeat(problem.n_ic_cols + np.arange(problem.n_ec), m))
    vals.append(problem.lut_ec[problem.ec_orient].ravel())
    for j in range(problem.n_iso):
        rows.append((np.arange(problem.n_rows)[:, None] * m + meas).ravel())
        cols.append(np.repeat(problem.n_ic_cols + problem.n_ec + np.arange(problem.n_rows) * problem.n_iso + j, m))
        vals.append(np.tile(problem.lut_iso[j], problem.n_rows))
    shape = (problem.n_rows * m, problem.n_cols)
    matrix = sparse.coo_matrix(
        (np.concatenate(vals).astype(np.float64), (np.concatenate(rows), np.concatenate(cols))), shape=shape
    )
    return matrix.tocsr()  # duplicates summed


def column_norms(problem: Problem) -> np.ndarray:
    """‖A e_j‖ for every column (exact: IC columns summed per (streamline, voxel) first)."""
    seg = problem.segments
    ic = np.zeros((problem.n_ic, problem.n_fibers))
    key = seg.fiber.astype(np.int64) * problem.n_rows + seg.row
    order = np.argsort(key, kind="stable")
    key_sorted = key[order]
    bounds = np.flatnonzero(np.r_[True, key_sorted[1:] != key_sorted[:-1], True])
    for s in range(0, len(bounds) - 1, CHUNK):  # groups of (fiber, voxel)
        b = bounds[s : s + CHUNK + 1]
        members = order[b[0] : b[-1]]
        for j in range(problem.n_ic):
            vectors = seg.length[members, None].astype(np.float64) * problem.lut_ic[j, seg.orient[members]]
            summed = np.add.reduceat(vectors, b[:-1] - b[0], axis=0)
            np.add.at(ic[j], seg.fiber[members[b[:-1] - b[0]]], (summed**2).sum(1))
    ec = ec_column_norms2(problem)
    iso = np.tile((problem.lut_iso.astype(np.float64) ** 2).sum(1), problem.n_rows)
    return np.sqrt(np.concatenate([ic.ravel(), ec, iso]))


#: Orientations of the EC table squared and summed at a time
EC_NORM_ROWS = 512


def ec_column_norms2(problem: Problem) -> np.ndarray:
    """‖A e_j‖² of the EC columns: each column is its orientation's row of the EC table, so the
    squared norm is that row's, computed once per orientation and looked up (the same sum of
    the same row in the same order as per column, bit for bit; gathering each column's response
    cost n_ec × M float64 of traffic: half a minute for a whole-brain tractogram)."""
    table = np.asarray(problem.lut_ec)
    per_orientation = np.empty(len(table))
    for start in range(0, len(table), EC_NORM_ROWS):  # a few MB of float64 at a time
        per_orientation[start : start + EC_NORM_ROWS] = (
            table[start : start + EC_NORM_ROWS].astype(np.float64) ** 2
        ).sum(1)
    orient = problem.ec_orient
    return per_orientation[orient if isinstance(orient, np.ndarray) else host_array(orient)]


class NumpyOperator:
    """The NumPy reference with the operator interface (flat vectors)."""

    def __init__(self, problem: Problem):
        self.problem = problem

    def a(self, x):
        return apply_a_numpy(self.problem, x).ravel()

    def at(self, y):
        return apply_at_numpy(self.problem, y)

    def column_norms(self) -> np.ndarray:
        return column_norms(self.problem)
