"""A form generated from a parameter dataclass (label, tooltip, unit, limits and choices come
from each field's metadata, ``gpu.params.meta``; a str field whose metadata names ``several``
choices holds any of them, comma-separated, and gets a check box each), and :func:`spin_for`, a spin box whose
default and range are a dataclass field's, for panels that lay out a parameter by hand.

A form starts at the window's presets (:func:`app.params.gui_preset`: the default unless one is
declared), and shows a field in the window's unit (:mod:`app.window_units`: a cosine threshold in
degrees); :meth:`ParamsForm.values` and :meth:`ParamsForm.set_values` speak the dataclass's units."""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from tractlens.app.params import default_of, field_of, gui_preset
from tractlens.app.window_units import (
    DEGREES,
    choice_words,
    from_window,
    to_window,
    window_default,
    window_limits,
    window_unit,
)

UNIT_WORDS = {"vox": "voxels"}  # a unit as the panels spell it


class ParamsForm(QWidget):
    """Edits one frozen parameter dataclass; :meth:`value` builds (and so validates) it."""

    def __init__(self, params_type: type, choices: dict[str, tuple[str, ...]] | None = None, parent=None):
        super().__init__(parent)
        self.params_type = params_type
        self.editors: dict[str, QWidget] = {}
        # (value shown, the dataclass's value) of a converted field until it is edited: 78.5° is
        # the default cosine 0.2 exactly, not cos(78.5°) = 0.1994
        self._exact: dict[str, tuple[float, float]] = {}
        layout = QFormLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for spec in dataclasses.fields(params_type):
            meta = spec.metadata
            default = window_default(params_type, spec.name)
            options = (choices or {}).get(spec.name) or (meta.get("choices") if isinstance(default, str) else None)
            words = choice_words(params_type, spec.name)
            if meta.get("several"):
                editor = _Several(meta["several"], default)
            elif words:  # a numbered choice, offered by name (its number is the data)
                editor = QComboBox()
                for value, text in words.items():
                    editor.addItem(text, value)
                editor.setCurrentIndex(editor.findData(default))
            elif isinstance(default, tuple):
                editor = _Numbers(default)
            elif options:
                editor = QComboBox()
                editor.addItems([str(option) for option in options])
                editor.setCurrentText(default)
            elif isinstance(default, bool):
                editor = QCheckBox()
                editor.setChecked(default)
            elif isinstance(default, int):
                editor = QSpinBox()
                lo, hi = meta.get("limits") or (0, 10**9)
                editor.setRange(int(lo), int(hi))
                editor.setValue(default)
            else:
                editor = QDoubleSpinBox()
                lo, hi = window_limits(params_type, spec.name) or (-1e9, 1e9)
                unit = window_unit(params_type, spec.name)
                decimals = 1 if unit == DEGREES else 3 if hi <= 1.0 else 2
                while decimals < 6 and unit != DEGREES and any(round(v, decimals) != v for v in (lo, float(default))):
                    decimals += 1  # the limits and the default are shown as they are, not rounded
                editor.setDecimals(decimals)
                editor.setRange(lo, hi)
                editor.setSingleStep(0.05 if hi <= 1.0 else 0.5 if hi <= 10 else 5.0)
                editor.setValue(float(default))
                self._remember(spec.name, editor, gui_preset(params_type, spec.name))
                if unit:
                    editor.setSuffix(unit if unit == DEGREES else f" {UNIT_WORDS.get(unit, unit)}")
                if lo == 0 and "0 = off" in meta.get("help", ""):
                    editor.setSpecialValueText("off")  # not "0.00 mm", which reads as a length
            editor.setObjectName(f"param_{spec.name}")
            editor.setToolTip(meta.get("help", ""))
            layout.addRow(meta.get("label", spec.name), editor)
            self.editors[spec.name] = editor

    def values(self) -> dict[str, Any]:
        out = {}
        for name, editor in self.editors.items():
            if isinstance(editor, _Several | _Numbers):
                out[name] = editor.value() if isinstance(editor, _Numbers) else editor.text()
            elif isinstance(editor, QComboBox):
                out[name] = editor.currentText() if editor.currentData() is None else editor.currentData()
            elif isinstance(editor, QCheckBox):
                out[name] = editor.isChecked()
            elif isinstance(editor, QSpinBox):
                out[name] = editor.value()
            else:
                shown, exact = self._exact.get(name, (None, None))
                out[name] = exact if editor.value() == shown else from_window(self.params_type, name, editor.value())
        return out

    def _remember(self, name: str, editor: QDoubleSpinBox, value) -> None:
        if to_window(self.params_type, name, value) != value:
            self._exact[name] = (editor.value(), value)

    def value(self):
        """The parameters as the dataclass (raises ValueError with the engine's message)."""
        return self.params_type(**self.values())

    def set_values(self, **values) -> None:
        for name, value in values.items():
            editor = self.editors[name]
            if isinstance(editor, _Several | _Numbers):
                editor.set_text(value if isinstance(editor, _Several) else " ".join(str(v) for v in value))
            elif isinstance(editor, QComboBox):
                index = editor.findData(value)
                editor.setCurrentIndex(index) if index >= 0 else editor.setCurrentText(value)
            elif isinstance(editor, QCheckBox):
                editor.setChecked(bool(value))
            elif isinstance(editor, QSpinBox):
                editor.setValue(int(value))
            else:
                editor.setValue(float(to_window(self.params_type, name, value)))
                self._remember(name, editor, value)


class _Several(QWidget):
    """Any of ``choices``, a check box each; the value is the checked ones, comma-separated."""

    def __init__(self, choices, value: str):
        super().__init__()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.boxes = {str(choice): QCheckBox(str(choice)) for choice in choices}
        for choice, box in self.boxes.items():
            box.setObjectName(f"choice_{choice}")
            layout.addWidget(box)
        layout.addStretch(1)
        self.set_text(value)

    def text(self) -> str:
        return ",".join(choice for choice, box in self.boxes.items() if box.isChecked())

    def set_text(self, value: str) -> None:
        chosen = {part.strip().lower() for part in str(value).split(",")}
        for choice, box in self.boxes.items():
            box.setChecked(choice.lower() in chosen)


class _Numbers(QLineEdit):
    """A tuple of whole numbers (iterations per level: ``100 50 20``), typed with spaces between;
    :meth:`value` raises ValueError for anything else."""

    def __init__(self, value: tuple):
        super().__init__(" ".join(str(v) for v in value))

    def value(self) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in self.text().replace(",", " ").split())
        except ValueError:
            raise ValueError(f"{self.text()!r} is not whole numbers separated by spaces") from None


def limits_of(params_type: type, name: str) -> tuple[float, float] | None:
    """The range a user interface offers for one field (its metadata's limits)."""
    return field_of(params_type, name).metadata.get("limits")


def spin_for(params_type: type, name: str, box: QSpinBox | QDoubleSpinBox | None = None):
    """A spin box (or ``box``) with the range and the default of ``params_type.name``: a QSpinBox
    for an int field, a QDoubleSpinBox otherwise. Decimals, suffix and tooltip are the caller's."""
    default = default_of(params_type, name)
    if box is None:
        box = QSpinBox() if isinstance(default, int) else QDoubleSpinBox()
    lo, hi = limits_of(params_type, name) or ((0, 10**9) if isinstance(box, QSpinBox) else (-1e9, 1e9))
    if isinstance(box, QSpinBox):
        box.setRange(int(lo), int(hi))
        box.setValue(int(default))
    else:
        box.setRange(float(lo), float(hi))
        box.setValue(float(default))
    return box
