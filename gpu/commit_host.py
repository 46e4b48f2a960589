"""COMMIT's operator on the CPU, compact: the segments as they are, threads over voxel rows.

A and Aᵀ of :class:`~gpu.commit_operator.Problem` read the row-sorted segments in place (int32
streamline, float32 length, uint16 orientation; the rows as one start per voxel row, as the
segments cut on the host hold them: :attr:`~gpu.commit_segments.Segments.row_start`), as
:class:`~gpu.commit_device.DeviceOperator` does on the GPU: no float64 or int64 copy of a
per-segment array, no transposed duplicate, no sparse matrix. Host memory per segment is
therefore the segments' own (:data:`~gpu.commit_segments.HOST_SEGMENT_BYTES`), whatever the
number of measurements; each length is widened to float64 as it is read.

Each product runs on :func:`gpu.host.host_threads` threads over contiguous blocks of voxel
rows (balanced by segments):

- ``A x``: per voxel row, the segments' weights ``ℓ · x_f`` are summed per orientation first
  (segments of many streamlines share a voxel's few orientations), then each distinct
  orientation adds its weight times its look-up table row: ``M`` multiply-adds per
  (voxel, orientation) pair rather than per segment — the factorisation of
  :mod:`gpu.commit_sparse` without storing it. Rows are disjoint: no atomics.
- ``Aᵀ y``: per voxel row, the dot product of each distinct orientation's table row with the
  row's measurements, once; each segment adds ``ℓ · dot`` to its streamline in the thread's
  own accumulator (one float64 per streamline and IC response per thread), summed after.
- column norms: per voxel row, each streamline's summed response there, squared.

The loops are compiled by numba (the ``cpu`` extra) and release the GIL; without numba, the
same row blocks run in NumPy (the chunked reference's arithmetic), several times slower.
Sums are float64 in another order than the reference: results agree to about 1e-13 relative.
"""

from __future__ import annotations

import itertools

import numpy as np

from . import commit, commit_device, commit_operator, commit_segments
from .host import compile_or_uncached, host_threads, numba_module, release_freed_memory, run_parallel

__all__ = ["CPU_FIT_DTYPE", "HostOperator", "host_operator", "host_operator_bytes", "load_loops"]

#: The signal's type in the CPU engine's fit (the float32 signal taken as it is). With the
#: compiled loops no other measurement-sized vector is kept (A x and A z are made row by row,
#: :meth:`HostOperator.step`); without them FISTA's A x and A z are float32 too, each value summed
#: in float64 and rounded once when stored. On the test phantoms the weights stay within ~1e-8
#: relative of a float64 fit (tests/test_commit_cpu.py).
CPU_FIT_DTYPE = np.float32
#: A x of a fit with the fused loops (float64, voxels × measurements) larger than this is not
#: made whole on the host: its error maps come from blocks of rows (app.pipelines.commit).
MODEL_HOST_BYTES = 512 << 20
#: Host bytes per streamline and IC response per thread (the Aᵀ and norms accumulators).
ACCUMULATOR_BYTES = 8
#: Row blocks per thread of A x (disjoint rows: more blocks balance the threads better).
A_BLOCKS_PER_THREAD = 4


def host_operator_bytes(n_rows: int, n_fibers: int, n_ic: int, n_meas: int, threads: int | None = None) -> int:
    """Host bytes a :class:`HostOperator` adds to its problem: row starts, the threads'
    accumulators and scratch (nothing per segment)."""
    threads = threads or host_threads()
    per_thread = ACCUMULATOR_BYTES * n_ic * n_fibers + 8 * n_ic * commit.N_ORIENTATIONS * 2 + 8 * n_meas * 8
    per_thread += 8 * commit.N_ORIENTATIONS * (n_ic + 2)  # the fused loop's marks and dot products
    return 8 * (2 * n_rows + 2) + threads * per_thread


def _kernels():
    """The compiled row loops (numba), or None without numba."""
    if numba_module() is None:
        return None
    from . import commit_loops

    return (
        commit_loops.a_rows,
        commit_loops.at_rows,
        commit_loops.norms_rows,
        commit_loops.fused_rows,
        commit_loops.step_rows,
    )


def load_loops(tables: dict[str, np.ndarray]) -> bool:
    """Compile the row loops (or load them from numba's cache) on a one-segment problem with a
    job's look-up tables (:func:`gpu.commit.lookup_tables`: the loops' array types), before the
    job's own arrays exist. The first compilation takes up to ~400 MB for a moment; made inside
    the job (:class:`HostOperator`), that comes on top of the segments and the signal, at the
    job's peak. False without numba (nothing to load)."""
    if _kernels() is None:
        return False
    step = np.array([[0.0, 0.0, 0.0], [0.25, 0.0, 0.0]], dtype=np.float32)
    seg = commit_segments.segments(step, np.array([0, 2]), np.zeros((1, 1, 1), dtype=np.int64), np.ones(3))
    ec_row, ec_orient = commit_operator.ec_from_segments(seg)
    HostOperator(commit_operator.Problem(1, seg, ec_row, ec_orient, tables["ic"], tables["ec"], tables["iso"]), 1)
    release_freed_memory()  # the compiler's working memory back to the system
    return True


def _balanced_blocks(row_start: np.ndarray, n_blocks: int) -> list[np.ndarray]:
    """``n_blocks`` contiguous row ranges of about equal segments (plus one per row, so that
    empty rows count), as int64 row arrays."""
    n_rows = len(row_start) - 1
    if n_rows == 0:
        return []
    work = row_start[1:] + np.arange(1, n_rows + 1)
    cuts = np.searchsorted(work, np.linspace(0, work[-1], n_blocks + 1)[1:-1], side="right")
    bounds = np.unique(np.r_[0, cuts, n_rows])
    return [np.arange(a, b, dtype=np.int64) for a, b in itertools.pairwise(bounds) if b > a]


class HostOperator:
    """A and Aᵀ of a :class:`~gpu.commit_operator.Problem` on host threads (module docstring), with the
    interface of :class:`~gpu.commit_operator.NumpyOperator`: flat float64 vectors, x (n_cols,) and
    y (n_rows · M,). ``a`` and ``at`` also write into given vectors (``out=``), and take or give
    float32 measurement vectors."""

    #: ``a(x, out=)`` and ``at(y, out=)`` (:func:`gpu.commit_solver.fista`'s ``writes_into``)
    writes_into = True

    def __init__(self, problem: commit_operator.Problem, threads: int | None = None):
        self.problem = p = problem
        seg = p.segments
        if seg.on_device:
            raise ValueError("the host operator needs the segments on the host")
        self.threads = threads or host_threads()
        self.row_start = np.ascontiguousarray(seg.starts(p.n_rows), dtype=np.int64)  # no per-segment rows read
        self.ec_start = np.searchsorted(p.ec_row, np.arange(p.n_rows + 1)).astype(np.int64)
        self.ec_orient = np.ascontiguousarray(p.ec_orient, dtype=np.int32)
        self.luts = tuple(np.ascontiguousarray(t, dtype=np.float32) for t in (p.lut_ic, p.lut_ec, p.lut_iso))
        self.kernels = None if _kernels() is None else compile_or_uncached(_kernels, self._compile, "commit_loops")
        self.a_blocks = _balanced_blocks(self.row_start, self.threads * A_BLOCKS_PER_THREAD)
        self.t_blocks = _balanced_blocks(self.row_start, self.threads)  # one accumulator each

    def _compile(self, kernels) -> None:
        """Each loop called on no rows (compiled for these arrays' types, nothing computed)."""
        p, none = self.problem, np.zeros(0, dtype=np.int64)
        lut_ic, lut_ec, lut_iso = self.luts
        ic, iso = np.zeros((p.n_ic, p.n_fibers)), np.zeros((p.n_rows, p.n_iso))
        scratch = np.zeros((p.n_ic, commit.N_ORIENTATIONS))
        mark = np.zeros(commit.N_ORIENTATIONS, dtype=np.int64)
        ec = np.zeros(p.n_ec)
        for dtype in (np.float64, np.float32):  # the measurement vectors' two types (gpu.commit_solver)
            y = np.zeros((0, p.n_meas), dtype=dtype)
            kernels[0](none, *self._segments(), ic, lut_ic, self.ec_start, self.ec_orient, ec, lut_ec, iso, lut_iso,
                       y, scratch, mark, mark.copy(), np.zeros(p.n_meas), 0)  # fmt: skip
            kernels[1](none, *self._segments(), lut_ic, self.ec_start, self.ec_orient, lut_ec, lut_iso, y, ic, ec,
                       iso, scratch, mark)  # fmt: skip
        kernels[2](none, *self._segments(), lut_ic, ic, np.zeros((p.n_ic, p.n_meas)))
        m64 = np.zeros(p.n_meas)
        kernels[3](none, *self._segments(), ic, ec, iso, ic, ec, iso, lut_ic, self.ec_start, self.ec_orient, lut_ec,
                   lut_iso, ic, ec, iso, scratch, mark, mark.copy(), m64, scratch)  # fmt: skip
        kernels[4](none, *self._segments(), ic, ec, iso, ic, ec, iso, ic, ec, iso, lut_ic, self.ec_start,
                   self.ec_orient, lut_ec, lut_iso, np.zeros((0, p.n_meas), dtype=np.float32), np.float64(0.0), True,
                   ic, ec, iso, scratch, scratch.copy(), mark, mark.copy(), m64, m64.copy(), scratch.copy(),
                   np.zeros(1))  # fmt: skip

    @property
    def compiled(self) -> bool:
        return self.kernels is not None

    def _scratch(self):
        p = self.problem
        mark = np.full(commit.N_ORIENTATIONS, -1, dtype=np.int64)
        return np.empty((p.n_ic, commit.N_ORIENTATIONS)), mark

    def _segments(self):
        seg = self.problem.segments
        return self.row_start, seg.fiber, seg.length, seg.orient

    def a(self, x, out=None) -> np.ndarray:
        """A x, flat (n_rows · M,): float64, or written into ``out`` (float64 or float32: each
        row summed in float64, rounded once when stored)."""
        p = self.problem
        ic, ec, iso = p.split(np.ascontiguousarray(x, dtype=np.float64))
        ic, iso = np.ascontiguousarray(ic), np.ascontiguousarray(iso)
        y = np.empty((p.n_rows, p.n_meas)) if out is None else _rows_view(out, p)
        lut_ic, lut_ec, lut_iso = self.luts

        def block(rows):
            def run():
                if self.kernels is None:
                    return _a_rows_numpy(
                        p, self.row_start, self.ec_start, rows, ic, ec, iso, lut_ic, lut_ec, lut_iso, y
                    )
                weight, mark = self._scratch()
                touched = np.empty(commit.N_ORIENTATIONS, dtype=np.int64)
                self.kernels[0](rows, *self._segments(), ic, lut_ic, self.ec_start, self.ec_orient, ec, lut_ec, iso,
                                lut_iso, y, weight, mark, touched, np.empty(p.n_meas), 0)  # fmt: skip

            return run

        run_parallel([block(rows) for rows in self.a_blocks], self.threads)
        return y.ravel() if out is None else out

    def at(self, y, out=None) -> np.ndarray:
        """Aᵀ y, (n_cols,) float64 (into ``out`` when given); ``y`` float64 or float32 (read
        as it is, widened per value)."""
        p = self.problem
        y = np.asarray(y)
        if y.dtype not in (np.float32, np.float64):
            y = y.astype(np.float64)
        y = np.ascontiguousarray(y.reshape(p.n_rows, p.n_meas))
        if out is None:
            out = np.zeros(p.n_cols)
        else:
            out[...] = 0.0
        _, out_ec, out_iso = p.split(out)
        lut_ic, lut_ec, lut_iso = self.luts

        def block(rows):
            def run():
                acc = np.zeros((p.n_ic, p.n_fibers))
                if self.kernels is None:
                    _at_rows_numpy(p, self.row_start, self.ec_start, rows, y, lut_ic, lut_ec, lut_iso, acc, out_ec,
                                   out_iso)  # fmt: skip
                    return acc
                dots, mark = self._scratch()
                self.kernels[1](rows, *self._segments(), lut_ic, self.ec_start, self.ec_orient, lut_ec, lut_iso, y,
                                acc, out_ec, out_iso, dots, mark)  # fmt: skip
                return acc

            return run

        ic = out[: p.n_ic_cols].reshape(p.n_ic, p.n_fibers)
        for acc in run_parallel([block(rows) for rows in self.t_blocks], self.threads):
            ic += acc  # in block order: the same sums for the same thread count
        return out

    def a_rows(self, x, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0 … r1 − 1`` of A x, (r1 − r0, M) float64: the values of :meth:`a`'s rows, bit for
        bit (each row is summed on its own), without the rest."""
        p = self.problem
        ic, ec, iso = p.split(np.ascontiguousarray(x, dtype=np.float64))
        ic, iso = np.ascontiguousarray(ic), np.ascontiguousarray(iso)
        y = np.empty((r1 - r0, p.n_meas))
        lut_ic, lut_ec, lut_iso = self.luts
        rows = np.arange(r0, r1, dtype=np.int64)
        if self.kernels is None:
            full = self.a(x)  # the NumPy rows need a whole vector
            return full.reshape(p.n_rows, p.n_meas)[r0:r1].copy()
        weight, mark = self._scratch()
        touched = np.empty(commit.N_ORIENTATIONS, dtype=np.int64)
        self.kernels[0](rows, *self._segments(), ic, lut_ic, self.ec_start, self.ec_orient, ec, lut_ec, iso, lut_iso,
                        y, weight, mark, touched, np.empty(p.n_meas), r0)  # fmt: skip
        return y

    def fused(self, x, inv, out=None) -> np.ndarray:
        """Aᵀ A (x · inv) in one visit of every voxel row, with no measurement-sized vector (the
        power iteration's product; the compiled loops only: :attr:`compiled`), into ``out`` when
        given. Aᵀ's blocks are :meth:`at`'s (one accumulator per thread, summed in block order)."""
        self._need_loops()
        p = self.problem
        (x_ic, x_ec, x_iso), (inv_ic, inv_ec, inv_iso) = self._columns(x), self._columns(inv)
        out = self._zeroed(out)
        _, out_ec, out_iso = p.split(out)
        lut_ic, lut_ec, lut_iso = self.luts

        def block(rows):
            def run():
                acc = np.zeros((p.n_ic, p.n_fibers))
                weight, mark = self._scratch()
                touched = np.empty(commit.N_ORIENTATIONS, dtype=np.int64)
                self.kernels[3](rows, *self._segments(), x_ic, x_ec, x_iso, inv_ic, inv_ec, inv_iso, lut_ic,
                                self.ec_start, self.ec_orient, lut_ec, lut_iso, acc, out_ec, out_iso, weight, mark,
                                touched, np.empty(p.n_meas), np.empty((p.n_ic, commit.N_ORIENTATIONS)))  # fmt: skip
                return acc

            return run

        self._sum_into(out, run_parallel([block(rows) for rows in self.t_blocks], self.threads))
        return out

    def step(self, x_new, x_old, inv, y, beta: float, out=None, *, transpose: bool = True) -> float:
        """FISTA's step (:func:`gpu.commit_solver.fista_fused`) in one visit of every voxel row,
        with no measurement-sized vector kept: A x_new and A z for z = x_new + β (x_new − x_old)
        (the columns times ``inv``) made row by row from the segments, ``out = Aᵀ (A z − y)``
        (with ``transpose``) and the return value ‖A x_new − y‖². ``y`` (n_rows · M,) float32 or
        float64. The compiled loops only. Each thread's squared residual and accumulator are
        summed in block order: the same values for the same thread count."""
        self._need_loops()
        p = self.problem
        xn, xo, scale = self._columns(x_new), self._columns(x_old), self._columns(inv)
        y_rows = _rows_view(np.asarray(y), p)
        if transpose:
            out = self._zeroed(out)
            _, out_ec, out_iso = p.split(out)
        else:
            out_ec, out_iso = np.zeros(0), np.zeros((0, p.n_iso))  # not written
        lut_ic, lut_ec, lut_iso = self.luts
        beta = np.float64(beta)

        def block(rows):
            def run():
                acc = np.zeros((p.n_ic, p.n_fibers)) if transpose else np.zeros((p.n_ic, 0))
                wn, mark = self._scratch()
                residual2 = np.zeros(1)
                self.kernels[4](rows, *self._segments(), *xn, *xo, *scale, lut_ic, self.ec_start, self.ec_orient,
                                lut_ec, lut_iso, y_rows, beta, transpose, acc, out_ec, out_iso, wn, np.empty_like(wn),
                                mark, np.empty(commit.N_ORIENTATIONS, dtype=np.int64), np.empty(p.n_meas),
                                np.empty(p.n_meas), np.empty((p.n_ic, commit.N_ORIENTATIONS)), residual2)  # fmt: skip
                return acc, residual2[0]

            return run

        blocks = self.t_blocks if transpose else self.a_blocks
        parts = run_parallel([block(rows) for rows in blocks], self.threads)
        if transpose:
            self._sum_into(out, [acc for acc, _ in parts])
        return float(sum(value for _, value in parts))  # in block order

    def _need_loops(self) -> None:
        if self.kernels is None:
            raise RuntimeError("the fused products need the compiled loops (numba)")

    def _columns(self, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A column vector's IC, EC and iso parts, contiguous float64 (views where it is one)."""
        ic, ec, iso = self.problem.split(np.ascontiguousarray(v, dtype=np.float64))
        return np.ascontiguousarray(ic), ec, np.ascontiguousarray(iso)

    def _zeroed(self, out) -> np.ndarray:
        if out is None:
            return np.zeros(self.problem.n_cols)
        out[...] = 0.0
        return out

    def _sum_into(self, out: np.ndarray, accumulators) -> None:
        p = self.problem
        ic = out[: p.n_ic_cols].reshape(p.n_ic, p.n_fibers)
        for acc in accumulators:
            ic += acc  # in block order: the same sums as at()

    def column_norms(self) -> np.ndarray:
        """‖A e_j‖ for every column (exact: each streamline's response summed per voxel first)."""
        p = self.problem
        lut_ic = self.luts[0]

        def block(rows):
            def run():
                if self.kernels is None:
                    return _norms_rows_numpy(p, self.row_start, rows)
                out2 = np.zeros((p.n_ic, p.n_fibers))
                self.kernels[2](rows, *self._segments(), lut_ic, out2, np.empty((p.n_ic, p.n_meas)))
                return out2

            return run

        ic = np.zeros((p.n_ic, p.n_fibers))
        for part in run_parallel([block(rows) for rows in self.t_blocks], self.threads):
            ic += part
        ec = commit_operator.ec_column_norms2(p)
        iso = np.tile((p.lut_iso.astype(np.float64) ** 2).sum(1), p.n_rows)
        return np.sqrt(np.concatenate([ic.ravel(), ec, iso]))


# ------------------------------------------------------------------ without numba: NumPy
def _segment_range(row_start: np.ndarray, rows: np.ndarray) -> slice:
    return slice(int(row_start[rows[0]]), int(row_start[rows[-1] + 1])) if len(rows) else slice(0, 0)


def _rows_view(out: np.ndarray, p) -> np.ndarray:
    """``out`` (flat, contiguous, float64 or float32) seen as (n_rows, M), without a copy."""
    if out.dtype not in (np.float32, np.float64) or not out.flags.c_contiguous or out.size != p.n_rows * p.n_meas:
        raise ValueError("out must be a contiguous float64 or float32 vector of n_rows · M values")
    return out.reshape(p.n_rows, p.n_meas)


def _a_rows_numpy(p, row_start, ec_start, rows, ic, ec, iso, lut_ic, lut_ec, lut_iso, y) -> None:
    r0, r1 = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
    block = y[r0:r1] if y.dtype == np.float64 else np.empty((r1 - r0, y.shape[1]))  # summed in float64
    block[:] = iso[r0:r1] @ lut_iso.astype(np.float64)
    e = slice(int(ec_start[r0]), int(ec_start[r1]))
    commit_operator._add_sorted(block, p.ec_row[e] - r0, ec[e, None] * lut_ec[p.ec_orient[e]])
    seg, whole = p.segments, _segment_range(row_start, rows)
    for start in range(whole.start, whole.stop, commit_operator.CHUNK):
        part = slice(start, min(start + commit_operator.CHUNK, whole.stop))
        rel = seg.rows_of(part) - r0
        for j in range(p.n_ic):
            weight = seg.length[part] * ic[j, seg.fiber[part]]
            commit_operator._add_sorted(block, rel, weight[:, None] * lut_ic[j, seg.orient[part]])
    if y.dtype != np.float64:  # stored once, rounded once
        y[r0:r1] = block


def _at_rows_numpy(p, row_start, ec_start, rows, y, lut_ic, lut_ec, lut_iso, acc, out_ec, out_iso) -> None:
    r0, r1 = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)
    out_iso[r0:r1] = y[r0:r1] @ lut_iso.T.astype(np.float64)
    e = slice(int(ec_start[r0]), int(ec_start[r1]))
    out_ec[e] = np.einsum("ij,ij->i", lut_ec[p.ec_orient[e]], y[p.ec_row[e]].astype(np.float64, copy=False))
    seg, whole = p.segments, _segment_range(row_start, rows)
    for start in range(whole.start, whole.stop, commit_operator.CHUNK):
        part = slice(start, min(start + commit_operator.CHUNK, whole.stop))
        y_rows = y[seg.rows_of(part)].astype(np.float64, copy=False)
        for j in range(p.n_ic):
            dots = np.einsum("ij,ij->i", lut_ic[j, seg.orient[part]], y_rows)
            acc[j] += np.bincount(seg.fiber[part], weights=seg.length[part] * dots, minlength=p.n_fibers)


def _norms_rows_numpy(p, row_start, rows) -> np.ndarray:
    """Squared IC column norms of the block's rows: the reference on the block's own problem."""
    if not len(rows):
        return np.zeros((p.n_ic, p.n_fibers))
    sub, _, _ = commit_device.sub_problem(p, int(rows[0]), int(rows[-1]) + 1)
    return commit_operator.column_norms(sub)[: p.n_ic_cols].reshape(p.n_ic, p.n_fibers) ** 2


def host_operator(
    problem: commit_operator.Problem, *, notes: list | None = None, threads: int | None = None
) -> HostOperator:
    """The CPU operator of ``problem`` (:class:`HostOperator`); a note says when its loops run
    without numba."""
    op = HostOperator(problem, threads)
    if notes is not None and not op.compiled:
        from .host import compiled_note

        notes.append(compiled_note())
    return op
