"""COMMIT's operator on the CPU as SciPy sparse products (the CPU engine of :mod:`gpu.commit`).

The IC block of A factors through the distinct (voxel, orientation) pairs that the segments
fall on: ``A_IC = B · S`` with

- ``S`` (pairs × streamlines), the summed segment lengths of each streamline on each pair
  (as many non-zeros as segments), and
- ``B`` (voxels · M × pairs), the look-up table row of each pair's orientation in its voxel's
  measurements (M non-zeros a pair).

A streamline bundle puts many segments on one pair (parallel streamlines, 1° orientations), so
``B`` is several times smaller than the segments × M products that the reference
(:func:`gpu.commit.apply_a_numpy`) gathers, and both products run in SciPy's compiled sparse
mat-vec (``A x = B (S x)``, ``Aᵀ y = Sᵀ (Bᵀ y)``). The EC and ISO columns of A are further
columns of ``B`` (so no small dense product calls the BLAS, whose threads cost more than they
save at these sizes on a busy machine). Everything is float64, as the reference; the
sums run in another order (results agree to about 1e-15 relative).

Only ``Bᵀ`` is stored (a CSR matrix whose rows are the pairs, built without sorting); ``B`` is
its transpose view (CSC), whose mat-vec SciPy runs as fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import get_backend
from .commit import N_ORIENTATIONS
from .commit_operator import CHUNK, NumpyOperator, Problem, row_chunks
from .commit_segments import row_parts

__all__ = [
    "OrientationPairs",
    "SparseOperator",
    "cpu_operator",
    "orientation_pairs",
    "pair_structure",
    "sparse_operator_bytes",
]

#: Peak bytes per stored non-zero of Bᵀ while it is built and kept (values, column indices,
#: the float64 table rows gathered for it).
BYTES_PER_NONZERO = 24
#: Bytes per segment of S (int32 streamline index, float64 length) and of its building.
BYTES_PER_SEGMENT = 16
#: (voxel, orientation) pairs per block of the column norms (bounds their working memory).
NORM_BLOCK_PAIRS = 1 << 12


def orientation_pairs(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (voxel row, orientation) pairs of the segments, sorted by row: (row,
    orientation, pair of each segment)."""
    seg = problem.segments
    key = seg.row.astype(np.int64) * N_ORIENTATIONS + seg.orient
    pairs, pair_of_segment = np.unique(key, return_inverse=True)
    return (pairs // N_ORIENTATIONS).astype(np.int64), pairs % N_ORIENTATIONS, pair_of_segment.ravel()


@dataclass
class OrientationPairs:
    """The distinct (voxel row, orientation) pairs, sorted, and S (pairs × streamlines) as CSR
    arrays: each pair's segments by streamline, their summed lengths."""

    row: np.ndarray  # (n_pairs,) int32
    orient: np.ndarray  # (n_pairs,) int32
    indptr: np.ndarray  # (n_pairs + 1,)
    fiber: np.ndarray  # (n_segments,) int32
    length: np.ndarray  # (n_segments,) float64

    def __len__(self) -> int:
        return len(self.row)


def pair_structure(problem: Problem) -> OrientationPairs:
    """:class:`OrientationPairs` of ``problem``'s segments (sorted by row): each chunk of whole
    rows re-sorted stably by orientation and written into S's preallocated arrays, so no
    per-segment int64 key, inverse or COO triplet of the whole exists."""
    seg = problem.segments
    n = len(seg)
    index = np.int32 if n < np.iinfo(np.int32).max else np.int64
    fiber, length = np.empty(n, dtype=index), np.empty(n)
    pair_rows, pair_orients, pair_sizes = [], [], []
    for part, rows in row_parts(seg, CHUNK):
        key = rows.astype(np.int64) * N_ORIENTATIONS + seg.orient[part]
        order = np.argsort(key, kind="stable")  # within a pair, streamlines stay ascending
        key = key[order]
        fiber[part], length[part] = seg.fiber[part][order], seg.length[part][order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        pair_rows.append((key[starts] // N_ORIENTATIONS).astype(np.int32))
        pair_orients.append((key[starts] % N_ORIENTATIONS).astype(np.int32))
        pair_sizes.append(np.diff(np.r_[starts, len(key)]))
    if not pair_rows:
        return OrientationPairs(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, index), fiber, length)
    indptr = np.r_[0, np.cumsum(np.concatenate(pair_sizes))].astype(index)
    return OrientationPairs(np.concatenate(pair_rows), np.concatenate(pair_orients), indptr, fiber, length)


def sparse_operator_bytes(problem: Problem, n_pairs: int | None = None) -> int:
    """Host bytes a :class:`SparseOperator` for ``problem`` needs at its peak (``n_pairs``: the
    distinct (voxel, orientation) pairs; at most one per segment when not given)."""
    n_pairs = len(problem.segments) if n_pairs is None else n_pairs
    nonzeros = (problem.n_ic * n_pairs + problem.n_ec + problem.n_rows * problem.n_iso) * problem.n_meas
    return BYTES_PER_NONZERO * nonzeros + BYTES_PER_SEGMENT * len(problem.segments)


class SparseOperator:
    """A and Aᵀ of a :class:`~gpu.commit_operator.Problem` as SciPy sparse products (module docstring),
    with the interface of :class:`~gpu.commit_operator.NumpyOperator`: flat float64 vectors, x
    (n_cols,) and y (n_rows · M,)."""

    def __init__(self, problem: Problem, pairs: OrientationPairs | None = None):
        from scipy import sparse

        self.problem = p = problem
        pairs = pair_structure(p) if pairs is None else pairs
        self.n_pairs = n_pairs = len(pairs)
        self.pair_row = pairs.row
        self.s = sparse.csr_matrix((pairs.length, pairs.fiber, pairs.indptr), shape=(n_pairs, p.n_fibers), copy=False)
        m = p.n_meas
        n_b = p.n_ic * n_pairs + p.n_ec + p.n_rows * p.n_iso  # rows of Bᵀ: A's columns after S
        index = np.int32 if max(p.n_rows * m, n_b * m) < np.iinfo(np.int32).max else np.int64
        meas = np.arange(m, dtype=index)
        voxel_of_row = np.concatenate(
            [np.tile(pairs.row, p.n_ic), p.ec_row, np.repeat(np.arange(p.n_rows), p.n_iso)]
        ).astype(index)
        columns = (voxel_of_row[:, None] * m + meas).ravel()
        del voxel_of_row
        values = np.empty((n_b, m))  # filled in chunks: no float32 gather or list of the whole
        for j in range(p.n_ic):
            for s in range(0, n_pairs, CHUNK):
                stop = min(s + CHUNK, n_pairs)
                values[j * n_pairs + s : j * n_pairs + stop] = p.lut_ic[j][pairs.orient[s:stop]]
        e0 = p.n_ic * n_pairs
        for s in range(0, p.n_ec, CHUNK):
            stop = min(s + CHUNK, p.n_ec)
            values[e0 + s : e0 + stop] = p.lut_ec[p.ec_orient[s:stop]]
        values[e0 + p.n_ec :] = np.tile(p.lut_iso.astype(np.float64), (p.n_rows, 1))
        indptr = np.arange(n_b + 1, dtype=index) * m
        self.bt = sparse.csr_matrix((values.ravel(), columns, indptr), shape=(n_b, p.n_rows * m), copy=False)

    def a(self, x) -> np.ndarray:
        """A x, flat (n_rows · M,) float64."""
        p = self.problem
        x = np.asarray(x, dtype=np.float64)
        on_pairs = self.s @ x[: p.n_ic_cols].reshape(p.n_ic, p.n_fibers).T  # (n_pairs, n_ic)
        return self.bt.T @ np.concatenate([on_pairs.T.ravel(), x[p.n_ic_cols :]])

    def at(self, y) -> np.ndarray:
        """Aᵀ y, (n_cols,) float64."""
        p = self.problem
        on_b = self.bt @ np.asarray(y, dtype=np.float64).ravel()
        split = p.n_ic * self.n_pairs
        ic = self.s.T @ on_b[:split].reshape(p.n_ic, self.n_pairs).T  # (n_fibers, n_ic)
        return np.concatenate([ic.T.ravel(), on_b[split:]])

    def column_norms(self) -> np.ndarray:
        """‖A e_j‖ for every column, exact: for IC response j, ‖B_j S e_f‖² = (Sᵀ G_j S)_ff with
        ``G_j = B_jᵀ B_j``, non-zero only between pairs of one voxel; so it is taken over blocks of
        whole voxels (:data:`NORM_BLOCK_PAIRS` pairs), each block's terms added to the streamline's
        sum in pair order (the sums of one whole product, in its order)."""
        p = self.problem
        ic = np.zeros((p.n_ic, p.n_fibers))
        pair_row = self.pair_row
        for j in range(p.n_ic):
            for block in row_chunks(pair_row, NORM_BLOCK_PAIRS):
                bt_j = self.bt[j * self.n_pairs + block.start : j * self.n_pairs + block.stop]
                s_block = self.s[block]
                terms = s_block.multiply((bt_j @ bt_j.T) @ s_block).tocsr()
                np.add.at(ic[j], terms.indices, terms.data)
        rest = np.empty(self.bt.shape[0] - p.n_ic * self.n_pairs)
        first = p.n_ic * self.n_pairs
        for s in range(0, len(rest), NORM_BLOCK_PAIRS):  # EC and ISO columns: one row of Bᵀ each
            part = self.bt[first + s : first + min(s + NORM_BLOCK_PAIRS, len(rest))]
            rest[s : s + NORM_BLOCK_PAIRS] = np.asarray(part.multiply(part).sum(axis=1)).ravel()
        return np.sqrt(np.concatenate([np.maximum(ic.ravel(), 0.0), rest]))


def cpu_operator(problem: Problem, *, notes: list | None = None, available_bytes: int | None = None):
    """The CPU operator for ``problem``: a :class:`SparseOperator` when it fits in half of the
    host's available memory (``available_bytes``; MemAvailable when not given), else the
    chunked NumPy reference (:class:`~gpu.commit_operator.NumpyOperator`, bounded memory, many times
    slower), with a note saying so."""
    pairs = pair_structure(problem)
    needed = sparse_operator_bytes(problem, len(pairs))
    available = get_backend("cpu").free_memory_bytes() if available_bytes is None else available_bytes
    if needed <= available // 2:
        return SparseOperator(problem, pairs)
    if notes is not None:
        notes.append(
            f"the sparse CPU operator would need {needed / 2**30:.1f} GiB of the {available / 2**30:.1f} GiB "
            "available: A and Aᵀ run in the chunked NumPy reference instead (slower)"
        )
    del pairs
    return NumpyOperator(problem)
