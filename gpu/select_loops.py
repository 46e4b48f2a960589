"""The compiled loop of fiber selection on the CPU (:mod:`gpu.select_host`), in numba. Imported
only when numba (the ``cpu`` extra) is installed. Module-level functions (not closures), so that
numba's on-disk cache finds them again in the next process.

The arithmetic is the NumPy reference's (:func:`gpu.select.hits_arrays`), operation for operation
in float32 and in the same order, so the bits are the same: pieces ``a + d·(k/n)``, crossings
``(plane - p)/d``, midpoints ``0.5·(e_m + e_m+1)``, samples ``p + mid·(q - p)``, voxels
``floor(x + 0.5)``. numba contracts no multiply-add without ``fastmath``, so none is fused.
Voxels are compared with the region box as floats before they become integers: a coordinate
that is NaN or too large for an integer is simply outside, as in the reference.
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)

#: More pieces than this in one segment (2**31: a segment longer than any grid) are not traversed
MAX_PIECES = 2147483648.0


@_jit
def _bits_at(bits, box, x, y, z):
    """Region bits of the voxel holding (x, y, z); ``box``: float32 (lo x, y, z, hi x, y, z)."""
    half = np.float32(0.5)
    i = np.floor(x + half)
    j = np.floor(y + half)
    k = np.floor(z + half)
    if i >= box[0] and i <= box[3] and j >= box[1] and j <= box[4] and k >= box[2] and k <= box[5]:
        return bits[int(i - box[0]), int(j - box[1]), int(k - box[2])]
    return np.uint32(0)


@_jit
def _crossing(p, q):
    """Parameter (0-1 along p->q) where it crosses the voxel boundary plane above its lower end,
    else 1."""
    half = np.float32(0.5)
    lo = min(p, q)
    plane = np.floor(lo + half) + half
    d = q - p
    if plane < max(p, q) and d != np.float32(0.0):
        return (plane - p) / d
    return np.float32(1.0)


@_jit
def _segment_bits(bits, box, near, ax, ay, az, bx, by, bz):
    """OR of the bits of the voxels the segment a->b crosses (its end points excluded), in pieces
    of at most one voxel per axis, the reference's; pieces that cannot reach the region box
    (``near``: float32 (lo - 1, hi + 1)) are skipped, as the reference skips such segments."""
    hit = np.uint32(0)
    half = np.float32(0.5)
    dx, dy, dz = bx - ax, by - ay, bz - az
    longest = np.ceil(max(abs(dx), max(abs(dy), abs(dz))))
    if not longest < MAX_PIECES:  # also NaN or infinite: not traversed
        return hit
    n = max(int(longest), 1)
    nf = np.float32(n)
    for k in range(n):
        t0 = np.float32(k) / nf
        t1 = np.float32(k + 1) / nf
        px, py, pz = ax + dx * t0, ay + dy * t0, az + dz * t0
        qx, qy, qz = ax + dx * t1, ay + dy * t1, az + dz * t1
        if max(px, qx) < near[0] or max(py, qy) < near[1] or max(pz, qz) < near[2]:
            continue
        if min(px, qx) > near[3] or min(py, qy) > near[4] or min(pz, qz) > near[5]:
            continue
        t_a = _crossing(px, qx)
        t_b = _crossing(py, qy)
        t_c = _crossing(pz, qz)
        if t_a > t_b:
            t_a, t_b = t_b, t_a
        if t_b > t_c:
            t_b, t_c = t_c, t_b
        if t_a > t_b:
            t_a, t_b = t_b, t_a
        ex, ey, ez = qx - px, qy - py, qz - pz
        m = half * (np.float32(0.0) + t_a)
        hit |= _bits_at(bits, box, px + m * ex, py + m * ey, pz + m * ez)
        m = half * (t_a + t_b)
        hit |= _bits_at(bits, box, px + m * ex, py + m * ey, pz + m * ez)
        m = half * (t_b + t_c)
        hit |= _bits_at(bits, box, px + m * ex, py + m * ey, pz + m * ez)
        m = half * (t_c + np.float32(1.0))
        hit |= _bits_at(bits, box, px + m * ex, py + m * ey, pz + m * ez)
    return hit


@_jit
def _side(x, y, z, near):
    """Six flags: below ``near``'s lo / above its hi on each axis (0 within it, or NaN)."""
    return (
        (x < near[0]) | ((x > near[3]) << 1) | ((y < near[1]) << 2) | ((y > near[4]) << 3)
        | ((z < near[2]) << 4) | ((z > near[5]) << 5)
    )  # fmt: skip


@_jit
def streamline_bits(points, offsets, bits, box, near, first, last, out):
    """``out[s - first]`` = region bits of streamline s, for s in ``first..last-1``: the voxels of
    its points and those its segments cross. ``points`` (P, 3) float32 voxel coordinates,
    ``bits`` the region bits inside the box (uint32), ``box`` its float32 voxel bounds (lo, hi),
    ``near`` (lo - 1, hi + 1).

    A point outside ``near`` lies in no region; a segment whose ends lie beyond one same side of
    ``near`` cannot reach one (the reference's test, ``max(a, b) >= lo - 1`` and ``min(a, b) <=
    hi + 1`` on every axis; a segment with a NaN end that passes is not traversed)."""
    for s in range(first, last):
        hit = np.uint32(0)
        start, end = offsets[s], offsets[s + 1]
        if start < end:
            ax, ay, az = points[start, 0], points[start, 1], points[start, 2]
            side_a = _side(ax, ay, az, near)
            if side_a == 0:
                hit |= _bits_at(bits, box, ax, ay, az)
            for i in range(start + 1, end):
                bx, by, bz = points[i, 0], points[i, 1], points[i, 2]
                side_b = _side(bx, by, bz, near)
                if side_b == 0:
                    hit |= _bits_at(bits, box, bx, by, bz)
                if side_a & side_b == 0:
                    hit |= _segment_bits(bits, box, near, ax, ay, az, bx, by, bz)
                ax, ay, az, side_a = bx, by, bz, side_b
        out[s - first] = hit
