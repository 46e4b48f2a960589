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
    n_ic, m, n_iso = lut_ic.shape[0], lut_ic.shape[2], lut_iso.shape[0]
    for r in rows:
        yr = y[r]
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
               ec_orient, lut_ec, lut_iso, y, ax, neg_beta, mode, out_ic, out_ec, out_iso, weight, mark, touched, yr,
               res, dots):  # fmt: skip
    # One visit per voxel row: A (x · inv) summed in float64 (a_rows' arithmetic), then, by mode,
    #   0: Aᵀ of that float64 row (the power iteration's Aᵀ A v, no measurement vector);
    #   1: FISTA's step: A x_new rounded to float32, A z = (A x − A x_new)(−β) + A x_new and the
    #      residual A z − y as NumPy's operations on float32 vectors make them (the product with
    #      the float64 scalar −β in float64, rounded once; the rest in float32), A x_new
    #      stored in ``ax`` over A x, and Aᵀ of the residual (at_rows' arithmetic);
    #   2: A x_new rounded to float32 into ``ax`` only.
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
        if mode == 2:
            out = ax[r]
            for k in range(m):
                out[k] = yr[k]
            continue
        if mode == 1:
            old = ax[r]
            yy = y[r]
            for k in range(m):
                new = np.float32(yr[k])
                z = np.float32((old[k] - new) * neg_beta) + new  # −β a float64 scalar, as NumPy's
                res[k] = z - yy[k]
                old[k] = new
            for k in range(m):
                yr[k] = res[k]  # exact: float32 values
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
