"""Streamline colours by local direction (the usual fibre colouring: |R t| as RGB), computed in
chunks by threads so that a whole-brain tractogram needs no float copy of its points."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

COLOUR_CHUNK_POINTS = 1 << 22  # direction colours are computed this many points at a time
COLOUR_THREADS = min(16, os.cpu_count() or 1)  # ... by this many threads


def direction_colours(
    points: np.ndarray, offsets: np.ndarray, rotation: np.ndarray | None = None, *, rgba: bool = False
) -> np.ndarray:
    """Per-point colour (uint8) from the local streamline direction |R t| (``rotation`` R: voxel
    to world, identity by default), the usual fiber colouring; RGB, or RGBA (opaque) with
    ``rgba``. Computed :data:`COLOUR_CHUNK_POINTS` at a time: no float copy of all points."""
    n = len(points)
    out = np.empty((n, 4 if rgba else 3), dtype=np.uint8)
    if rgba:
        out[:, 3] = 255
    breaks = np.asarray(offsets[1:-1], dtype=np.int64)  # first points of streamlines 1..
    turn = None if rotation is None else np.asarray(rotation, dtype=np.float32).T

    def chunk(a: int) -> None:  # NumPy releases the GIL: chunks in parallel threads
        b = min(n, a + COLOUR_CHUNK_POINTS)
        lo, hi = max(a - 1, 0), min(b + 1, n)
        part = np.asarray(points[lo:hi], dtype=np.float32)
        diff = np.diff(part, axis=0)  # diff[j] joins points lo + j and lo + j + 1
        inside = breaks[(breaks > lo) & (breaks < hi)]
        diff[inside - 1 - lo] = 0.0  # no tangent across streamline boundaries
        tangent = np.zeros_like(part)
        tangent[:-1] += diff
        tangent[1:] += diff
        tangent = tangent[a - lo : a - lo + (b - a)]
        if turn is not None:
            tangent = tangent @ turn
        norm = np.sqrt(np.einsum("ij,ij->i", tangent, tangent))
        scale = np.float32(255.0) / np.where(norm > 0, norm, np.float32(1.0))
        np.abs(tangent, out=tangent)
        tangent *= scale[:, None]
        tangent += np.float32(0.5)
        with np.errstate(invalid="ignore"):  # a file's NaN point (refused once its check ends) is black
            out[a:b, :3] = tangent.astype(np.uint8)

    starts = range(0, n, COLOUR_CHUNK_POINTS)
    if len(starts) <= 1:
        for a in starts:
            chunk(a)
        return out
    with ThreadPoolExecutor(max_workers=min(COLOUR_THREADS, len(starts))) as pool:
        list(pool.map(chunk, starts))
    return out
