"""The compiled loop of probabilistic tracking on the CPU (:mod:`gpu.probabilistic_host`): the
NumPy reference :func:`gpu.probabilistic_numpy.track_numpy` one streamline at a time, in numba,
with the same Philox4x32-10 streams (:mod:`gpu.rng`) and the same floating-point operations in
the same order (sums of three terms left to right, as NumPy reduces them), so it takes the
reference's steps bit for bit. Imported only when numba (the ``cpu`` extra) is installed.
Module-level functions (not closures), so that numba's on-disk cache finds them again in the
next process.

A streamline's distinct voxels are kept in an open-addressing hash set (entries ``stamp << 32 |
voxel``, the stamp the streamline's number in the call, so a new streamline finds the table empty
without clearing it), as the CUDA kernel keeps them; a voxel entering the set is appended to the
streamline's member list, which :func:`accumulate` adds to the totals if it is kept.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .probabilistic_params import BIT_BRAIN, BIT_EXCLUDE, BIT_STOP, P_EULER, P_RANDFIB, P_START, P_STEP
from .rng import PHILOX_M, PHILOX_W

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)

_M0, _M1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
_W0, _W1 = np.uint64(PHILOX_W[0]), np.uint64(PHILOX_W[1])
_MASK32, _SHIFT32 = np.uint64(0xFFFFFFFF), np.uint64(32)
_HASH = np.uint64(2654435761)
_bit_brain, _bit_exclude, _bit_stop = BIT_BRAIN, BIT_EXCLUDE, BIT_STOP
_p_step, _p_start, _p_euler, _p_randfib = P_STEP, P_START, P_EULER, P_RANDFIB


@_jit
def philox(draw, purpose, half, sid, k0, k1):
    """Philox4x32-10 at counter (draw, purpose | half << 8, sid low, sid high): four uint64
    holding 32-bit words (:func:`gpu.rng.philox4x32`)."""
    c0 = np.uint64(draw)
    c1 = np.uint64(purpose + 256 * half)
    c2 = sid & _MASK32
    c3 = sid >> _SHIFT32
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (p1 >> _SHIFT32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> _SHIFT32) ^ c3 ^ k1, p0 & _MASK32
    return c0, c1, c2, c3


@_jit
def uniform(x):
    return (np.float64(x) + 0.5) * 2.0**-32


@_jit
def voxel_of(x, y, z, nx, ny, nz):
    """(rounded voxel, inside the grid, the rounded voxel clipped to the grid's flat index)."""
    vx, vy, vz = int(np.rint(x)), int(np.rint(y)), int(np.rint(z))
    inside = 0 <= vx < nx and 0 <= vy < ny and 0 <= vz < nz
    cx, cy, cz = min(max(vx, 0), nx - 1), min(max(vy, 0), ny - 1), min(max(vz, 0), nz - 1)
    return inside, (cx * ny + cy) * nz + cz


@_jit
def sample_direction(dirs, fr, index, px, py, pz, qx, qy, qz, has_prev, r0, r1, r2, r3, fib_r, randfib, fibthresh):
    """The direction drawn at (px, py, pz) (``_sample_direction`` of the reference); zero when
    no sample can be drawn there."""
    nx, ny, nz = index.shape
    S, L = dirs.shape[1], dirs.shape[2]
    bx, by, bz = np.floor(px), np.floor(py), np.floor(pz)
    vx = int(bx + (1.0 if uniform(r0) < px - bx else 0.0))
    vy = int(by + (1.0 if uniform(r1) < py - by else 0.0))
    vz = int(bz + (1.0 if uniform(r2) < pz - bz else 0.0))
    cx = min(max(int(np.rint(px)), 0), nx - 1)
    cy = min(max(int(np.rint(py)), 0), ny - 1)
    cz = min(max(int(np.rint(pz)), 0), nz - 1)
    if not (0 <= vx < nx and 0 <= vy < ny and 0 <= vz < nz):
        vx, vy, vz = cx, cy, cz
    row = index[vx, vy, vz]
    if row < 0:
        row = index[cx, cy, cz]
    if row < 0:
        return 0.0, 0.0, 0.0
    s = int((r3 * np.uint64(S)) >> _SHIFT32)
    choice = 0
    if has_prev:
        best = -1.0
        for i in range(L):
            if np.float64(fr[row, s, i]) > fibthresh:
                dx = np.float64(dirs[row, s, i, 0])
                dy = np.float64(dirs[row, s, i, 1])
                dz = np.float64(dirs[row, s, i, 2])
                dot = abs(dx * qx + dy * qy + dz * qz)
                if dot > best:
                    best, choice = dot, i
    elif randfib:
        total = 0.0
        for i in range(L):
            if np.float64(fr[row, s, i]) > fibthresh:
                total += 1.0 if randfib == 1 else np.float64(fr[row, s, i])
        if total > 0.0:
            pick = uniform(fib_r) * total
            cum = 0.0
            count = 0
            for i in range(L):
                if np.float64(fr[row, s, i]) > fibthresh:
                    cum += 1.0 if randfib == 1 else np.float64(fr[row, s, i])
                if cum <= pick:
                    count += 1
            choice = min(count, L - 1)
    return np.float64(dirs[row, s, choice, 0]), np.float64(dirs[row, s, choice, 1]), np.float64(dirs[row, s, choice, 2])


@_jit
def set_insert(table, stamp, v):
    """Voxel ``v`` into the set of streamline ``stamp``: 1 when added, 0 when already there (the
    table holds twice the most voxels a streamline can visit: never full)."""
    cap = np.uint64(len(table) - 1)
    h = (np.uint64(v) * _HASH) & cap
    mark = np.uint64(stamp) << _SHIFT32
    while True:
        e = table[h]
        if (e >> _SHIFT32) != np.uint64(stamp):
            table[h] = mark | np.uint64(v)
            return 1
        if (e & _MASK32) == np.uint64(v):
            return 0
        h = (h + np.uint64(1)) & cap


@_jit
def set_contains(table, stamp, v):
    cap = np.uint64(len(table) - 1)
    h = (np.uint64(v) * _HASH) & cap
    while True:
        e = table[h]
        if (e >> _SHIFT32) != np.uint64(stamp):
            return False
        if (e & _MASK32) == np.uint64(v):
            return True
        h = (h + np.uint64(1)) & cap


@_jit
def track_streamlines(dirs, fr, index, bits, seeds, sids, seed_of, lo, hi, n_steps, randfib, loopcheck, modeuler,
                      scale, cthr, fibthresh, k0, k1, waymask, way_and, table, voxels, offsets, kept, hits, moves,
                      executed, trace, record):  # fmt: skip
    """Streamlines ``lo ..`` of ``sids`` (their seed voxels ``seed_of``) up to ``hi``, or fewer:
    each starts only while ``voxels`` has room for any streamline's members. Per streamline
    ``i``: ``kept[i]``, the mask bits met ``hits[i]``, ``moves[i]`` steps taken, ``executed[i, half]``
    steps tried, and its members ``voxels[offsets[i] : offsets[i + 1]]`` (none when not kept);
    with ``record`` its positions and alive flags per step in ``trace[i, half]`` (the
    reference's ``record``, padded to ``n_steps + 1`` rows). Returns the next streamline."""
    nx, ny, nz = index.shape
    flat_bits = bits.reshape(-1)
    most = 2 * n_steps + 1
    sx, sy, sz = scale[0], scale[1], scale[2]
    used = offsets[lo]
    i = lo
    while i < hi and used + most <= len(voxels):
        sid = sids[i]
        stamp = i - lo + 1
        c0, c1, c2, _ = philox(0, _p_start, 0, sid, k0, k1)
        seed = seed_of[i]
        x0 = np.float64(seeds[seed, 0]) + (uniform(c0) - 0.5)
        y0 = np.float64(seeds[seed, 1]) + (uniform(c1) - 0.5)
        z0 = np.float64(seeds[seed, 2]) + (uniform(c2) - 0.5)
        in_grid, start_voxel = voxel_of(x0, y0, z0, nx, ny, nz)
        size = 0
        met = 0
        if in_grid:
            met = np.int64(flat_bits[start_voxel])
            set_insert(table, stamp, start_voxel)
            voxels[used] = start_voxel
            size = 1
        excluded = (met & _bit_exclude) != 0
        fx = fy = fz = 0.0
        first_taken = False
        taken = 0
        for half in range(2):
            px, py, pz = x0, y0, z0
            qx, qy, qz = (-fx, -fy, -fz) if half else (0.0, 0.0, 0.0)
            has_prev = first_taken if half else False
            alive = in_grid and (met & _bit_brain) != 0 and not excluded
            current = start_voxel
            if record:
                trace[i, half, 0, 0], trace[i, half, 0, 1], trace[i, half, 0, 2] = px, py, pz
                trace[i, half, 0, 3] = 1.0 if alive else 0.0
            step = 0
            while step < n_steps and alive:
                r0, r1, r2, r3 = philox(step, _p_step, half, sid, k0, k1)
                fib = philox(step, _p_randfib, half, sid, k0, k1)[0] if randfib and not has_prev else np.uint64(0)
                dx, dy, dz = sample_direction(dirs, fr, index, px, py, pz, qx, qy, qz, has_prev, r0, r1, r2, r3, fib,
                                              randfib, fibthresh)  # fmt: skip
                cosine = dx * qx + dy * qy + dz * qz
                if has_prev and cosine < 0:
                    dx, dy, dz = -dx, -dy, -dz
                zero = not (abs(dx) + abs(dy) + abs(dz) > 0)
                turn = has_prev and abs(cosine) < cthr
                if modeuler:
                    e0, e1, e2, e3 = philox(step, _p_euler, half, sid, k0, k1)
                    ex, ey, ez = sample_direction(dirs, fr, index, px + dx * sx, py + dy * sy, pz + dz * sz, dx, dy,
                                                  dz, True, e0, e1, e2, e3, e0, randfib, fibthresh)  # fmt: skip
                    if ex * dx + ey * dy + ez * dz < 0:
                        ex, ey, ez = -ex, -ey, -ez
                    mx, my, mz = dx + ex, dy + ey, dz + ez
                    norm = math.sqrt(mx * mx + my * my + mz * mz)
                    if norm > 0:
                        dx, dy, dz = mx / norm, my / norm, mz / norm
                alive = not zero and not turn
                nx_, ny_, nz_ = px + dx * sx, py + dy * sy, pz + dz * sz
                inside, v = voxel_of(nx_, ny_, nz_, nx, ny, nz)
                b = np.int64(flat_bits[v]) if inside else 0
                alive = alive and inside and (b & _bit_brain) != 0
                if alive:
                    taken += 1
                    px, py, pz = nx_, ny_, nz_
                    if half == 0 and not first_taken:
                        fx, fy, fz = dx, dy, dz
                        first_taken = True
                    qx, qy, qz = dx, dy, dz
                    has_prev = True
                    met |= b
                    if b & _bit_exclude:
                        excluded = True
                        alive = False
                if alive and v != current:
                    if loopcheck and set_contains(table, stamp, v):
                        alive = False
                    else:
                        if set_insert(table, stamp, v):
                            voxels[used + size] = v
                            size += 1
                        current = v
                if alive and (b & _bit_stop):
                    alive = False
                step += 1
                if record:
                    trace[i, half, step, 0], trace[i, half, step, 1], trace[i, half, step, 2] = px, py, pz
                    trace[i, half, step, 3] = 1.0 if alive else 0.0
            executed[i, half] = step
            if record:
                for rest in range(step + 1, n_steps + 1):
                    trace[i, half, rest, 0], trace[i, half, rest, 1], trace[i, half, rest, 2] = px, py, pz
                    trace[i, half, rest, 3] = 0.0
        keep = not excluded
        if waymask:
            keep = keep and ((met & waymask) == waymask if way_and else (met & waymask) != 0)
        kept[i] = keep
        hits[i] = met
        moves[i] = taken
        if keep:
            used += size
        offsets[i + 1] = used
        i += 1
    return i


@_jit
def accumulate(paths, seed_targets, seed_matrix, seed_number, lo, hi, seed_of, kept, hits, voxels, offsets,
               target_shift):  # fmt: skip
    """Add kept streamlines ``lo .. hi`` to the totals: each member voxel once to ``paths``
    (flat), each target met to its seed voxel's row of ``seed_targets``, and with a non-empty
    ``seed_number`` (per voxel its seed voxel number, −1) the seed voxels visited to ``seed_matrix``."""
    n_targets = seed_targets.shape[1]
    matrix = len(seed_number) > 0
    for i in range(lo, hi):
        if not kept[i]:
            continue
        seed = seed_of[i]
        for k in range(offsets[i], offsets[i + 1]):
            v = voxels[k]
            paths[v] += 1
            if matrix:
                other = seed_number[v]
                if other >= 0:
                    seed_matrix[seed, other] += 1
        for t in range(n_targets):
            if (hits[i] >> (target_shift + t)) & 1:
                seed_targets[seed, t] += 1
