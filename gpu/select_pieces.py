"""Fiber selection's exact segment traversal, as array operations (NumPy or CuPy): segments cut
into pieces of at most one voxel per axis, and the voxels each piece visits (see
:mod:`gpu.select`). Shared by the reference (:func:`gpu.select.hits_arrays`) and the CPU engine
without numba (:mod:`gpu.select_host`), so both compute the same float32 values."""

from __future__ import annotations


def piece_counts(xp, p0, p1):
    """Pieces of each segment p0->p1: ``max(ceil(longest axis), 1)`` (float, of ``p0``'s dtype)."""
    return xp.maximum(xp.ceil(xp.abs(p1 - p0).max(axis=1)), 1)


def pieces(xp, p0, p1, k, n):
    """Piece ``k`` of ``n`` of segments p0->p1 (one row each): its ends (p, q)."""
    n = n.astype(p0.dtype)
    d = p1 - p0
    p = p0 + d * (k.astype(p0.dtype) / n)[:, None]
    q = p0 + d * ((k + 1).astype(p0.dtype) / n)[:, None]
    return p, q


def piece_cells(xp, p, q):
    """Voxels visited by pieces p->q (each ≤ 1 voxel per axis): (4, N, 3) int64 indices.

    Interval midpoints between the sorted boundary-crossing parameters; unused
    intervals repeat a visited voxel, which changes no OR.
    """
    d = q - p
    # Parameter where each axis crosses its boundary plane (k + 0.5) between p and q, else 1.
    lo = xp.minimum(p, q)
    plane = xp.floor(lo + 0.5) + 0.5  # first plane above the lower end
    crosses = (plane < xp.maximum(p, q)) & (d != 0)
    t = xp.where(crosses, (plane - p) / xp.where(d != 0, d, 1.0), 1.0)
    t = xp.sort(t, axis=1)  # (N, 3)
    zero = xp.zeros((t.shape[0], 1), dtype=t.dtype)
    one = xp.ones((t.shape[0], 1), dtype=t.dtype)
    edges = xp.concatenate([zero, t, one], axis=1)  # (N, 5)
    mids = 0.5 * (edges[:, :-1] + edges[:, 1:])  # (N, 4)
    samples = p[None, :, :] + mids.T[:, :, None] * d[None, :, :]
    return xp.floor(samples + 0.5).astype(xp.int64)
