"""The compiled row loops of COMMIT's CPU operator (:mod:`gpu.commit_host`), in numba. Imported
only when numba (the ``cpu`` extra) is installed. Module-level functions (not closures), so that
numba's on-disk cache finds them again in the next process."""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)


@_jit
def a_rows(rows, row_start, fiber, length, orient, x_ic, lut_ic, ec_start, ec_orient, x_ec, lut_ec, x_iso,
           lut_iso, y, weight, mark, touched, yr, row0):  # fmt: skip
    # yr: the row summed in float64 (y may be float32: each value rounded once, when stored);
    # row r goes to y[r - row0] (row0 > 0: y holds a block of rows only)
    n_ic, m, n_iso = lut_ic.shape[0], lut_ic.shape[2], lut_iso.shape[0]
    for r in rows:
        yr[:] = 0.0
        for j in range(n_iso):
            w = x_iso[r, j]
            for k in range(m):
                yr[k] += w * lut_iso[j, k]
        for e in range(ec_start[r], ec_start[r + 1]):
            w = x_ec[e]
            o = ec_orient[e]
            for k in range(m):
                yr[k] += w * lut_ec[o, k]
        n_touched = 0
        for s in range(row_start[r], row_start[r + 1]):
            o = orient[s]
            if mark[o] != r:
                mark[o] = r
                touched[n_touched] = o
                n_touched += 1
                for j in range(n_ic):
                    weight[j, o] = 0.0
            f = fiber[s]
            for j in range(n_ic):
                weight[j, o] += length[s] * x_ic[j, f]
        for t in range(n_touched):
            o = touched[t]
            for j in range(n_ic):
                w = weight[j, o]
                for k in range(m):
                    yr[k] += w * lut_ic[j, o, k]
        out = y[r - row0]
        for k in range(m):
            out[k] = yr[k]


@_jit
def at_rows(rows, row_start, fiber, length, orient, lut_ic, ec_start, ec_orient, lut_ec, lut_iso, y, out_ic,
            out_ec, out_iso, dots, mark):  # fmt: skip
    n_ic, m = lut_ic.shape[0], lut_ic.shape[2]
    for r in rows:
        yr = y[r]
        _transpose_iso_ec(r, ec_start, ec_orient, lut_ec, lut_iso, yr, out_ec, out_iso)
        for s_ in range(row_start[r], row_start[r + 1]):
            o = orient[s_]
            if mark[o] != r:
                mark[o] = r
                for j in range(n_ic):
                    s = 0.0
                    for k in range(m):
                        s += np.float64(lut_ic[j, o, k]) * yr[k]
                    dots[j, o] = s
            f = fiber[s_]
            for j in range(n_ic):
                out_ic[j, f] += length[s_] * dots[j, o]


@_jit
def norms_rows(rows, row_start, fiber, length, orient, lut_ic, out2, vector):
    n_ic, m = lut_ic.shape[0], lut_ic.shape[2]
    for r in rows:
        s0, s1 = row_start[r], row_start[r + 1]
        if s1 == s0:
            continue
        order = np.argsort(fiber[s0:s1], kind="mergesort")  # a row's streamlines together
        g = 0
        while g < s1 - s0:
            f = fiber[s0 + order[g]]
            vector[:, :] = 0.0
            while g < s1 - s0 and fiber[s0 + order[g]] == f:
                s = s0 + order[g]
                o = orient[s]
                ell = np.float64(length[s])  # a float32 length times a float32 table: widened first
                for j in range(n_ic):
                    for k in range(m):
                        vector[j, k] += ell * lut_ic[j, o, k]
                g += 1
            for j in range(n_ic):
                total = 0.0
                for k in range(m):
                    total += vector[j, k] * vector[j, k]
                out2[j, f] += total


@_jit
def fused_rows(rows, row_start, fiber, length, orient, x_ic, x_ec, x_iso, inv_ic, inv_ec, inv_iso, lut_ic, ec_start,
               ec_orient, lut_ec, lut_iso, out_ic, out_ec, out_iso, weight, mark, touched, yr, dots):  # fmt: skip
    # One visit per voxel row: A (x · inv) summed in float64 (a_rows' arithmetic), then Aᵀ of that
    # float64 row (the power iteration's Aᵀ A v, no measurement vector)
    n_ic, m, n_iso = lut_ic.shape[0], lut_ic.shape[2], lut_iso.shape[0]
    for r in rows:
        for k in range(m):
            yr[k] = 0.0
        for j in range(n_iso):
            w = x_iso[r, j] * inv_iso[r, j]
            for k in range(m):
                yr[k] += w * lut_iso[j, k]
        for e in range(ec_start[r], ec_start[r + 1]):
            w = x_ec[e] * inv_ec[e]
            o = ec_orient[e]
            for k in range(m):
                yr[k] += w * lut_ec[o, k]
        n_touched = 0
        for s in range(row_start[r], row_start[r + 1]):
            o = orient[s]
            if mark[o] != r:
                mark[o] = r
                touched[n_touched] = o
                n_touched += 1
                for j in range(n_ic):
                    weight[j, o] = 0.0
            f = fiber[s]
            for j in range(n_ic):
                weight[j, o] += length[s] * (x_ic[j, f] * inv_ic[j, f])
        for t in range(n_touched):
            o = touched[t]
            for j in range(n_ic):
                w = weight[j, o]
                for k in range(m):
                    yr[k] += w * lut_ic[j, o, k]
        _transpose_row(r, row_start, fiber, length, orient, lut_ic, ec_start, ec_orient, lut_ec, lut_iso, yr,
                       n_touched, touched, out_ic, out_ec, out_iso, dots)  # fmt: skip


@_jit
def step_rows(rows, row_start, fiber, length, orient, xn_ic, xn_ec, xn_iso, xo_ic, xo_ec, xo_iso, inv_ic, inv_ec,
              inv_iso, lut_ic, ec_start, ec_orient, lut_ec, lut_iso, y, beta, transpose, out_ic, out_ec, out_iso,
              wn, wo, mark, touched, yn, yz, dots, residual2):  # fmt: skip
    # FISTA's step in one visit per voxel row, with no measurement-sized vector kept between
    # iterations: A x_new and A z = (1 + β) A x_new − β A x_old (x_new, x_old times inv), both
    # summed in float64 from the segments (each orientation's two weights summed first, then
    # its table row added once to both); residual2[0] += ‖A x_new − y‖² over the rows; with
    # ``transpose``, Aᵀ (A z − y) (at_rows' arithmetic, float64 row)
    n_ic, m, n_iso = lut_ic.shape[0], lut_ic.shape[2], lut_iso.shape[0]
    keep = 1.0 + beta
    total = 0.0
    for r in rows:
        for k in range(m):
            yn[k] = 0.0
            yz[k] = 0.0
        for j in range(n_iso):
            a = xn_iso[r, j] * inv_iso[r, j]
            b = keep * a - beta * (xo_iso[r, j] * inv_iso[r, j])
            for k in range(m):
                v = lut_iso[j, k]
                yn[k] += a * v
                yz[k] += b * v
        for e in range(ec_start[r], ec_start[r + 1]):
            a = xn_ec[e] * inv_ec[e]
            b = keep * a - beta * (xo_ec[e] * inv_ec[e])
            o = ec_orient[e]
            for k in range(m):
                v = lut_ec[o, k]
                yn[k] += a * v
                yz[k] += b * v
        n_touched = 0
        for s in range(row_start[r], row_start[r + 1]):
            o = orient[s]
            if mark[o] != r:
                mark[o] = r
                touched[n_touched] = o
                n_touched += 1
                for j in range(n_ic):
                    wn[j, o] = 0.0
                    wo[j, o] = 0.0
            f = fiber[s]
            ell = length[s]
            for j in range(n_ic):
                wn[j, o] += ell * (xn_ic[j, f] * inv_ic[j, f])
                wo[j, o] += ell * (xo_ic[j, f] * inv_ic[j, f])
        for t in range(n_touched):
            o = touched[t]
            for j in range(n_ic):
                a = wn[j, o]
                b = keep * a - beta * wo[j, o]
                for k in range(m):
                    v = lut_ic[j, o, k]
                    yn[k] += a * v
                    yz[k] += b * v
        yy = y[r]
        for k in range(m):
            d = yn[k] - yy[k]
            total += d * d
            yz[k] -= yy[k]
        if transpose:
            _transpose_row(r, row_start, fiber, length, orient, lut_ic, ec_start, ec_orient, lut_ec, lut_iso, yz,
                           n_touched, touched, out_ic, out_ec, out_iso, dots)  # fmt: skip
    residual2[0] += total


@_jit
def _transpose_row(r, row_start, fiber, length, orient, lut_ic, ec_start, ec_orient, lut_ec, lut_iso, yr, n_touched,
                   touched, out_ic, out_ec, out_iso, dots):  # fmt: skip
    # Aᵀ of one float64 row ``yr`` (at_rows' arithmetic): the row's iso and EC columns, and each
    # segment's streamline by its orientation's dot product (made once per distinct orientation)
    n_ic, m = lut_ic.shape[0], lut_ic.shape[2]
    _transpose_iso_ec(r, ec_start, ec_orient, lut_ec, lut_iso, yr, out_ec, out_iso)
    for t in range(n_touched):  # the row's distinct orientations: their dot products once
        o = touched[t]
        for j in range(n_ic):
            s = 0.0
            for k in range(m):
                s += np.float64(lut_ic[j, o, k]) * yr[k]
            dots[j, o] = s
    for s_ in range(row_start[r], row_start[r + 1]):
        o = orient[s_]
        f = fiber[s_]
        for j in range(n_ic):
            out_ic[j, f] += length[s_] * dots[j, o]


@_jit
def _transpose_iso_ec(r, ec_start, ec_orient, lut_ec, lut_iso, yr, out_ec, out_iso):
    # Aᵀ of row r's measurements ``yr`` (float32 or float64, widened per value) for its iso
    # columns and its EC compartments: each table row's dot product with it, in float64
    m, n_iso = lut_iso.shape[1], lut_iso.shape[0]
    for j in range(n_iso):
        s = 0.0
        for k in range(m):
            s += np.float64(lut_iso[j, k]) * yr[k]
        out_iso[r, j] = s
    for e in range(ec_start[r], ec_start[r + 1]):
        o = ec_orient[e]
        s = 0.0
        for k in range(m):
            s += np.float64(lut_ec[o, k]) * yr[k]
        out_ec[e] = s
