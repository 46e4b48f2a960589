"""ROI drawing state shared by the slice views: the tool, the brush radius, the ROI being edited."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.model import ROI_ROLES, Document, Layer, RoiMask

TOOLS = ("navigate", "brush", "eraser")


class RoiTools:
    def __init__(self, document: Document, selected_layer: Callable[[], Layer | None]):
        self.document = document
        self._selected_layer = selected_layer
        self.tool = "navigate"
        self.radius = 1  # voxels, in the plane of the view
        self.role = "seed"  # role of the next new ROI

    def active_roi(self) -> Layer | None:
        """The ROI to edit: the selected layer if it is an ROI, else the newest ROI."""
        selected = self._selected_layer()
        if selected is not None and selected.kind == "roi":
            return selected
        for layer in reversed(self.document.layers):
            if layer.kind == "roi":
                return layer
        return None

    def new_roi(self, role: str | None = None) -> Layer:
        """An empty ROI on the reference grid, named after its role ("seed 1", "target 2", ...)."""
        role = role or self.role
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}")
        doc = self.document
        if doc.reference_affine is None:
            raise ValueError("open an image first: an ROI lives on its grid")
        count = 1 + sum(1 for layer in doc.layers if layer.kind == "roi" and layer.data.role == role)
        name = f"{role} {count}"
        mask = RoiMask(name, np.zeros(doc.reference_shape, dtype=bool), doc.reference_affine, role=role)
        return doc.add_layer(Layer(name, mask, "roi"))
