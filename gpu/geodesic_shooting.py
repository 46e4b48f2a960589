"""Two-point geodesic ray tracing: the geodesic from a seed point to a target point, by shooting.

Seed 004 (§3.4.2) describes it and leaves it unimplemented: the connectivity measure of a
seed–target pair should not depend on whether one of the sampled initial directions happened
to pass through the target. Here, for every pair (seed point ``p``, target point ``q``):

1. **Sampling**: the rays shot from ``p`` (any set of directions, e.g. the pipeline's cone
   around ±e1) are traced once, without stopping at the target; the ray that passes closest
   to ``q`` gives the initial direction ``d₀``.
2. **Shooting**: the direction ``d(a, b) = normalise(d₀ + a u + b w)`` (``u, w ⊥ d₀``) is
   refined by Levenberg–Marquardt on the two angles ``(a, b)``: the residual is the miss
   vector ``m(a, b)`` from ``q`` to the point of the ray closest to it (mm, on the ray's
   segments, so that it varies smoothly with the angles); its Jacobian comes from forward
   differences (two more rays per pair). A trial that does not shorten ``|m|`` is rejected
   and the damping raised. All the rays of all pairs of one iteration are traced together
   (:func:`gpu.geodesic.track_all`: the CUDA kernel on a GPU, the NumPy reference on the CPU).
3. A pair is **connected** when ``|m|`` falls below ``tolerance_mm``; its geodesic is the ray
   up to the closest point and its CM is the ray's CM there.

The geodesic between two points need not be unique and shooting finds the one nearest the
best sampled ray; the tracking mask (with its tolerance) and the other stopping rules apply to
every ray as they do to ordinary fibres.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .backend import get_backend
from .geodesic import track_all
from .geodesic_field import with_regions


@dataclass
class ShootingResult:
    """One row per seed–target pair: ``seed`` and ``target`` (indices into the points given),
    the final ``direction``, ``miss_mm`` (distance from the target point to the geodesic),
    ``hit`` (``miss_mm ≤`` the tolerance), ``cm`` (the CM at the closest point), ``iterations``;
    ``points``/``offsets`` the geodesics (voxel coordinates) from the seed to the closest point."""

    seed: np.ndarray
    target: np.ndarray
    direction: np.ndarray
    miss_mm: np.ndarray
    hit: np.ndarray
    cm: np.ndarray
    iterations: np.ndarray
    points: np.ndarray
    offsets: np.ndarray
    provenance: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.seed)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points[self.offsets[i] : self.offsets[i + 1]]


def closest_approach(batch, rows: np.ndarray, targets_mm: np.ndarray, voxel_size: np.ndarray):
    """For fibre ``rows[i]`` of ``batch`` (fibres in order of their ``fiber`` index) and target
    ``targets_mm[i]``: the miss vector (closest point − target, mm, on the segments next to the
    nearest stored point), the index of that point within the fibre, and the CM there."""
    voxel_size = np.asarray(voxel_size, np.float64)
    starts, ends = batch.offsets[rows], batch.offsets[rows + 1]
    counts = ends - starts
    owner = np.repeat(np.arange(len(rows)), counts)
    index = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    flat = np.repeat(starts, counts) + index
    pts = batch.points[flat].astype(np.float64) * voxel_size
    d2 = np.sum((pts - targets_mm[owner]) ** 2, axis=1)
    order = np.lexsort((d2, owner))  # by fibre, nearest first
    first = np.searchsorted(owner[order], np.arange(len(rows)))
    best = index[order[first]]
    miss = np.empty((len(rows), 3))
    for side in (-1, 1):  # the closer of the two segments that end at the nearest point
        other = np.clip(best + side, 0, counts - 1)
        a = batch.points[starts + best].astype(np.float64) * voxel_size
        b = batch.points[starts + other].astype(np.float64) * voxel_size
        seg = b - a
        length2 = np.sum(seg * seg, axis=1)
        t = np.clip(np.sum((targets_mm - a) * seg, axis=1) / np.where(length2 > 0, length2, 1.0), 0.0, 1.0)
        candidate = a + t[:, None] * seg - targets_mm
        if side == -1:
            miss[:] = candidate
        else:
            closer = np.sum(candidate**2, axis=1) < np.sum(miss**2, axis=1)
            miss[closer] = candidate[closer]
    cm = batch.cm[starts + best]
    return miss, best, cm


def _basis(d: np.ndarray):
    helper = np.where(np.abs(d[:, :1]) < 0.9, np.array([[1.0, 0, 0]]), np.array([[0, 1.0, 0]]))
    u = np.cross(d, helper)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return u, np.cross(d, u)


def _trace(fld, starts, directions, params, device):
    """Trace and return (batch, row of every fibre or −1 when it could not start)."""
    batch = track_all(fld, starts, directions, params, device=device)
    rows = np.full(len(starts), -1, np.int64)
    rows[batch.fiber] = np.arange(len(batch))
    return batch, rows


def best_sampled_directions(fld, seeds, directions, targets, params, *, device="auto", chunk=1 << 22):
    """Step 1: for every pair (seed ``i``, target ``j``), the sampled direction (``directions[i]``,
    ``(P, K, 3)``) whose ray passes closest to target ``j``, and that distance (mm)."""
    seeds = np.asarray(seeds, np.float64)
    p, k = directions.shape[:2]
    starts = np.repeat(seeds, k, axis=0)
    batch, rows = _trace(fld, starts, directions.reshape(-1, 3), params, device)
    vs = np.asarray(fld.voxel_size, np.float64)
    targets_mm = np.asarray(targets, np.float64) * vs
    best = np.full((p, len(targets)), np.inf)
    best_dir = np.zeros((p, len(targets), 3))
    lengths = np.diff(batch.offsets)
    owner = np.repeat(batch.fiber, lengths)  # the fibre (seed · K + direction) of every point
    pts = batch.points.astype(np.float64) * vs
    for j, q in enumerate(targets_mm):
        d2 = np.empty(len(pts))
        for a in range(0, len(pts), chunk):
            d2[a : a + chunk] = np.sum((pts[a : a + chunk] - q) ** 2, axis=1)
        per_fibre = np.full(p * k, np.inf)
        np.minimum.at(per_fibre, owner, d2)
        per_fibre = per_fibre.reshape(p, k)
        choice = np.argmin(per_fibre, axis=1)
        best[:, j] = np.sqrt(per_fibre[np.arange(p), choice])
        best_dir[:, j] = directions[np.arange(p), choice]
    del rows
    return best_dir, best


def shoot(
    fld,
    seeds: np.ndarray,
    targets: np.ndarray,
    sampled_directions: np.ndarray,
    params,
    *,
    tolerance_mm: float | None = None,
    max_iterations: int = 15,
    delta_rad: float = 2e-3,
    device="auto",
    cancelled=None,
) -> ShootingResult:
    """Two-point ray tracing between every seed point (``(P, 3)`` voxel coordinates) and every
    target point (``(Q, 3)``), the sampled rays ``sampled_directions`` (``(P, K, 3)``) giving the
    initial directions. ``params`` are the tracking parameters (the target does not stop rays;
    every point is stored). ``tolerance_mm`` defaults to half the smallest voxel size."""
    backend = get_backend(device)
    seeds = np.asarray(seeds, np.float64).reshape(-1, 3)
    targets = np.asarray(targets, np.float64).reshape(-1, 3)
    vs = np.asarray(fld.voxel_size, np.float64)
    tol = 0.5 * float(vs.min()) if tolerance_mm is None else float(tolerance_mm)
    params = replace(params, stop_at_target=False, store_every=1)
    free = with_regions(fld, fld.region & 1 if fld.region is not None else None, None)
    initial, _distance = best_sampled_directions(free, seeds, sampled_directions, targets, params, device=backend)
    p, q = len(seeds), len(targets)
    seed_of = np.repeat(np.arange(p), q)
    target_of = np.tile(np.arange(q), p)
    d0 = initial.reshape(-1, 3)
    d0 = d0 / np.linalg.norm(d0, axis=1, keepdims=True)
    u, w = _basis(d0)
    n = len(d0)
    angles = np.zeros((n, 2))
    damping = np.full(n, 1e-2)
    targets_mm = targets[target_of] * vs
    miss = np.full((n, 3), np.inf)
    jacobian = np.zeros((n, 3, 2))
    iterations = np.zeros(n, np.int64)
    active = np.ones(n, bool)
    trial = angles.copy()

    def direction_of(a):
        d = d0[idx] + a[:, :1] * u[idx] + a[:, 1:2] * w[idx]
        return d / np.linalg.norm(d, axis=1, keepdims=True)

    for iteration in range(max_iterations + 1):
        if cancelled is not None and cancelled():
            break
        idx = np.flatnonzero(active)
        if not len(idx):
            break
        m = len(idx)
        probes = np.concatenate([trial[idx], trial[idx] + [delta_rad, 0.0], trial[idx] + [0.0, delta_rad]])
        dirs = np.concatenate(
            [direction_of(probes[:m]), direction_of(probes[m : 2 * m]), direction_of(probes[2 * m :])]
        )
        starts = np.tile(seeds[seed_of[idx]], (3, 1))
        batch, rows = _trace(free, starts, dirs, params, backend)
        ok = (rows[:m] >= 0) & (rows[m : 2 * m] >= 0) & (rows[2 * m :] >= 0)
        if not ok.any():
            active[idx] = False
            break
        safe = np.where(rows >= 0, rows, 0)
        misses = [closest_approach(batch, safe[s * m : (s + 1) * m], targets_mm[idx], vs)[0] for s in range(3)]
        new = np.sum(misses[0] ** 2, axis=1)
        old = np.sum(miss[idx] ** 2, axis=1)
        better = ok & (new < old)
        accepted = idx[better]
        angles[accepted] = trial[accepted]
        miss[accepted] = misses[0][better]
        jacobian[accepted] = np.stack([(misses[1] - misses[0]) / delta_rad, (misses[2] - misses[0]) / delta_rad], -1)[
            better
        ]
        damping[accepted] = np.maximum(damping[accepted] / 3.0, 1e-6)
        damping[idx[~better]] *= 4.0
        iterations[idx] = iteration
        done = np.sum(miss[idx] ** 2, axis=1) <= tol * tol
        hopeless = damping[idx] > 1e4
        active[idx[done | hopeless | ~ok]] = False
        # Next trial: Levenberg–Marquardt step from the accepted angles.
        j = jacobian[idx]
        jtj = np.einsum("nki,nkj->nij", j, j)
        scale = np.trace(jtj, axis1=1, axis2=2)[:, None, None] / 2.0 + 1e-12
        lhs = jtj + damping[idx][:, None, None] * scale * np.eye(2)
        rhs = -np.einsum("nki,nk->ni", j, miss[idx])
        step = np.linalg.solve(lhs, rhs[..., None])[..., 0]
        limit = 0.2  # radians per iteration
        norm = np.linalg.norm(step, axis=1, keepdims=True)
        step = np.where(norm > limit, step * limit / np.maximum(norm, 1e-30), step)
        trial[idx] = angles[idx] + np.where(np.isfinite(step), step, 0.0)

    # The final geodesics, traced once more from the accepted angles.
    idx = np.arange(n)
    dirs = direction_of(angles)
    batch, rows = _trace(free, seeds[seed_of], dirs, params, backend)
    traced = rows >= 0
    safe = np.where(traced, rows, 0)
    final_miss, nearest, cm = closest_approach(batch, safe, targets_mm, vs)
    miss_mm = np.where(traced, np.linalg.norm(final_miss, axis=1), np.inf)
    cm = np.where(traced, cm, np.nan)
    counts = np.where(traced, nearest + 1, 0)
    first = batch.offsets[safe]
    flat = np.repeat(first, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    points = batch.points[flat]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    hit = miss_mm <= tol
    return ShootingResult(
        seed=seed_of,
        target=target_of,
        direction=dirs,
        miss_mm=miss_mm.astype(np.float32),
        hit=hit,
        cm=cm.astype(np.float32),
        iterations=iterations,
        points=points,
        offsets=offsets,
        provenance={
            "pairs": n,
            "hit": int(hit.sum()),
            "tolerance_mm": tol,
            "sampled_directions": int(sampled_directions.shape[1]),
            "max_iterations": max_iterations,
            "median_miss_mm": float(np.median(miss_mm[np.isfinite(miss_mm)])) if np.isfinite(miss_mm).any() else None,
            "backend": backend.name,
        },
    )


def pairs_connected(result: ShootingResult, seeds: int) -> float:
    """The share of seed points joined to at least one target point."""
    return len(np.unique(result.seed[result.hit])) / seeds if seeds else math.nan
