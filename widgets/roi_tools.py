"""ROI drawing state shared by the slice views: the tool, the brush radius, the ROI being edited."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

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
