"""The compiled plane loop of :mod:`gpu.resample` on the CPU, in numba. Imported only when numba (the
``cpu`` extra) is installed; module-level functions so numba's on-disk cache finds them again in the
next process. The same arithmetic as the NumPy path (float64 coordinates, SciPy's
``mode="constant"`` edges: outside ``[0, n - 1]`` reads ``cval``, the field reads 0; nearest rounds
half up)."""

from __future__ import annotations

import math

import numba

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)


@_jit
def _trilinear(volume, c, x, y, z):
    """Channel ``c`` of ``volume`` at (x, y, z), a point inside it."""
    nx, ny, nz = volume.shape[0], volume.shape[1], volume.shape[2]
    bx, by, bz = math.floor(x), math.floor(y), math.floor(z)
    fx, fy, fz = x - bx, y - by, z - bz
    x0, y0, z0 = int(bx), int(by), int(bz)
    x1, y1, z1 = min(x0 + 1, nx - 1), min(y0 + 1, ny - 1), min(z0 + 1, nz - 1)
    gx, gy, gz = 1.0 - fx, 1.0 - fy, 1.0 - fz
    return (
        gx * gy * gz * volume[x0, y0, z0, c]
        + gx * gy * fz * volume[x0, y0, z1, c]
        + gx * fy * gz * volume[x0, y1, z0, c]
        + gx * fy * fz * volume[x0, y1, z1, c]
        + fx * gy * gz * volume[x1, y0, z0, c]
        + fx * gy * fz * volume[x1, y0, z1, c]
        + fx * fy * gz * volume[x1, y1, z0, c]
        + fx * fy * fz * volume[x1, y1, z1, c]
    )


@_jit
def _displacement(field, u, v, t):
    """The field's three components at (u, v, t), trilinear with one set of weights; 0 outside."""
    nx, ny, nz = field.shape[0], field.shape[1], field.shape[2]
    if not (0.0 <= u <= nx - 1 and 0.0 <= v <= ny - 1 and 0.0 <= t <= nz - 1):
        return 0.0, 0.0, 0.0
    bx, by, bz = math.floor(u), math.floor(v), math.floor(t)
    fx, fy, fz = u - bx, v - by, t - bz
    x0, y0, z0 = int(bx), int(by), int(bz)
    x1, y1, z1 = min(x0 + 1, nx - 1), min(y0 + 1, ny - 1), min(z0 + 1, nz - 1)
    gx, gy, gz = 1.0 - fx, 1.0 - fy, 1.0 - fz
    w = (gx * gy * gz, gx * gy * fz, gx * fy * gz, gx * fy * fz, fx * gy * gz, fx * gy * fz, fx * fy * gz, fx * fy * fz)
    a = field[x0, y0, z0]
    b = field[x0, y0, z1]
    c = field[x0, y1, z0]
    d = field[x0, y1, z1]
    e = field[x1, y0, z0]
    f = field[x1, y0, z1]
    g = field[x1, y1, z0]
    h = field[x1, y1, z1]
    out0 = w[0] * a[0] + w[1] * b[0] + w[2] * c[0] + w[3] * d[0] + w[4] * e[0] + w[5] * f[0] + w[6] * g[0] + w[7] * h[0]
    out1 = w[0] * a[1] + w[1] * b[1] + w[2] * c[1] + w[3] * d[1] + w[4] * e[1] + w[5] * f[1] + w[6] * g[1] + w[7] * h[1]
    out2 = w[0] * a[2] + w[1] * b[2] + w[2] * c[2] + w[3] * d[2] + w[4] * e[2] + w[5] * f[2] + w[6] * g[2] + w[7] * h[2]
    return out0, out1, out2


@_jit
def resample_planes(data, out, i0, i1, linear, field, has_field, at, step, order, cval):
    """Planes ``i0:i1`` of ``out`` (X, Y, Z, C: the whole output, each call writes its planes) from ``data`` (SX, SY, SZ, C): ``linear`` and ``at``
    (3, 4) float64, ``field`` (FX, FY, FZ, 3) float32 (read when ``has_field``), ``step`` (3, 3)."""
    sx, sy, sz = data.shape[0], data.shape[1], data.shape[2]
    channels = data.shape[3]
    for i in range(i0, i1):
        for j in range(out.shape[1]):
            for k in range(out.shape[2]):
                x = linear[0, 0] * i + linear[0, 1] * j + linear[0, 2] * k + linear[0, 3]
                y = linear[1, 0] * i + linear[1, 1] * j + linear[1, 2] * k + linear[1, 3]
                z = linear[2, 0] * i + linear[2, 1] * j + linear[2, 2] * k + linear[2, 3]
                if has_field:
                    u = at[0, 0] * i + at[0, 1] * j + at[0, 2] * k + at[0, 3]
                    v = at[1, 0] * i + at[1, 1] * j + at[1, 2] * k + at[1, 3]
                    t = at[2, 0] * i + at[2, 1] * j + at[2, 2] * k + at[2, 3]
                    w0, w1, w2 = _displacement(field, u, v, t)
                    x += step[0, 0] * w0 + step[0, 1] * w1 + step[0, 2] * w2
                    y += step[1, 0] * w0 + step[1, 1] * w1 + step[1, 2] * w2
                    z += step[2, 0] * w0 + step[2, 1] * w1 + step[2, 2] * w2
                inside = 0.0 <= x <= sx - 1 and 0.0 <= y <= sy - 1 and 0.0 <= z <= sz - 1
                if order == 0:
                    if inside:
                        a, b, c = math.floor(x + 0.5), math.floor(y + 0.5), math.floor(z + 0.5)  # int in numba
                        for ch in range(channels):
                            out[i, j, k, ch] = data[a, b, c, ch]
                    else:
                        for ch in range(channels):
                            out[i, j, k, ch] = cval
                else:
                    for ch in range(channels):
                        value = _trilinear(data, ch, x, y, z) if inside else cval
                        out[i, j, k, ch] = value
