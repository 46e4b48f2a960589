"""The NumPy reference of probabilistic tracking (:mod:`gpu.probabilistic` describes the steps):
all streamlines of a batch advance together as array operations, drawing from the same Philox
streams (:mod:`gpu.rng`) as the CUDA kernel, so both engines track the same streamlines."""

from __future__ import annotations

import numpy as np

from .probabilistic_params import (
    BIT_BRAIN,
    BIT_EXCLUDE,
    BIT_STOP,
    P_EULER,
    P_RANDFIB,
    P_START,
    P_STEP,
    TARGET_SHIFT,
    WAYPOINT_SHIFT,
    ProbParams,
    ProbResult,
    SampleField,
    empty_seed_matrix,
    run_length,
    streamline_ids,
)
from .rng import philox4x32, seed_key


def _uniform(x):
    return (x.astype(np.float64) + 0.5) * 2.0**-32


def _draw(purpose: int, half: int, draw, sid: np.ndarray, key):
    s = sid.astype(np.uint64)
    counter = (
        np.asarray(draw, dtype=np.uint64),
        np.uint64(purpose | (half << 8)),
        s & np.uint64(0xFFFFFFFF),
        s >> np.uint64(32),
    )
    return philox4x32(counter, key)


def _sample_direction(field_: SampleField, params: ProbParams, pos, prev, has_prev, draws, fib_draw):
    """Direction (N, 3) drawn at continuous voxel positions ``pos``; zero where none can be drawn."""
    shape = np.array(field_.shape)
    base = np.floor(pos)
    frac = pos - base
    u = np.stack([_uniform(draws[0]), _uniform(draws[1]), _uniform(draws[2])], 1)
    vox = (base + (u < frac)).astype(np.int64)
    inside = ((vox >= 0) & (vox < shape)).all(1)
    centre = np.rint(pos).astype(np.int64)
    vox = np.where(inside[:, None], vox, np.clip(centre, 0, shape - 1))
    row = field_.index[vox[:, 0], vox[:, 1], vox[:, 2]]
    fallback = field_.index[tuple(np.clip(centre, 0, shape - 1).T)]
    row = np.where(row >= 0, row, fallback)
    S, L = field_.n_samples, field_.n_fibres
    s = ((draws[3].astype(np.uint64) * np.uint64(S)) >> np.uint64(32)).astype(np.int64)
    ok = row >= 0
    r = np.where(ok, row, 0)
    d = field_.dirs[r, s].astype(np.float64)  # (N, L, 3)
    f = field_.f[r, s].astype(np.float64)  # (N, L)
    eligible = f > params.fibthresh
    dots = np.abs((d * prev[:, None, :]).sum(-1))
    best = np.where(eligible.any(1), np.argmax(np.where(eligible, dots, -1.0), axis=1), 0)
    if params.randfib == 0:
        first = np.zeros(len(pos), dtype=np.int64)
    else:
        weights = eligible * (1.0 if params.randfib == 1 else f)
        total = weights.sum(1)
        cum = np.cumsum(weights, 1)
        pick = _uniform(fib_draw) * total
        first = np.where(total > 0, np.minimum((cum <= pick[:, None]).sum(1), L - 1), 0)
    choice = np.where(has_prev, best, first)
    out = d[np.arange(len(pos)), choice]
    return np.where(ok[:, None], out, 0.0)


def track_numpy(
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
):
    """Track the streamlines at run positions ``first_id .. first_id + count`` (default: all
    ``len(seeds) * n_samples``; or the run positions ``positions``; see
    :func:`streamline_ids`; ``seeds`` ijk (n, 3)) with the NumPy reference. Returns :class:`ProbResult` (seed × target rows for
    all of ``seeds``), plus the step sequences (x, y, z, alive per step, per half) when
    ``record``. Visits are kept in a dense bitmap of streamlines × the voxels they can visit (the
    brain's and the seeds': :func:`bitmap_voxels`), so batches must be small on large grids
    (:func:`gpu.probabilistic.iter_track` sizes them)."""
    key = seed_key(params.seed)
    shape = np.array(field_.shape)
    n_vox = int(np.prod(shape))
    n = run_length(first_id, count, positions, len(seeds), params.n_samples)
    sid, seed_of = streamline_ids(first_id, n, len(seeds), params.n_samples, positions)
    jitter = _draw(P_START, 0, 0, sid, key)
    start = seeds[seed_of] + np.stack([_uniform(jitter[i]) - 0.5 for i in range(3)], 1)
    flat = lambda v: (v[:, 0] * shape[1] + v[:, 1]) * shape[2] + v[:, 2]  # noqa: E731
    hits = np.zeros(n, dtype=np.uint32)
    excluded = np.zeros(n, dtype=bool)
    first_dir = np.zeros((n, 3))
    first_taken = np.zeros(n, dtype=bool)
    rows = np.arange(n)
    sv = np.rint(start).astype(np.int64)
    in_grid = ((sv >= 0) & (sv < shape)).all(1)
    svc = np.clip(sv, 0, shape - 1)
    # The visit bitmap has a column per voxel a streamline can visit: the brain's (a step enters no
    # other), the seed voxels' and the start voxels' (a seed may lie outside the brain).
    columns = np.union1d(
        np.flatnonzero(np.asarray(bits).reshape(-1) & np.uint32(BIT_BRAIN)),
        np.concatenate([flat(np.asarray(seeds, dtype=np.int64).reshape(-1, 3)), flat(svc)[in_grid]]),
    )
    column = np.zeros(n_vox, dtype=np.int64)  # a voxel's column (0 for the others: never looked at)
    column[columns] = np.arange(len(columns))
    visited = np.zeros((n, len(columns)), dtype=bool)
    visited[rows[in_grid], column[flat(svc)[in_grid]]] = True
    hits |= np.where(in_grid, bits[tuple(svc.T)], 0).astype(np.uint32)
    excluded |= (hits & BIT_EXCLUDE) != 0
    steps_record = []
    moves = 0
    scale = params.step_mm / field_.voxel_size
    for half in (0, 1):
        pos = start.copy()
        prev = -first_dir if half else np.zeros((n, 3))
        has_prev = first_taken.copy() if half else np.zeros(n, dtype=bool)
        alive = in_grid & ((hits & BIT_BRAIN) != 0) & ~excluded
        current = flat(svc)
        trace = [np.concatenate([pos, alive[:, None]], 1)] if record else None
        for step in range(params.n_steps):
            if not alive.any():
                break
            draws = _draw(P_STEP, half, step, sid, key)
            fib = _draw(P_RANDFIB, half, step, sid, key)[0]
            d = _sample_direction(field_, params, pos, prev, has_prev, draws, fib)
            cos = (d * prev).sum(1)
            d = np.where((has_prev & (cos < 0))[:, None], -d, d)
            cos = np.abs(cos)
            zero = ~(np.abs(d).sum(1) > 0)
            turn = has_prev & (cos < params.cthr)
            if params.modeuler:
                mid = pos + d * scale
                draws2 = _draw(P_EULER, half, step, sid, key)
                d2 = _sample_direction(field_, params, mid, d, np.ones(n, bool), draws2, draws2[0])
                d2 = np.where(((d2 * d).sum(1) < 0)[:, None], -d2, d2)
                mean = d + d2
                norm = np.linalg.norm(mean, axis=1)
                d = np.where((norm > 0)[:, None], mean / np.where(norm > 0, norm, 1.0)[:, None], d)
            alive &= ~zero & ~turn
            new = pos + d * scale
            nv = np.rint(new).astype(np.int64)
            inside = ((nv >= 0) & (nv < shape)).all(1)
            nvc = np.clip(nv, 0, shape - 1)
            b = np.where(inside, bits[tuple(nvc.T)], 0).astype(np.uint32)
            alive &= inside & ((b & BIT_BRAIN) != 0)
            moves += int(alive.sum())
            pos = np.where(alive[:, None], new, pos)
            if half == 0:
                first_dir = np.where((alive & ~first_taken)[:, None], d, first_dir)
                first_taken |= alive
            prev = np.where(alive[:, None], d, prev)
            has_prev |= alive
            hits |= np.where(alive, b, 0).astype(np.uint32)
            newly_excluded = alive & ((b & BIT_EXCLUDE) != 0)
            excluded |= newly_excluded
            alive &= ~newly_excluded
            idx = flat(nvc)
            moved = alive & (idx != current)
            seen = visited[rows, column[idx]]
            if params.loopcheck:
                looped = moved & seen
                alive &= ~looped
                moved &= ~looped
            visited[rows[moved], column[idx[moved]]] = True
            current = np.where(moved, idx, current)
            alive &= (b & BIT_STOP) == 0
            if record:
                trace.append(np.concatenate([pos, alive[:, None]], 1))
        if record:
            steps_record.append(np.stack(trace, 1))
    waymask = sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints))
    if n_waypoints == 0:
        kept = ~excluded
    elif params.waycond == "AND":
        kept = ~excluded & ((hits & np.uint32(waymask)) == waymask)
    else:
        kept = ~excluded & ((hits & np.uint32(waymask)) != 0)
    paths = np.zeros(n_vox, dtype=np.int64)
    paths[columns] = visited[kept].sum(0)
    paths = paths.reshape(tuple(shape))
    seed_targets = np.zeros((len(seeds), n_targets), dtype=np.int64)
    for j in range(n_targets):
        reached = kept & ((hits >> np.uint32(TARGET_SHIFT + j)) & 1).astype(bool)
        seed_targets[:, j] = np.bincount(seed_of[reached], minlength=len(seeds))
    matrix = None
    if seed_matrix:
        matrix = empty_seed_matrix(len(seeds))
        np.add.at(matrix, seed_of[kept], visited[kept][:, column[flat(seeds)]].astype(np.int64))
    result = ProbResult(paths, int(kept.sum()), seed_targets, n, steps=moves, seed_matrix=matrix)
    return (result, steps_record) if record else result
