"""The document the user works on: volumes, ROI masks and tractograms.

Plain Python with change events (napari's model/view split): views subscribe
with :meth:`Observable.connect` and are called on every change; nothing polls
and nothing here knows about Qt or VTK. Arrays live in voxel index space
(voxel centres at integer indices); each object carries the affine that maps
voxel indices to RAS+ millimetres.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .derived import DerivedCache

if TYPE_CHECKING:
    from .io import DWI, BedpostSamples

ROI_ROLES = ("seed", "target", "exclusion", "waypoint", "stop")


class Observable:
    """Minimal event source: ``connect(callback)``, ``emit(event, **info)``."""

    def __init__(self) -> None:
        self._listeners: list[Callable[..., None]] = []

    def connect(self, callback: Callable[..., None]) -> None:
        self._listeners.append(callback)

    def disconnect(self, callback: Callable[..., None]) -> None:
        self._listeners.remove(callback)

    def emit(self, event: str, **info: Any) -> None:
        for callback in list(self._listeners):
            callback(self, event, **info)


class Volume(Observable):
    """A 3-D scalar/vector volume (or 4-D series) with its voxel-to-RAS affine.

    ``kind`` says how to show and use it: ``scalar``, ``rgb``, ``vector``,
    ``tensor`` (6 components, order xx, xy, xz, yy, yz, zz in voxel axes),
    ``dwi``, ``labels`` or ``dyads`` (fibre orientations, see :class:`Layer`).
    """

    def __init__(self, name: str, data: np.ndarray, affine: np.ndarray, *, kind: str = "scalar", source: str = ""):
        super().__init__()
        data = np.asarray(data)
        if data.ndim < 3:
            raise ValueError(f"a volume needs at least 3 dimensions, got shape {data.shape}")
        affine = np.asarray(affine, dtype=np.float64)
        if affine.shape != (4, 4):
            raise ValueError("affine must be 4x4")
        self.name = name
        self._data = data
        self.affine = affine
        self.kind = kind
        self.source = source
        self.lut = None  # labels: an app.io.lut.LabelTable with the regions' names, when one is known

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape[:3] != self._data.shape[:3]:
            raise ValueError("a volume's grid cannot change; make a new volume instead")
        self._data = value
        self.emit("data")

    @property
    def shape3(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self._data.shape[:3])

    @property
    def voxel_size(self) -> np.ndarray:
        return np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0))

    def __repr__(self) -> str:
        return f"Volume({self.name!r}, shape={self._data.shape}, kind={self.kind!r})"


class DWIVolume(Volume):
    """A loaded diffusion series as a layer's data: shown as its mean b=0 image, the series kept.

    ``data`` is the 3-D mean of the b=0 volumes (what the views draw, in grey);
    ``dwi`` is the :class:`app.io.DWI` itself (4-D signal, b-values, b-vectors in
    voxel axes), which model fits started from the layer (ball & sticks) use.
    """

    def __init__(self, name: str, dwi: DWI):
        super().__init__(name, dwi.mean_b0().astype(np.float32), dwi.affine, kind="dwi", source=dwi.path)
        self.dwi = dwi


class DyadsVolume(Volume):
    """Fibre orientations for display (kind ``dyads``, see :class:`Layer`) that keep the
    posterior samples they summarise (:class:`app.io.BedpostSamples`), which
    probabilistic tracking started from the layer uses."""

    def __init__(self, name: str, data: np.ndarray, samples: BedpostSamples, *, source: str = ""):
        super().__init__(name, data, samples.affine, kind="dyads", source=source)
        self.samples = samples


def shape_half_sizes(shape: dict) -> np.ndarray:
    """A shape's half-size per voxel axis (3,): the radius of a sphere three times, a box's
    half-sizes (its radius is one number or one per axis)."""
    return np.broadcast_to(np.asarray(shape["radius"], dtype=float), (3,)).copy()


def normal_shape(shape: dict) -> dict:
    """A shape dict with its centre as a float array and its radius as a float (a box's
    per-axis half-sizes as a tuple of floats when they differ); checks the kind."""
    if shape["kind"] not in ("sphere", "box"):
        raise ValueError(f"unknown ROI shape {shape['kind']!r}")
    radius = np.asarray(shape["radius"], dtype=float)
    if radius.ndim == 0 or np.all(radius == radius.flat[0]):
        radius = float(radius.flat[0])
    elif shape["kind"] == "sphere" or radius.shape != (3,):
        raise ValueError("a sphere has one radius; a box one half-size or three (i, j, k)")
    else:
        radius = tuple(float(v) for v in radius)
    if np.any(np.asarray(radius) < 0):
        raise ValueError("a shape's radius cannot be negative")
    return dict(shape, centre=np.asarray(shape["centre"], dtype=float).reshape(3), radius=radius)


class RoiMask(Observable):
    """A region of interest as a boolean voxel mask on a reference grid."""

    def __init__(self, name: str, mask: np.ndarray, affine: np.ndarray, *, role: str = "seed"):
        super().__init__()
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}: one of {', '.join(ROI_ROLES)}")
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 3:
            raise ValueError("an ROI mask must be 3-D")
        self.name = name
        self.mask = mask
        self.affine = np.asarray(affine, dtype=np.float64)
        self.role = role
        # A movable 3-D shape ({"kind": "sphere"|"box", "centre": (3,) voxels, "radius": voxels})
        # whose voxels the mask holds; None for a freehand ROI (painting turns a shape freehand).
        # A box's radius is its half-size, one number or one per voxel axis (i, j, k).
        self.shape: dict | None = None

    def apply_shape(self, shape: dict | None) -> None:
        """Make the mask the voxels of ``shape`` (sphere: distance ≤ radius; box: |d| ≤ radius per axis)."""
        self.shape = None if shape is None else normal_shape(shape)
        if shape is None:
            return
        grid = np.indices(self.mask.shape, dtype=np.float64)
        d = grid - self.shape["centre"][:, None, None, None]
        if self.shape["kind"] == "sphere":
            r = float(self.shape["radius"])
            inside = (d**2).sum(axis=0) <= r * r + 1e-9
        else:
            half = shape_half_sizes(self.shape)
            inside = (np.abs(d) <= half[:, None, None, None] + 1e-9).all(axis=0)
        self.mask[...] = inside

    @property
    def voxel_count(self) -> int:
        return int(np.count_nonzero(self.mask))

    @property
    def shape3(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.mask.shape)

    def set_voxels(self, index: tuple, value: bool = True) -> None:
        """Paint (or erase) voxels; ``index`` is anything NumPy accepts."""
        self.mask[index] = value
        self.emit("mask")

    def voxel_coordinates(self) -> np.ndarray:
        """(M, 3) integer voxel indices inside the ROI."""
        return np.argwhere(self.mask)


@dataclass
class Tractogram(Observable):
    """Streamlines as one ragged array: ``points`` (P, 3) and ``offsets`` (S + 1,).

    Streamline ``i`` is ``points[offsets[i]:offsets[i + 1]]``, in voxel index
    coordinates of the grid described by ``affine`` (voxel -> RAS mm) and
    ``dimensions``. ``point_scalars`` hold (P,) or (P, k) arrays,
    ``streamline_scalars`` (S,) or (S, k) arrays.
    """

    points: np.ndarray
    offsets: np.ndarray
    affine: np.ndarray = field(default_factory=lambda: np.eye(4))
    dimensions: tuple[int, int, int] = (1, 1, 1)
    point_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    streamline_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "tractogram"
    source: str = ""  # the file it was read from ("" when computed)

    def __post_init__(self) -> None:
        Observable.__init__(self)
        self.points = np.asarray(self.points, dtype=np.float32).reshape(-1, 3)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.affine = np.asarray(self.affine, dtype=np.float64)
        self.dimensions = tuple(int(d) for d in self.dimensions)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must start at 0")
        if self.offsets[-1] != len(self.points) or np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing and end at the number of points")
        for key, values in self.point_scalars.items():
            if len(values) != len(self.points):
                raise ValueError(f"point scalar {key!r} has {len(values)} values for {len(self.points)} points")
        for key, values in self.streamline_scalars.items():
            if len(values) != len(self):
                raise ValueError(f"streamline scalar {key!r} has {len(values)} values for {len(self)} streamlines")

    @classmethod
    def from_list(cls, streamlines, **kwargs) -> Tractogram:
        lengths = [len(s) for s in streamlines]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        points = (
            np.concatenate([np.asarray(s, np.float32).reshape(-1, 3) for s in streamlines])
            if streamlines
            else np.zeros((0, 3), np.float32)
        )
        return cls(points, offsets, **kwargs)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @property
    def lengths(self) -> np.ndarray:
        """Number of points per streamline."""
        return np.diff(self.offsets)

    def points_on(self, affine: np.ndarray, dtype=np.float64) -> np.ndarray:
        """The points in voxel coordinates of another grid (``affine``: its voxel -> RAS mm)."""
        to_grid = np.linalg.solve(affine, self.affine)
        return (self.points.astype(np.float64) @ to_grid[:3, :3].T + to_grid[:3, 3]).astype(dtype, copy=False)

    def subset(self, keep: np.ndarray, name: str | None = None) -> Tractogram:
        """The streamlines where ``keep`` (bool mask or indices) holds, scalars included."""
        index = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep, dtype=np.int64)
        lengths = self.lengths[index]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        owner = np.repeat(index, lengths)
        within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)
        point_index = self.offsets[owner] + within
        return Tractogram(
            self.points[point_index],
            offsets,
            self.affine,
            self.dimensions,
            {k: np.asarray(v)[point_index] for k, v in self.point_scalars.items()},
            {k: np.asarray(v)[index] for k, v in self.streamline_scalars.items()},
            name=name or self.name,
        )

    @classmethod
    def concatenate(cls, tracts: list[Tractogram], name: str | None = None) -> Tractogram:
        """Streamlines of several tractograms on one grid, one after another (shared scalars kept)."""
        if not tracts:
            raise ValueError("nothing to concatenate")
        first = tracts[0]
        starts = np.cumsum([0] + [len(t.points) for t in tracts[:-1]])
        offsets = np.concatenate([[0]] + [t.offsets[1:] + s for t, s in zip(tracts, starts)]).astype(np.int64)
        point_keys = set.intersection(*(set(t.point_scalars) for t in tracts))
        stream_keys = set.intersection(*(set(t.streamline_scalars) for t in tracts))
        return cls(
            np.concatenate([t.points for t in tracts]),
            offsets,
            first.affine,
            first.dimensions,
            {k: np.concatenate([np.asarray(t.point_scalars[k]) for t in tracts]) for k in point_keys},
            {k: np.concatenate([np.asarray(t.streamline_scalars[k]) for t in tracts]) for k in stream_keys},
            name=name or first.name,
        )

    def points_world(self) -> np.ndarray:
        """All points in RAS mm (float32, like the points)."""
        rotation = self.affine[:3, :3].T.astype(np.float32)
        return self.points @ rotation + self.affine[:3, 3].astype(np.float32)

    def __eq__(self, other) -> bool:  # dataclass eq would compare arrays ambiguously
        return self is other

    __hash__ = object.__hash__


LAYER_KINDS = ("scalar", "rgb", "labels", "tensor", "tractogram", "roi", "dwi", "dyads")
SCALAR_KINDS = ("scalar", "dwi")  # drawn through a colour map and a display range
GLYPH_KINDS = ("tensor", "dyads")  # drawn as glyphs on the cursor's slice planes, not as pixels
ROLE_COLOURS = {  # RGB 0..1, the usual conventions: seed green, target blue, exclusion red
    "seed": (0.1, 0.9, 0.2),
    "target": (0.2, 0.5, 1.0),
    "exclusion": (1.0, 0.15, 0.15),
    "waypoint": (1.0, 0.85, 0.1),
    "stop": (0.8, 0.3, 1.0),
}
STICK_COLOURS = (  # RGB 0..1 of dyads sticks 1, 2, 3 (largest mean fraction first; a 4th is red again)
    (1.0, 0.2, 0.2),
    (0.2, 1.0, 0.2),
    (0.3, 0.55, 1.0),
)
GLYPH_SHAPES = ("superquadric", "ellipsoid")
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

    Display properties: ``visible``, ``opacity`` (0..1), ``colormap`` and
    ``clim`` (scalar and dwi layers), ``color_by`` (tractograms: ``"direction"``
    or the name of a point/streamline scalar; tensors: ``"direction"`` or
    ``"fa"``), ``tubes`` (tractograms drawn as shaded tubes instead of lines),
    and for the glyph kinds (tensor, dyads), shown on the cursor's slice planes,
    ``glyph`` (tensor shape), ``glyph_step`` (every n-th voxel; default 2 for
    tensors, 1 for dyads) and ``glyph_size`` (1 = the largest glyph fills its
    grid cell); ``transparent_below`` (scalar layers: values below it let the
    layers beneath show through, e.g. an overlay that is empty almost
    everywhere; None: every value is drawn); ``color`` (ROIs: ``"#rrggbb"``, None: the
    colour of the ROI's role, see :meth:`color_rgb`). Changing one emits ``display``
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
        self.glyph_step = 1 if kind == "dyads" else 2
        self.glyph_size = 1.0
        self.tubes = False
        self.transparent_below: float | None = None
        self.color: str | None = None  # ROIs: "#rrggbb", None = the role's colour
        self.selection: np.ndarray | None = None  # tractograms: streamlines passing the ROIs, None = all
        # Where the layer came from: {"file": path} for a loaded file; for a computed result its
        # method, parameters, inputs, backend, device and timings (reports and sessions show it)
        self.provenance: dict = {}
        for key, value in display.items():
            if key not in self._DISPLAY:
                raise ValueError(f"unknown display property {key!r}")
            setattr(self, key, value)

    def _default_clim(self) -> tuple[float, float]:
        if self.kind == "roi":
            self.opacity = 0.6
        if self.kind not in SCALAR_KINDS:
            return (0.0, 1.0)
        values = np.asarray(self.data.data)
        finite = values[np.isfinite(values)]
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
            if getattr(self, key) != value:
                setattr(self, key, value)
                changed.append(key)
        if "color_by" in changed and "clim" not in changes and self.kind == "tractogram":
            self.clim = self.scalar_range(self.color_by)
            changed.append("clim")
        return changed

    def color_rgb(self) -> tuple[float, float, float]:
        """The colour an ROI is drawn in (RGB 0..1): its own ``color``, else its role's."""
        if self.color:
            return tuple(int(self.color[i : i + 2], 16) / 255.0 for i in (1, 3, 5))
        if self.kind == "roi":
            return ROLE_COLOURS[self.data.role]
        return (1.0, 1.0, 1.0)

    def set_selection(self, selected: np.ndarray | None) -> None:
        """Show only these streamlines (bool per streamline), or all with None."""
        if selected is not None:
            selected = np.asarray(selected, dtype=bool)
            if selected.shape != (len(self.data),):
                raise ValueError("a selection needs one flag per streamline")
        if selected is None and self.selection is None:
            return
        if selected is not None and self.selection is not None and np.array_equal(selected, self.selection):
            return
        self.selection = selected
        self.emit("display", changed=["selection"])

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
            return np.asarray(tract.point_scalars[name], dtype=np.float64).reshape(len(tract.points), -1)[:, 0]
        if name in tract.streamline_scalars:
            per = np.asarray(tract.streamline_scalars[name], dtype=np.float64).reshape(len(tract), -1)[:, 0]
            return np.repeat(per, tract.lengths)
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
        return vol.data[tuple(ijk)]


class Document(Observable):
    """Everything the user has open: an ordered layer stack (bottom first) and a cursor.

    The first volume added fixes the reference grid (affine and shape); the
    cursor is a voxel index on it. Events: ``layers`` (added, removed, moved),
    ``display`` (a layer's display property; ``layer=`` says which), ``cursor``,
    ``roi`` (an ROI's voxels or shape changed; ``layer=``).

    The ROI edits are undoable (:meth:`undo`, :meth:`redo`): painting, shapes placed,
    moved and resized, role, name and colour changes, and layers added or removed with
    ``undoable=True`` (an ROI created, loaded or deleted by the user). A layer removed
    without ``undoable`` (a script, a session replacing the document) takes its history
    with it; when none is left, the whole history goes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layers: list[Layer] = []
        self._undo: list[tuple] = []
        self._redo: list[tuple] = []
        self.reference_affine: np.ndarray | None = None
        self.reference_shape: tuple[int, int, int] | None = None
        self.cursor = np.zeros(3, dtype=int)
        #: metrics, streamline indexes, sample fields... computed from the layers' data
        self.derived = DerivedCache()

    def add_layer(self, layer: Layer, *, undoable: bool = False, index: int | None = None) -> Layer:
        """Put ``layer`` on top of the stack (or at ``index``); ``undoable``: an edit that
        :meth:`undo` takes back (an ROI the user created or loaded)."""
        self._insert(layer, len(self.layers) if index is None else index)
        if undoable:
            self._record(("add", layer, self.layers.index(layer)))
        return layer

    def _insert(self, layer: Layer, index: int) -> None:
        if layer.kind != "tractogram" and self.reference_affine is None:
            self.reference_affine = layer.data.affine.copy()
            self.reference_shape = layer.data.shape3
            self.cursor = np.array(self.reference_shape) // 2
        elif layer.kind == "tractogram" and self.reference_affine is None and layer.data.dimensions != (1, 1, 1):
            self.reference_affine = layer.data.affine.copy()
            self.reference_shape = layer.data.dimensions
            self.cursor = np.array(self.reference_shape) // 2
        self.layers.insert(max(0, min(index, len(self.layers))), layer)
        layer.connect(self._forward_display)
        self.emit("layers")

    def remove_layer(self, layer: Layer, *, undoable: bool = False) -> None:
        """Take ``layer`` out; ``undoable``: :meth:`undo` puts it back where it was (an ROI
        the user deleted), else its undo history goes with it."""
        index = self.layers.index(layer)
        self._take_out(layer)
        if undoable:
            self._record(("remove", layer, index))
        elif not self.layers:  # e.g. a session replacing the document: nothing of before to redo
            self._undo.clear()
            self._redo.clear()
        else:
            self._forget(layer)

    def _take_out(self, layer: Layer) -> None:
        self.layers.remove(layer)
        layer.disconnect(self._forward_display)
        self.emit("layers")

    def _forget(self, layer: Layer) -> None:
        """Drop the undo and redo records of a layer that left the document for good."""
        self._undo[:] = [record for record in self._undo if record[1] is not layer]
        self._redo[:] = [record for record in self._redo if record[1] is not layer]

    def _record(self, record: tuple) -> None:
        """A new edit: undoable, and the end of what could be redone."""
        self._undo.append(record)
        self._redo.clear()

    def replace_layer(self, old: Layer, new: Layer) -> Layer:
        """Put ``new`` where ``old`` is (e.g. a growing tracking result), in one ``layers`` event.
        Appends ``new`` when ``old`` is no longer in the document."""
        if old not in self.layers:
            return self.add_layer(new)
        index = self.layers.index(old)
        old.disconnect(self._forward_display)
        self._forget(old)
        self.layers[index] = new
        new.connect(self._forward_display)
        self.emit("layers", replaced=(old, new))
        return new

    def move_layer(self, layer: Layer, index: int) -> None:
        self.layers.remove(layer)
        self.layers.insert(max(0, min(index, len(self.layers))), layer)
        self.emit("layers")

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def _forward_display(self, layer, event, **info) -> None:
        self.emit("display", layer=layer, **info)

    # ------------------------------------------------------------ ROI edits
    def paint(self, layer: Layer, voxels: np.ndarray, value: bool, *, merge_with_last: bool = False) -> int:
        """Set ``voxels`` (N, 3 indices) of an ROI layer to ``value``; undoable. Returns voxels changed.

        ``merge_with_last`` folds the edit into the previous undo step (one brush
        stroke = one undo), as long as it edits the same layer.
        """
        mask = layer.data.mask
        voxels = np.asarray(voxels, dtype=np.int64).reshape(-1, 3)
        inside = np.all((voxels >= 0) & (voxels < np.array(mask.shape)), axis=1)
        voxels = np.unique(voxels[inside], axis=0)
        index = tuple(voxels.T)
        old = mask[index].copy()
        changed = old != value
        if not changed.any():
            return 0
        voxels, old = voxels[changed], old[changed]
        shape_before = layer.data.shape
        layer.data.shape = None  # painting makes a shape freehand
        mask[tuple(voxels.T)] = value
        last = self._undo[-1] if self._undo else None
        if merge_with_last and last is not None and last[0] == "mask" and last[1] is layer:
            _, _, prev_voxels, prev_old, prev_shape = last
            merged = ("mask", layer, np.concatenate([prev_voxels, voxels]), np.concatenate([prev_old, old]), prev_shape)
            self._undo[-1] = merged
            self._redo.clear()
        else:
            self._record(("mask", layer, voxels, old, shape_before))
        self.emit("roi", layer=layer)
        return len(voxels)

    def set_roi_shape(self, layer: Layer, shape: dict, *, merge_with_last: bool = False) -> None:
        """Place, move or resize a shape ROI; undoable (a drag with ``merge_with_last`` is one step)."""
        before = layer.data.shape
        # A freehand ROI turned into a shape: its voxels, for the undo.
        voxels_before = layer.data.mask.copy() if before is None else None
        last = self._undo[-1] if self._undo else None
        if merge_with_last and last is not None and last[0] == "shape" and last[1] is layer:
            before, voxels_before = last[2], last[4]
            self._undo.pop()
        layer.data.apply_shape(shape)
        self._record(("shape", layer, before, layer.data.shape, voxels_before))
        self.emit("roi", layer=layer)

    def set_roi_role(self, layer: Layer, role: str) -> None:
        """Change what an ROI does (seed, target, waypoint, exclusion, stop); undoable."""
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}: one of {', '.join(ROI_ROLES)}")
        if layer.data.role != role:
            self._record(("role", layer, layer.data.role, role))
            self._set_role(layer, role)

    @staticmethod
    def _set_role(layer: Layer, role: str) -> None:
        layer.data.role = role
        layer.emit("display", changed=["role"])

    def rename_layer(self, layer: Layer, name: str) -> bool:
        """Give a layer another name (an ROI's mask takes it too); undoable. Names stay unique:
        one another layer has is refused (ValueError). False when nothing changed."""
        name = str(name).strip()
        if not name:
            raise ValueError("a layer needs a name")
        if name == layer.name:
            return False
        if any(other is not layer and other.name == name for other in self.layers):
            raise ValueError(f"there is already a layer named {name!r}")
        self._record(("display", layer, {"name": layer.name}, {"name": name}))
        self._set_display(layer, {"name": name})
        return True

    def set_layer_color(self, layer: Layer, color) -> bool:
        """An ROI's own colour (``"#rrggbb"`` or RGB 0..1; None: its role's colour); undoable."""
        color = hex_colour(color)
        if color == layer.color:
            return False
        self._record(("display", layer, {"color": layer.color}, {"color": color}))
        self._set_display(layer, {"color": color})
        return True

    @staticmethod
    def _set_display(layer: Layer, changes: dict) -> None:
        if "name" in changes and isinstance(layer.data, RoiMask):
            layer.data.name = changes["name"]
        layer.set(**changes)

    def roi_sets(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Masks of the visible ROIs that select fibers: (include: seed, target, waypoint; exclude)."""
        include, exclude = [], []
        for layer in self.layers:
            if layer.kind == "roi" and layer.visible and layer.data.mask.any():
                if layer.data.role in ("seed", "target", "waypoint"):
                    include.append(layer.data.mask)
                elif layer.data.role == "exclusion":
                    exclude.append(layer.data.mask)
        return include, exclude

    def image_layers_key(self) -> tuple:
        """Identity and order of every layer but the tractograms: views that draw fibres over
        an image compare it to tell whether a ``layers`` event changed the image at all."""
        return tuple(id(layer) for layer in self.layers if layer.kind != "tractogram")

    def roi_masks_by_role(self) -> dict[str, list[np.ndarray]]:
        """Masks of the visible, non-empty ROIs grouped by role (on the reference grid)."""
        out: dict[str, list[np.ndarray]] = {role: [] for role in ROI_ROLES}
        for layer in self.layers:
            if layer.kind == "roi" and layer.visible and layer.data.mask.any():
                out[layer.data.role].append(layer.data.mask)
        return out

    def undo(self) -> bool:
        """Revert the last ROI edit exactly (a stroke, a fill, a shape placed, moved or resized,
        a role, name or colour change, an ROI created, loaded or deleted). False: nothing to undo."""
        return self._step(self._undo, self._redo, backwards=True)

    def redo(self) -> bool:
        """Do again the last edit :meth:`undo` took back. False: nothing to redo."""
        return self._step(self._redo, self._undo, backwards=False)

    def _step(self, source: list, target: list, *, backwards: bool) -> bool:
        """Pop an edit record from ``source``, apply it, and push its inverse onto ``target``.

        Records: ``("mask", layer, voxels, values, shape_before)`` the voxel values to restore
        (and the shape the ROI had before the painting); ``("shape", layer, before, after,
        voxels_before)``, voxels_before the mask of an ROI that had no shape before;
        ``("role", layer, before, after)``; ``("display", layer, before, after)`` with dicts of
        display properties (name, colour); ``("add", layer, index)`` and ``("remove", layer,
        index)``, a layer put into or taken out of the stack at ``index``.
        """
        if not source:
            return False
        record = source.pop()
        kind, layer = record[0], record[1]
        if kind == "mask":
            _, _, voxels, values, shape_before = record
            index = tuple(voxels.T)
            previous = layer.data.mask[index].copy()
            layer.data.mask[index] = values
            layer.data.shape = shape_before if backwards else None
            target.append(("mask", layer, voxels, previous, shape_before))
            self.emit("roi", layer=layer)
        elif kind == "shape":
            _, _, before, after, voxels_before = record
            shape = before if backwards else after
            layer.data.apply_shape(shape)
            if shape is None:
                layer.data.mask[...] = voxels_before
            target.append(record)
            self.emit("roi", layer=layer)
        elif kind == "role":
            self._set_role(layer, record[2] if backwards else record[3])
            target.append(record)
        elif kind == "display":
            self._set_display(layer, record[2] if backwards else record[3])
            target.append(record)
        elif kind in ("add", "remove"):
            if (kind == "add") == backwards:
                self._take_out(layer)
            else:
                self._insert(layer, record[2])
            target.append(record)
        else:
            raise ValueError(f"unknown undo record {kind!r}")
        return True

    def set_cursor(self, ijk) -> None:
        if self.reference_shape is None:
            return
        ijk = np.clip(np.rint(np.asarray(ijk, dtype=float)).astype(int), 0, np.array(self.reference_shape) - 1)
        if not np.array_equal(ijk, self.cursor):
            self.cursor = ijk
            self.emit("cursor")

    def cursor_world(self) -> np.ndarray:
        if self.reference_affine is None:
            return np.zeros(3)
        return self.reference_affine[:3, :3] @ self.cursor + self.reference_affine[:3, 3]

    def values_at_cursor(self) -> list[tuple[str, object]]:
        """(layer name, value) for every visible volume layer at the cursor."""
        return self.values_at(self.cursor)

    def values_at(self, ijk) -> list[tuple[str, object]]:
        """(layer name, value) for every visible volume layer at a reference voxel, top first.

        A value is what the layer holds there (a number, or a vector), except for a label
        layer, ``{"label": n}`` with ``"name"`` added when its lookup table names ``n``, and a
        tensor layer, ``{"FA": fa, "λ1": largest eigenvalue}`` (eigenvalues clipped at 0)."""
        world = self.reference_affine[:3, :3] @ np.asarray(ijk, dtype=float) + self.reference_affine[:3, 3]
        out = []
        for layer in reversed(self.layers):
            if layer.visible and layer.kind != "tractogram":
                value = layer.value_at_world(world)
                if value is None:
                    continue
                if layer.kind == "labels":
                    label = int(value)
                    lut = getattr(layer.data, "lut", None)
                    value = {"label": label}
                    if lut is not None and label in lut.names:
                        value["name"] = lut.names[label]
                elif layer.kind == "tensor":
                    value = _tensor_summary(np.asarray(value, dtype=np.float64))
                out.append((layer.name, value))
        return out


def _tensor_summary(d: np.ndarray) -> dict[str, float]:
    """FA and λ1 of one tensor (xx, xy, xz, yy, yz, zz)."""
    matrix = np.array([[d[0], d[1], d[2]], [d[1], d[3], d[4]], [d[2], d[4], d[5]]])
    lam = np.maximum(np.linalg.eigvalsh(matrix), 0.0)
    norm = float(np.sqrt((lam**2).sum()))
    spread = float(np.sqrt(0.5 * ((lam[0] - lam[1]) ** 2 + (lam[1] - lam[2]) ** 2 + (lam[2] - lam[0]) ** 2)))
    return {"FA": spread / norm if norm > 0 else 0.0, "λ1": float(lam[2])}
