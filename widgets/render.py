"""Turning layers into pixels: slice planes through the reference grid, colour maps, compositing.

Pure NumPy (no Qt, no VTK), shared by the 2-D slice views and the slice planes
of the 3-D view so both always show the same colours.

Orientation: a view's screen axes are world (RAS+) axes. ``axial`` shows R to
the right and A up, ``coronal`` R right and S up, ``sagittal`` A to the left
(P right) and S up, i.e. neurological convention (the patient's left on the
screen's left); ``radiological=True`` mirrors left-right in axial and coronal.
Whatever the voxel order of the file, the affine decides where each voxel goes,
and the edge labels say which side is which.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import nibabel as nib
import numpy as np

from tractlens.app.colormaps import LUTS
from tractlens.app.grid import Grid
from tractlens.app.model import GLYPH_KINDS, Document, Layer

# For each view: (world axis shown horizontally, +1 if it increases to the right),
# (world axis shown vertically, +1 if it increases upwards), world axis across.
VIEWS = {
    "axial": ((0, +1), (1, +1), 2),
    "coronal": ((0, +1), (2, +1), 1),
    "sagittal": ((1, -1), (2, +1), 0),
}
WORLD_LABELS = (("L", "R"), ("P", "A"), ("I", "S"))


@dataclass(frozen=True)
class PlaneGeometry:
    """A slice plane of the reference grid laid out for the screen.

    ``voxels``: (H, W, 3) reference voxel indices of each pixel (row 0 at the top);
    ``pixel_mm``: (height, width) of one pixel in mm; ``labels``: text for the
    (left, right, top, bottom) edges; ``cursor_pixel``: (row, column) of the cursor.
    """

    voxels: np.ndarray
    pixel_mm: tuple[float, float]
    labels: tuple[str, str, str, str]
    cursor_pixel: tuple[int, int]
    normal_axis: int  # voxel axis across the plane
    h_axis: int  # voxel axis along the screen's x
    v_axis: int  # voxel axis along the screen's y
    h_reversed: bool  # column 0 holds the last voxel of h_axis
    v_reversed: bool  # row 0 holds the last voxel of v_axis
    screen_x_world: tuple[int, int] = (0, 1)  # (world axis, +1/-1) pointing to the screen's right
    screen_up_world: tuple[int, int] = (1, 1)  # (world axis, +1/-1) pointing up the screen

    def pixel_of(self, ijk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, column), fractional, of reference voxel coordinates (..., 3)."""
        height, width = self.voxels.shape[:2]
        col = ijk[..., self.h_axis]
        row = ijk[..., self.v_axis]
        if self.h_reversed:
            col = width - 1 - col
        if self.v_reversed:
            row = height - 1 - row
        return row, col


def voxel_axis_for_world(affine: np.ndarray) -> list[tuple[int, int]]:
    """For world axes R, A, S: (voxel axis closest to it, +1/-1 direction)."""
    return list(_axes_of(np.asarray(affine, dtype=np.float64).tobytes()))


@functools.lru_cache(maxsize=16)
def _axes_of(affine_bytes: bytes) -> tuple[tuple[int, int], ...]:
    """:func:`voxel_axis_for_world` of an affine's bytes, found once (every paint of the three
    slice views asks for it, several times: nibabel's orientation took a fifth of a slice step)."""
    ornt = nib.orientations.io_orientation(np.frombuffer(affine_bytes, dtype=np.float64).reshape(4, 4))
    out = [(0, 1)] * 3
    for voxel_axis, (world_axis, sign) in enumerate(ornt):
        out[int(world_axis)] = (voxel_axis, int(sign))
    return tuple(out)


def normal_slice(doc: Document, view: str) -> int:
    """The reference voxel index of ``view``'s slice along its normal (what its image shows):
    the cursor moving along the other axes leaves that image as it is."""
    n_axis, _ = voxel_axis_for_world(doc.reference_affine)[VIEWS[view][2]]
    return int(doc.cursor[n_axis])


def plane_geometry(doc: Document, view: str, radiological: bool = False) -> PlaneGeometry:
    (h_world, h_dir), (v_world, v_dir), n_world = VIEWS[view]
    if radiological and h_world == 0:
        h_dir = -h_dir
    axes = voxel_axis_for_world(doc.reference_affine)
    shape = np.array(doc.reference_shape)
    h_axis, h_sign = axes[h_world]
    v_axis, v_sign = axes[v_world]
    n_axis, _ = axes[n_world]
    cols = np.arange(shape[h_axis])
    h_reversed = h_sign * h_dir < 0
    if h_reversed:
        cols = cols[::-1]
    rows = np.arange(shape[v_axis])
    v_reversed = v_sign * v_dir > 0  # row 0 is the top of the screen: largest world value first
    if v_reversed:
        rows = rows[::-1]
    voxels = np.empty((len(rows), len(cols), 3), dtype=np.int64)
    voxels[..., h_axis] = cols[None, :]
    voxels[..., v_axis] = rows[:, None]
    voxels[..., n_axis] = doc.cursor[n_axis]
    zooms = np.sqrt((doc.reference_affine[:3, :3] ** 2).sum(axis=0))
    h_low, h_high = WORLD_LABELS[h_world] if h_dir > 0 else WORLD_LABELS[h_world][::-1]
    v_low, v_high = WORLD_LABELS[v_world]
    cursor_col = int(np.flatnonzero(cols == doc.cursor[h_axis])[0])
    cursor_row = int(np.flatnonzero(rows == doc.cursor[v_axis])[0])
    return PlaneGeometry(
        voxels,
        (float(zooms[v_axis]), float(zooms[h_axis])),
        (h_low, h_high, v_high, v_low),
        (cursor_row, cursor_col),
        n_axis,
        h_axis,
        v_axis,
        bool(h_reversed),
        bool(v_reversed),
        (h_world, h_dir),
        (v_world, v_dir),
    )


def fractional_voxel(geometry: PlaneGeometry, row: float, col: float) -> np.ndarray:
    """Fractional reference voxel coordinates of a point of the plane image given in pixels
    (``row``, ``col``: pixel (r, c) spans [r, r+1] x [c, c+1])."""
    voxel = geometry.voxels[int(row), int(col)].astype(np.float64)
    voxel[geometry.h_axis] += (col - int(col) - 0.5) * (-1 if geometry.h_reversed else 1)
    voxel[geometry.v_axis] += (row - int(row) - 0.5) * (-1 if geometry.v_reversed else 1)
    return voxel


MAX_OVERSAMPLE = 4


def display_oversample(doc: Document) -> int:
    """Screen pixels per reference voxel (each way) the slices are composited at: more than one
    when a visible image or ROI has finer voxels than the reference grid (a 1 mm T1 or a lesion
    drawn on it over 2 mm diffusion data), so that it shows at its own resolution; at most
    :data:`MAX_OVERSAMPLE`."""
    if doc.reference_affine is None:
        return 1
    reference = Grid(doc.reference_affine, doc.reference_shape).voxel_sizes.min()
    finest = [
        Grid.of(layer.data).voxel_sizes.min()
        for layer in doc.layers
        if layer.visible and layer.opacity > 0 and layer.kind not in ("tractogram", *GLYPH_KINDS)
    ]
    factor = int(np.ceil(reference / min(finest) - 0.05)) if finest else 1
    return int(np.clip(factor, 1, MAX_OVERSAMPLE))


def oversampled_voxels(geometry: PlaneGeometry, factor: int) -> np.ndarray:
    """(H·f, W·f, 3) fractional reference voxel coordinates of the sub-pixels of the plane
    (``factor`` f each way; the plane's own integer voxels when f is 1)."""
    if factor == 1:
        return geometry.voxels
    offsets = (np.arange(factor) + 0.5) / factor - 0.5
    voxels = np.repeat(np.repeat(geometry.voxels.astype(np.float64), factor, axis=0), factor, axis=1)
    height, width = geometry.voxels.shape[:2]
    voxels[..., geometry.h_axis] += np.tile(offsets, width)[None, :] * (-1 if geometry.h_reversed else 1)
    voxels[..., geometry.v_axis] += np.tile(offsets, height)[:, None] * (-1 if geometry.v_reversed else 1)
    return voxels


def sample_layer(layer: Layer, doc: Document, voxels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest-neighbour values of a volume layer at reference voxels (integer, or fractional:
    sub-pixels); (values, inside mask)."""
    vol = layer.data
    array = vol.mask if layer.kind == "roi" else vol.data
    if voxels.dtype.kind in "iu" and Grid.of(vol).matches((doc.reference_affine, doc.reference_shape)):
        ijk = voxels
    else:
        to_layer = np.linalg.solve(vol.affine, doc.reference_affine)
        ijk = np.rint(voxels @ to_layer[:3, :3].T + to_layer[:3, 3]).astype(np.int64)
    inside = np.all((ijk >= 0) & (ijk < np.array(vol.shape3)), axis=-1)
    safe = np.where(inside[..., None], ijk, 0)
    values = array[safe[..., 0], safe[..., 1], safe[..., 2]]
    return values, inside


def _axis_range(indices: np.ndarray) -> slice:
    """The slice that reads ``indices`` (consecutive voxel indices, rising or falling) from an axis."""
    start = int(indices[0])
    step = 1 if len(indices) == 1 or indices[1] > indices[0] else -1
    stop = int(indices[-1]) + step
    return slice(start, None if stop < 0 else stop, step)


def sample_plane(layer: Layer, doc: Document, geometry: PlaneGeometry, oversample: int = 1):
    """:func:`sample_layer` over a plane's pixels (or sub-pixels, ``oversample``), (values, inside).
    A layer on the reference grid at one pixel a voxel is read as a slice of its array (no gather
    of every pixel's voxel: that was most of a composite's time on an HCP-sized grid)."""
    vol = layer.data
    if oversample != 1 or not Grid.of(vol).matches((doc.reference_affine, doc.reference_shape)):
        return sample_layer(layer, doc, oversampled_voxels(geometry, oversample))
    array = vol.mask if layer.kind == "roi" else vol.data
    voxels = geometry.voxels
    index = [slice(None)] * 3
    index[geometry.normal_axis] = int(voxels[0, 0, geometry.normal_axis])
    index[geometry.v_axis] = _axis_range(voxels[:, 0, geometry.v_axis])
    index[geometry.h_axis] = _axis_range(voxels[0, :, geometry.h_axis])
    values = array[tuple(index)]  # the two in-plane axes in voxel order, then any per-voxel axes
    if geometry.v_axis > geometry.h_axis:
        values = np.swapaxes(values, 0, 1)
    return values, np.ones(values.shape[:2], dtype=bool)


def label_colours(labels: np.ndarray, lut=None) -> np.ndarray:
    """Colours (RGB 0..1) of integer labels: the lookup table's colour where ``lut`` (an
    :class:`app.io.lut.LabelTable`) has one, else distinct, reproducible golden-ratio hues."""
    if lut is not None and lut.colours:
        keys = np.array(sorted(lut.colours), dtype=np.int64)
        table = np.array([lut.colours[int(k)] for k in keys], dtype=np.float64) / 255.0
        where = np.clip(np.searchsorted(keys, labels), 0, len(keys) - 1)
        known = keys[where] == labels
        rgb = label_colours(labels)
        rgb[known] = table[where[known]]
        return rgb
    hue = (labels.astype(np.float64) * 0.618033988749895) % 1.0
    h6 = hue * 6.0
    x = 1 - np.abs(h6 % 2 - 1)
    zeros = np.zeros_like(hue)
    ones = np.ones_like(hue)
    sector = h6.astype(int) % 6
    choices = [
        (ones, x, zeros),
        (x, ones, zeros),
        (zeros, ones, x),
        (zeros, x, ones),
        (x, zeros, ones),
        (ones, zeros, x),
    ]
    rgb = np.zeros((*labels.shape, 3))
    for s, (r, g, b) in enumerate(choices):
        sel = sector == s
        rgb[sel] = np.stack([r[sel], g[sel], b[sel]], -1)
    return 0.35 + 0.65 * rgb


def colorize(layer: Layer, values: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RGB (float 0..1) and alpha for sampled values of a layer."""
    if layer.kind == "roi":
        rgb = np.broadcast_to(np.array(layer.color_rgb()), (*values.shape[:2], 3))  # its own colour, or its role's
        alpha = values.astype(np.float64)
    elif layer.kind == "rgb":
        rgb = np.clip(np.nan_to_num(values[..., :3].astype(np.float64)), 0.0, 1.0)
        alpha = (rgb.max(-1) > 0).astype(np.float64)
    elif layer.kind == "labels":
        labels = values.astype(np.int64)
        rgb = label_colours(labels, getattr(layer.data, "lut", None))
        alpha = (labels > 0).astype(np.float64)
    else:  # the scalar kinds (scalar, dwi): a colour map over the display range
        lo, hi = layer.clim
        finite = np.nan_to_num(values.astype(np.float64))
        scaled = (finite - lo) / (hi - lo if hi > lo else 1.0)
        index = np.clip((scaled * 255).astype(np.int64), 0, 255)
        rgb = LUTS.get(layer.colormap, LUTS["gray"])[index]
        if layer.transparent_below is None:
            alpha = np.ones(values.shape[:2])
        else:  # an overlay: the layers beneath show through where it is low
            alpha = (finite >= layer.transparent_below).astype(np.float64)
    alpha = alpha * inside * layer.opacity
    return rgb, alpha


def composite(doc: Document, geometry: PlaneGeometry, oversample: int = 1) -> np.ndarray:
    """(H, W, 3) uint8 image of the visible volume layers, bottom to top, over black
    (glyph layers and tractograms are drawn over it by the views); (H·f, W·f, 3) with
    ``oversample`` f (:func:`display_oversample`)."""
    height, width = (n * oversample for n in geometry.voxels.shape[:2])
    out = np.zeros((height, width, 3))
    for layer in doc.layers:
        if not layer.visible or layer.kind in ("tractogram", *GLYPH_KINDS) or layer.opacity <= 0:
            continue
        values, inside = sample_plane(layer, doc, geometry, oversample)
        rgb, alpha = colorize(layer, values, inside)
        if layer.alignment != "none" and layer.kind not in ("roi", "labels"):
            voxels = oversampled_voxels(geometry, oversample)
            rgb, alpha = alignment_view(layer, doc, voxels, values, rgb, alpha)
        out = out * (1 - alpha[..., None]) + rgb * alpha[..., None]
    return (np.clip(out, 0, 1) * 255 + 0.5).astype(np.uint8)


def stroke_voxels(doc: Document, layer: Layer, voxels) -> np.ndarray | None:
    """The reference voxels an ROI edit changed (``voxels``: the ``roi`` event's, on the ROI's
    grid), or None when they cannot say where the slices changed (no voxels given: a shape or an
    undo of one; an ROI on another grid)."""
    if voxels is None or doc.reference_affine is None:
        return None
    if not Grid.of(layer.data).matches((doc.reference_affine, doc.reference_shape)):
        return None
    return np.asarray(voxels, dtype=np.int64).reshape(-1, 3)


def plane_rect(geometry: PlaneGeometry, voxels: np.ndarray) -> tuple[slice, slice] | None:
    """The rectangle (rows, columns) of the plane's pixels that holds those of the reference
    ``voxels`` (N, 3) lying on the plane; None when none does (the plane is unchanged)."""
    normal = geometry.normal_axis
    on_plane = voxels[voxels[:, normal] == geometry.voxels[0, 0, normal]]
    if len(on_plane) == 0:
        return None
    rows, cols = geometry.pixel_of(on_plane)
    return slice(int(rows.min()), int(rows.max()) + 1), slice(int(cols.min()), int(cols.max()) + 1)


def pointwise(doc: Document) -> bool:
    """Is each composited pixel a function of its own voxel only? Not when a visible layer shows
    its edges (``alignment == "edges"``: gradients over the neighbours): then a changed voxel
    changes pixels around it, and only a whole plane composited again is right."""
    return not any(layer.visible and layer.alignment == "edges" for layer in doc.layers)


def patch_stroke(doc: Document, geometry: PlaneGeometry, image: np.ndarray, layer: Layer, voxels) -> bool | None:
    """Bring a plane's composited ``image`` up to date after an ROI edit, in place, compositing
    again only the rectangle of the edit's ``voxels`` (the ``roi`` event's) on the plane. True:
    patched; False: the edit missed the plane (the image is unchanged); None: it cannot be told
    where (see :func:`stroke_voxels` and :func:`pointwise`): composite the whole plane again."""
    voxels = stroke_voxels(doc, layer, voxels)
    if voxels is None or not pointwise(doc):
        return None
    rect = plane_rect(geometry, voxels)
    if rect is None:
        return False
    recomposite(doc, geometry, image, rect, display_oversample(doc))
    return True


def recomposite(doc: Document, geometry: PlaneGeometry, image: np.ndarray, rect, oversample: int = 1) -> None:
    """Composite a rectangle of the plane again, into ``image`` (:func:`composite`'s of the whole
    plane, (H·f, W·f, 3) with ``oversample`` f), in place: a brush stroke changes a few voxels,
    and the rest of the plane is as it was. ``rect``: (rows, columns) slices of the plane's
    pixels (:func:`plane_rect`). Needs :func:`pointwise` compositing."""
    rows, cols = rect
    part = replace(geometry, voxels=geometry.voxels[rows, cols])
    f = oversample
    image[rows.start * f : rows.stop * f, cols.start * f : cols.stop * f] = composite(doc, part, f)


EDGE_COLOUR = (1.0, 0.15, 0.85)  # magenta: apart from grey anatomy and from the ROI colours
EDGE_THRESHOLD = 0.12  # a gradient above this fraction of the display range (per pixel) is an edge


def alignment_view(layer: Layer, doc: Document, voxels: np.ndarray, values, rgb, alpha):
    """How an image layer is drawn to judge its alignment with the layers under it
    (``layer.alignment``): half blended; in the alternate squares of a checkerboard
    ``layer.checker_mm`` wide (in world mm, so the squares stay put across slices and views);
    or only its edges (gradient above :data:`EDGE_THRESHOLD` of its display range), in
    :data:`EDGE_COLOUR`."""
    if layer.alignment == "blend":
        return rgb, alpha * 0.5
    if layer.alignment == "checkerboard":
        world = voxels @ doc.reference_affine[:3, :3].T + doc.reference_affine[:3, 3]
        squares = np.floor(world / float(layer.checker_mm)).astype(np.int64).sum(axis=-1)
        return rgb, alpha * (squares % 2 == 0)
    intensity = rgb.mean(axis=-1) if layer.kind == "rgb" else _scaled(layer, values)
    edges = thin_edges(np.where(alpha > 0, intensity, 0.0), EDGE_THRESHOLD)
    colour = np.broadcast_to(np.array(EDGE_COLOUR), rgb.shape)
    return colour, edges * (alpha > 0) * layer.opacity


def thin_edges(image: np.ndarray, threshold: float) -> np.ndarray:
    """Edges one pixel wide (Canny's non-maximum suppression, without its hysteresis): pixels
    whose gradient magnitude is above ``threshold`` (per pixel) and not below their two
    neighbours along the gradient's direction (rounded to 0, 45, 90 or 135°)."""
    rows, cols = np.gradient(image)
    magnitude = np.hypot(rows, cols)
    padded = np.pad(magnitude, 1)
    angle = np.rad2deg(np.arctan2(rows, cols)) % 180
    sector = (np.rint(angle / 45).astype(int)) % 4  # 0: along columns, 1: 45°, 2: along rows, 3: 135°
    steps = {0: (0, 1), 1: (1, 1), 2: (1, 0), 3: (1, -1)}
    height, width = magnitude.shape
    keep = magnitude > threshold
    for number, (dr, dc) in steps.items():
        ahead = padded[1 + dr : 1 + dr + height, 1 + dc : 1 + dc + width]
        behind = padded[1 - dr : 1 - dr + height, 1 - dc : 1 - dc + width]
        keep &= ~((sector == number) & ((magnitude < ahead) | (magnitude < behind)))
    return keep


def _scaled(layer: Layer, values: np.ndarray) -> np.ndarray:
    lo, hi = layer.clim
    return np.clip((np.nan_to_num(values.astype(np.float64)) - lo) / (hi - lo if hi > lo else 1.0), 0.0, 1.0)
