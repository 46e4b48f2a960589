"""The document the user works on: the stack of layers, the reference grid and cursor, and the
undoable ROI edits (paint, shapes, role, name and colour, ROIs added or removed)."""

from __future__ import annotations

import numpy as np

from .derived import DerivedCache
from .fiber_cache import FiberArrayCache
from .grid import Grid
from .layers import Layer, hex_colour
from .observable import Observable
from .volumes import ROI_ROLES, RoiMask


class Document(Observable):
    """Everything the user has open: an ordered layer stack (bottom first) and a cursor.

    The first volume added fixes the reference grid (affine and shape); the
    cursor is a voxel index on it. Events: ``layers`` (added, removed, moved),
    ``display`` (a layer's display property; ``layer=`` says which), ``cursor``,
    ``roi`` (an ROI's voxels or shape changed; ``layer=``; a paint, or its undo, also gives
    ``voxels=``: the (N, 3) voxels of the ROI's grid it changed, so that a view redraws only those).

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
        #: registrations the user made or opened by id ("R1"...: app.registration.Registration), oldest first;
        #: a layer they placed names one in its provenance (app.anatomy_layers)
        self.registrations: dict = {}
        self.fiber_arrays = FiberArrayCache()  # tractograms' display arrays, shared by the views

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
        self.emit("roi", layer=layer, voxels=voxels)
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

    def roi_on_reference(self, layer: Layer) -> np.ndarray:
        """An ROI's mask on the reference grid: itself, or (an ROI drawn on an image of another
        grid, e.g. a registered T1) brought onto it by nearest neighbour."""
        grid = Grid(self.reference_affine, self.reference_shape)
        return grid.resample_nearest(
            np.asarray(layer.data.mask, dtype=bool), Grid(layer.data.affine, np.shape(layer.data.mask))
        )

    def roi_sets(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Masks of the visible ROIs that select fibers (on the reference grid): (include: seed,
        target, waypoint; exclude)."""
        include, exclude = [], []
        for layer in self.layers:
            if layer.kind == "roi" and layer.visible and layer.data.mask.any():
                if layer.data.role in ("seed", "target", "waypoint"):
                    include.append(self.roi_on_reference(layer))
                elif layer.data.role == "exclusion":
                    exclude.append(self.roi_on_reference(layer))
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
                out[layer.data.role].append(self.roi_on_reference(layer))
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
            self.emit("roi", layer=layer, voxels=voxels)
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
