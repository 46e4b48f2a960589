"""A tract's uncertainty envelopes in the window: one layer per level, drawn as a translucent
surface in 3-D (nested: the narrow level inside the wide one) and as an outline on the slices.

The envelopes themselves are :func:`app.envelopes.envelopes` of the probabilistic panel's path
distribution (the definition is there). Each level becomes a ``labels`` layer named
"envelope 95 %" whose mask is the level's region; its fill is clear (opacity 0: what lies
beneath stays readable) and :mod:`widgets.roi_outlines` draws its edge in the level's colour.
The layer's provenance keeps the level (``envelope_level``), the colour and the definition, so
the presurgical panel and the report find and name it. The 3-D surface is the 0.5 level of the
mask (marching cubes over the crop around it, made on the GUI thread like the isosurface).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tractlens.app.envelopes import LEVEL_MEANING, EnvelopeSet
from tractlens.app.model import Document, Layer, Volume

#: Colours of the levels, narrowest first (the viridis ramp: dark to light as the level widens).
LEVEL_COLOURS = ((0.27, 0.0, 0.33), (0.23, 0.32, 0.55), (0.13, 0.57, 0.55), (0.37, 0.79, 0.38), (0.99, 0.91, 0.15))
#: Surface opacity of the narrowest level; the wider ones are fainter, so the inner ones show through.
INNER_OPACITY = 0.55
PREFIX = "envelope "


def envelope_name(label: str) -> str:
    return f"{PREFIX}{label}"


def is_envelope(layer: Layer) -> bool:
    return layer.kind == "labels" and "envelope_level" in (layer.provenance or {})


def envelope_layers(found: EnvelopeSet, source: str) -> list[Layer]:
    """One clear-filled labels layer per level (worker-safe: no VTK, no Qt)."""
    layers = []
    for i, envelope in enumerate(found.envelopes):
        name = envelope_name(envelope.label)
        layer = Layer(name, Volume(name, envelope.mask.astype(np.uint8), found.affine), "labels", opacity=0.0)
        colour = LEVEL_COLOURS[min(i, len(LEVEL_COLOURS) - 1)]
        layer.provenance = {
            "computed": "uncertainty envelope",
            "envelope_level": envelope.level,
            "envelope_colour": colour,
            "source": source,
            "voxels": envelope.voxels,
            "volume_mm3": round(envelope.volume_mm3, 1),
            "share": round(envelope.share, 4),
            "meaning": LEVEL_MEANING,
        }
        layers.append(layer)
    return layers


def show_envelopes(document: Document, layers: list[Layer], surfaces: list, view3d=None) -> None:
    """Replace the document's envelope layers by ``layers`` and give each its 3-D surface
    (``surfaces``: one mesh or None per layer, in world mm)."""
    for old in [layer for layer in document.layers if is_envelope(layer)]:
        document.remove_layer(old)
    count = len(layers)
    for i, (layer, surface) in enumerate(zip(layers, surfaces, strict=True)):
        document.add_layer(layer)
        if view3d is not None:
            opacity = INNER_OPACITY * (1.0 - 0.6 * i / max(1, count - 1))
            view3d.set_layer_surface(layer, surface, color=layer.provenance["envelope_colour"], opacity=opacity)


@dataclass
class EnvelopeRow:
    """An envelope's line in the presurgical table and the report: its distance to the lesion
    (nearest voxel centres, mm; 0 when they overlap) and whether it lies within the margin."""

    name: str
    level: float
    min_mm: float
    overlap_voxels: int
    margin_mm: float

    @property
    def within_margin(self) -> bool:
        return self.min_mm <= self.margin_mm

    @property
    def closest_text(self) -> str:
        return f"0 (overlaps {self.overlap_voxels} voxels)" if self.overlap_voxels else f"{self.min_mm:.1f}"

    def cells(self) -> tuple[str, ...]:
        """Cells under the table's columns (tractogram, streamlines, closest, within margin)."""
        return (self.name, "–", self.closest_text, "yes" if self.within_margin else "no")


def envelope_rows(document: Document, margin_mm: float) -> list[EnvelopeRow]:
    """A row per envelope layer whose distance to the lesion was measured, narrowest level first."""
    rows = []
    for layer in document.layers:
        measured = (layer.provenance or {}).get("lesion distance") if is_envelope(layer) else None
        if measured:
            rows.append(EnvelopeRow(layer.name, float(layer.provenance["envelope_level"]), float(measured["min_mm"]),
                                    int(measured["overlap_voxels"]), margin_mm))  # fmt: skip
    return sorted(rows, key=lambda row: row.level)
