"""A layer: one thing shown in the views (a volume, an ROI, a tractogram) with its display
properties (visibility, opacity, colour map and range, glyphs, fibre colouring and selection)."""

from __future__ import annotations

import numpy as np

from tractlens.gpu.sh import Y00

from .observable import Observable
from .tractogram import first_column
from .volumes import Volume

LAYER_KINDS = ("scalar", "rgb", "labels", "tensor", "tractogram", "roi", "dwi", "dyads", "fod")
SCALAR_KINDS = ("scalar", "dwi")
#: A tractogram's ``color_by`` that draws it in one colour, its ``color`` (a named bundle's).
SOLID = "solid"  # drawn through a colour map and a display range
GLYPH_KINDS = ("tensor", "dyads", "fod")  # drawn as glyphs on the cursor's slice planes, not as pixels
ROLE_COLOURS = {  # RGB 0..1, the usual conventions: seed green, target blue, exclusion red
    "seed": (0.1, 0.9, 0.2),
    "target": (0.2, 0.5, 1.0),
    "exclusion": (1.0, 0.15, 0.15),
    "waypoint": (1.0, 0.85, 0.1),
    "stop": (0.8, 0.3, 1.0),
    "lesion": (1.0, 0.55, 0.0),
}
# One colour per ROI: each role has a family of hues that stay apart from the other roles' and
# from each other, the role's colour first (the first seed is green as before, the second seed a
# teal, the third a lime...). The views draw ROIs as outlines with a dark halo over a translucent
# fill, so that even a green seed on the green of colour FA keeps its edge.
ROLE_PALETTES = {
    "seed": ("#1ae633", "#00d9c0", "#b8ff3d", "#2e9c5a", "#7dffb0"),
    "target": ("#3380ff", "#00bfff", "#8f7bff", "#2040c0", "#9cc9ff"),
    "exclusion": ("#ff2626", "#ff7a45", "#d01e8a", "#ff6fae", "#a01010"),
    "waypoint": ("#ffd91a", "#ffa000", "#f5f08a", "#c9a000", "#ffc66e"),
    "stop": ("#cc4cff", "#ff66f0", "#8f5fd0", "#eab0ff", "#a02cc0"),
    "lesion": ("#ff8c00", "#d2691e", "#ff9f5a", "#b35900", "#ffb27f"),
}
STICK_COLOURS = (  # RGB 0..1 of dyads sticks 1, 2, 3 (largest mean fraction first; a 4th is red again)
    (1.0, 0.2, 0.2),
    (0.2, 1.0, 0.2),
    (0.3, 0.55, 1.0),
)
GLYPH_SHAPES = ("superquadric", "ellipsoid")
FOD_SCALINGS = ("voxel", "global")  # fODF glyphs: min-max per voxel, or relative sizes (app.fod_display)
# How an image is drawn over the layers under it to judge their alignment (a registration):
# as itself, half blended, in alternate squares of a checkerboard (``checker_mm`` wide), or
# as its edges only.
ALIGNMENT_MODES = ("none", "blend", "checkerboard", "edges")
COLORMAPS = ("gray", "hot", "viridis", "cool-warm", "safety")  # safety: red→yellow up to mid-range, then green
RANGE_SAMPLE = 100_000  # values enough for a display range (1st-99th percentile)


def hex_colour(value) -> str | None:
    """``"#rrggbb"`` (lower case) from such a string or an RGB triple of 0..1 floats; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if len(text) == 7 and text[0] == "#" and all(c in "0123456789abcdef" for c in text[1:]):
            return text
        raise ValueError(f"a colour is written #rrggbb, not {value!r}")
    rgb = np.asarray(value, dtype=float)
    if rgb.shape != (3,) or np.any(rgb < 0) or np.any(rgb > 1):
        raise ValueError(f"a colour is three values between 0 and 1, not {value!r}")
    return "#" + "".join(f"{round(float(c) * 255):02x}" for c in rgb)


def next_roi_colour(layers, role: str) -> str:
    """The colour (``"#rrggbb"``) for a new ROI of ``role`` beside ``layers``: the first of the
    role's palette (:data:`ROLE_PALETTES`) that no other ROI is drawn in, so that no two ROIs
    share a colour until a role has more ROIs than its palette has colours (then they repeat
    in order)."""
    palette = ROLE_PALETTES[role]
    used = {hex_colour(layer.color_rgb()) for layer in layers if layer.kind == "roi"}
    free = [colour for colour in palette if colour not in used]
    if free:
        return free[0]
    same_role = sum(1 for layer in layers if layer.kind == "roi" and layer.data.role == role)
    return palette[same_role % len(palette)]


class Layer(Observable):
    """A thing shown in the views, with its display properties.

    ``data`` is a :class:`Volume` (kinds ``scalar``, ``rgb``, ``labels``,
    ``tensor``, ``dyads``), a :class:`DWIVolume` (kind ``dwi``: a diffusion
    series, drawn like a scalar layer as its mean b=0 image), a :class:`RoiMask`
    (kind ``roi``) or a :class:`Tractogram` (kind ``tractogram``).

    A ``dyads`` volume holds fibre orientations, (X, Y, Z, n_sticks, 4) with per
    stick ``[vx, vy, vz, f]``: a unit direction in voxel axes and its volume
    fraction (all zero where no stick is shown), sticks ordered by fraction. It
    is drawn on the cursor's slice planes as one line per stick, centred on the
    voxel, coloured by stick number (:data:`STICK_COLOURS`: 1 red, 2 green,
    3 blue) and f × ``glyph_step`` × ``glyph_size`` voxels long (the slice views
    draw its in-plane projection). Its value at a point is the fractions.

    An ``fod`` volume holds fODFs, (X, Y, Z, C) spherical-harmonic coefficients in MRtrix's
    basis and the world frame (:mod:`app.io.fod`), drawn as SH surfaces on the cursor's
    planes (:mod:`app.fod_display`) sized by ``fod_scaling``: ``"voxel"`` (min-max per
    voxel) or ``"global"`` (relative amplitudes).

    Display properties: ``visible``, ``opacity`` (0..1), ``colormap`` and
    ``clim`` (scalar and dwi layers), ``color_by`` (tractograms: ``"direction"``,
    :data:`SOLID` (one colour, ``color``) or the name of a point/streamline scalar; tensors: ``"direction"`` or
    ``"fa"``), ``tubes`` (tractograms drawn as shaded tubes instead of lines),
    and for the glyph kinds (tensor, dyads), shown on the cursor's slice planes,
    ``glyph`` (tensor shape), ``glyph_step`` (every n-th voxel; default 2 for
    tensors, 1 for dyads and fODFs) and ``glyph_size`` (1 = the largest glyph fills its
    grid cell); ``transparent_below`` (scalar layers: values below it let the
    layers beneath show through, e.g. an overlay that is empty almost
    everywhere; None: every value is drawn); ``alignment`` and ``checker_mm`` (image layers:
    drawn over the layers beneath as a blend, a checkerboard of squares that wide, or edges,
    to judge a registration, :data:`ALIGNMENT_MODES`); ``color`` (ROIs: ``"#rrggbb"``, None: the
    colour of the ROI's role, see :meth:`color_rgb`; tractograms: the colour ``SOLID`` draws); ``filter_by_rois`` (tractograms: show only
    the streamlines that pass the ROIs, the user's choice per layer; off by default). Changing one emits ``display``
    with the names that changed; :meth:`set_data` replaces a volume layer's
    values (same grid) and emits ``display`` with ``"data"`` among them.
    """

    _DISPLAY = (
        "visible",
        "opacity",
        "colormap",
        "clim",
        "color_by",
        "name",
        "glyph",
        "glyph_step",
        "glyph_size",
        "tubes",
        "transparent_below",
        "color",
        "fod_scaling",
        "alignment",
        "checker_mm",
        "filter_by_rois",
    )

    def __init__(self, name: str, data, kind: str, **display):
        super().__init__()
        if kind not in LAYER_KINDS:
            raise ValueError(f"unknown layer kind {kind!r}")
        self.name = name
        self.data = data
        self.kind = kind
        self.visible = True
        self.opacity = 1.0
        self.colormap = "viridis" if kind == "tractogram" else "gray"
        self.clim = self._default_clim()
        self.color_by = "direction"
        self.glyph = "superquadric"
        self.glyph_step = 1 if kind in ("dyads", "fod") else 2
        self.glyph_size = 1.0
        self.tubes = False
        self.transparent_below: float | None = None
        self.color: str | None = None  # ROIs: "#rrggbb", None = the role's colour
        self.fod_scaling = "voxel"  # fod layers: glyph radii min-max per voxel, or "global"
        self.alignment = "none"  # image layers: see ALIGNMENT_MODES
        self.checker_mm = 10.0  # the checkerboard's square size (mm)
        # Tractograms: shown through the ROIs only when the user asks (layer menu "Filter by ROIs"):
        # drawing an ROI must never hide a result, least of all one just computed.
        self.filter_by_rois = False
        self.selection: np.ndarray | None = None  # tractograms: streamlines passing the ROIs, None = all
        self.selection_by: str | None = None  # what made the selection ("ROI target", "connectivity cell")
        # Where the layer came from: {"file": path} for a loaded file; for a computed result its
        # method, parameters, inputs, backend, device and timings (reports and sessions show it)
        self.provenance: dict = {}
        for key, value in display.items():
            if key not in self._DISPLAY:
                raise ValueError(f"unknown display property {key!r}")
            setattr(self, key, value)

    def _default_clim(self) -> tuple[float, float]:
        if self.kind == "roi":
            self.opacity = 0.45  # translucent: the map shows through, the outline marks the edge
        if self.kind not in SCALAR_KINDS:
            return (0.0, 1.0)
        values = np.asarray(self.data.data)
        values = values.view(np.uint8) if values.dtype == bool else values  # percentiles need numbers
        # Integers are all finite: no whole-volume copy (a tracking result's counts on an HCP grid)
        finite = values if values.dtype.kind in "iu" else values[np.isfinite(values)]
        nonzero = finite[finite != 0]
        if nonzero.size == 0:
            return (0.0, 1.0)
        lo, hi = np.percentile(nonzero, [0.5, 99.5])
        lo = min(0.0, float(lo))
        return (lo, float(hi) if hi > lo else lo + 1.0)

    def set(self, **changes) -> None:
        """Change display properties and notify the views once."""
        changed = self._apply(changes)
        if changed:
            self.emit("display", changed=changed)

    def set_data(self, values: np.ndarray, **changes) -> None:
        """Replace a volume layer's values in place (the same grid: a result that fills in while
        its job runs) and change display properties with them (e.g. ``clim``); the views hear one
        ``display`` event whose ``changed`` starts with ``"data"``."""
        if not isinstance(self.data, Volume):
            raise ValueError(f"a {self.kind} layer holds no volume whose values could be replaced")
        for key in changes:  # check before anything changes
            if key not in self._DISPLAY:
                raise ValueError(f"unknown display property {key!r}")
        self.data.data = values  # refuses another grid
        self.emit("display", changed=["data", *self._apply(changes)])

    def _apply(self, changes: dict) -> list[str]:
        """Set display properties; the names of those that changed."""
        changed = []
        for key, value in changes.items():
            if key not in self._DISPLAY:
                raise ValueError(f"unknown display property {key!r}")
            if key == "opacity":
                value = float(min(1.0, max(0.0, value)))
            if key == "clim":
                value = (float(value[0]), float(value[1]))
            if key == "transparent_below" and value is not None:
                value = float(value)
            if key == "color":
                value = hex_colour(value)
            if key == "alignment" and value not in ALIGNMENT_MODES:
                raise ValueError(f"alignment is one of {', '.join(ALIGNMENT_MODES)}, not {value!r}")
            if key == "checker_mm":
                value = float(value)
                if not value > 0:
                    raise ValueError("the checkerboard's squares need a size above 0 mm")
            if key == "fod_scaling" and value not in FOD_SCALINGS:
                raise ValueError(f"fODF scaling is one of {', '.join(FOD_SCALINGS)}, not {value!r}")
            if getattr(self, key) != value:
                setattr(self, key, value)
                changed.append(key)
        if "color_by" in changed and "clim" not in changes and self.kind == "tractogram":
            self.clim = self.scalar_range(self.color_by)
            changed.append("clim")
        return changed

    def color_rgb(self) -> tuple[float, float, float]:
        """The colour an ROI is drawn in (RGB 0..1): its own ``color``, else its role's. A colour
        given from another role's palette (:func:`next_roi_colour`; the role changed since) is
        drawn as the same entry of this role's palette, so that a seed turned exclusion turns red."""
        if self.color and self.kind == "roi" and self.color not in ROLE_PALETTES[self.data.role]:
            for palette in ROLE_PALETTES.values():
                if self.color in palette:
                    return _rgb(ROLE_PALETTES[self.data.role][palette.index(self.color)])
        if self.color:
            return _rgb(self.color)
        if self.kind == "roi":
            return ROLE_COLOURS[self.data.role]
        return (1.0, 1.0, 1.0)

    def set_selection(self, selected: np.ndarray | None, by: str | None = None) -> None:
        """Show only these streamlines (bool per streamline), or all with None; ``by`` says what
        selected them (e.g. ``"ROI target"``), for every count the views show."""
        if selected is not None:
            selected = np.asarray(selected, dtype=bool)
            if selected.shape != (len(self.data),):
                raise ValueError("a selection needs one flag per streamline")
        by = None if selected is None else by
        same_by, self.selection_by = by == self.selection_by, by
        if selected is None and self.selection is None:
            return
        count = None if selected is None else int(np.count_nonzero(selected))
        same = (
            count is not None
            and count == self.selected_count()  # (cheaper than comparing 10 M flags, and mostly enough)
            and np.array_equal(selected, self.selection)
        )
        if same and same_by:
            return
        self.selection, self._counted = selected, (selected, count)
        self.emit("display", changed=["selection"])

    def selected_count(self) -> int | None:
        """How many streamlines the selection keeps (None: no selection), counted once per
        selection array: a whole-brain tractogram's is 10 M flags, which each view counted again
        at every ROI edit."""
        selection = self.selection
        if selection is None:
            return None
        counted = getattr(self, "_counted", None)
        if counted is None or counted[0] is not selection:  # (assigned another way: a session's)
            counted = self._counted = (selection, int(np.count_nonzero(selection)))
        return counted[1]

    def scalar_range(self, name: str) -> tuple[float, float]:
        """Robust display range (1st-99th percentile) of a tractogram's point or streamline scalar."""
        tract = self.data
        values = tract.point_scalars.get(name, tract.streamline_scalars.get(name))
        if values is None or len(values) == 0:
            return (0.0, 1.0)
        values = np.asarray(values)
        if len(values) > RANGE_SAMPLE:  # a regular sample: the same range, in a millisecond
            values = values[:: len(values) // RANGE_SAMPLE]
        lo, hi = np.percentile(values.astype(np.float64), [1, 99])
        return (float(lo), float(hi) if hi > lo else float(lo) + 1.0)

    def point_values(self, name: str) -> np.ndarray:
        """A tractogram scalar per point (streamline scalars repeated along each streamline)."""
        tract = self.data
        if name in tract.point_scalars:
            return first_column(tract.point_scalars[name], tract.n_points)
        if name in tract.streamline_scalars:
            return np.repeat(first_column(tract.streamline_scalars[name], len(tract)), tract.lengths)
        raise KeyError(f"{self.name} has no scalar {name!r}")

    def value_at_world(self, world: np.ndarray):
        """The layer's value at a world point (nearest voxel), or None outside it."""
        if self.kind in ("tractogram",):
            return None
        if self.kind == "roi":
            vol = Volume(self.name, self.data.mask, self.data.affine)
            ijk = np.rint(np.linalg.solve(vol.affine, np.append(world, 1.0))[:3]).astype(int)
            inside = np.all(ijk >= 0) and np.all(ijk < vol.shape3)
            return int(vol.data[tuple(ijk)]) if inside else None
        vol = self.data
        ijk = np.rint(np.linalg.solve(vol.affine, np.append(world, 1.0))[:3]).astype(int)
        if np.any(ijk < 0) or np.any(ijk >= vol.shape3):
            return None
        if self.kind == "dyads":
            return vol.data[tuple(ijk)][:, 3]  # the sticks' fractions
        if self.kind == "fod":  # the mean amplitude (l=0 term), not the 45 coefficients
            return float(vol.data[tuple(ijk)][0]) * Y00
        return vol.data[tuple(ijk)]


def _rgb(colour: str) -> tuple[float, float, float]:
    """``"#rrggbb"`` as RGB 0..1."""
    return tuple(int(colour[i : i + 2], 16) / 255.0 for i in (1, 3, 5))
