"""What the window says and where it looks after a tracking run: the run's count in words
(streamlines for a tractogram, streamlines kept for a probabilistic path distribution) and the
middle of the result on the reference grid (where the cursor goes). Qt-free, so that every
tracking panel's result is announced alike."""

from __future__ import annotations

import numpy as np

METHOD_WORDS = {
    "deterministic": "Deterministic tracking",
    "geodesic": "Geodesic tracking",
    "probabilistic": "Probabilistic tracking",
}


def result_count(layer) -> int:
    """Streamlines in a tractogram layer; for a path distribution (a scalar map), the
    streamlines kept (its provenance's ``waytotal``)."""
    if layer.kind == "tractogram":
        return len(layer.data)
    return int(layer.provenance.get("waytotal", 0))


def result_text(method: str, layer) -> str:
    """``"Probabilistic tracking: 1,234 streamlines in layer paths"``."""
    count = result_count(layer)
    kept = " kept" if layer.kind != "tractogram" else ""
    noun = f"streamline{'s' * (count != 1)}{kept}"
    return f"{METHOD_WORDS.get(method, method)}: {count:,} {noun} in layer {layer.name}"


def result_centre(layer, reference_affine) -> np.ndarray | None:
    """The median of a result's points (a tractogram's points, a map's non-zero voxels) in
    voxels of the reference grid; None when it has none."""
    if layer.kind == "tractogram":
        points = layer.data.points_on(reference_affine)
    else:
        data = np.asarray(layer.data.data)
        voxels = np.argwhere((data.reshape((*data.shape[:3], -1)) != 0).any(axis=3))
        if not len(voxels):
            return None
        to_ref = np.linalg.solve(reference_affine, layer.data.affine)
        points = voxels @ to_ref[:3, :3].T + to_ref[:3, 3]
    return np.median(points, axis=0) if len(points) else None
