"""Ragged streamline arrays: points ``(P, 3)`` and offsets ``(S + 1,)``, as the tracking
engines produce them batch by batch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from . import cuda

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
    seed within the streamline.
    """

    points: np.ndarray
    offsets: np.ndarray
    seed_index: np.ndarray
    stop: np.ndarray
    seed_point: np.ndarray
    provenance: dict = field(default_factory=dict)

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
        starts = np.cumsum([0] + [len(b.points) for b in batches[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [b.offsets[1:] + s for b, s in zip(batches, starts)])
        return cls(
            np.concatenate([b.points for b in batches]),
            offsets,
            np.concatenate([b.seed_index for b in batches]),
            np.concatenate([b.stop for b in batches]),
            np.concatenate([b.seed_point for b in batches]),
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
        )

    def reason_counts(self) -> dict[str, int]:
        """How many streamline ends stopped for each reason."""
        codes, counts = np.unique(self.stop, return_counts=True)
        return {STOP_REASONS[int(c)]: int(n) for c, n in zip(codes, counts)}

    def pieces(self, max_points: int) -> Iterator[StreamlineBatch]:
        """Consecutive runs of whole streamlines of at most ``max_points`` points each (a longer
        streamline is a piece of its own), as views of this batch's arrays: a GPU batch can
        hold a whole brain, and host work on it (scalars, writing) goes piece by piece."""
        total = len(self)
        if total == 0 or int(self.offsets[-1] - self.offsets[0]) <= max_points:
            yield self
            return
        first = 0
        while first < total:
            base = self.offsets[first]
            last = int(np.searchsorted(self.offsets, base + max_points, side="right")) - 1
            last = min(max(last, first + 1), total)
            yield StreamlineBatch(
                self.points[base : self.offsets[last]],
                self.offsets[first : last + 1] - base,
                self.seed_index[first:last],
                self.stop[first:last],
                self.seed_point[first:last],
                self.provenance,
            )
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
