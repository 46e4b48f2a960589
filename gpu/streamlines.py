"""Ragged streamline arrays: points ``(P, 3)`` and offsets ``(S + 1,)``, as the tracking
engines produce them batch by batch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from . import cuda
from .interpolate import trilinear

# Why a streamline end stopped (one code per end), for the deterministic and geodesic
# trackers alike; the kernels receive these values as defines (stop_code_defines).
MAX_LENGTH, OUTSIDE_VOLUME, OUTSIDE_MASK, LOW_FA, SHARP_ANGLE, STOP_REGION, MAX_STEPS, REACHED_TARGET = range(1, 9)
STOP_CODES = {
    "MAX_LENGTH": MAX_LENGTH,
    "OUTSIDE_VOLUME": OUTSIDE_VOLUME,
    "OUTSIDE_MASK": OUTSIDE_MASK,
    "LOW_FA": LOW_FA,
    "SHARP_ANGLE": SHARP_ANGLE,
    "STOP_REGION": STOP_REGION,
    "MAX_STEPS": MAX_STEPS,
    "REACHED_TARGET": REACHED_TARGET,
}
STOP_REASONS = {
    0: "none",
    MAX_LENGTH: "max length",
    OUTSIDE_VOLUME: "left the volume",
    OUTSIDE_MASK: "left the mask",
    LOW_FA: "FA below threshold",
    SHARP_ANGLE: "angle above maximum",
    STOP_REGION: "entered a stop region",
    MAX_STEPS: "max steps",
    REACHED_TARGET: "reached the target",
}


def stop_code_defines(*names: str) -> tuple[tuple[str, int], ...]:
    """The stop codes ``names`` as ``(NAME, value)`` compile-time defines for a tracking kernel."""
    return tuple((name, STOP_CODES[name]) for name in names)


@dataclass
class StreamlineBatch:
    """Streamlines in voxel coordinates with where they came from and why they stopped.

    ``points`` (P, 3) float32; ``offsets`` (S + 1,) int64; ``seed_index`` (S,) the index of
    each streamline's seed in the seed array; ``stop`` (S, 2) uint8 reasons for the
    backward and the forward end (:data:`STOP_REASONS`); ``seed_point`` (S,) index of the
    seed within the streamline. ``point_scalars`` ((P,) each) and ``streamline_scalars``
    ((S,) each) hold values computed where the points were made (:class:`StreamlineScalars`),
    carried along by :meth:`subset` and :meth:`pieces`. ``frame``: ``"voxel"``, or ``"mm"`` when
    the tracker turned the points into RAS millimetres of the grid before they left the device
    (:attr:`StreamlineScalars.world`).
    """

    points: np.ndarray
    offsets: np.ndarray
    seed_index: np.ndarray
    stop: np.ndarray
    seed_point: np.ndarray
    provenance: dict = field(default_factory=dict)
    point_scalars: dict = field(default_factory=dict)
    streamline_scalars: dict = field(default_factory=dict)
    frame: str = "voxel"

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points[self.offsets[i] : self.offsets[i + 1]]

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def empty(cls) -> StreamlineBatch:
        return cls(
            np.zeros((0, 3), np.float32),
            np.zeros(1, np.int64),
            np.zeros(0, np.int64),
            np.zeros((0, 2), np.uint8),
            np.zeros(0, np.int64),
        )

    @classmethod
    def concatenate(cls, batches: Iterable[StreamlineBatch]) -> StreamlineBatch:
        batches = [b for b in batches if len(b)]
        if not batches:
            return cls.empty()
        frames = {b.frame for b in batches}
        if len(frames) > 1:
            raise ValueError(f"batches in different frames ({', '.join(sorted(frames))}) do not join")
        starts = np.cumsum([0] + [len(b.points) for b in batches[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [b.offsets[1:] + s for b, s in zip(batches, starts)])
        return cls(
            np.concatenate([b.points for b in batches]),
            offsets,
            np.concatenate([b.seed_index for b in batches]),
            np.concatenate([b.stop for b in batches]),
            np.concatenate([b.seed_point for b in batches]),
            point_scalars=_joined([b.point_scalars for b in batches]),
            streamline_scalars=_joined([b.streamline_scalars for b in batches]),
            frame=frames.pop(),
        )

    def subset(self, keep: np.ndarray) -> StreamlineBatch:
        """The streamlines where ``keep`` (bool per streamline) holds."""
        keep = np.asarray(keep, bool)
        counts = self.counts[keep]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        index = np.repeat(self.offsets[:-1][keep] - offsets[:-1], counts) + np.arange(offsets[-1])
        return StreamlineBatch(
            self.points[index],
            offsets,
            self.seed_index[keep],
            self.stop[keep],
            self.seed_point[keep],
            self.provenance,
            {k: v[index] for k, v in self.point_scalars.items()},
            {k: v[keep] for k, v in self.streamline_scalars.items()},
            self.frame,
        )

    def reason_counts(self) -> dict[str, int]:
        """How many streamline ends stopped for each reason."""
        codes, counts = np.unique(self.stop, return_counts=True)
        return {STOP_REASONS[int(c)]: int(n) for c, n in zip(codes, counts)}

    def pieces(self, max_points: int) -> Iterator[StreamlineBatch]:
        """Consecutive runs of whole streamlines of at most ``max_points`` points each (a longer
        streamline is a piece of its own), as views of this batch's arrays: a GPU batch can
        hold a whole brain, and host work on it (scalars, writing) goes piece by piece."""
        if len(self) == 0 or int(self.offsets[-1] - self.offsets[0]) <= max_points:
            yield self
            return
        for first, last in piece_bounds(self.offsets, max_points):
            base, end = self.offsets[first], self.offsets[last]
            yield StreamlineBatch(
                self.points[base:end],
                self.offsets[first : last + 1] - base,
                self.seed_index[first:last],
                self.stop[first:last],
                self.seed_point[first:last],
                self.provenance,
                {k: v[base:end] for k, v in self.point_scalars.items()},
                {k: v[first:last] for k, v in self.streamline_scalars.items()},
                self.frame,
            )


def _joined(dicts: list[dict]) -> dict:
    """The scalars the batches all have, concatenated."""
    names = set.intersection(*(set(d) for d in dicts)) if dicts else set()
    return {k: np.concatenate([d[k] for d in dicts]) for k in dicts[0] if k in names} if names else {}


def piece_bounds(offsets: np.ndarray, max_points: int) -> Iterator[tuple[int, int]]:
    """``(first, last)`` streamline ranges of consecutive runs of at most ``max_points`` points
    (a longer streamline is a run of its own), over host ``offsets`` (S + 1,)."""
    total = len(offsets) - 1
    first = 0
    while first < total:
        base = offsets[first]
        last = int(np.searchsorted(offsets, base + max_points, side="right")) - 1
        last = min(max(last, first + 1), total)
        yield first, last
        first = last


def stop_reason_totals(counts: np.ndarray) -> dict[str, int]:
    """:meth:`StreamlineBatch.reason_counts` from per-code counts (``np.bincount`` of the stop
    codes, summed over batches), in the same order: by code, the codes that occur."""
    return {STOP_REASONS[int(c)]: int(counts[c]) for c in np.flatnonzero(counts)}


def repeat_counts(xp, values, counts):
    """``np.repeat(values, counts)`` for NumPy and CuPy alike (CuPy's repeat takes no array of counts)."""
    if xp is np:
        return np.repeat(values, counts)
    total = int(counts.sum())
    owner = xp.searchsorted(xp.cumsum(counts), xp.arange(total), side="right")
    return values[owner]


def _pack_rows_kernel():
    return cuda.function("streamlines.cu", "pack_rows")


def pack_rows(xp, buf, rows, first, counts):
    """Points ``buf[rows[i], first[i] : first[i] + counts[i]]`` of an ``(N, W, C)`` (or ``(N, W)``)
    float32 buffer, packed one streamline after another: ``(points (P, C) or (P,), offsets (S + 1,))``."""
    offsets = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(counts.astype(np.int64))])
    total = int(offsets[-1])
    if xp is np:
        column = np.repeat(first - offsets[:-1], counts) + np.arange(total)
        return buf[np.repeat(rows, counts), column], offsets
    width = int(np.prod(buf.shape[2:], dtype=np.int64))
    out = xp.empty((total, *buf.shape[2:]), np.float32)
    n = len(rows)
    if n:
        threads = 256
        blocks = (n * 32 + threads - 1) // threads
        _pack_rows_kernel()(
            (blocks,),
            (threads,),
            (
                xp.ascontiguousarray(buf, dtype=np.float32),
                np.int64(buf.shape[1] * width),
                rows.astype(np.int64),
                first.astype(np.int64),
                offsets,
                np.int32(n),
                np.int32(width),
                out,
            ),
        )
    return out, offsets


# ----------------------------------------------------------------------------- per-point scalars
#: Points per piece of scalar work on a GPU: about 0.5 GB of float64 temporaries there.
DEVICE_PIECE_POINTS = 1 << 22
# One matrix product per piece; a product of a single row takes another BLAS path whose last
# bit can differ from the same row in a larger product, so short pieces are padded.
_MIN_ROWS = 16


def _times(xp, points, matrix):
    """``points @ matrix`` with the values a product over more rows would give."""
    if 0 < len(points) < _MIN_ROWS:
        padded = xp.zeros((_MIN_ROWS, points.shape[1]), points.dtype)
        padded[: len(points)] = points
        return (padded @ matrix)[: len(points)]
    return points @ matrix


def sample_volume(xp, volume, points):
    """Trilinear values ``(P,)`` float64 of a 3-D ``volume`` at ``(P, 3)`` voxel coordinates."""
    if len(points) == 0:
        return xp.zeros(0)
    return trilinear(xp, volume[..., None], points.astype(np.float64))[:, 0]


class PathLength:
    """Streamline lengths in mm, part after part, as if over all parts joined: the segments
    between consecutive points (across streamline boundaries too) summed in one running
    cumulative sum (float64), a streamline's length the difference at its ends. The same
    code on the host (NumPy) and the device (CuPy): ``xp`` is that of the points."""

    def __init__(self, affine):
        self.rotation = np.asarray(affine, dtype=np.float64)[:3, :3].T
        self.last_point = None  # (3,) on the side of the last points
        self.total = 0.0

    def lengths(self, points, offsets, xp=np):
        """Lengths ``(S,)`` float64 of the streamlines ``offsets`` (on ``xp``) over ``points``."""
        if len(offsets) == 1:
            return xp.zeros(0)
        if xp is not np:  # NumPy multiplies float32 by float64 as float64: the same, said outright
            points = points.astype(np.float64)
        shift = 0 if self.last_point is None else 1
        if shift:
            points = xp.concatenate([xp.asarray(self.last_point, dtype=points.dtype)[None], points])
        rotation = xp.asarray(self.rotation)
        segments = xp.linalg.norm(xp.diff(_times(xp, points, rotation), axis=0), axis=1)
        cumulative = xp.cumsum(xp.concatenate([xp.full(1, self.total), segments]))
        lengths = cumulative[offsets[1:] - 1 + shift] - cumulative[offsets[:-1] + shift]
        self.last_point = points[-1].copy()
        self.total = float(cumulative[-1])
        return lengths


@dataclass
class StreamlineScalars:
    """What a tracker computes at its points before they leave the device: ``fa`` trilinear
    of ``fa_volume`` at every point, ``length_mm`` per streamline (:class:`PathLength` over
    the grid's ``affine``, continued from batch to batch); float32 both.

    ``world``: the points themselves also leave the device as RAS millimetres of ``affine``
    (:func:`points_to_world`, after the scalars), for a run whose points only go to a file: the
    host then writes them as they come instead of converting them (a third of a whole-brain
    tractogram's write on the host)."""

    fa_volume: np.ndarray
    affine: np.ndarray
    path_length: PathLength | None = None
    world: bool = False

    def __post_init__(self) -> None:
        self.path_length = self.path_length or PathLength(self.affine)
        self._on: tuple | None = None  # (xp, volume there)

    def compute(self, xp, points, offsets, host_offsets=None, piece_points=DEVICE_PIECE_POINTS) -> tuple[dict, dict]:
        """``({"fa": (P,)}, {"length_mm": (S,)})`` float32 on ``xp``, piece by piece (bounded
        temporaries): the values :func:`sample_volume` and :meth:`PathLength.lengths` give."""
        if self._on is None or self._on[0] is not xp:
            # C order (put in order on the host, on its way to the device): trilinear then gathers
            # by flat voxel number, the same kernels whatever the order the volume came in (a
            # Fortran-ordered one would take three index arrays, and other kernels)
            self._on = (xp, xp.asarray(self.fa_volume, order="C"))
        volume = self._on[1]
        host_offsets = np.asarray(offsets) if host_offsets is None else host_offsets
        fa = xp.empty(len(points), np.float32)
        lengths = xp.empty(len(host_offsets) - 1, np.float32)
        for first, last in piece_bounds(host_offsets, piece_points):
            base, end = int(host_offsets[first]), int(host_offsets[last])
            piece = points[base:end]
            fa[base:end] = sample_volume(xp, volume, piece).astype(np.float32)
            lengths[first:last] = self.path_length.lengths(piece, offsets[first : last + 1] - base, xp).astype(
                np.float32
            )
        return {"fa": fa}, {"length_mm": lengths}


def points_to_world(xp, points, affine, piece_points=DEVICE_PIECE_POINTS):
    """``points`` ((P, 3) float32 voxel coordinates on ``xp``) made RAS millimetres of ``affine``
    in place, a piece at a time: each point's sum computed in float64 and rounded to float32
    once (at most half a float32 step from the exact value; the host's float32 product can be a
    step off). Returns ``points``."""
    matrix = xp.asarray(np.asarray(affine, dtype=np.float64))
    rotation, shift = matrix[:3, :3].T, matrix[:3, 3]
    for start in range(0, len(points), piece_points):
        piece = points[start : start + piece_points]
        piece[...] = _times(xp, piece.astype(np.float64), rotation) + shift
    return points
