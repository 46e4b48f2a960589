"""Tracking output part by part: the scalars of deterministic streamlines, and joining parts.

The engines yield batches; a GPU batch may hold a whole brain. Host work on a batch (FA per
point, length per streamline, writing) goes through pieces of at most :data:`PIECE_POINTS`
points, each becoming a :class:`~app.model.Tractogram` part that is written (a sink) or kept,
so the host never holds float64 copies of all the points. The parts' values are those of the
whole: the length of a streamline is a difference of one running cumulative sum over all
points, continued from part to part (:class:`PathLength`), as it was computed at once before.
"""

from __future__ import annotations

import numpy as np

from tractlens.gpu.interpolate import trilinear
from tractlens.gpu.streamlines import StreamlineBatch

from ..model import Tractogram

#: Points of one piece of host work: about 100 MB of float64 temporaries.
PIECE_POINTS = 1 << 20
# One matrix product per piece; a product of a single row takes another BLAS path whose last
# bit can differ from the same row in a larger product, so short pieces are padded.
_MIN_ROWS = 16


def _times(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``points @ matrix`` with the values a product over more rows would give."""
    if 0 < len(points) < _MIN_ROWS:
        padded = np.zeros((_MIN_ROWS, points.shape[1]), points.dtype)
        padded[: len(points)] = points
        return (padded @ matrix)[: len(points)]
    return points @ matrix


class PathLength:
    """Streamline lengths in mm, part after part, as if over all parts joined: the segments
    between consecutive points (across streamline boundaries too) summed in one running
    cumulative sum, a streamline's length the difference at its ends."""

    def __init__(self, affine: np.ndarray):
        self.rotation = np.asarray(affine, dtype=np.float64)[:3, :3].T
        self.last_point: np.ndarray | None = None
        self.total = 0.0

    def lengths(self, points: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        if len(offsets) == 1:
            return np.zeros(0)
        shift = 0 if self.last_point is None else 1
        if shift:
            points = np.concatenate([self.last_point[None], points])
        segments = np.linalg.norm(np.diff(_times(points, self.rotation), axis=0), axis=1)
        cumulative = np.cumsum(np.concatenate([[self.total], segments]))
        lengths = cumulative[offsets[1:] - 1 + shift] - cumulative[offsets[:-1] + shift]
        self.last_point = points[-1].copy()
        self.total = cumulative[-1]
        return lengths


def deterministic_part(batch: StreamlineBatch, fa_volume: np.ndarray, affine, dimensions, name: str,
                       path_length: PathLength) -> Tractogram:  # fmt: skip
    """A piece of deterministic streamlines as a tractogram part: FA per point (trilinear),
    length per streamline (mm, continued by ``path_length``)."""
    points = batch.points
    fa = trilinear(np, fa_volume[..., None], points.astype(np.float64))[:, 0] if len(points) else np.zeros(0)
    lengths = path_length.lengths(points, batch.offsets)
    return Tractogram(
        points,
        batch.offsets,
        affine=affine,
        dimensions=dimensions,
        point_scalars={"fa": np.asarray(fa, dtype=np.float32)},
        streamline_scalars={"length_mm": lengths.astype(np.float32)},
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
