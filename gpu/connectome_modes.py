"""probtrackx2's connectome modes as entries (:mod:`gpu.connectome` gives their definitions):
each chunk of streamlines as its (streamline, voxel) first visits (:class:`Visits`), which
streamlines are kept (:func:`kept_streamlines`), and the entries of matrix2
(:func:`emit_matrix2`), matrix3 (:func:`emit_matrix3`) and network mode
(:func:`network_reached`), on the array module given (NumPy or CuPy)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .connectome_counts import SparseAccumulator, bincount_or_zeros
from .indices import flatnonzero, nonzero
from .probabilistic_params import (
    BIT_EXCLUDE,
    WAYPOINT_SHIFT,
)


@dataclass
@dataclass
class Visits:
    """The first visit of each (streamline, voxel) of a chunk (device arrays), sorted by
    streamline then voxel: ``distance_mm`` is signed (the second half negative) so that the
    length between two visits is the absolute difference; ``order`` is the tracking order."""

    stream: object
    voxel: object
    distance_mm: object
    order: object
    length_mm: object  # (n,) each streamline's length, both halves
    n: int


def visits_from_trace(xp, trace, shape, step_mm: float) -> Visits:
    """The voxels each streamline visits, from its recorded steps ``trace`` (n, 2, T, ≥3:
    x, y, z per step of each half; a stopped half repeats its last position). A voxel is
    visited where a position lies in it (rounded), as the tracker counts it: the start, and
    each step that moved."""
    n, _, T = trace.shape[:3]
    P = trace[..., :3]
    shape_a = xp.asarray(np.array(shape, dtype=np.int64))
    moved = xp.any(P[:, :, 1:] != P[:, :, :-1], axis=3)  # (n, 2, T - 1)
    moves = xp.cumsum(moved, axis=2, dtype=xp.int32)
    length = (moves[:, :, -1].sum(1) if T > 1 else xp.zeros(n, xp.int32)).astype(xp.float64) * step_mm
    s1, h1, t1 = nonzero(xp, moved)
    stream = xp.concatenate([xp.arange(n, dtype=xp.int64), s1.astype(xp.int64)])
    half = xp.concatenate([xp.zeros(n, dtype=xp.int64), h1.astype(xp.int64)])
    t = xp.concatenate([xp.zeros(n, dtype=xp.int64), t1.astype(xp.int64) + 1])
    travelled = xp.concatenate([xp.zeros(n, dtype=xp.float64), moves[s1, h1, t1].astype(xp.float64)])
    distance = travelled * step_mm * (1.0 - 2.0 * half)
    order = half * T + t
    v = xp.rint(P[stream, half, t]).astype(xp.int64)
    inside = xp.all((v >= 0) & (v < shape_a), axis=1)
    flat = (v[:, 0] * int(shape[1]) + v[:, 1]) * int(shape[2]) + v[:, 2]
    stream, flat, distance, order = stream[inside], flat[inside], distance[inside], order[inside]
    # The first visit of each (streamline, voxel): one sort on a combined key.
    n_vox = int(np.prod(shape))
    if n * n_vox * 2 * T >= 2**62:
        raise ValueError("too many streamlines in one chunk for this grid; use smaller chunks")
    key = (stream * n_vox + flat) * (2 * T) + order
    idx = xp.argsort(key)
    pair = key[idx] // (2 * T)
    first = xp.concatenate([xp.ones(min(1, len(pair)), dtype=bool), pair[1:] != pair[:-1]])
    idx = idx[first]
    return Visits(stream[idx], flat[idx], distance[idx], order[idx], length, n)


def _repeat(xp, counts):
    """(source index, rank within its repeat) of ``np.repeat(arange(len(counts)), counts)``,
    without array-valued repeats (CuPy lacks them)."""
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    k = xp.arange(total, dtype=xp.int64)
    src = xp.searchsorted(ends, k, side="right")
    return src, k - (ends - counts)[src]


def _first_per_key(xp, key_hi, order, *columns):
    """Keep, per ``key_hi`` value, the entry of least ``order`` (columns filtered alike),
    sorted by ``key_hi``."""
    if len(key_hi) == 0:
        return columns
    span = int(order.max()) + 1
    idx = xp.argsort(key_hi * span + order)  # one key: CuPy's lexsort takes no int64 pairs
    k = key_hi[idx]
    first = xp.concatenate([xp.ones(1, dtype=bool), k[1:] != k[:-1]])
    idx = idx[first]
    return tuple(c[idx] for c in columns)


def _groups(xp, stream):
    """(start of its group, group size) of each entry of entries sorted by ``stream``."""
    new = xp.concatenate([xp.ones(min(1, len(stream)), dtype=bool), stream[1:] != stream[:-1]])
    starts = flatnonzero(xp, new)
    group = xp.cumsum(new) - 1
    sizes = xp.diff(xp.concatenate([starts, xp.asarray([len(stream)], dtype=starts.dtype)]))
    return starts[group], sizes[group]


def count_and_length(xp, lengths):
    """The values an entry adds: one (the count) and the path length (for ``pd``, ``ompl``)."""
    return xp.stack([xp.ones(len(lengths), dtype=xp.float64), xp.abs(lengths)], 1)


def emit_matrix2(xp, acc: SparseAccumulator, visits: Visits, entry_kept, columns, seed_of):
    """Seed voxel × target2 column, once per streamline and column."""
    col = columns[visits.voxel]
    sel = entry_kept & (col >= 0)
    s, c, d, o = visits.stream[sel], col[sel], visits.distance_mm[sel], visits.order[sel]
    s, c, d = _first_per_key(xp, s * acc.shape[1] + c, o, s, c, d)
    acc.add(seed_of[s], c, count_and_length(xp, d))


def emit_matrix3(xp, acc: SparseAccumulator, visits: Visits, entry_kept, nodes, columns=None, most: int = 1 << 24):
    """Every pair of distinct target3 voxels a streamline visits (a < b), or with
    ``columns`` (lrtarget3) every target3 voxel × lrtarget3 column; in pieces of at most
    ``most`` pairs."""
    node = nodes[visits.voxel]
    sel = entry_kept & (node >= 0)
    s, a, da = visits.stream[sel], node[sel], visits.distance_mm[sel]  # sorted by streamline
    if columns is None:
        start, size = _groups(xp, s)
        rank = xp.arange(len(s), dtype=xp.int64) - start
        partners = size - 1 - rank  # the later entries of its streamline
        other_node, other_d, other_start = a, da, None
    else:
        col = columns[visits.voxel]
        csel = entry_kept & (col >= 0)
        cs, cc, cd, co = visits.stream[csel], col[csel], visits.distance_mm[csel], visits.order[csel]
        cs, cc, cd = _first_per_key(xp, cs * acc.shape[1] + cc, co, cs, cc, cd)  # sorted by streamline
        first = xp.searchsorted(cs, s, side="left")
        partners = xp.searchsorted(cs, s, side="right") - first
        other_node, other_d, other_start = cc, cd, first
    _emit_pairs(xp, acc, a, da, partners, other_node, other_d, other_start, columns is None, most)


def _emit_pairs(xp, acc, a, da, partners, other_node, other_d, other_start, triangle: bool, most: int):
    ends = xp.cumsum(partners)
    total = int(ends[-1]) if len(ends) else 0
    for lo in range(0, total, most):
        k = xp.arange(lo, min(total, lo + most), dtype=xp.int64)
        src = xp.searchsorted(ends, k, side="right")
        within = k - (ends - partners)[src]
        partner = src + 1 + within if triangle else other_start[src] + within
        x, y = a[src], other_node[partner]
        rows, cols = (xp.minimum(x, y), xp.maximum(x, y)) if triangle else (x, y)
        acc.add(rows, cols, count_and_length(xp, da[src] - other_d[partner]))


def network_reached(xp, visits: Visits, entry_kept, membership, own_mask, n_masks: int):
    """(streamline, mask, |distance| at first entry) of every other network mask each kept
    streamline enters; ``membership``: (indptr over voxels, mask numbers), CSR."""
    indptr, masks = membership
    sel = entry_kept
    s, v, d, o = visits.stream[sel], visits.voxel[sel], visits.distance_mm[sel], visits.order[sel]
    src, rank = _repeat(xp, indptr[v + 1] - indptr[v])
    m = masks[indptr[v[src]] + rank]
    s, d, o = s[src], d[src], o[src]
    other = m != own_mask[s]
    s, m, d, o = s[other], m[other], d[other], o[other]
    return _first_per_key(xp, s * n_masks + m, o, s, m, xp.abs(d))


def membership_csr(masks: np.ndarray):
    """(indptr over flat voxels, mask numbers): which masks hold each voxel."""
    m = masks.shape[0]
    per_voxel = masks.reshape(m, -1).T  # (n_vox, m)
    vox, mask = np.nonzero(per_voxel)
    indptr = np.zeros(per_voxel.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(vox, minlength=per_voxel.shape[0]), out=indptr[1:])
    return indptr, mask.astype(np.int64)


def kept_streamlines(xp, visits: Visits, bits_flat, n_waypoints, waycond, distthresh):
    """Kept streamlines: no exclusion voxel, the waypoint condition, at least ``distthresh`` long."""
    n = visits.n
    b = bits_flat[visits.voxel]
    excluded = bincount_or_zeros(xp, visits.stream[(b & BIT_EXCLUDE) != 0], n) > 0
    kept = ~excluded & (visits.length_mm >= distthresh)
    if n_waypoints:
        met = xp.zeros(n, dtype=xp.int64)
        for i in range(n_waypoints):
            hit = bincount_or_zeros(xp, visits.stream[((b >> (WAYPOINT_SHIFT + i)) & 1) != 0], n) > 0
            met += hit
        kept &= (met == n_waypoints) if waycond == "AND" else (met > 0)
    return kept
