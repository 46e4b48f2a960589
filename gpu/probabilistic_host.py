"""Probabilistic tracking on the CPU as a compiled loop: one streamline at a time, threads over
blocks of streamlines (the ``"compiled"`` engine of :mod:`gpu.probabilistic`).

The loop (:mod:`gpu.probabilistic_loops`, numba: the ``cpu`` extra) is the NumPy reference
:func:`gpu.probabilistic_numpy.track_numpy` streamline by streamline: the same Philox streams
and the same float64 arithmetic in the same order, so it takes the same steps and gives the same
totals bit for bit — path distribution, waytotal, seed × target counts, seed × seed matrix and
steps — and, recorded, the same positions (tests/test_probabilistic_host.py). Every option of the
reference is covered: waypoints (AND/OR), exclusion, stop and target masks, curvature
threshold, step length, ``n_steps``, ``randfib``, ``fibthresh``, ``loopcheck``, ``modeuler``,
the seed matrix, recorded steps and run positions.

The reference advances a batch of streamlines together as array operations, paying NumPy's
per-call cost at every step for arrays that empty as the streamlines end, and keeps its visits
in a bitmap of streamlines × brain voxels that limits a batch to some hundred streamlines on an
HCP grid. The compiled loop follows each streamline to its end, keeps its voxels in a small hash
set, and runs without the GIL on :func:`gpu.host.host_threads` threads. Each block's kept
streamlines are added to the totals under a lock (integer counts: the order of the blocks does
not matter). Cancellation is asked on the calling thread before each block is handed out: once
it says yes no further block starts, and :class:`gpu.backend.Cancelled` is raised when the
blocks under way have ended.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait

import numpy as np

from .backend import Cancelled
from .host import NUMBA_HINT, compile_or_uncached, host_threads, numba_module, thread_pool
from .probabilistic_params import (
    TARGET_SHIFT,
    WAYPOINT_SHIFT,
    ProbParams,
    ProbResult,
    SampleField,
    empty_seed_matrix,
    run_length,
    streamline_ids,
)
from .rng import seed_key

__all__ = ["COMPILED_BATCH", "CompiledTracker", "available", "track_compiled", "track_on_host"]

#: Streamlines per batch of a run when the caller gives none (running totals every ~0.1-1 s
#: on a laptop's cores; nothing is kept per streamline beyond a block, so a batch may be large).
COMPILED_BATCH = 65_536
#: Blocks per thread in a batch (streamlines differ in length: smaller blocks balance the
#: threads), each of at least :data:`SMALLEST_BLOCK` and at most :data:`LARGEST_BLOCK`
#: streamlines (a cancel waits for the blocks under way: some tenths of a second on an HCP grid).
BLOCKS_PER_THREAD = 4
SMALLEST_BLOCK, LARGEST_BLOCK = 16, 1024
#: Entries of a block's list of kept streamlines' voxels, flushed into the totals when it could
#: not hold another streamline's (int32: 1 MiB per thread; an HCP streamline has some hundred).
VOXEL_BUFFER = 1 << 18
#: Host bytes of recorded steps a trace chunk may take (:func:`trace_chunk`).
TRACE_CHUNK_BYTES = 64 * 2**20


def available() -> bool:
    """Whether the compiled loop can run (numba installed and not disabled)."""
    return numba_module() is not None


def require() -> None:
    """Raise when the compiled engine was asked for and numba is missing."""
    if not available():
        raise ValueError(f"the 'compiled' engine needs numba: {NUMBA_HINT}; or use engine='numpy'")


def _loops():
    from . import probabilistic_loops

    return probabilistic_loops


def trace_chunk(params: ProbParams) -> int:
    """Streamlines recorded at a time: their (2, n_steps + 1, 4) float64 steps in
    :data:`TRACE_CHUNK_BYTES`."""
    return max(1, TRACE_CHUNK_BYTES // (2 * (params.n_steps + 1) * 4 * 8))


class CompiledTracker:
    """A run's inputs prepared for the compiled loop and its running totals, added to by
    :meth:`run` (any run positions, in any number of calls) and read by :meth:`result`."""

    def __init__(
        self,
        field_: SampleField,
        bits: np.ndarray,
        seeds: np.ndarray,
        params: ProbParams,
        n_targets: int = 0,
        n_waypoints: int = 0,
        *,
        seed_matrix: bool = False,
        threads: int | None = None,
    ):
        require()
        self.field, self.params = field_, params
        self.n_targets, self.threads = n_targets, threads or host_threads()
        self.dirs = np.ascontiguousarray(field_.dirs, dtype=np.float32)
        self.f = np.ascontiguousarray(field_.f, dtype=np.float32)
        self.index = np.ascontiguousarray(field_.index, dtype=np.int32)
        self.bits = np.ascontiguousarray(bits, dtype=np.uint32)
        self.seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
        n_seeds, n_vox = len(self.seeds), int(np.prod(field_.shape))
        self.paths = np.zeros(n_vox, dtype=np.int64)
        self.seed_targets = np.zeros((n_seeds, n_targets), dtype=np.int64)
        self.seed_number = np.zeros(0, dtype=np.int32)
        self.seed_matrix = np.zeros((0, 0), dtype=np.int64)
        if seed_matrix:
            self.seed_matrix = empty_seed_matrix(n_seeds)
            self.seed_number = np.full(n_vox, -1, dtype=np.int32)
            self.seed_number[np.ravel_multi_index(tuple(self.seeds.T), field_.shape)] = np.arange(n_seeds)
        self.has_matrix = seed_matrix
        self.waytotal = self.steps = self.streamlines = 0
        self.lock = threading.Lock()
        key0, key1 = seed_key(params.seed)
        waymask = sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints))
        self.args = (
            params.n_steps, params.randfib, bool(params.loopcheck), bool(params.modeuler),
            np.asarray(params.step_mm / field_.voxel_size, dtype=np.float64), float(params.cthr),
            float(params.fibthresh), np.uint64(key0), np.uint64(key1), waymask, params.waycond == "AND",
        )  # fmt: skip
        cap = 1 << int(np.ceil(np.log2(2 * (2 * params.n_steps + 1))))
        self.table_slots, self.buffer = cap, max(VOXEL_BUFFER, 2 * (2 * params.n_steps + 1))
        self.loops = compile_or_uncached(_loops, self._compile, "probabilistic_loops")

    def _compile(self, loops) -> None:
        """Each loop called on no streamlines (compiled for these arrays' types)."""
        ids, of = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        trace = np.zeros((0, 2, 1, 4))
        self._block(loops, ids, of, trace, False)

    def _block(self, loops, sids, seed_of, trace, record):
        """Track the streamlines ``sids`` and add them to the totals; the steps each tried per half (n, 2)."""
        n = len(sids)
        kept = np.zeros(n, dtype=np.bool_)
        hits = np.zeros(n, dtype=np.int64)
        moves = np.zeros(n, dtype=np.int64)
        executed = np.zeros((n, 2), dtype=np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        voxels = np.empty(self.buffer, dtype=np.int32)
        table = np.zeros(self.table_slots, dtype=np.uint64)
        lo = 0
        while True:
            if lo:  # a fresh voxel list and table for the rest (stamps restart with each call)
                offsets[lo] = 0
                table.fill(0)
            hi = loops.track_streamlines(
                self.dirs, self.f, self.index, self.bits, self.seeds, sids, seed_of, lo, n, *self.args,
                table, voxels, offsets, kept, hits, moves, executed, trace, record,
            )  # fmt: skip
            with self.lock:
                loops.accumulate(self.paths, self.seed_targets, self.seed_matrix, self.seed_number, lo, hi, seed_of,
                                 kept, hits, voxels, offsets, TARGET_SHIFT)  # fmt: skip
                self.waytotal += int(kept[lo:hi].sum())
                self.steps += int(moves[lo:hi].sum())
                self.streamlines += hi - lo
            if hi >= n:
                return executed
            lo = hi

    def run(
        self,
        first: int = 0,
        count: int | None = None,
        *,
        positions: np.ndarray | None = None,
        cancelled: Callable[[], bool] | None = None,
        trace: np.ndarray | None = None,
    ) -> np.ndarray:
        """Track run positions ``first .. first + count`` (or ``positions``) on the threads,
        adding them to the totals; with ``trace`` ((n, 2, n_steps + 1, 4) float64) record their
        steps. Returns the steps tried per streamline and half (n, 2). :class:`Cancelled` when
        ``cancelled()`` says so (the totals then hold part of these streamlines)."""
        n_seeds, n_samples = len(self.seeds), self.params.n_samples
        n = run_length(first, count, positions, n_seeds, n_samples)
        sid, seed_of = streamline_ids(first, n, n_seeds, n_samples, positions)
        sid, seed_of = np.ascontiguousarray(sid), np.ascontiguousarray(seed_of)
        record = trace is not None
        trace = trace if record else np.zeros((0, 2, 1, 4))
        executed = np.zeros((n, 2), dtype=np.int64)
        size = int(np.clip(-(-n // (self.threads * BLOCKS_PER_THREAD)), SMALLEST_BLOCK, LARGEST_BLOCK))
        bounds = [*range(0, n, size), n]

        def block(lo: int, hi: int):
            part = trace[lo:hi] if record else trace
            executed[lo:hi] = self._block(self.loops, sid[lo:hi], seed_of[lo:hi], part, record)

        tasks = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
        if self.threads <= 1 or len(tasks) <= 1:
            for lo, hi in tasks:
                if cancelled is not None and cancelled():
                    raise Cancelled()
                block(lo, hi)
            return executed
        # At most one block per thread in flight; the next is handed out when one ends, after
        # asking the caller's cancelled() on this thread (it need not be safe to call from others).
        pool, pending = thread_pool(self.threads), set()
        try:
            for lo, hi in tasks:
                if cancelled is not None and cancelled():
                    raise Cancelled()
                pending.add(pool.submit(block, lo, hi))
                if len(pending) >= self.threads:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()
        finally:
            for future in wait(pending).done:  # the blocks under way end (their totals are added)
                future.result()
        return executed

    def result(self, provenance: dict | None = None) -> ProbResult:
        """The totals so far (copies)."""
        with self.lock:
            return ProbResult(
                self.paths.reshape(self.field.shape).copy(),
                self.waytotal,
                self.seed_targets.copy(),
                self.streamlines,
                {"threads": self.threads, **(provenance or {})},
                steps=self.steps,
                seed_matrix=self.seed_matrix.copy() if self.has_matrix else None,
            )


def track_compiled(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    n_targets: int = 0,
    n_waypoints: int = 0,
    first_id: int = 0,
    count: int | None = None,
    record: bool = False,
    positions: np.ndarray | None = None,
    seed_matrix: bool = False,
    *,
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
):
    """:func:`gpu.probabilistic_numpy.track_numpy` (same arguments, same results) with the
    compiled loop on ``threads`` threads. With ``record`` also the steps as the reference
    records them: per half (n, 1 + steps the longest of that half tried, 4): x, y, z, alive."""
    tracker = CompiledTracker(field_, bits, seeds, params, n_targets, n_waypoints, seed_matrix=seed_matrix,
                              threads=threads)  # fmt: skip
    n = run_length(first_id, count, positions, len(tracker.seeds), params.n_samples)
    trace = np.empty((n, 2, params.n_steps + 1, 4)) if record else None
    executed = tracker.run(first_id, n, positions=positions, cancelled=cancelled, trace=trace)
    result = tracker.result()
    result.provenance = {}
    if not record:
        return result
    halves = [trace[:, half, : 1 + int(executed[:, half].max(initial=0))] for half in (0, 1)]
    return result, halves


def track_on_host(*args, **kwargs):
    """The host's tracker of :func:`gpu.probabilistic_numpy.track_numpy`'s arguments: the
    compiled loop when numba is installed, else the reference itself."""
    if available():
        return track_compiled(*args, **kwargs)
    from .probabilistic_numpy import track_numpy

    return track_numpy(*args, **kwargs)
