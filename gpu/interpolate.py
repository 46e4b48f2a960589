"""Trilinear interpolation of voxel fields at continuous voxel coordinates.

Voxel ``i`` has its centre at coordinate ``i``; a point lies inside the volume when
every coordinate is in ``[-0.5, n - 0.5)``. Interpolation clamps coordinates to the
voxel centres ``[0, n - 1]`` (constant extension across the outer half voxel), which
is what the CUDA kernels in ``kernels/tracking.cuh`` do.
"""

from __future__ import annotations

import numpy as np


def inside_volume(xp, points, shape):
    """``(N,)`` bool: the points (``(N, 3)`` voxel coordinates) lie inside a grid of ``shape``."""
    upper = xp.asarray([n - 0.5 for n in shape[:3]], dtype=points.dtype)
    return xp.all((points >= -0.5) & (points < upper), axis=-1)


def nearest_voxel(xp, points, shape):
    """Index ``(N, 3)`` of the voxel containing each point, clamped to the grid."""
    index = xp.floor(points + 0.5).astype(xp.int64)
    upper = xp.asarray([n - 1 for n in shape[:3]], dtype=xp.int64)
    return xp.clip(index, 0, upper)


def lookup(xp, volume, points):
    """Nearest-voxel values of a 3-D ``volume`` at ``(N, 3)`` points (clamped)."""
    index = nearest_voxel(xp, points, volume.shape)
    return volume[index[:, 0], index[:, 1], index[:, 2]]


def trilinear(xp, field, points):
    """Values of ``field`` (``(X, Y, Z, C)``) at ``(N, 3)`` points: ``(N, C)``.

    Computed in the dtype of ``points``; corners are read in the field's dtype.
    """
    shape = field.shape[:3]
    upper = xp.asarray([n - 1 for n in shape], dtype=points.dtype)
    p = xp.clip(points, 0.0, upper)
    base = xp.floor(p)
    frac = p - base
    i0 = base.astype(xp.int64)
    i1 = xp.minimum(i0 + 1, xp.asarray([n - 1 for n in shape], dtype=xp.int64))
    fx, fy, fz = frac[:, 0:1], frac[:, 1:2], frac[:, 2:3]
    out = None
    if field.flags.c_contiguous:
        # One gather by flat voxel number per corner, several times faster than three index
        # arrays; the same values and the same sum, in the same order. The weights of x and y
        # are multiplied once per pair (the same product), the corners' float32 values widened
        # by the product itself, and the sum grows in place: fewer temporaries, the same bits.
        flat = field.reshape(-1, *field.shape[3:])
        sy, sx = shape[2], shape[1] * shape[2]
        xs = ((i0[:, 0] * sx, 1.0 - fx), (i1[:, 0] * sx, fx))
        ys = ((i0[:, 1] * sy, 1.0 - fy), (i1[:, 1] * sy, fy))
        zs = ((i0[:, 2], 1.0 - fz), (i1[:, 2], fz))
        # a field of a wider type than the points is narrowed first, as the docstring says
        narrow = np.result_type(field.dtype, points.dtype) != points.dtype
        for cx, wx in xs:
            for cy, wy in ys:
                row, wxy = cx + cy, wx * wy
                for cz, wz in zs:
                    corner = xp.take(flat, row + cz, axis=0)
                    term = (wxy * wz) * (corner.astype(points.dtype) if narrow else corner)
                    if out is None:
                        out = term
                    else:
                        out += term
        return out
    for cx, wx in ((i0[:, 0], 1.0 - fx), (i1[:, 0], fx)):
        for cy, wy in ((i0[:, 1], 1.0 - fy), (i1[:, 1], fy)):
            for cz, wz in ((i0[:, 2], 1.0 - fz), (i1[:, 2], fz)):
                term = (wx * wy * wz) * field[cx, cy, cz].astype(points.dtype)
                out = term if out is None else out + term
    return out
