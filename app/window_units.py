"""Parameters the window shows in another unit or in other words than the engine and the command
line take.

probtrackx's curvature threshold (``ProbParams.cthr``, ``--cthr``) is the cosine of the sharpest
turn allowed, while every other angle in the window is in degrees ("Max angle 45°" of
deterministic tracking). The parameter stays defined once, as a cosine, in its dataclass (the
command line keeps probtrackx's option and numbers); a field whose metadata unit is
:data:`COSINE` is shown and edited in degrees, converted here and only here (the form
generator, the GUI presets and the report all go through :func:`to_window` /
:func:`from_window`).

Choices that are codes (probtrackx's ``--randfib 0|1|2``, bedpostX's ``--model 1|2``, the
registration's ``--metric mi|cc``) are offered by name, :data:`CHOICE_WORDS`; the value stays the code.

The engine flips each new direction onto the previous one before the test (probtrackx does the
same), so a turn is never sharper than 90°: a threshold of 90° or more never stops a streamline.
"""

from __future__ import annotations

import math
from typing import Any

from .params import BallStickParams, ProbParams, RegisterParams, field_of, gui_preset

#: The metadata unit of a field that holds the cosine of an angle.
COSINE = "cosine"
#: The unit the window shows such a field in.
DEGREES = "°"


def cosine_to_degrees(cosine: float) -> float:
    """The angle (degrees, 0–180) whose cosine is ``cosine`` (clipped to [-1, 1])."""
    return math.degrees(math.acos(min(1.0, max(-1.0, float(cosine)))))


def degrees_to_cosine(degrees: float) -> float:
    """The cosine of ``degrees``; 90° gives exactly 0 (not 6e-17), so "90°" and "--cthr 0" are
    the same run."""
    return round(math.cos(math.radians(float(degrees))), 12)


def _is_cosine(params_type: type, name: str) -> bool:
    return field_of(params_type, name).metadata.get("unit") == COSINE


def window_unit(params_type: type, name: str) -> str:
    """The unit the window shows ``params_type.name`` in: degrees for a cosine, else its own."""
    unit = field_of(params_type, name).metadata.get("unit") or ""
    return DEGREES if unit == COSINE else unit


def to_window(params_type: type, name: str, value: Any) -> Any:
    """A value of the field, in the dataclass's unit, as the window shows it."""
    return cosine_to_degrees(value) if _is_cosine(params_type, name) else value


def from_window(params_type: type, name: str, value: Any) -> Any:
    """A value the window shows, back in the dataclass's unit."""
    return degrees_to_cosine(value) if _is_cosine(params_type, name) else value


def window_limits(params_type: type, name: str) -> tuple[float, float] | None:
    """The field's limits in the window's unit, lowest first (a cosine's -1..1 is 180°..0°)."""
    limits = field_of(params_type, name).metadata.get("limits")
    if limits is None:
        return None
    shown = sorted(to_window(params_type, name, value) for value in limits)
    return shown[0], shown[1]


def window_default(params_type: type, name: str) -> Any:
    """The value the window starts with (:func:`app.params.gui_preset`), in the window's unit."""
    return to_window(params_type, name, gui_preset(params_type, name))


#: Numbered choices in words, for the window's forms: {(parameter class, field): {value: words}}.
CHOICE_WORDS: dict[tuple[type, str], dict[Any, str]] = {
    (ProbParams, "randfib"): {0: "stick 1", 1: "any stick, uniformly", 2: "by volume fraction"},
    (BallStickParams, "model"): {1: "one diffusivity", 2: "diffusivity distribution (multi-shell)"},
    (RegisterParams, "metric"): {
        "mi": "mutual information (other contrast)",
        "cc": "cross-correlation (same contrast)",
    },
}


def choice_words(params_type: type, name: str) -> dict[Any, str] | None:
    """{value: words} of a numbered choice the window offers by name, or None."""
    return CHOICE_WORDS.get((params_type, name))
