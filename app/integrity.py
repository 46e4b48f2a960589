"""What must hold of a document at any moment (after any job finished, failed or was cancelled).

:func:`document_problems` lists every broken invariant in words; an empty list means the
document is consistent: every layer is whole (arrays of the sizes its kind needs, ragged
streamlines whose offsets add up, scalars and selections of the right length), ROIs lie on
the reference grid (or, drawn on an image of another grid such as a registered T1, on that
image's), names are unique (layers are found by name), and the cursor is on the grid. Tests
call it after cancelling jobs at arbitrary moments; it is cheap enough to call after every job
in a debugging session.
"""

from __future__ import annotations

import numpy as np

from .grid import Grid
from .model import LAYER_KINDS, Document, DWIVolume, DyadsVolume, Layer, RoiMask, Tractogram, Volume


def _tractogram_problems(name: str, layer: Layer) -> list[str]:
    tract = layer.data
    if not isinstance(tract, Tractogram):
        return [f"{name}: a tractogram layer holds {type(tract).__name__}"]
    out = []
    mapped = tract.mapped  # a file's millimetres: their shape is the points' (none converted here)
    offsets, points = np.asarray(tract.offsets), (np.asarray(tract.points) if mapped is None else mapped.world)
    if points.ndim != 2 or points.shape[1] != 3:
        out.append(f"{name}: points have shape {points.shape}")
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(points):
        out.append(f"{name}: offsets do not span the points")
    elif np.any(np.diff(offsets) < 0):
        out.append(f"{name}: offsets decrease")
    n = len(offsets) - 1
    for key, values in tract.point_scalars.items():
        if len(values) != len(points):
            out.append(f"{name}: point scalar {key!r} has {len(values)} values for {len(points)} points")
    for key, values in tract.streamline_scalars.items():
        if len(values) != n:
            out.append(f"{name}: streamline scalar {key!r} has {len(values)} values for {n} streamlines")
    if layer.selection is not None and np.shape(layer.selection) != (n,):
        out.append(f"{name}: the selection has {np.shape(layer.selection)} flags for {n} streamlines")
    if not np.isfinite(np.asarray(tract.affine)).all():
        out.append(f"{name}: the affine is not finite")
    return out


def _volume_problems(name: str, layer: Layer) -> list[str]:
    volume = layer.data
    if not isinstance(volume, Volume):
        return [f"{name}: a {layer.kind} layer holds {type(volume).__name__}"]
    out = []
    data = np.asarray(volume.data)
    if data.ndim < 3:
        out.append(f"{name}: data of shape {data.shape}")
    if np.asarray(volume.affine).shape != (4, 4) or not np.isfinite(volume.affine).all():
        out.append(f"{name}: the affine is not a finite 4x4 matrix")
    expected = {"rgb": 4, "tensor": 4, "dyads": 5}.get(layer.kind)
    if expected is not None and data.ndim != expected:
        out.append(f"{name}: a {layer.kind} volume with {data.ndim} dimensions")
    if layer.kind == "dwi":
        if not isinstance(volume, DWIVolume):
            out.append(f"{name}: a dwi layer without its series")
        else:
            dwi = volume.dwi
            if dwi.data.ndim != 4 or dwi.data.shape[:3] != data.shape[:3] or dwi.data.shape[3] != len(dwi.bvals):
                out.append(f"{name}: the series, its mean b=0 image and its b-values disagree")
            if np.shape(dwi.bvecs) != (len(dwi.bvals), 3):
                out.append(f"{name}: {np.shape(dwi.bvecs)} b-vectors for {len(dwi.bvals)} b-values")
    if layer.kind == "dyads" and isinstance(volume, DyadsVolume):
        samples = volume.samples
        if samples.theta.shape != samples.phi.shape or samples.theta.shape != samples.f.shape:
            out.append(f"{name}: posterior samples of different shapes")
    return out


def _roi_problems(name: str, layer: Layer, document: Document) -> list[str]:
    roi = layer.data
    if not isinstance(roi, RoiMask):
        return [f"{name}: an roi layer holds {type(roi).__name__}"]
    out = []
    if roi.mask.dtype != bool or roi.mask.ndim != 3:
        out.append(f"{name}: the mask is {roi.mask.dtype} of shape {roi.mask.shape}")
    if layer.provenance.get("drawn_on"):  # on an image's own grid (app.anatomy_layers.new_roi_on)
        return out
    if document.reference_shape is not None and roi.mask.shape != tuple(document.reference_shape):
        out.append(f"{name}: the mask is {roi.mask.shape} on a {tuple(document.reference_shape)} grid")
    if document.reference_affine is not None and not Grid.affines_match(roi.affine, document.reference_affine):
        out.append(f"{name}: the ROI is not on the reference grid")
    return out


def document_problems(document: Document) -> list[str]:
    """Every broken invariant of ``document``, in words (empty: consistent)."""
    problems = []
    names = [layer.name for layer in document.layers]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        problems.append(f"layer names used twice: {', '.join(duplicated)}")
    if len({id(layer) for layer in document.layers}) != len(document.layers):
        problems.append("a layer is in the document twice")
    for layer in document.layers:
        name = repr(layer.name)
        if layer.kind not in LAYER_KINDS:
            problems.append(f"{name}: unknown kind {layer.kind!r}")
        elif layer.kind == "tractogram":
            problems += _tractogram_problems(name, layer)
        elif layer.kind == "roi":
            problems += _roi_problems(name, layer, document)
        else:
            problems += _volume_problems(name, layer)
    if document.reference_shape is not None:
        cursor = np.asarray(document.cursor)
        if cursor.shape != (3,) or np.any(cursor < 0) or np.any(cursor >= np.asarray(document.reference_shape)):
            problems.append(f"the cursor {cursor.tolist()} is off the {tuple(document.reference_shape)} grid")
    return problems
