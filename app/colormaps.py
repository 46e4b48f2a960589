"""The colour maps of the views: 256-entry RGB tables (floats in 0 … 1) by name.

Pure NumPy, shared by the slice views, the 3-D view, the plots and the display arrays of
tractograms (:mod:`.fiber_arrays`), so that every view shows one value in one colour.
"""

from __future__ import annotations

import numpy as np


def lookup_table(name: str) -> np.ndarray:
    """The (256, 3) table of colour map ``name`` (an unknown name: gray)."""
    t = np.linspace(0.0, 1.0, 256)
    if name == "hot":
        rgb = np.stack([np.clip(3 * t, 0, 1), np.clip(3 * t - 1, 0, 1), np.clip(3 * t - 2, 0, 1)], 1)
    elif name == "viridis":
        anchors = np.array(
            [
                [0.267, 0.005, 0.329],
                [0.229, 0.322, 0.546],
                [0.128, 0.567, 0.551],
                [0.369, 0.789, 0.383],
                [0.993, 0.906, 0.144],
            ]
        )
        x = np.linspace(0, 1, len(anchors))
        rgb = np.stack([np.interp(t, x, anchors[:, c]) for c in range(3)], 1)
    elif name == "cool-warm":
        rgb = np.stack([t, 1 - np.abs(2 * t - 1) * 0.6, 1 - t], 1)
    elif name == "safety":  # distance to a lesion over (0, 2 × margin): red, orange, yellow at the margin, then green
        x = np.array([0.0, 0.25, 0.5, 0.5 + 1.0 / 255, 1.0])
        anchors = np.array(
            [
                [0.85, 0.05, 0.05],
                [1.0, 0.5, 0.0],
                [1.0, 0.92, 0.1],
                [0.55, 0.85, 0.25],
                [0.1, 0.65, 0.3],
            ]
        )
        rgb = np.stack([np.interp(t, x, anchors[:, c]) for c in range(3)], 1)
    else:
        rgb = np.stack([t, t, t], 1)
    return rgb


#: The colour maps the layers may use, by name.
LUTS = {name: lookup_table(name) for name in ("gray", "hot", "viridis", "cool-warm", "safety")}
