"""Deterministic tensor tracking on the CPU as a compiled loop: one seed at a time, threads over
blocks of seeds (the ``"compiled"`` engine of :mod:`gpu.deterministic`).

The loop is ``kernels/deterministic.cu`` (with ``sym3.cuh`` and ``tracking.cuh``) line for line in
numba (the ``cpu`` extra), in float64: trilinear tensor, Eberly's closed-form main eigenvector,
FA from the invariants, Euler or RK4, tensorlines; the rules of :mod:`gpu.deterministic`. Its
streamlines equal the array-operations reference to rounding (tests/test_deterministic_host.py).

The array-operations engine walks all live streamlines of a batch step by step, paying NumPy's
per-call cost on small arrays at every step; the compiled loop follows each streamline to its
end in registers, without the GIL, so the threads scale with the cores.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .host import NUMBA_HINT, compile_or_uncached, host_threads, numba_module, run_parallel

__all__ = ["available", "track_compiled"]

#: Seed blocks per thread (streamlines differ in length: smaller blocks balance the threads)
BLOCKS_PER_THREAD = 4


def available() -> bool:
    """Whether the compiled loop can run (numba installed)."""
    return numba_module() is not None


def require() -> None:
    """Raise when the compiled engine was asked for and numba is missing."""
    if not available():
        raise ValueError(f"the 'compiled' engine needs numba: {NUMBA_HINT}; or use engine='arrays'")


def _kernel():
    from . import deterministic_loops

    return deterministic_loops.track_block


def track_compiled(
    field8: np.ndarray, region: np.ndarray, scale, seeds: np.ndarray, params, threads: int | None = None
):
    """Both halves of every seed's streamline, as the other engines return them: (buffer
    (N, 2M+1, 3) float32, counts (N, 2), stop codes (N, 2), valid (N,)); ``field8`` the
    (X, Y, Z, 8) float32 tensor field, ``region`` the region map, ``scale`` voxels per mm."""
    require()
    n, m = len(seeds), params.max_steps
    buf = np.empty((n, 2 * m + 1, 3), np.float32)  # only the rows a streamline reaches are read
    count = np.zeros((n, 2), np.int32)
    stop = np.zeros((n, 2), np.uint8)
    valid = np.zeros(n, bool)
    seeds = np.ascontiguousarray(seeds, dtype=np.float64)
    h = np.asarray(scale, dtype=np.float64) * params.step_mm
    threads = threads or host_threads()
    args = (
        float(params.fa_threshold),
        math.cos(math.radians(params.max_angle_deg)),
        m,
        params.integrator == "rk4",
        params.method == "tensorline",
        float(params.tensorline_puncture),
        buf,
        count,
        stop,
        valid,
    )
    field8, region = np.ascontiguousarray(field8, dtype=np.float32), np.ascontiguousarray(region)
    bounds = np.linspace(0, n, min(n, threads * BLOCKS_PER_THREAD) + 1).astype(int)

    kernel = compile_or_uncached(_kernel, lambda k: k(field8, region, seeds, 0, 0, h, *args), "deterministic_loops")

    def block(lo: int, hi: int):
        return lambda: kernel(field8, region, seeds, lo, hi, h, *args)

    run_parallel([block(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo], threads)
    return buf, count, stop, valid
