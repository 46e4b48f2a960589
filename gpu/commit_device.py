"""COMMIT's operator on the GPU: A and Aᵀ as CUDA kernels (``kernels/commit.cu``) on a problem
copied to the device once (:class:`DeviceOperator`), or in blocks of voxel rows re-sent each
iteration when it does not fit (:class:`BlockedOperator`); :func:`device_operator` picks.
The NumPy reference they match is :mod:`gpu.commit_operator`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import cuda
from .commit_operator import Problem, ec_column_norms2
from .commit_segments import Segments, array_module, host_array

KERNEL_NAMES = ("commit_a", "commit_at_rows", "commit_at_fibers", "commit_ic_norms")


def kernel_defines(n_meas: int, n_ic: int, n_orient: int) -> tuple[tuple[str, int], ...]:
    """What kernels/commit.cu receives at compile time: measurements per lane (up to
    32 · MPL measurements), IC responses per streamline and orientations per look-up table."""
    mpl = max(1, -(-n_meas // 32))
    if mpl > 32:
        raise ValueError(f"{n_meas} measurements: at most 1024 are supported")
    return (("MPL", mpl), ("NIC", int(n_ic)), ("NORIENT", int(n_orient)))


def kernels(problem: Problem) -> tuple:
    """The four kernels of :class:`DeviceOperator` (:data:`KERNEL_NAMES`), compiled for ``problem``."""
    defines = kernel_defines(problem.n_meas, problem.n_ic, problem.lut_ic.shape[1])
    return tuple(cuda.function("commit.cu", name, (), defines) for name in KERNEL_NAMES)


class DeviceOperator:
    """A and Aᵀ as CUDA kernels on a :class:`Problem` copied to the device once
    (``gpu/kernels/commit.cu``): segments sorted by voxel row for A·x, a permutation listing
    them by streamline for Aᵀ·y; float64 accumulation, no atomics. Vectors are device arrays:
    x (n_cols,), y flat (n_rows · M,)."""

    BLOCK = 128

    def __init__(self, backend, problem: Problem):
        cp = self.cp = backend.xp
        self.backend, self.problem = backend, problem
        seg = problem.segments
        self._a, self._at_rows, self._at_fibers, self._norms = kernels(problem)

        def starts(keys, n):  # where each of 0..n begins in sorted keys (device arrays)
            return cp.searchsorted(keys, cp.arange(n + 1, dtype=keys.dtype)).astype(cp.int64)

        # The compact host arrays go up as they are and are widened on the device: no host copies
        # (segments built on the device are used where they are).
        row = cp.asarray(seg.row).astype(cp.int32, copy=False)
        fiber = cp.asarray(seg.fiber).astype(cp.int32, copy=False)
        self.row_start = starts(row, problem.n_rows)
        self.ec_start = starts(cp.asarray(problem.ec_row).astype(cp.int32, copy=False), problem.n_rows)
        # Segments listed by streamline, rows ascending within each (the norms kernel groups by row).
        if seg.by_fiber is not None:
            self.order = cp.asarray(seg.by_fiber).astype(cp.int64, copy=False)
        else:
            self.order = cp.argsort(fiber.astype(cp.int64) * max(problem.n_rows, 1) + row).astype(cp.int64)
        self.fiber_start = starts(fiber[self.order], problem.n_fibers)
        self.seg_row, self.seg_fiber = row, fiber
        self.seg_len = cp.asarray(seg.length).astype(cp.float64, copy=False)
        self.seg_orient = cp.asarray(seg.orient).astype(cp.int32)
        self.ec_orient = cp.asarray(problem.ec_orient).astype(cp.int32, copy=False)
        self.luts = tuple(
            cp.asarray(np.ascontiguousarray(t, dtype=np.float32))
            for t in (problem.lut_ic, problem.lut_ec, problem.lut_iso)
        )
        self.seg_value = cp.empty(len(seg) * problem.n_ic, dtype=cp.float64)
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        self.grid_rows = max(1, min(-(-problem.n_rows * 32 // self.BLOCK), props["multiProcessorCount"] * 64))
        self.grid_fibers = max(1, min(-(-problem.n_fibers // self.BLOCK), props["multiProcessorCount"] * 64))
        self.grid_fibers_warps = max(
            1, min(-(-problem.n_ic_cols * 32 // self.BLOCK), props["multiProcessorCount"] * 64)
        )

    def column_norms(self) -> np.ndarray:
        """:func:`gpu.commit_operator.column_norms` with the IC columns computed on the device (host array)."""
        cp, p = self.cp, self.problem
        norm2 = cp.empty(p.n_ic_cols, dtype=cp.float64)
        args = (self.order, self.fiber_start, np.int32(p.n_fibers), np.int32(p.n_meas), self.seg_row, self.seg_len)
        self._norms((self.grid_fibers_warps,), (self.BLOCK,), (*args, self.seg_orient, self.luts[0], norm2))
        ec = ec_column_norms2(p)
        iso = np.tile((p.lut_iso.astype(np.float64) ** 2).sum(1), p.n_rows)
        return np.sqrt(np.concatenate([self.backend.to_host(norm2), ec, iso]))

    def _sizes(self):
        p = self.problem
        return (np.int32(p.n_rows), np.int32(p.n_meas), np.int32(p.n_fibers), np.int32(p.n_ec), np.int32(p.n_iso))

    def a(self, x):
        """A x: flat (n_rows · M,) float64 on the device."""
        cp = self.cp
        x = cp.ascontiguousarray(cp.asarray(x, dtype=cp.float64))
        y = cp.empty(self.problem.n_rows * self.problem.n_meas, dtype=cp.float64)
        args = (x, *self._sizes(), self.row_start, self.seg_fiber, self.seg_len, self.seg_orient)
        self._a((self.grid_rows,), (self.BLOCK,), (*args, self.ec_start, self.ec_orient, *self.luts, y))
        return y

    def at(self, y):
        """Aᵀ y: (n_cols,) float64 on the device."""
        cp = self.cp
        y = cp.ascontiguousarray(cp.asarray(y, dtype=cp.float64).ravel())
        x = cp.empty(self.problem.n_cols, dtype=cp.float64)
        args = (y, *self._sizes(), self.row_start, self.seg_len, self.seg_orient, self.ec_start, self.ec_orient)
        self._at_rows((self.grid_rows,), (self.BLOCK,), (*args, *self.luts, self.seg_value, x))
        args = (self.seg_value, self.order, self.fiber_start, np.int32(self.problem.n_fibers), x)
        self._at_fibers((self.grid_fibers,), (self.BLOCK,), args)
        return x


# ------------------------------------------------------------- problems larger than the device
#: Device bytes per segment while a :class:`DeviceOperator` exists and is being built (its
#: arrays, the per-segment values and the sort's temporaries), for planning blocks.
DEVICE_BYTES_PER_SEGMENT = 96
#: What a :class:`DeviceOperator` adds per segment to segments already on the device with their
#: listing by streamline (per-segment values, orientations widened, a gathered streamline index)
RESIDENT_EXTRA_BYTES_PER_SEGMENT = 24


def row_blocks(problem: Problem, max_segments: int) -> list[tuple[int, int]]:
    """Contiguous voxel-row ranges holding at most ``max_segments`` segments each (a row with
    more is a block of its own)."""
    starts = host_array(problem.segments.starts(problem.n_rows))
    blocks, r0 = [], 0
    while r0 < problem.n_rows:
        r1 = int(np.searchsorted(starts, starts[r0] + max(1, max_segments), side="right")) - 1
        r1 = min(max(r1, r0 + 1), problem.n_rows)
        blocks.append((r0, r1))
        r0 = r1
    return blocks


def sub_problem(problem: Problem, r0: int, r1: int) -> tuple[Problem, int, int]:
    """The rows ``r0 … r1 − 1`` of A as a problem of their own (all streamlines' IC columns, the
    EC and ISO columns of those rows), and the range of its EC compartments in the whole."""
    seg = problem.segments
    e0, e1 = (int(v) for v in np.searchsorted(problem.ec_row, [r0, r1]))
    if seg.has_row_array:
        xp = array_module(seg.row)
        s0, s1 = (int(v) for v in host_array(xp.searchsorted(seg.row, xp.asarray([r0, r1], dtype=seg.row.dtype))))
        row, row_start = (seg.row[s0:s1] - r0).astype(np.int32), None
    else:  # the rows' starts, shifted: nothing per segment
        starts = seg.starts(r1)[r0:]
        s0, s1 = int(starts[0]), int(starts[-1])
        row, row_start = None, starts - s0
    part = Segments(row, seg.fiber[s0:s1], seg.length[s0:s1], seg.orient[s0:s1], seg.n_fibers, row_start=row_start)
    sub = Problem(
        r1 - r0,
        part,
        (problem.ec_row[e0:e1] - r0).astype(np.int32),
        problem.ec_orient[e0:e1],
        problem.lut_ic,
        problem.lut_ec,
        problem.lut_iso,
    )
    return sub, e0, e1


class BlockedOperator:
    """A and Aᵀ in blocks of voxel rows, for problems whose segments do not fit on the device
    at once: each product builds one block's operator (``make(sub_problem)``, e.g. a
    :class:`DeviceOperator`), applies it and frees it before the next. A·x fills each block's
    rows; Aᵀ·y adds each block's part of the streamline columns (a streamline's voxels may lie
    in several blocks) and sets its EC and ISO columns. Slower than one resident operator (the
    segments cross the bus twice per FISTA iteration) but bounded in device memory. A block
    that still runs out of memory (``is_oom``) halves the block size and the product restarts."""

    def __init__(
        self,
        problem: Problem,
        make: Callable[[Problem], object],
        max_segments: int,
        xp=np,
        is_oom: Callable[[BaseException], bool] | None = None,
        free_cache: Callable[[], None] | None = None,
    ):
        self.problem, self.make, self.xp = problem, make, xp
        self.is_oom = is_oom or (lambda exc: isinstance(exc, MemoryError))
        self.free_cache = free_cache or (lambda: None)
        self._split(max_segments)

    def _split(self, max_segments: int) -> None:
        self.max_segments = max(1, int(max_segments))
        self.blocks = [
            (r0, r1, *sub_problem(self.problem, r0, r1)) for r0, r1 in row_blocks(self.problem, max_segments)
        ]

    def _retrying(self, product):
        while True:
            try:
                return product()
            except Exception as exc:
                if not self.is_oom(exc) or self.max_segments == 1:
                    raise
                self.free_cache()
                self._split(self.max_segments // 2)

    def __len__(self) -> int:
        return len(self.blocks)

    def _columns(self, r0: int, r1: int, e0: int, e1: int) -> tuple[slice, slice]:
        p = self.problem
        ec = slice(p.n_ic_cols + e0, p.n_ic_cols + e1)
        iso0 = p.n_ic_cols + p.n_ec
        return ec, slice(iso0 + r0 * p.n_iso, iso0 + r1 * p.n_iso)

    def a(self, x):
        return self._retrying(lambda: self._a(x))

    def at(self, y):
        return self._retrying(lambda: self._at(y))

    def column_norms(self) -> np.ndarray:
        """Column norms (host) from the blocks' operators: squared norms add over voxel rows."""
        return self._retrying(self._column_norms)

    def _a(self, x):
        xp, p = self.xp, self.problem
        x = xp.asarray(x, dtype=xp.float64).ravel()
        y = xp.empty(p.n_rows * p.n_meas)
        for r0, r1, sub, e0, e1 in self.blocks:
            ec, iso = self._columns(r0, r1, e0, e1)
            op = self.make(sub)
            y[r0 * p.n_meas : r1 * p.n_meas] = xp.ravel(op.a(xp.concatenate([x[: p.n_ic_cols], x[ec], x[iso]])))
            del op
        return y

    def _at(self, y):
        xp, p = self.xp, self.problem
        y = xp.asarray(y, dtype=xp.float64).ravel()
        x = xp.zeros(p.n_cols)
        for r0, r1, sub, e0, e1 in self.blocks:
            ec, iso = self._columns(r0, r1, e0, e1)
            op = self.make(sub)
            part = op.at(y[r0 * p.n_meas : r1 * p.n_meas])
            x[: p.n_ic_cols] += part[: p.n_ic_cols]
            x[ec] = part[p.n_ic_cols : p.n_ic_cols + sub.n_ec]
            x[iso] = part[p.n_ic_cols + sub.n_ec :]
            del op
        return x

    def _column_norms(self) -> np.ndarray:
        p = self.problem
        out = np.zeros(p.n_cols)
        for r0, r1, sub, e0, e1 in self.blocks:
            ec, iso = self._columns(r0, r1, e0, e1)
            part = np.asarray(self.make(sub).column_norms()) ** 2
            out[: p.n_ic_cols] += part[: p.n_ic_cols]
            out[ec] = part[p.n_ic_cols : p.n_ic_cols + sub.n_ec]
            out[iso] = part[p.n_ic_cols + sub.n_ec :]
        return np.sqrt(out)


def fista_bytes(problem: Problem) -> int:
    """Device bytes FISTA keeps besides the operator: about 16 vectors of the columns (x, z,
    their updates, scales, gradient) and 6 of the measurements (y, A x, A z, residuals), float64."""
    return 8 * (16 * problem.n_cols + 6 * problem.n_rows * problem.n_meas)


def device_operator(backend, problem: Problem, *, max_segments: int | None = None, notes: list | None = None):
    """The operator for ``problem`` on ``backend``: one resident :class:`DeviceOperator` when it
    fits in the free device memory next to FISTA's vectors, else (or when ``max_segments`` says
    so) a :class:`BlockedOperator` of device operators over blocks sized to what is left; a note
    says so. Out of device memory while building the resident one also falls back to blocks."""
    n_seg = max(1, len(problem.segments))
    per_segment = DEVICE_BYTES_PER_SEGMENT * problem.n_ic
    if problem.segments.on_device and problem.segments.by_fiber is not None:
        per_segment = RESIDENT_EXTRA_BYTES_PER_SEGMENT * problem.n_ic  # the segments are there already

    def budget() -> int:  # segments that fit in half of what FISTA leaves free
        return max(1, (backend.free_memory_bytes() - fista_bytes(problem)) // 2 // per_segment)

    if max_segments is None and n_seg <= budget():
        try:
            return DeviceOperator(backend, problem)
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            backend.free_cached_memory()
    op = BlockedOperator(
        problem,
        lambda sub: DeviceOperator(backend, sub),
        max_segments or budget(),
        backend.xp,
        is_oom=backend.is_out_of_memory,
        free_cache=backend.free_cached_memory,
    )
    if notes is not None:
        notes.append(
            f"the problem ({n_seg:,} segments) does not fit in the device's free memory at once: "
            f"A and Aᵀ run in {len(op)} blocks of voxel rows, re-sent each iteration (slower)"
        )
    return op
