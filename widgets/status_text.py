"""How the status bar writes a layer's value under the cursor."""

from __future__ import annotations

import numpy as np

#: Units of the maps a fit makes, by layer name (the last word): a value without one reads as nothing.
MAP_UNITS = {"MD": "mm²/s", "AD": "mm²/s", "RD": "mm²/s", "L1": "mm²/s", "L2": "mm²/s", "L3": "mm²/s"}


def with_unit(name: str, text: str) -> str:
    """``MD 0.0007 mm²/s``: a map's value with its unit, when the map has one."""
    unit = MAP_UNITS.get(name.split()[-1] if name.split() else name)
    return f"{text} {unit}" if unit else text


def format_value(value) -> str:
    """A layer's value in the status bar: ``3 (crossing_ap_start)`` for a named label,
    ``FA 0.62 λ1 1.7e-03`` for a tensor, numbers with 4 significant digits."""
    if isinstance(value, dict):
        if "label" in value:
            return f"{value['label']}" + (f" ({value['name']})" if "name" in value else "")
        return " ".join(f"{key} {format_value(number)}" for key, number in value.items())
    array = np.asarray(value)
    if array.ndim == 0:
        number = float(array)
        return f"{number:.4g}" if abs(number) >= 1e-3 or number == 0 else f"{number:.3e}"
    return "(" + ", ".join(f"{float(v):.3g}" for v in array.ravel()) + ")"
