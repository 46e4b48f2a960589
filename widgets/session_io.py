"""Sessions in the window: what the panels keep, and a reopened document put on screen.

The file format is :mod:`app.session`; this module only moves the window's state into and out
of it (the presurgical margin and lesion, the layers into the window's own document, whose
views are already subscribed to it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from app.pipelines.connectivity import DISTANCE_POINT_SCALAR, DISTANCE_STREAMLINE_SCALAR
from app.session import Session, load_session, save_session
from gpu.tractometry import RegionDistance


def panel_state(window) -> dict:
    """What the panels keep across a session (plain JSON values)."""
    state = {}
    presurgical = getattr(window, "presurgical_panel", None)
    if presurgical is not None:
        state["presurgical"] = {"margin_mm": float(presurgical.margin_mm), "lesion": presurgical.lesion_name}
    return state


def save_window_session(window, path: str | os.PathLike) -> Path:
    return save_session(window.document, path, panels=panel_state(window))


def apply_session(window, session: Session) -> None:
    """Replace the window's layers by the session's (same Document object, so the views follow)."""
    doc = window.document
    for layer in list(doc.layers):
        doc.remove_layer(layer)
    restored = session.document
    doc.reference_affine = None if restored.reference_affine is None else restored.reference_affine.copy()
    doc.reference_shape = restored.reference_shape
    for layer in list(restored.layers):
        restored.remove_layer(layer)
        doc.add_layer(layer)
    if restored.reference_shape is not None:
        doc.cursor = np.array(restored.cursor)
        doc.emit("cursor")
    presurgical = getattr(window, "presurgical_panel", None)
    state = session.panels.get("presurgical")
    if presurgical is not None and state:
        presurgical.lesion_name = str(state.get("lesion", ""))
        presurgical.margin_box.setValue(float(state.get("margin_mm", presurgical.margin_mm)))
        # tractograms saved with their distances come back measured: table and colours without recomputing
        presurgical.measured, presurgical.distances = {}, {}
        for layer in doc.layers:
            tract = layer.data if layer.kind == "tractogram" else None
            if tract is not None and DISTANCE_STREAMLINE_SCALAR in tract.streamline_scalars:
                presurgical.measured[layer.name] = layer
                presurgical.distances[layer.name] = RegionDistance(
                    np.asarray(tract.point_scalars.get(DISTANCE_POINT_SCALAR, np.zeros(len(tract.points)))),
                    np.asarray(tract.streamline_scalars[DISTANCE_STREAMLINE_SCALAR], dtype=np.float64),
                    {"restored_from": str(session.path)},
                )
        presurgical.refresh_table()


def open_window_session(window, path: str | os.PathLike) -> Session:
    session = load_session(path)
    apply_session(window, session)
    return session
