"""What a user interface needs to offer an engine parameter: the metadata of a dataclass field."""

from __future__ import annotations


def meta(label: str, help: str, unit: str = "", limits: tuple[float, float] | None = None) -> dict:
    """Field metadata: label, tooltip, unit and limits (the GUI builds its forms from these)."""
    return {"label": label, "help": help, "unit": unit, "limits": limits}
