"""COMMIT's extra-cellular (EC) compartments without a peaks file: a voxel's main orientations
among its segments (Daducci et al. 2015; :mod:`gpu.commit`).

dmri-commit makes EC compartments only from a peaks file (a few fibre directions a voxel, e.g.
MRtrix ``sh2peaks``' three, those below ``vf_THR`` = 0.1 of the largest dropped). Without one,
:func:`gpu.commit_operator.ec_from_segments` makes one per distinct look-up-table orientation
of the segments in a voxel: 1° bins, so a whole-brain tractogram gives ~20 a voxel, most of
them near-copies of one another (zeppelins 1–3° apart: nearly the same columns of A), and
holds 8 bytes per compartment and four float64 column vectors of the fit per compartment.

:func:`ec_main_orientations` picks, per voxel, at most ``k`` orientations as a peak finder does
on the voxel's orientation distribution of segment length (the track-density orientations):
the orientation with the most segment length first, then the next largest at least
:data:`MIN_SEPARATION_DEG` from every one picked (DIPY's ``peak_directions`` default), none
below :data:`RELATIVE_THRESHOLD` of the largest (dmri-commit's ``vf_THR`` default). Ties go to
the lower orientation index. The same array operations run on NumPy or CuPy.
"""

from __future__ import annotations

import numpy as np

from .commit import N_ORIENTATIONS, orientation_directions
from .commit_segments import Segments, array_module, host_array, row_parts
from .indices import flatnonzero

__all__ = ["MIN_SEPARATION_DEG", "RELATIVE_THRESHOLD", "ec_main_orientations", "main_orientations"]

#: Smallest angle between two orientations picked in one voxel (degrees)
MIN_SEPARATION_DEG = 25.0
#: An orientation with less than this share of the voxel's largest is not picked
RELATIVE_THRESHOLD = 0.1
#: Segments per step (whole voxel rows)
CHUNK_SEGMENTS = 1 << 20
CHUNK_SEGMENTS_DEVICE = 1 << 25  # ~40 bytes each at once on the device


def main_orientations(row, orient, length, k: int, directions=None):
    """(row, orientation) of the at most ``k`` main orientations of each voxel row among the
    segments ``row`` (sorted), ``orient`` and ``length`` (arrays of one module), sorted by row
    then orientation."""
    xp = array_module(row)
    if directions is None:
        directions = xp.asarray(orientation_directions())
    if not len(row):
        return xp.zeros(0, xp.int32), xp.zeros(0, xp.int32)
    key = row.astype(xp.int64) * N_ORIENTATIONS + orient.astype(xp.int64)
    pairs, inverse = xp.unique(key, return_inverse=True)
    total = xp.bincount(inverse.ravel(), weights=length.astype(xp.float64), minlength=len(pairs))
    pair_row, pair_orient = pairs // N_ORIENTATIONS, pairs % N_ORIENTATIONS
    order = xp.lexsort(xp.stack([pair_orient, -total, pair_row]))  # row, then most length, then index
    pair_row, pair_orient, total = pair_row[order], pair_orient[order], total[order]
    starts = xp.concatenate([xp.ones(1, bool), pair_row[1:] != pair_row[:-1]])
    largest = total[flatnonzero(xp, starts)][xp.cumsum(starts) - 1]  # each pair's row's largest
    alive = flatnonzero(xp, total >= RELATIVE_THRESHOLD * largest)
    cos_limit = np.cos(np.deg2rad(MIN_SEPARATION_DEG))
    picked_row, picked_orient = [], []
    for _ in range(k):
        if not len(alive):
            break
        rows = pair_row[alive]
        lead = xp.concatenate([xp.ones(1, bool), rows[1:] != rows[:-1]])
        top = alive[lead]  # each row's largest remaining
        picked_row.append(pair_row[top])
        picked_orient.append(pair_orient[top])
        which = xp.cumsum(lead) - 1  # the row's pick, for every remaining pair
        cos = xp.abs((directions[pair_orient[alive]] * directions[pair_orient[top]][which]).sum(1))
        alive = alive[cos < cos_limit]  # the pick itself (cos 1) and its neighbours leave
    out_row = xp.concatenate(picked_row)
    out_orient = xp.concatenate(picked_orient)
    final = xp.argsort(out_row * N_ORIENTATIONS + out_orient)
    return out_row[final].astype(xp.int32), out_orient[final].astype(xp.int32)


def ec_main_orientations(seg: Segments, k: int) -> tuple[np.ndarray, np.ndarray]:
    """EC compartments (row, orientation; host arrays, sorted by row) of ``seg``: at most ``k``
    main orientations per voxel row (:func:`main_orientations`), in chunks of whole rows; segments
    on the device are reduced there and only the compartments come to the host."""
    xp = array_module(seg.fiber)
    directions = xp.asarray(orientation_directions())
    rows_out, orients_out = [], []
    size = CHUNK_SEGMENTS_DEVICE if xp is not np else CHUNK_SEGMENTS
    for part, rows in row_parts(seg, size):
        r, o = main_orientations(rows, seg.orient[part], seg.length[part], k, directions)
        rows_out.append(host_array(r))
        orients_out.append(host_array(o))
    if not rows_out:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(rows_out), np.concatenate(orients_out)
