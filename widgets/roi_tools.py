"""ROI drawing state shared by the slice views: the tool, the brush radius, the ROI being edited."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tractlens.app.anatomy_layers import brush_voxels, covering_voxels
from tractlens.app.grid import Grid
from tractlens.app.layers import next_roi_colour
from tractlens.app.model import ROI_ROLES, Document, Layer, RoiMask

TOOLS = ("navigate", "brush", "eraser", "rectangle", "polygon", "fill", "sphere", "box", "ruler")


class RoiTools:
    def __init__(self, document: Document, selected_layer: Callable[[], Layer | None]):
        self.document = document
        self._selected_layer = selected_layer
        self.tool = "navigate"
        self.radius = 1  # voxels, in the plane of the view
        self.role = "seed"  # role of the next new ROI
        self.threshold = 0.2  # flood fill: voxels of the top scalar map above this, connected to the click

    def active_roi(self) -> Layer | None:
        """The ROI to edit: the selected layer if it is an ROI, else the newest ROI."""
        selected = self._selected_layer()
        if selected is not None and selected.kind == "roi":
            return selected
        for layer in reversed(self.document.layers):
            if layer.kind == "roi":
                return layer
        return None

    def new_roi(self, role: str | None = None, shape: dict | None = None) -> Layer:
        """An empty ROI on the reference grid, named after its role ("seed 1", "target 2", ...);
        with ``shape`` a movable sphere or box. Creating it (shape and all) is one undoable edit."""
        role = role or self.role
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}")
        doc = self.document
        if doc.reference_affine is None:
            raise ValueError("open an image first: an ROI lives on its grid")
        taken = {layer.name for layer in doc.layers}
        count = 1 + sum(1 for layer in doc.layers if layer.kind == "roi" and layer.data.role == role)
        while f"{role} {count}" in taken:  # e.g. "seed 1" whose role became exclusion
            count += 1
        name = f"{role} {count}"
        mask = RoiMask(name, np.zeros(doc.reference_shape, dtype=bool), doc.reference_affine, role=role)
        if shape is not None:
            mask.apply_shape(shape)
        colour = next_roi_colour(doc.layers, role)  # one colour per ROI (seeds differ from each other)
        return doc.add_layer(Layer(name, mask, "roi", color=colour), undoable=True)

    def unique_name(self, name: str) -> str:
        """``name``, or ``name (2)``, ``name (3)``, ... when a layer has it already."""
        taken = {layer.name for layer in self.document.layers}
        candidate, number = name, 1
        while candidate in taken:
            number += 1
            candidate = f"{name} ({number})"
        return candidate


def on_reference(document: Document, roi: Layer) -> bool:
    """Is ``roi`` on the document's reference grid (the slices' voxels are its voxels)?"""
    return Grid.of(roi.data).matches((document.reference_affine, document.reference_shape))


def to_roi_grid(document: Document, roi: Layer, voxels) -> np.ndarray:
    """Reference voxels drawn on a slice (a rectangle, a polygon) as the voxels of ``roi``: the
    same, or those of an ROI on an image's own grid whose centres they hold
    (:func:`app.anatomy_layers.covering_voxels`)."""
    if on_reference(document, roi):
        return np.asarray(voxels)
    return covering_voxels(Grid.of(roi.data), (document.reference_affine, document.reference_shape), voxels)


def nearest_on_roi(document: Document, roi: Layer, ijk) -> np.ndarray:
    """The voxel of ``roi`` nearest to the centre of reference voxel ``ijk``."""
    world = Grid(document.reference_affine, document.reference_shape).to_mm(np.array([ijk], dtype=float))
    return np.rint(Grid.of(roi.data).to_voxels(world)[0]).astype(np.int64)


def stroke(document: Document, roi: Layer, start, end, radius: int, h: int, v: int, normal: int) -> np.ndarray:
    """The voxels of ``roi`` a brush of ``radius`` reference voxels paints from ``start`` to ``end``
    (fractional reference voxel coordinates on a slice whose axes are ``h``, ``v``, across
    ``normal``): a disc of voxels on every voxel between them, or on an ROI of another grid
    (an image's own) the voxels within the disc in mm around every point between them, at the
    ROI's resolution (:func:`app.anatomy_layers.brush_voxels`)."""
    start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    first, last = np.floor(start + 0.5), np.floor(end + 0.5)  # the voxels under the two points
    steps = int(np.ceil(np.abs(last - first).max() * 2)) + 1
    if not on_reference(document, roi):
        centres = [start + (end - start) * t for t in np.linspace(0, 1, max(steps, 2))]
        grid = (document.reference_affine, document.reference_shape)
        return brush_voxels(Grid.of(roi.data), grid, np.array(centres), radius, normal)
    centres = [np.rint(first + (last - first) * t) for t in np.linspace(0, 1, steps)]
    r = int(radius)
    du, dv = np.mgrid[-r : r + 1, -r : r + 1]
    disc = (du**2 + dv**2) <= r * r
    offsets = np.zeros((int(disc.sum()), 3), dtype=np.int64)
    offsets[:, h], offsets[:, v] = du[disc], dv[disc]
    return np.concatenate([np.asarray(c, dtype=np.int64) + offsets for c in centres])


def ball(centre, radius: int, shape) -> np.ndarray:
    """(N, 3) voxels of a ball of ``radius`` voxels around ``centre``, clipped to ``shape``."""
    r = int(radius)
    d = np.mgrid[-r : r + 1, -r : r + 1, -r : r + 1].reshape(3, -1).T
    d = d[(d**2).sum(1) <= r * r]
    return _clip(np.asarray(centre) + d, shape)


def box(centre, half: int, shape) -> np.ndarray:
    """(N, 3) voxels of a cube of half-size ``half`` voxels around ``centre``, clipped to ``shape``."""
    h = int(half)
    d = np.mgrid[-h : h + 1, -h : h + 1, -h : h + 1].reshape(3, -1).T
    return _clip(np.asarray(centre) + d, shape)


def rectangle(a, b) -> np.ndarray:
    """(N, 3) voxels of the axis-aligned box spanned by voxels ``a`` and ``b`` (a slice when they share one)."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    grids = np.mgrid[lo[0] : hi[0] + 1, lo[1] : hi[1] + 1, lo[2] : hi[2] + 1]
    return grids.reshape(3, -1).T


def flood(values: np.ndarray, seed, threshold: float) -> np.ndarray:
    """(N, 3) voxels above ``threshold`` 6-connected to ``seed`` (empty if the seed is below)."""
    from scipy import ndimage

    above = np.nan_to_num(values) > threshold
    if not above[tuple(seed)]:
        return np.zeros((0, 3), dtype=np.int64)
    labels, _ = ndimage.label(above)
    return np.argwhere(labels == labels[tuple(seed)])


def _clip(voxels: np.ndarray, shape) -> np.ndarray:
    inside = np.all((voxels >= 0) & (voxels < np.array(shape)), axis=1)
    return voxels[inside]


def polygon(vertices, h_axis: int, v_axis: int) -> np.ndarray:
    """(N, 3) voxels of the slice whose centres lie inside or on the closed polygon through
    ``vertices`` (voxel indices on one slice; even-odd rule, edges included)."""
    vertices = np.asarray(vertices, dtype=np.int64)
    pts = vertices[:, [h_axis, v_axis]].astype(np.float64)
    lo, hi = pts.min(0).astype(int), pts.max(0).astype(int)
    hh, vv = np.mgrid[lo[0] : hi[0] + 1, lo[1] : hi[1] + 1]
    x, y = hh.ravel().astype(np.float64), vv.ravel().astype(np.float64)
    inside = np.zeros(x.shape, dtype=bool)
    on_edge = np.zeros(x.shape, dtype=bool)
    for (x0, y0), (x1, y1) in zip(pts, np.roll(pts, -1, axis=0), strict=True):
        crosses = (y0 > y) != (y1 > y)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_at = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
        inside ^= crosses & (x < x_at)
        # On the edge: collinear and within the segment's box.
        cross = (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0)
        within = (
            (np.minimum(x0, x1) <= x)
            & (x <= np.maximum(x0, x1))
            & (np.minimum(y0, y1) <= y)
            & (y <= np.maximum(y0, y1))
        )
        on_edge |= (np.abs(cross) < 1e-9) & within
    keep = inside | on_edge
    out = np.repeat(vertices[:1], int(keep.sum()), axis=0)
    out[:, h_axis] = x[keep].astype(np.int64)
    out[:, v_axis] = y[keep].astype(np.int64)
    return out
