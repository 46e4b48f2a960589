"""COMMIT's operator split by voxel rows across the GPUs of one host (or simulated GPUs on the
CPU, :func:`gpu.multidevice.simulated_backends`), so a tractogram whose segments do not fit on
one GPU (10 M streamlines, about 4 G segments) is fitted with every segment resident somewhere.

The rows are cut into one contiguous range per device holding about the same number of
segments (:func:`balanced_row_ranges`); each device holds the operator of its rows
(:func:`gpu.commit_device.device_operator` on its :func:`gpu.commit_device.sub_problem`: all
streamlines' IC columns, the EC and ISO columns of its rows). FISTA's vectors live on the first
GPU. A·x: each device receives x's IC part and its EC/ISO columns (peer copies), computes its
rows, and the rows come back into y. Aᵀ·y: each device receives its rows of y and returns
Aᵀ of them; the IC parts are added on the first GPU (a reduction over the devices; the order
of that float64 sum is the only difference from one device), the EC and ISO parts placed. The
devices work at once, one host thread each.

A device that fails while its operator is built or applied is named
(:class:`gpu.multidevice.DeviceFailure`) and the fit stops: nothing is written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .backend import Backend
from .commit_device import device_operator, sub_problem
from .commit_operator import NumpyOperator, Problem
from .commit_segments import Segments, host_array
from .multidevice import DeviceFailure, device_label
from .multidevice_copy import peer_copy


def balanced_row_ranges(problem: Problem, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous voxel-row ranges with about equal numbers of segments (empty ones
    left out; a row is never split)."""
    starts = host_array(problem.segments.starts(problem.n_rows))
    n = int(starts[-1])
    cuts = [0]
    for k in range(1, parts):
        r = int(np.searchsorted(starts, n * k / parts, side="left"))
        cuts.append(min(max(r, cuts[-1]), problem.n_rows))
    cuts.append(problem.n_rows)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _onto(backend: Backend, sub: Problem) -> Problem:
    """``sub`` with its segments on ``backend``'s device (peer copies from the device they were
    built on; host segments are uploaded by the operator itself)."""
    seg = sub.segments
    if not (backend.is_gpu and seg.on_device) or int(seg.row.device.id) == backend.device_id:
        return sub
    row, fiber, length, orient = peer_copy((seg.row, seg.fiber, seg.length, seg.orient), int(seg.row.device.id))
    moved = Segments(row, fiber, length, orient, seg.n_fibers)
    return Problem(sub.n_rows, moved, sub.ec_row, sub.ec_orient, sub.lut_ic, sub.lut_ec, sub.lut_iso)


class SplitOperator:
    """A and Aᵀ of ``problem`` over ``backends``, one block of voxel rows each (see the module).
    ``parts``: (backend, sub-problem, r0, r1, e0, e1) per device, when the blocks were made on
    their devices already (the benchmark's synthetic problems); otherwise cut from ``problem``.
    ``make(backend, sub)``: a block's operator (default: the device operator on a GPU, the NumPy
    reference on a CPU backend)."""

    def __init__(
        self,
        backends: Sequence[Backend],
        problem: Problem,
        *,
        parts: Sequence[tuple] | None = None,
        make: Callable[[Backend, Problem], object] | None = None,
        notes: list | None = None,
    ):
        self.problem, self.backends = problem, list(backends)
        self.notes = notes if notes is not None else []
        self.first = self.backends[0]
        self.xp = self.first.xp
        if parts is None:
            ranges = balanced_row_ranges(problem, len(self.backends))
            parts = [(b, *_sub(problem, r0, r1)) for b, (r0, r1) in zip(self.backends, ranges, strict=False)]
        self.parts = [(b, r0, r1, e0, e1) for b, _, r0, r1, e0, e1 in parts]
        self.peaks = [0] * len(self.parts)  # each device's largest memory pool seen after a product
        default = make or self._make
        subs = [sub for _, sub, *_ in parts]
        self.ops = self._each(lambda i, b: default(b, _onto(b, subs[i])), "building its part of the operator")
        self.segments = [len(sub.segments) for sub in subs]

    def _make(self, backend: Backend, sub: Problem):
        if backend.is_gpu:
            return device_operator(backend, sub, notes=self.notes)
        return NumpyOperator(sub)

    def _each(self, fn, stage: str) -> list:
        """``fn(i, backend)`` on every device at once, its device current, waiting for its work;
        a failure is raised naming its device once all have ended."""

        def run(i: int):
            backend = self.parts[i][0]
            try:
                with backend.activate():
                    out = fn(i, backend)
                    backend.synchronize()
                    if backend.is_gpu:
                        held = int(backend.xp.get_default_memory_pool().total_bytes())
                        self.peaks[i] = max(self.peaks[i], held)
                    return out
            except Exception as exc:
                raise DeviceFailure(backend, stage, exc) from exc

        with ThreadPoolExecutor(len(self.parts), thread_name_prefix="tractlens-commit") as pool:  # none outlives it
            futures = [pool.submit(run, i) for i in range(len(self.parts))]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        return [f.result() for f in futures]

    def __len__(self) -> int:
        return len(self.parts)

    # -------------------------------------------------------------- vectors between devices
    def _to(self, backend: Backend, array):
        """A first-device array onto ``backend`` (current)."""
        if backend.is_gpu and self.first.is_gpu and backend.device_id != self.first.device_id:
            return peer_copy((array,), self.first.device_id)[0]
        return array

    def _back(self, backend: Backend, array):
        """``backend``'s array onto the first device (current)."""
        if backend.is_gpu and self.first.is_gpu and backend.device_id != self.first.device_id:
            return peer_copy((array,), backend.device_id)[0]
        return array

    def _columns(self, r0, r1, e0, e1) -> tuple[slice, slice]:
        p = self.problem
        iso0 = p.n_ic_cols + p.n_ec
        return slice(p.n_ic_cols + e0, p.n_ic_cols + e1), slice(iso0 + r0 * p.n_iso, iso0 + r1 * p.n_iso)

    # -------------------------------------------------------------- the products
    def a(self, x):
        xp, p = self.xp, self.problem
        x = xp.asarray(x, dtype=xp.float64).ravel()
        pieces = []
        for _, r0, r1, e0, e1 in self.parts:
            ec, iso = self._columns(r0, r1, e0, e1)
            pieces.append(xp.concatenate([x[: p.n_ic_cols], x[ec], x[iso]]))
        outs = self._each(lambda i, b: self.ops[i].a(self._to(b, pieces[i])), "computing A x")
        y = xp.empty(p.n_rows * p.n_meas)
        for (b, r0, r1, *_), out in zip(self.parts, outs, strict=True):
            y[r0 * p.n_meas : r1 * p.n_meas] = self._back(b, xp.ravel(out)) if b.is_gpu else np.ravel(out)
        return y

    def at(self, y):
        xp, p = self.xp, self.problem
        y = xp.asarray(y, dtype=xp.float64).ravel()
        rows = [y[r0 * p.n_meas : r1 * p.n_meas] for _, r0, r1, _, _ in self.parts]
        outs = self._each(lambda i, b: self.ops[i].at(self._to(b, rows[i])), "computing Aᵀ y")
        x = xp.zeros(p.n_cols)
        for (b, r0, r1, e0, e1), out in zip(self.parts, outs, strict=True):
            part = self._back(b, out)
            ec, iso = self._columns(r0, r1, e0, e1)
            x[: p.n_ic_cols] += part[: p.n_ic_cols]  # the reduction over devices
            x[ec] = part[p.n_ic_cols : p.n_ic_cols + (e1 - e0)]
            x[iso] = part[p.n_ic_cols + (e1 - e0) :]
        return x

    def column_norms(self) -> np.ndarray:
        """Column norms (host): squared norms add over the devices' rows."""
        p = self.problem
        parts = self._each(lambda i, b: np.asarray(self.ops[i].column_norms()) ** 2, "computing column norms")
        out = np.zeros(p.n_cols)
        for (_, r0, r1, e0, e1), part in zip(self.parts, parts, strict=True):
            ec, iso = self._columns(r0, r1, e0, e1)
            out[: p.n_ic_cols] += part[: p.n_ic_cols]
            out[ec] = part[p.n_ic_cols : p.n_ic_cols + (e1 - e0)]
            out[iso] = part[p.n_ic_cols + (e1 - e0) :]
        return np.sqrt(out)

    def provenance(self) -> dict:
        return {
            "gpus": len(self.parts),
            "rows_per_device": {device_label(b): r1 - r0 for b, r0, r1, _, _ in self.parts},
            "segments_per_device": {device_label(b): n for (b, *_), n in zip(self.parts, self.segments, strict=True)},
            "device_pool_peak_bytes": {device_label(b): n for (b, *_), n in zip(self.parts, self.peaks, strict=True)},
        }


def _sub(problem: Problem, r0: int, r1: int):
    sub, e0, e1 = sub_problem(problem, r0, r1)
    return sub, r0, r1, e0, e1


__all__ = ["SplitOperator", "balanced_row_ranges"]
