"""Tracking output part by part: the scalars of deterministic streamlines, and joining parts.

The engines yield batches; a GPU batch may hold a whole brain. Host work on a batch (FA per
point, length per streamline, writing) goes through pieces of at most :data:`PIECE_POINTS`
points, each becoming a :class:`~app.model.Tractogram` part that is written (a sink) or kept,
so the host never holds float64 copies of all the points. The parts' values are those of the
whole: the length of a streamline is a difference of one running cumulative sum over all
points, continued from part to part (:class:`PathLength`), as it was computed at once before.
On a GPU the tracker computes both before the points leave the device (the same code through
CuPy, :class:`~gpu.streamlines.StreamlineScalars`) and the pieces carry them.
"""

from __future__ import annotations

import numpy as np

from tractlens.gpu.streamlines import PathLength, StreamlineBatch, sample_volume

from ..io.tractogram_mapped import world_points
from ..model import Tractogram

#: Points of one piece of host work: about 100 MB of float64 temporaries.
PIECE_POINTS = 1 << 20


def deterministic_part(batch: StreamlineBatch, fa_volume: np.ndarray, affine, dimensions, name: str,
                       path_length: PathLength) -> Tractogram:  # fmt: skip
    """A piece of deterministic streamlines as a tractogram part: FA per point (trilinear),
    length per streamline (mm, continued by ``path_length``). A piece whose tracker computed
    them already (a GPU batch: :class:`~gpu.streamlines.StreamlineScalars`) keeps those. A piece
    whose points left the device in millimetres (``frame == "mm"``) holds them as they are
    (:func:`~app.io.tractogram_mapped.world_points`: voxel coordinates made only when read)."""
    points = batch.points if batch.frame == "voxel" else world_points(batch.points, affine)
    if "fa" in batch.point_scalars and "length_mm" in batch.streamline_scalars:
        fa, lengths = batch.point_scalars["fa"], batch.streamline_scalars["length_mm"]
    else:
        voxels = points if batch.frame == "voxel" else points.voxels()
        fa = sample_volume(np, fa_volume, voxels)
        lengths = path_length.lengths(voxels, batch.offsets)
    return Tractogram(
        points,
        batch.offsets,
        affine=affine,
        dimensions=dimensions,
        point_scalars={"fa": np.asarray(fa, dtype=np.float32)},
        streamline_scalars={"length_mm": np.asarray(lengths, dtype=np.float32)},
        name=name,
    )


def join_parts(parts: list[Tractogram], empty: Tractogram) -> Tractogram:
    """The parts as one tractogram (``empty`` when there are none): one copy of their arrays."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty
    if len(parts) == 1:  # a new object over the same arrays: the part may be shown as a layer of its own
        p = parts[0]
        return Tractogram(p.points, p.offsets, p.affine, p.dimensions, dict(p.point_scalars),
                          dict(p.streamline_scalars), name=p.name)  # fmt: skip
    counts = [len(p.points) for p in parts]
    starts = np.cumsum([0, *counts[:-1]])
    offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
    first = parts[0]
    joined = Tractogram(
        np.concatenate([p.points for p in parts]),
        offsets,
        affine=first.affine,
        dimensions=first.dimensions,
        point_scalars={k: np.concatenate([p.point_scalars[k] for p in parts]) for k in first.point_scalars},
        streamline_scalars={
            k: np.concatenate([p.streamline_scalars[k] for p in parts]) for k in first.streamline_scalars
        },
        name=first.name,
    )
    return joined
