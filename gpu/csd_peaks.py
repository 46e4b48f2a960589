"""Peaks of fibre orientation distributions given as spherical-harmonic coefficients.

Up to ``n_peaks`` per voxel, found as MRtrix ``sh2peaks`` and DIPY ``peaks_from_model`` do
it, in two stages that are batched array operations (NumPy or CuPy alike):

1. the fODF is evaluated on a dense hemisphere (a Fibonacci lattice, ~4° apart); directions
   whose amplitude is at least that of their nearest neighbours (antipodes counted as the
   same direction) are local maxima; the largest is a peak, then local maxima more than
   ``min_separation_deg`` from every peak found so far, largest first, while they reach
   ``relative_threshold`` × the largest peak (DIPY's ``relative_peak_threshold`` and
   ``min_separation_angle``, defaults 0.5 and 25°);
2. each peak is refined by a pattern search on the sphere (compare the amplitude at six
   directions around it, move to the best, halve the step), to ~0.05°.

Peaks are unit vectors in the frame of the SH coefficients, with their amplitudes; missing
peaks are zero vectors with zero amplitude. A peak whose amplitude is not positive is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .host import compile_or_uncached, numba_module
from .indices import nonzero
from .params import meta
from .sh import fibonacci_hemisphere, n_coefficients, neighbours, sh_basis

#: Directions of the search sphere and neighbours that a local maximum must not be below.
SEARCH_DIRECTIONS = 1200
SEARCH_NEIGHBOURS = 6
REFINE_STEPS = 7


@dataclass(frozen=True)
class PeakParams:
    """How peaks are extracted from an fODF.

    n_peaks : most peaks per voxel (1..5).
    relative_threshold : a peak is kept when its amplitude reaches this fraction of the
        voxel's largest peak.
    min_separation_deg : peaks closer than this (degrees, antipodally) are one peak.
    """

    n_peaks: int = field(default=3, metadata=meta("Peaks per voxel", "most fODF peaks kept per voxel", "", (1, 5)))
    relative_threshold: float = field(
        default=0.5,
        metadata=meta(
            "Relative peak threshold",
            "a peak is kept when it reaches this fraction of the voxel's largest peak",
            "",
            (0.0, 1.0),
        ),
    )
    min_separation_deg: float = field(
        default=25.0,
        metadata=meta(
            "Minimum separation",
            "peaks closer than this angle are taken as one",
            "°",
            (0.0, 90.0),
        ),
    )

    def __post_init__(self):
        if not 1 <= self.n_peaks <= 5:
            raise ValueError(f"the number of peaks must be between 1 and 5, got {self.n_peaks}")
        if not 0.0 <= self.relative_threshold <= 1.0:
            raise ValueError(f"the relative peak threshold must be in [0, 1], got {self.relative_threshold}")
        if not 0.0 <= self.min_separation_deg <= 90.0:
            raise ValueError(f"the minimum peak separation must be in [0°, 90°], got {self.min_separation_deg}")


@lru_cache(maxsize=8)
def _search_sphere(lmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    directions = fibonacci_hemisphere(SEARCH_DIRECTIONS)
    return directions, neighbours(directions, SEARCH_NEIGHBOURS), sh_basis(np, directions, lmax)


def _stencil_offsets() -> np.ndarray:
    """Six unit tangent offsets in the plane orthogonal to z, 60° apart."""
    angles = np.arange(6) * (math.pi / 3)
    return np.stack([np.cos(angles), np.sin(angles), np.zeros(6)], axis=1)


def _tangent_frame(xp, v):
    """Two unit vectors orthogonal to each unit vector of ``v`` (..., 3) and to each other."""
    helper = xp.where(xp.abs(v[..., 2:3]) < 0.9, xp.asarray([0.0, 0.0, 1.0], dtype=v.dtype), 0.0)
    helper = helper + xp.where(xp.abs(v[..., 2:3]) >= 0.9, xp.asarray([1.0, 0.0, 0.0], dtype=v.dtype), 0.0)
    a = xp.cross(v, helper)
    a = a / xp.linalg.norm(a, axis=-1, keepdims=True)
    return a, xp.cross(v, a)


def _amplitude(xp, coefficients, directions, lmax: int):
    """Amplitude of each voxel's fODF (n, C) at its own directions (n, m, 3) -> (n, m)."""
    n, m = directions.shape[:2]
    basis = sh_basis(xp, directions.reshape(n * m, 3), lmax).reshape(n, m, -1)
    return xp.einsum("nmc,nc->nm", basis, coefficients)


def find_peaks(xp, coefficients, lmax: int, params: PeakParams | None = None):
    """Peaks of the fODFs ``coefficients`` (n, C) on the device of ``xp``.

    Returns ``(directions (n, P, 3), amplitudes (n, P))`` with P = ``params.n_peaks``, peaks
    in decreasing amplitude, in the coefficients' floating type (float64 for float64 input).
    """
    params = params or PeakParams()
    if coefficients.shape[-1] != n_coefficients(lmax):
        raise ValueError(f"{coefficients.shape[-1]} coefficients do not make an lmax {lmax} series")
    dtype = coefficients.dtype if coefficients.dtype.kind == "f" else xp.float64
    coefficients = coefficients.astype(dtype, copy=False)
    n = coefficients.shape[0]
    sphere_h, neighbour_h, basis_h = _search_sphere(lmax)
    sphere = xp.asarray(sphere_h, dtype=dtype)
    amplitude = coefficients @ xp.asarray(basis_h.T, dtype=dtype)  # (n, D)
    is_max = amplitude > 0
    for k in range(neighbour_h.shape[1]):  # one neighbour at a time: no (n, D, 6) temporary
        is_max &= amplitude >= amplitude[:, xp.asarray(neighbour_h[:, k])]
    candidates = xp.where(is_max, amplitude, -xp.inf)
    del is_max
    cos_sep = math.cos(math.radians(params.min_separation_deg))
    directions = xp.zeros((n, params.n_peaks, 3), dtype=dtype)
    amplitudes = xp.zeros((n, params.n_peaks), dtype=dtype)
    rows = xp.arange(n)
    for p in range(params.n_peaks):
        best = xp.argmax(candidates, axis=1)
        value = candidates[rows, best]
        direction = sphere[best]
        if p == 0:
            largest = value
        keep = xp.isfinite(value) & (value >= params.relative_threshold * largest) & (value > 0)
        directions[:, p] = xp.where(keep[:, None], direction, 0.0)
        amplitudes[:, p] = xp.where(keep, value, 0.0)
        near = xp.abs(direction @ sphere.T) >= cos_sep  # (n, D): within the separation
        candidates = xp.where(near, -xp.inf, candidates)
    _refine(xp, coefficients, lmax, directions, amplitudes)
    return directions, amplitudes


def _refine(xp, coefficients, lmax: int, directions, amplitudes) -> None:
    """Pattern search around each found peak, in place."""
    found = amplitudes > 0
    if not bool(found.any()):
        return
    voxel, slot = nonzero(xp, found)
    v = directions[voxel, slot]
    best = amplitudes[voxel, slot]
    c = coefficients[voxel]
    offsets = xp.asarray(_stencil_offsets(), dtype=v.dtype)
    step = math.radians(2.5)  # about half the search sphere's spacing
    for _ in range(REFINE_STEPS):
        a, b = _tangent_frame(xp, v)
        tangent = offsets[None, :, 0:1] * a[:, None, :] + offsets[None, :, 1:2] * b[:, None, :]
        trial = math.cos(step) * v[:, None, :] + math.sin(step) * tangent  # (m, 6, 3)
        value = _amplitude(xp, c, trial, lmax)
        pick = xp.argmax(value, axis=1)
        top = value[xp.arange(value.shape[0]), pick]
        better = top > best
        v = xp.where(better[:, None], trial[xp.arange(value.shape[0]), pick], v)
        best = xp.where(better, top, best)
        step *= 0.5
    v = v / xp.linalg.norm(v, axis=1, keepdims=True)
    v = xp.where(v[:, 2:3] < 0, -v, v)  # one representative of ±v: the upper hemisphere
    directions[voxel, slot] = v
    amplitudes[voxel, slot] = best


def compiled_peak_search(lmax: int, peak_params: PeakParams):
    """:func:`find_peaks` as a compiled loop per voxel (:mod:`gpu.csd_loops`), or
    None when numba is missing; ``peaks(sh) -> (directions, amplitudes)`` on the host."""
    if numba_module() is None:
        return None
    sphere, neighbour, basis = _search_sphere(lmax)
    args = (
        lmax,
        np.ascontiguousarray(sphere),
        np.ascontiguousarray(basis),
        np.ascontiguousarray(neighbour, dtype=np.int64),
        np.ascontiguousarray(_stencil_offsets()),
        float(peak_params.relative_threshold),
        math.cos(math.radians(peak_params.min_separation_deg)),
        REFINE_STEPS,
    )
    p = peak_params.n_peaks

    def loops():
        from . import csd_loops

        return csd_loops.peak_voxels

    loop = compile_or_uncached(loops, lambda k: k(np.zeros((0, basis.shape[1])), *args, np.zeros((0, p, 3)),
                                                   np.zeros((0, p))), "csd_loops")  # fmt: skip

    def peaks(sh: np.ndarray):
        directions, amplitudes = np.zeros((len(sh), p, 3)), np.zeros((len(sh), p))
        loop(np.ascontiguousarray(sh, dtype=np.float64), *args, directions, amplitudes)
        return directions, amplitudes

    return peaks
