"""Fiber selection's CPU engine without numba: NumPy over a block of streamlines, one region box
at a time (:mod:`gpu.select_host` owns the boxes, the blocks and the threads).

Every value is the reference's (:func:`gpu.select.hits_arrays`), the same float32 operations in
the same order, but computed axis by axis on 1-D arrays (NumPy's inner loops run over the
points, not over rows of three) and with the three crossings sorted by a min/max network
instead of ``sort`` (the same values in the same order). A code per point says on which side of
the box ± 1 it lies (six flags read as one 64-bit word), so a segment whose ends share a side
is dropped by one AND; the points and segments left are looked up and traversed, the segments in
batches of at most ``max_pieces`` pieces.
"""

from __future__ import annotations

import numpy as np

#: Segments with more pieces than this (longer than any grid) are not traversed; also non-finite ones
MAX_PIECES = 2**31

_HALF = np.float32(0.5)


def block_bits(points, offsets, boxes, first: int, last: int, max_pieces: int) -> np.ndarray:
    """Region bits of streamlines ``first..last-1`` (uint32): ``boxes`` a
    :class:`gpu.select_host.RegionBoxes`."""
    out = np.zeros(last - first, dtype=np.uint32)
    local = offsets[first : last + 1] - offsets[first]
    pts = points[int(offsets[first]) : int(offsets[last])]
    if len(pts):
        for c in range(len(boxes.starts)):
            _box_bits(pts, local, boxes.bits(c), boxes.boxes[c], max_pieces, out)
    return out


def _box_bits(pts, local, bits, box, max_pieces: int, out) -> None:
    """``out |=`` the bits of one box (``box``: float32 lo, hi, lo - 1, hi + 1) for the block."""
    n = len(pts)
    flags = np.zeros((n, 8), dtype=bool)  # below lo - 1 / above hi + 1 per axis, 2 bytes padding
    for axis in range(3):
        np.less(pts[:, axis], box[6 + axis], out=flags[:, axis])
        np.greater(pts[:, axis], box[9 + axis], out=flags[:, 3 + axis])
    code = flags.view(np.uint64)[:, 0]
    del flags
    candidates = np.flatnonzero(code == 0)  # only these can lie in a voxel of the box
    if len(candidates):
        xyz = pts[candidates]
        cells = [np.floor(xyz[:, axis] + _HALF) for axis in range(3)]
        _or_into(out, local, candidates, _cell_bits(bits, box, cells))
    if n < 2:
        return
    keep = (code[:-1] & code[1:]) == 0  # segment j -> j + 1: its ends share no side
    ends = local[1:] - 1
    keep[ends[(ends >= 0) & (ends < n - 1)]] = False  # not across streamlines
    segments = np.flatnonzero(keep)
    del keep, code
    if len(segments) == 0:
        return
    a = np.ascontiguousarray(pts[segments].T)  # (3, S)
    b = np.ascontiguousarray(pts[segments + 1].T)
    # The reference's own test (a NaN end fails it) and its piece counts
    near = np.ones(len(segments), dtype=bool)
    for axis in range(3):
        near &= np.maximum(a[axis], b[axis]) >= box[6 + axis]
        near &= np.minimum(a[axis], b[axis]) <= box[9 + axis]
    d = b - a
    count = np.maximum(np.ceil(np.abs(d).max(axis=0)), 1)
    traversed = near & (count < MAX_PIECES)  # also drops NaN and infinite lengths
    segments, a, d = segments[traversed], a[:, traversed], d[:, traversed]
    count = count[traversed].astype(np.int64)
    ends = np.cumsum(count)
    total = int(ends[-1]) if len(ends) else 0
    for g0 in range(0, total, max_pieces):
        piece = np.arange(g0, min(total, g0 + max_pieces))
        segment = np.searchsorted(ends, piece, side="right")
        k = piece - (ends[segment] - count[segment])
        n_of = count[segment].astype(np.float32)
        t0, t1 = k.astype(np.float32) / n_of, (k + 1).astype(np.float32) / n_of
        p = [a[axis, segment] + d[axis, segment] * t0 for axis in range(3)]
        q = [a[axis, segment] + d[axis, segment] * t1 for axis in range(3)]
        _or_into(out, local, segments[segment], _piece_bits(bits, box, p, q))


def _piece_bits(bits, box, p, q) -> np.ndarray:
    """Bits of the voxels pieces p->q visit (the reference's :func:`gpu.select_pieces.piece_cells`
    axis by axis): at the midpoints between the sorted boundary crossings."""
    e = [q[axis] - p[axis] for axis in range(3)]
    t = []
    for axis in range(3):
        plane = np.floor(np.minimum(p[axis], q[axis]) + _HALF) + _HALF
        crosses = (plane < np.maximum(p[axis], q[axis])) & (e[axis] != 0)
        t.append(np.where(crosses, (plane - p[axis]) / np.where(e[axis] != 0, e[axis], np.float32(1.0)), 1.0))
    first, second = np.minimum(t[0], t[1]), np.maximum(t[0], t[1])
    low, high = np.minimum(second, t[2]), np.maximum(second, t[2])
    edges = [np.zeros_like(first), np.minimum(first, low), np.maximum(first, low), high, np.ones_like(first)]
    values = np.zeros(len(first), dtype=np.uint32)
    for m in range(4):
        mid = _HALF * (edges[m] + edges[m + 1])
        cells = [np.floor(p[axis] + mid * e[axis] + _HALF) for axis in range(3)]
        values |= _cell_bits(bits, box, cells)
    return values


def _cell_bits(bits, box, cells) -> np.ndarray:
    """Bits of voxels ``cells`` (three float arrays of integer values) in the box, 0 outside it
    (compared as floats: a NaN or a huge coordinate is outside)."""
    inside = (cells[0] >= box[0]) & (cells[0] <= box[3])
    for axis in (1, 2):
        inside &= (cells[axis] >= box[axis]) & (cells[axis] <= box[3 + axis])
    values = np.zeros(len(inside), dtype=np.uint32)
    where = np.flatnonzero(inside)
    if len(where):
        i, j, k = ((cells[axis][where] - box[axis]).astype(np.intp) for axis in range(3))
        values[where] = bits[i, j, k]
    return values


def _or_into(out, local, index, values) -> None:
    """``out[streamline of point index] |= values``, for non-decreasing point indices ``index``
    of the block (``local``: its streamlines' offsets from its first point)."""
    hit = values != 0
    index, values = index[hit], values[hit]
    if len(values) == 0:
        return
    stream = np.searchsorted(local, index, side="right") - 1
    runs = np.flatnonzero(np.concatenate([[True], stream[1:] != stream[:-1]]))
    out[stream[runs]] |= np.bitwise_or.reduceat(values, runs)
