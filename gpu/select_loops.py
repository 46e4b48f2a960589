"""The compiled loop of fiber selection on the CPU (:mod:`gpu.select_host`), in numba. Imported
only when numba (the ``cpu`` extra) is installed. Module-level functions (not closures), so that
numba's on-disk cache finds them again in the next process.

The arithmetic is the NumPy reference's (:func:`gpu.select.hits_arrays`), operation for operation
in float32 and in the same order, so the bits are the same: pieces ``a + d·(k/n)``, crossings
``(plane - p)/d``, midpoints ``0.5·(e_m + e_m+1)``, samples ``p + mid·(q - p)``, voxels
``floor(x + 0.5)``. numba contracts no multiply-add without ``fastmath``, so none is fused.
Voxels are compared with a box as floats before they become integers: a coordinate that is NaN
or too large for an integer is simply outside, as in the reference.

The regions come as boxes (:class:`gpu.select_host.RegionBoxes`): ``flat`` holds each box's bits
one after another (C order) from ``starts[c]``, of shape ``shapes[c]``; ``boxes[c]`` is float32
(lo xyz, hi xyz, lo - 1 xyz, hi + 1 xyz) in voxels of the grid.
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)

#: More pieces than this in one segment (2**31: a segment longer than any grid) are not traversed
MAX_PIECES = 2147483648.0


@_jit
def _cell_bits(flat, starts, shapes, boxes, c, i, j, k):
    """Bits of voxel (i, j, k) (integer-valued floats) in box ``c``: 0 outside it."""
    if i >= boxes[c, 0] and i <= boxes[c, 3] and j >= boxes[c, 1] and j <= boxes[c, 4]:
        if k >= boxes[c, 2] and k <= boxes[c, 5]:
            ii, jj, kk = int(i - boxes[c, 0]), int(j - boxes[c, 1]), int(k - boxes[c, 2])
            return flat[starts[c] + (ii * shapes[c, 1] + jj) * shapes[c, 2] + kk]
    return np.uint32(0)


@_jit
def _bits_at(flat, starts, shapes, boxes, c, x, y, z):
    """Bits of the voxel holding (x, y, z) in box ``c``."""
    half = np.float32(0.5)
    return _cell_bits(flat, starts, shapes, boxes, c, np.floor(x + half), np.floor(y + half), np.floor(z + half))


@_jit
def _side(boxes, c, x, y, z):
    """Six flags: below lo - 1 / above hi + 1 of box ``c`` on each axis (0 within, or NaN)."""
    return (
        (x < boxes[c, 6]) | ((x > boxes[c, 9]) << 1) | ((y < boxes[c, 7]) << 2) | ((y > boxes[c, 10]) << 3)
        | ((z < boxes[c, 8]) << 4) | ((z > boxes[c, 11]) << 5)
    )  # fmt: skip


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
def _piece_bits(flat, starts, shapes, boxes, c, px, py, pz, qx, qy, qz):
    """OR of the bits (box ``c``) of the voxels the piece p->q (≤ 1 voxel per axis) visits: at
    the midpoints of the intervals between its sorted boundary crossings. An empty interval (an
    axis that crosses no plane) repeats the voxel before it, which is not read again."""
    half = np.float32(0.5)
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
    hit = np.uint32(0)
    last_i, last_j, last_k = np.float32(np.nan), np.float32(np.nan), np.float32(np.nan)
    for m in range(4):
        if m == 0:
            mid = half * (np.float32(0.0) + t_a)
        elif m == 1:
            mid = half * (t_a + t_b)
        elif m == 2:
            mid = half * (t_b + t_c)
        else:
            mid = half * (t_c + np.float32(1.0))
        i = np.floor(px + mid * ex + half)
        j = np.floor(py + mid * ey + half)
        k = np.floor(pz + mid * ez + half)
        if i != last_i or j != last_j or k != last_k:
            hit |= _cell_bits(flat, starts, shapes, boxes, c, i, j, k)
            last_i, last_j, last_k = i, j, k
    return hit


@_jit
def _segment_bits(flat, starts, shapes, boxes, c, ax, ay, az, bx, by, bz):
    """OR of the bits (box ``c``) of the voxels the segment a->b crosses, in pieces of at most
    one voxel per axis, the reference's; a piece whose bounds miss box ``c`` ± 1 is skipped (its
    samples cannot reach the box), as the reference skips such segments."""
    hit = np.uint32(0)
    dx, dy, dz = bx - ax, by - ay, bz - az
    longest = np.ceil(max(abs(dx), max(abs(dy), abs(dz))))
    if not longest < MAX_PIECES:  # also NaN or infinite: not traversed
        return hit
    n = max(int(longest), 1)
    nf = np.float32(n)
    # piece k starts where piece k - 1 ended (a + d·(k/n): the same operations, the same value;
    # the first at a + d·0 = a)
    qx, qy, qz = ax, ay, az
    for k in range(n):
        px, py, pz = qx, qy, qz
        t1 = np.float32(k + 1) / nf
        qx, qy, qz = ax + dx * t1, ay + dy * t1, az + dz * t1
        if max(px, qx) < boxes[c, 6] or max(py, qy) < boxes[c, 7] or max(pz, qz) < boxes[c, 8]:
            continue
        if min(px, qx) > boxes[c, 9] or min(py, qy) > boxes[c, 10] or min(pz, qz) > boxes[c, 11]:
            continue
        hit |= _piece_bits(flat, starts, shapes, boxes, c, px, py, pz, qx, qy, qz)
    return hit


@_jit
def streamline_bits(points, offsets, flat, starts, shapes, boxes, present, first, last, out):
    """``out[s - first]`` = region bits of streamline s, for s in ``first..last-1``: the voxels of
    its points and those its segments cross. ``points`` (P, 3) float32 voxel coordinates.

    A point outside a box ± 1 lies in none of its voxels; a segment whose ends lie beyond one
    same side of it cannot reach it (the reference's test, ``max(a, b) >= lo - 1`` and ``min(a,
    b) <= hi + 1`` on every axis; a segment with a NaN end that passes is not traversed). Once a
    streamline has every bit ``present[c]`` of box ``c``, the box can add nothing to it and is
    not looked at again for that streamline."""
    n_boxes = len(starts)
    side = np.empty(n_boxes, dtype=np.int64)
    for s in range(first, last):
        hit = np.uint32(0)
        start, end = offsets[s], offsets[s + 1]
        if start < end:
            ax, ay, az = points[start, 0], points[start, 1], points[start, 2]
            for c in range(n_boxes):
                side[c] = _side(boxes, c, ax, ay, az)
                if side[c] == 0:
                    hit |= _bits_at(flat, starts, shapes, boxes, c, ax, ay, az)
            for i in range(start + 1, end):
                bx, by, bz = points[i, 0], points[i, 1], points[i, 2]
                for c in range(n_boxes):
                    if hit & present[c] == present[c]:
                        continue
                    side_b = _side(boxes, c, bx, by, bz)
                    if side_b == 0:
                        hit |= _bits_at(flat, starts, shapes, boxes, c, bx, by, bz)
                    if side[c] & side_b == 0:
                        hit |= _segment_bits(flat, starts, shapes, boxes, c, ax, ay, az, bx, by, bz)
                    side[c] = side_b
                ax, ay, az = bx, by, bz
        out[s - first] = hit
