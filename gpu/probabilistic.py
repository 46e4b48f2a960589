"""Probabilistic tractography from ball & sticks posterior samples, probtrackx style
(Behrens et al. 2007, probtrackx; Hernández et al. 2013, on the GPU).

Every seed voxel sends ``n_samples`` streamlines from uniform random points in it.
Each streamline is tracked in two halves from its start point, the second starting
against the first's initial direction; a step:

1. takes the voxel to sample from: per axis, the upper neighbour of the position
   with probability equal to the position's fractional part (trilinear weights);
2. takes one posterior sample of that voxel uniformly, and in it the stick best
   aligned with the previous direction among those with f > ``fibthresh`` (stick 1
   when none is); on a half's first step without a previous direction the stick is
   given by ``randfib``: 0 stick 1, 1 uniform among f > fibthresh, 2 proportional to f;
3. flips the stick to agree with the previous direction and stops the half when the
   cosine between them is below ``cthr``;
4. moves ``step_mm`` along it (``modeuler``: along the mean of it and the direction
   sampled the same way at the Euler end point).

A half stops when it leaves the grid or the brain mask, after ``n_steps`` steps, on
a sharp turn, on entering a stop voxel (which is counted), or — with ``loopcheck`` —
on re-entering a voxel it has left. Entering an exclusion voxel discards the whole
streamline. A kept streamline (``waycond`` AND: it met every waypoint mask, OR: at
least one; all kept without waypoints) adds one to every voxel it visited (once per
streamline, however often it passes) in the path distribution, and one per target
mask reached to its seed voxel's row of the seed × target counts.

FSL's loop check compares directions on a coarse grid; ours stops a half that
re-enters a voxel of the streamline it has already left, which uses the set of
visited voxels the counting keeps anyway.

Masks reach the engine as one uint32 volume of bits (:func:`gpu.probabilistic_params.mask_bits`).
Random numbers: Philox4x32-10 (:mod:`gpu.rng`), one stream per
streamline (counter: draw, purpose and half, streamline id); the streamline id is
``seed voxel number × n_samples + k`` for sample k, so results do not depend on
batching. Streamlines are run in the order j = k × n_seeds + seed voxel number
(sample k of every seed voxel before sample k + 1; :func:`streamline_ids`), so a
batch — a range of j — spreads over all the seed voxels and the path distribution
fills in evenly while a run goes on.

This module runs the method (:func:`iter_track`, :func:`track`; the streamlines traced again as
polylines, :func:`trace_paths` and :func:`trace_kept`, are in :mod:`gpu.probabilistic_trace`); its
parameters and data are in :mod:`gpu.probabilistic_params`, the NumPy reference in
:mod:`gpu.probabilistic_numpy`, the compiled CPU loop (numba, the CPU default when installed) in
:mod:`gpu.probabilistic_host`, the CUDA kernel's wrapper in :mod:`gpu.probabilistic_kernel`,
the run split over several GPUs in :mod:`gpu.probabilistic_split` and the connectome modes in
:mod:`gpu.connectome`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict

import numpy as np

from . import probabilistic_host
from .backend import Cancelled, get_backend
from .engines import COMPILED, KERNEL, NUMPY, choose_engine
from .probabilistic_kernel import KernelTracker
from .probabilistic_numpy import track_numpy
from .probabilistic_params import (
    GPU_BATCH,
    NUMPY_BITMAP_BYTES,
    ProbParams,
    ProbResult,
    SampleField,
    numpy_batch,
)
from .probabilistic_trace import trace_kept as trace_kept  # re-exported: the run's streamlines as polylines
from .probabilistic_trace import trace_paths as trace_paths


def path_positions(total: int, most: int) -> np.ndarray:
    """Run positions of the streamlines to save: all of them, or the first ``most`` in the
    run's order — the first samples of every seed voxel alike (:func:`streamline_ids`)."""
    return np.arange(min(total, most), dtype=np.int64)


ENGINES = (KERNEL, COMPILED, NUMPY)


def host_engine(engine: str, backend) -> str:
    """The engine that runs: ``engine`` checked (:func:`gpu.engines.choose_engine`), ``"auto"``
    on the CPU being the compiled loop when numba is installed, else the NumPy reference."""
    requested = engine
    engine = choose_engine(engine, backend, available=ENGINES, method="probabilistic tracking")
    if engine == COMPILED and not probabilistic_host.available():
        if requested == COMPILED:
            probabilistic_host.require()
        engine = NUMPY
    return engine


def default_batch(engine: str, bits, n_seeds: int) -> int:
    """Streamlines per batch of ``engine`` when the caller gives none."""
    if engine == KERNEL:
        return GPU_BATCH
    return probabilistic_host.COMPILED_BATCH if engine == COMPILED else numpy_batch(bits, n_seeds)


def largest_batch(n_voxels: int, backend) -> int:
    """The most streamlines one batch may hold with the engine ``"auto"`` picks on ``backend``:
    the GPU's batch, the compiled loop's (it keeps nothing per streamline beyond a block), or
    what the NumPy reference's visit bitmap allows over a grid of ``n_voxels``."""
    engine = host_engine("auto", backend)
    if engine == NUMPY:
        return max(1, NUMPY_BITMAP_BYTES // max(1, n_voxels))
    return GPU_BATCH if engine == KERNEL else probabilistic_host.COMPILED_BATCH


def iter_track(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    *,
    n_targets: int = 0,
    n_waypoints: int = 0,
    device="auto",
    engine: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_streamlines: int | None = None,
    device_field=None,
    seed_matrix: bool = False,
    first_batch: int | None = None,
) -> Iterator[ProbResult]:
    """Track every streamline of every seed voxel in batches, yielding the running totals
    (a fresh :class:`ProbResult`) after each, so a viewer can show the path distribution
    filling in; the last one is the result. ``engine``: ``"kernel"`` (GPU), ``"compiled"`` (the
    CPU default when numba is installed: :mod:`gpu.probabilistic_host`, the same totals bit for
    bit) or ``"numpy"`` (the reference; the CPU default without numba). ``cancelled()`` is
    polled between batches (and, compiled, between the blocks of a batch); when it
    says yes, the totals of every batch already computed are yielded (on the GPU the
    handed-out totals trail the queued batch by one) and then :class:`Cancelled` is
    raised. ``progress(done, total)`` comes with each yield. ``device_field``: the field's
    arrays (dirs, f, index) already on the GPU (:func:`gpu.probabilistic_kernel.upload_field`), to track from the
    same samples again without copying them (gigabytes for a whole brain). ``seed_matrix``:
    also count the seed × seed matrix (:class:`ProbResult`). ``first_batch``: the first batch's
    size when it differs (a coarse first look before the larger batches that refine it; at most
    ``batch_streamlines``)."""
    backend = get_backend(device)
    engine = host_engine(engine, backend)
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    total = len(seeds) * params.n_samples
    batch = batch_streamlines or default_batch(engine, bits, len(seeds))
    t0 = time.perf_counter()

    def provenance(done: int) -> dict:
        elapsed = time.perf_counter() - t0
        return {
            "params": asdict(params),
            "engine": engine,
            "backend": backend.name,
            "device": backend.device_name,
            "tracking_s": elapsed,
            "streamlines_per_s": done / elapsed if elapsed > 0 else None,
        }

    def report(result: ProbResult) -> ProbResult:
        if progress is not None:
            progress(result.streamlines, total)
        return result

    first = min(batch, total, max(1, first_batch)) if first_batch else 0
    batches = ([(0, first)] if first else []) + [
        (start, min(batch, total - start)) for start in range(first, total, batch)
    ]
    if engine == COMPILED:
        tracker = probabilistic_host.CompiledTracker(
            field_, bits, seeds, params, n_targets, n_waypoints, seed_matrix=seed_matrix
        )
        for start, count in batches:
            if cancelled is not None and cancelled():
                raise Cancelled()
            tracker.run(start, count, cancelled=cancelled)
            yield report(tracker.result(provenance(start + count)))
        return
    if engine == NUMPY:
        paths = np.zeros(field_.shape, dtype=np.int64)
        seed_targets = np.zeros((len(seeds), n_targets), dtype=np.int64)
        waytotal = steps = 0
        matrix = np.zeros((len(seeds), len(seeds)), dtype=np.int64) if seed_matrix else None
        for start, count in batches:
            if cancelled is not None and cancelled():
                raise Cancelled()
            part = track_numpy(
                field_, bits, seeds, params, n_targets, n_waypoints, start, count, seed_matrix=seed_matrix
            )
            if seed_matrix:
                matrix += part.seed_matrix
            paths += part.paths
            seed_targets += part.seed_targets
            waytotal += part.waytotal
            steps += part.steps
            done = start + count
            yield report(
                ProbResult(
                    paths.copy(),
                    waytotal,
                    seed_targets.copy(),
                    done,
                    provenance(done),
                    steps,
                    None if matrix is None else matrix.copy(),
                )
            )
        return
    # The GPU: totals accumulate on the device. After queueing a batch, its totals are copied
    # to the host on a second stream while the next batch runs, and the previous batch's are
    # handed out meanwhile, so the GPU never waits for the host.
    cp = backend.xp
    tracker = KernelTracker(
        backend,
        field_,
        bits,
        seeds,
        params,
        n_targets,
        n_waypoints,
        max_batch=batch,
        device_field=device_field,
        seed_matrix=seed_matrix,
    )
    copy_stream = cp.cuda.Stream(non_blocking=True)
    pending = copied = None
    for start, count in batches:
        if cancelled is not None and cancelled():
            if pending is not None:  # computed before the cancel: keep it
                yield report(pending(provenance(tracker.streamlines)))
            raise Cancelled()
        tracker.launch(start, count)
        copied, result = tracker.snapshot(copy_stream, after=copied)
        if pending is not None:
            yield report(pending(provenance(tracker.streamlines - count)))
        pending = result
    if pending is not None:
        yield report(pending(provenance(total)))


def track(field_: SampleField, bits: np.ndarray, seeds: np.ndarray, params: ProbParams, **kwargs) -> ProbResult:
    """:func:`iter_track` run to the end: the final totals."""
    last = deque(iter_track(field_, bits, seeds, params, **kwargs), maxlen=1)
    if last:
        return last[0]
    n_targets = kwargs.get("n_targets", 0)  # no seeds
    return ProbResult(np.zeros(field_.shape, np.int64), 0, np.zeros((0, n_targets), np.int64), 0)
