"""A form generated from a parameter dataclass of the engine (label, tooltip, unit and
limits come from each field's metadata; choices from the module's ``CHOICES``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QSpinBox, QWidget


class ParamsForm(QWidget):
    """Edits one frozen parameter dataclass; :meth:`value` builds (and so validates) it."""

    def __init__(self, params_type: type, choices: dict[str, tuple[str, ...]] | None = None, parent=None):
        super().__init__(parent)
        self.params_type = params_type
        self.editors: dict[str, QWidget] = {}
        layout = QFormLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        defaults = params_type()
        for spec in dataclasses.fields(params_type):
            meta = spec.metadata
            default = getattr(defaults, spec.name)
            if choices and spec.name in choices:
                editor = QComboBox()
                editor.addItems(list(choices[spec.name]))
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
                lo, hi = meta.get("limits") or (-1e9, 1e9)
                editor.setRange(lo, hi)
                editor.setDecimals(3 if hi <= 1.0 else 2)
                editor.setSingleStep(0.05 if hi <= 1.0 else 0.5 if hi <= 10 else 5.0)
                editor.setValue(float(default))
                if meta.get("unit"):
                    editor.setSuffix(f" {meta['unit']}")
            editor.setObjectName(f"param_{spec.name}")
            editor.setToolTip(meta.get("help", ""))
            layout.addRow(meta.get("label", spec.name), editor)
            self.editors[spec.name] = editor

    def values(self) -> dict[str, Any]:
        out = {}
        for name, editor in self.editors.items():
            if isinstance(editor, QComboBox):
                out[name] = editor.currentText()
            elif isinstance(editor, QCheckBox):
                out[name] = editor.isChecked()
            elif isinstance(editor, QSpinBox):
                out[name] = editor.value()
            else:
                out[name] = editor.value()
        return out

    def value(self):
        """The parameters as the dataclass (raises ValueError with the engine's message)."""
        return self.params_type(**self.values())

    def set_values(self, **values) -> None:
        for name, value in values.items():
            editor = self.editors[name]
            if isinstance(editor, QComboBox):
                editor.setCurrentText(value)
            elif isinstance(editor, QCheckBox):
                editor.setChecked(bool(value))
            elif isinstance(editor, QSpinBox):
                editor.setValue(int(value))
            else:
                editor.setValue(float(value))
