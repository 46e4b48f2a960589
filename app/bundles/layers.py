"""Named bundles as layers of the document: each kept tractogram in its standard colour
(:func:`.protocols.bundle_colour`, drawn with ``color_by="solid"``), named after the bundle, with
its bundles.json record as provenance (reports and sessions show it). Qt-free: the window's
bundles controller adds what this gives."""

from __future__ import annotations

from ..layers import SOLID, hex_colour
from ..model import Layer
from .protocols import bundle_colour
from .run import BundlesResult


def bundle_layers(result: BundlesResult) -> list[Layer]:
    """One tractogram layer per bundle of ``result`` that holds streamlines, in the run's order."""
    layers = []
    for name, outcome in result.bundles.items():
        if outcome.tractogram is None or not len(outcome.tractogram):
            continue
        layer = Layer(name, outcome.tractogram, "tractogram", color_by=SOLID, color=hex_colour(bundle_colour(name)))
        record = outcome.record
        layer.provenance = {
            "method": f"named bundle ({result.summary['engine']})",
            "protocol": record["protocol"]["source"],
            "citation": record["protocol"]["citation"],
            "protocols_version": record["protocol"]["protocols_version"],
            "waytotal": record["waytotal"],
            "streamlines": record["streamlines"],
            "volume_mm3": record["volume_mm3"],
            "file": str(result.output / record["file"]),
            "registration": result.summary["registration"],
        }
        layers.append(layer)
    return layers


def problems_text(result: BundlesResult) -> str:
    """What the window says of the bundles that came out empty or whose regions missed ('' if none)."""
    return "; ".join(f"{o.name}: {o.status}" for o in result.problems)
