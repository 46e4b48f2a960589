"""The compiled loop of deterministic tracking on the CPU (:mod:`gpu.deterministic_host`): the
CUDA kernel ``kernels/deterministic.cu`` with ``sym3.cuh`` and ``tracking.cuh``, line for line,
in numba. Imported only when numba (the ``cpu`` extra) is installed. Module-level functions
(not closures), so that numba's on-disk cache finds them again in the next process."""

from __future__ import annotations

import math

import numba

from .streamlines import LOW_FA, MAX_LENGTH, OUTSIDE_MASK, OUTSIDE_VOLUME, SHARP_ANGLE, STOP_REGION

c_max_length, c_outside_volume, c_outside_mask = MAX_LENGTH, OUTSIDE_VOLUME, OUTSIDE_MASK
c_low_fa, c_sharp_angle, c_stop_region = LOW_FA, SHARP_ANGLE, STOP_REGION
region_outside, region_stop = 0, 2  # gpu.deterministic's OUTSIDE and STOP
_inline = numba.njit(nogil=True, cache=True, inline="always")  # small helpers: inlined in numba's IR
_call = numba.njit(nogil=True, cache=True)  # the larger ones: compiled once, inlined by LLVM where it pays


@_inline
def cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


@_inline
def dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@_inline
def unit(u, fallback):
    n = math.sqrt(dot(u, u))
    return (u[0] / n, u[1] / n, u[2] / n) if n > 0.0 else fallback


@_inline
def apply(c, v):
    return (
        c[0] * v[0] + c[1] * v[1] + c[2] * v[2],
        c[1] * v[0] + c[3] * v[1] + c[4] * v[2],
        c[2] * v[0] + c[4] * v[1] + c[5] * v[2],
    )


@_call
def fa_invariants(t):
    a, b, c, d, e, f = t
    i1 = a + d + f
    i2 = a * d + a * f + d * f - b * b - c * c - e * e
    i4 = i1 * i1 - 2.0 * i2
    return math.sqrt(max(1.0 - i2 / i4, 0.0)) if i4 > 0.0 else 0.0


@_call
def eigvec_by_cross(c, lam, fallback):
    r0 = (c[0] - lam, c[1], c[2])
    r1 = (c[1], c[3] - lam, c[4])
    r2 = (c[2], c[4], c[5] - lam)
    best = cross(r0, r1)
    best_norm = dot(best, best)
    cand = cross(r0, r2)
    n = dot(cand, cand)
    if n > best_norm:
        best, best_norm = cand, n
    cand = cross(r1, r2)
    n = dot(cand, cand)
    if n > best_norm:
        best = cand
    return unit(best, fallback)


@_call
def eigvec_in_plane(c, w, lam):
    if abs(w[0]) > abs(w[1]):
        inv = 1.0 / math.sqrt(w[0] * w[0] + w[2] * w[2])
        u = (-w[2] * inv, 0.0, w[0] * inv)
    else:
        inv = 1.0 / math.sqrt(w[1] * w[1] + w[2] * w[2])
        u = (0.0, w[2] * inv, -w[1] * inv)
    v = cross(w, u)
    au, av = apply(c, u), apply(c, v)
    m00, m01, m11 = dot(u, au) - lam, dot(u, av), dot(v, av) - lam
    a00, a01, a11 = abs(m00), abs(m01), abs(m11)
    row0 = a00 >= a11
    cu = m01 if row0 else m11
    cv = -m00 if row0 else -m01
    big = max(max(a00, a01), a11)
    vec = unit((u[0] * cu + v[0] * cv, u[1] * cu + v[1] * cv, u[2] * cu + v[2] * cv), u)
    return vec if big > 0.0 else u


@_call
def principal(t):
    """(λ1, λ2) and e1 (sym3.principal, Eberly's closed form)."""
    scale = 0.0
    for i in range(6):
        scale = max(scale, abs(t[i]))
    nonzero = scale > 0.0
    s = scale if nonzero else 1.0
    c = (t[0] / s, t[1] / s, t[2] / s, t[3] / s, t[4] / s, t[5] / s)
    q = (c[0] + c[3] + c[5]) / 3.0
    b00, b11, b22 = c[0] - q, c[3] - q, c[5] - q
    p2 = b00 * b00 + b11 * b11 + b22 * b22 + 2.0 * (c[1] * c[1] + c[2] * c[2] + c[4] * c[4])
    p = math.sqrt(p2 / 6.0)
    aniso = p > 0.0
    ps = p if aniso else 1.0
    c00, c11, c22 = b00 / ps, b11 / ps, b22 / ps
    c01, c02, c12 = c[1] / ps, c[2] / ps, c[4] / ps
    half_det = 0.5 * (c00 * (c11 * c22 - c12 * c12) - c01 * (c01 * c22 - c02 * c12) + c02 * (c01 * c12 - c02 * c11))
    half_det = min(max(half_det, -1.0), 1.0)
    angle = math.acos(half_det) / 3.0
    beta_hi = 2.0 * math.cos(angle)
    beta_lo = 2.0 * math.cos(angle + 2.0 * math.pi / 3.0)
    beta_mid = min(max(-(beta_hi + beta_lo), beta_lo), beta_hi)
    lam0, lam1, lam2 = q + p * beta_hi, q + p * beta_mid, q + p * beta_lo
    hi_first = half_det >= 0.0
    ex = (1.0, 0.0, 0.0)
    v_first = eigvec_by_cross(c, lam0 if hi_first else lam2, ex)
    v = v_first if hi_first else eigvec_in_plane(c, v_first, lam0)
    iso = not (aniso and nonzero)
    e1 = ex if iso else v
    l1 = (q if iso else lam0) * s if nonzero else 0.0
    l2 = (q if iso else lam1) * s if nonzero else 0.0
    return l1, l2, e1


@_call
def trilinear(field, p):
    nx, ny, nz = field.shape[0], field.shape[1], field.shape[2]
    x = min(max(p[0], 0.0), nx - 1.0)
    y = min(max(p[1], 0.0), ny - 1.0)
    z = min(max(p[2], 0.0), nz - 1.0)
    bx, by, bz = math.floor(x), math.floor(y), math.floor(z)
    fx, fy, fz = x - bx, y - by, z - bz
    i0, j0, k0 = int(bx), int(by), int(bz)
    i1, j1, k1 = min(i0 + 1, nx - 1), min(j0 + 1, ny - 1), min(k0 + 1, nz - 1)
    t0 = t1 = t2 = t3 = t4 = t5 = 0.0
    for a in range(2):
        ia, wa = (i0, 1.0 - fx) if a == 0 else (i1, fx)
        for b in range(2):
            jb, wb = (j0, 1.0 - fy) if b == 0 else (j1, fy)
            for cc in range(2):
                kc, wc = (k0, 1.0 - fz) if cc == 0 else (k1, fz)
                w = wa * wb * wc
                t0 += w * field[ia, jb, kc, 0]
                t1 += w * field[ia, jb, kc, 1]
                t2 += w * field[ia, jb, kc, 2]
                t3 += w * field[ia, jb, kc, 3]
                t4 += w * field[ia, jb, kc, 4]
                t5 += w * field[ia, jb, kc, 5]
    return (t0, t1, t2, t3, t4, t5)


@_call
def direction(field, p, vref, deflect, puncture):
    t = trilinear(field, p)
    l1, l2, e1 = principal(t)
    fa = fa_invariants(t)
    if dot(e1, vref) < 0.0:
        e1 = (-e1[0], -e1[1], -e1[2])
    if deflect:
        cl = (l1 - l2) / l1 if l1 > 0.0 else 0.0
        cl = min(max(cl, 0.0), 1.0)
        dv = unit(apply(t, vref), vref)
        mix = tuple_mix(vref, dv, 1.0 - puncture, puncture)
        e1 = unit(tuple_mix(e1, mix, cl, 1.0 - cl), vref)
    return e1, fa


@_inline
def tuple_mix(a, b, wa, wb):
    return (a[0] * wa + b[0] * wb, a[1] * wa + b[1] * wb, a[2] * wa + b[2] * wb)


@_inline
def inside(p, shape):
    return -0.5 <= p[0] < shape[0] - 0.5 and -0.5 <= p[1] < shape[1] - 0.5 and -0.5 <= p[2] < shape[2] - 0.5


@_inline
def nearest(region, p):
    nx, ny, nz = region.shape
    i = min(max(math.floor(p[0] + 0.5), 0), nx - 1)
    j = min(max(math.floor(p[1] + 0.5), 0), ny - 1)
    k = min(max(math.floor(p[2] + 0.5), 0), nz - 1)
    return region[i, j, k]


@numba.njit(nogil=True, cache=True)
def track_block(field, region, seeds, lo, hi, h, fa_threshold, cos_max, m, rk4, tensorline, puncture, buf,
                count, stop, valid):  # fmt: skip
    shape = region.shape
    sign_ref = (0.8017837257372732, 0.5345224838248488, 0.2672612419124244)
    for i in range(lo, hi):
        p0 = (seeds[i, 0], seeds[i, 1], seeds[i, 2])
        buf[i, m, 0], buf[i, m, 1], buf[i, m, 2] = p0[0], p0[1], p0[2]
        count[i, 0] = 0
        count[i, 1] = 0
        stop[i, 0] = 0
        stop[i, 1] = 0
        seed_stop = 0
        if not inside(p0, shape):
            seed_stop = c_outside_volume
        elif nearest(region, p0) == region_outside:
            seed_stop = c_outside_mask
        valid[i] = seed_stop == 0
        d0, fa = direction(field, p0, sign_ref, False, puncture)
        if seed_stop == 0 and fa < fa_threshold:
            seed_stop = c_low_fa
        if seed_stop != 0:
            stop[i, 0] = seed_stop
            stop[i, 1] = seed_stop
            continue
        forward_steps = 0
        for end in (1, 0):
            budget = m if end == 1 else m - forward_steps
            p = p0
            d = d0 if end == 1 else (-d0[0], -d0[1], -d0[2])
            steps = 0
            reason = 0
            while True:
                if steps >= budget:
                    reason = c_max_length
                    break
                v = d
                if rk4:
                    k2, _ = direction(field, (p[0] + 0.5 * h[0] * d[0], p[1] + 0.5 * h[1] * d[1],
                                              p[2] + 0.5 * h[2] * d[2]), d, tensorline, puncture)  # fmt: skip
                    k3, _ = direction(field, (p[0] + 0.5 * h[0] * k2[0], p[1] + 0.5 * h[1] * k2[1],
                                              p[2] + 0.5 * h[2] * k2[2]), d, tensorline, puncture)  # fmt: skip
                    k4, _ = direction(field, (p[0] + h[0] * k3[0], p[1] + h[1] * k3[1], p[2] + h[2] * k3[2]),
                                      d, tensorline, puncture)  # fmt: skip
                    v = unit(
                        (
                            (d[0] + 2.0 * k2[0]) + (2.0 * k3[0] + k4[0]),
                            (d[1] + 2.0 * k2[1]) + (2.0 * k3[1] + k4[1]),
                            (d[2] + 2.0 * k2[2]) + (2.0 * k3[2] + k4[2]),
                        ),
                        d,
                    )
                q = (p[0] + h[0] * v[0], p[1] + h[1] * v[1], p[2] + h[2] * v[2])
                if not inside(q, shape):
                    reason = c_outside_volume
                    break
                code = nearest(region, q)
                if code == region_outside:
                    reason = c_outside_mask
                    break
                steps += 1
                at = m + steps if end == 1 else m - steps
                buf[i, at, 0], buf[i, at, 1], buf[i, at, 2] = q[0], q[1], q[2]
                if code == region_stop:
                    reason = c_stop_region
                    break
                e, fa = direction(field, q, v, tensorline, puncture)
                if fa < fa_threshold:
                    reason = c_low_fa
                    break
                if dot(e, v) < cos_max:
                    reason = c_sharp_angle
                    break
                p = q
                d = e
            count[i, end] = steps
            stop[i, end] = reason
            if end == 1:
                forward_steps = steps
