"""fODF sections of a slice view drawn into a picture with NumPy, on a glyph worker.

A section is a star-shaped polygon around its voxel's centre: vertex k at angle t_k, its piece
k the triangle (centre, vertex k, vertex k+1) in the colour of the direction between them. The
sections of a 1.25 mm slice are some thousand polygons of 32 pieces. Filled with Qt, they cost
the GUI thread tens of milliseconds at each slice step, and a worker could not take that
over: PySide holds Python's lock while Qt fills or parses a path. Here each pixel finds its
glyph (the nearest cell of the glyphs' lattice, and its neighbours when glyphs are larger than
their cells), its piece (from its angle around the glyph's centre) and its distance to the
piece's outer edge, which gives an antialiased coverage. All of it is array arithmetic over
the picture's pixels, during which NumPy lets the GUI thread run. The GUI thread only draws the
finished picture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Lattice:
    """Where the glyph cells are in the picture: cell (row b, column a) is centred on
    (``x0`` + a·``dx``, ``y0`` + b·``dy``) picture pixels (pixel i spans [i, i + 1)), for
    a < ``columns`` and b < ``rows``."""

    x0: float
    y0: float
    dx: float
    dy: float
    rows: int
    columns: int


@dataclass(frozen=True, eq=False)
class GlyphPicture:
    """A slice view's 2-D glyphs as premultiplied ARGB pixels (H, W) uint32, for the part
    ``area`` (left, top, width, height; widget pixels) of the slice drawn at ``target`` (the
    slice's rectangle on the widget then), at ``ratio`` picture pixels per widget pixel."""

    pixels: np.ndarray
    area: tuple[float, float, float, float]
    target: tuple[float, float, float, float]
    ratio: float

    def placed(self, target: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        """The picture's rectangle (left, top, width, height) relative to ``target``'s top-left
        corner, for the slice drawn at ``target`` now (zoomed or panned since: scaled along)."""
        f = target[2] / self.target[2] if self.target[2] else 1.0
        g = target[3] / self.target[3] if self.target[3] else 1.0
        return ((self.area[0] - self.target[0]) * f, (self.area[1] - self.target[1]) * g,
                self.area[2] * f, self.area[3] * g)  # fmt: skip


def section_pixels(
    x: np.ndarray,
    y: np.ndarray,
    colours: np.ndarray,
    opacity: float,
    lattice: Lattice,
    cells: np.ndarray,
    shape: tuple[int, int],
) -> np.ndarray:
    """Premultiplied ARGB pixels (H, W) uint32 of star-shaped sections.

    ``x``, ``y``: (G, K) vertex offsets from each glyph's centre, in picture pixels (y down),
    vertex k at angle t_k = 2πk/K counter-clockwise on the screen; ``colours`` (K, 3) in 0..1,
    piece k's (between vertices k and k + 1); ``cells`` (G, 2): each glyph's (row, column) in
    ``lattice`` (one glyph per cell). A pixel takes the glyph that covers it most."""
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    height, width = (int(v) for v in shape)
    out = np.zeros((height, width), np.uint32)
    count, k = x.shape
    if count == 0 or height == 0 or width == 0:
        return out
    table = np.full((lattice.rows, lattice.columns), -1, np.int64)
    table[cells[:, 0], cells[:, 1]] = np.arange(count)
    # the cells around a pixel's own that can reach it: glyphs larger than their cells (a glyph
    # size above 1) reach into their neighbours'; less than a pixel beyond is cut off
    radius = np.hypot(x, y)  # each vertex's distance from its glyph's centre
    reach = float(radius.max(initial=0.0)) - 1.0
    span = max(0, math.ceil(reach / max(min(lattice.dx, lattice.dy), 1e-9) - 0.5))
    # per piece (glyph g, piece j: flat g·K + j): its first vertex, its outer edge (to the next
    # vertex) over the edge's length, and how far it reaches from the centre (-1: a piece of
    # no area, both vertices at the centre)
    x1, y1 = np.roll(x, -1, axis=1), np.roll(y, -1, axis=1)
    ex, ey = x1 - x, y1 - y
    length = np.hypot(ex, ey)
    solid = length > 1e-6
    per = np.where(solid, 1.0 / np.where(solid, length, 1.0), 0.0)
    farthest = np.where(solid, np.maximum(radius, np.roll(radius, -1, axis=1)), -1.0)
    pieces = np.stack([x, y, ex * per, ey * per, farthest], -1).reshape(count * k, 5).astype(np.float32)
    reach_squared = ((farthest.max(axis=1) + 1.0) ** 2).astype(np.float32)  # a glyph's pixels lie within
    # the pixels' centres, their nearest lattice column and row
    centres_x, centres_y = np.arange(width) + 0.5, np.arange(height) + 0.5
    near_a = np.rint((centres_x - lattice.x0) / lattice.dx).astype(np.int64)
    near_b = np.rint((centres_y - lattice.y0) / lattice.dy).astype(np.int64)
    best = np.zeros(height * width, np.float32)  # the coverage taken so far (flat)
    piece = np.zeros(height * width, np.int16)  # and its piece number
    turns = np.float32(k / (2.0 * np.pi))
    for ob in range(-span, span + 1):
        b = near_b + ob
        py_all = (centres_y - (lattice.y0 + b * lattice.dy)).astype(np.float32)
        # the rows a neighbour row's glyphs can reach (all of them for a pixel's own row)
        rows = np.flatnonzero(((b >= 0) & (b < lattice.rows)) & ((ob == 0) | (np.abs(py_all) <= reach + 1.5)))
        for oa in range(-span, span + 1):
            a = near_a + oa
            px_all = (centres_x - (lattice.x0 + a * lattice.dx)).astype(np.float32)
            columns = np.flatnonzero(((a >= 0) & (a < lattice.columns)) & ((oa == 0) | (np.abs(px_all) <= reach + 1.5)))
            if rows.size == 0 or columns.size == 0:
                continue
            glyph = table[b[rows][:, None], a[columns][None, :]]  # (R, C)
            py, px = py_all[rows][:, None], px_all[columns][None, :]
            # only the pixels within their glyph's reach are worked on further
            near = np.flatnonzero((glyph >= 0) & (px * px + py * py <= reach_squared[np.maximum(glyph, 0)]))
            if near.size == 0:
                continue
            r, c = np.divmod(near, columns.size)
            g, dx, dy = glyph.ravel()[near], px_all[columns][c], py_all[rows][r]
            rho = np.hypot(dx, dy)
            # the piece a pixel's angle falls in (counter-clockwise on the screen: y down)
            j = np.floor(np.arctan2(-dy, dx) * turns).astype(np.int32) % k
            at = np.take(pieces, g * k + j, axis=0)  # (N, 5)
            # signed distance to the outer edge, positive on the centre's side; no nearer the
            # centre than the piece reaches (beyond both vertices a pixel can lie on the edge's
            # line: a piece with one vertex at the centre, seen along the other's direction)
            inside = at[:, 3] * (dx - at[:, 0]) - at[:, 2] * (dy - at[:, 1])
            inside = np.minimum(inside, at[:, 4] - rho)
            cover = np.clip(inside + 0.5, 0.0, 1.0)
            flat = rows[r] * width + columns[c]
            better = cover > best[flat]
            best[flat[better]] = cover[better]
            piece[flat[better]] = j[better]
    drawn = np.flatnonzero(best > 0.0)
    alpha = np.rint(best[drawn] * np.float32(255.0 * opacity)).astype(np.uint32)  # 0..255
    palette = np.rint(np.clip(colours, 0.0, 1.0) * 255.0).astype(np.uint32)  # (K, 3)
    rgb = palette[piece[drawn]]  # (N, 3)
    premultiplied = (rgb * alpha[:, None] + 127) // 255
    out.ravel()[drawn] = (alpha << 24) | (premultiplied[:, 0] << 16) | (premultiplied[:, 1] << 8) | premultiplied[:, 2]
    return out
