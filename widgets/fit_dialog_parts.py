"""Parts the job dialogs share (the fits, registration, atlas regions, named bundles): where to
fit, where to save, the line that says what is wrong with the settings, and the buttons."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
)

from tractlens.app.io import split_suffix

from . import dialogs

BRAIN = "brain (mask from the b=0 images)"


def region_choice(rois, object_name: str) -> QComboBox:
    """Fit in the brain mask, or in one of ``rois`` (named with their voxel counts)."""
    region = QComboBox()
    region.setObjectName(object_name)
    region.addItems([BRAIN, *(f"ROI {roi.name} ({roi.data.voxel_count} voxels)" for roi in rois)])
    return region


def submit_buttons(dialog: QDialog, text: str, object_name: str) -> tuple[QDialogButtonBox, QPushButton]:
    """OK (named ``text``, found by ``object_name``) and Cancel, wired to ``dialog``'s accept and reject."""
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
    ok.setText(text)
    ok.setObjectName(object_name)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    return buttons, ok


def message_label(object_name: str) -> QLabel:
    """The dialog's line for what is wrong with its settings (red, wrapped)."""
    message = QLabel()
    message.setObjectName(object_name)
    message.setWordWrap(True)
    message.setStyleSheet("color: #e06060")
    return message


def default_folder(dwi, suffix: str) -> Path:
    """``NAME<suffix>`` beside the DWI's file (``dwi<suffix>`` for a series without one)."""
    if not dwi.path:
        return Path(f"dwi{suffix}")
    return Path(dwi.path).parent / f"{split_suffix(Path(dwi.path))[0]}{suffix}"


class SaveFolder:
    """A "save to" check box and its folder (typed, or chosen with Browse…, which ticks the box).

    ``check`` and ``edit`` are the widgets; ``row`` is the layout to put beside the check box."""

    def __init__(self, parent, text: str, folder: Path, prefix: str, browse_title: str):
        self.parent, self.browse_title = parent, browse_title
        self.check = QCheckBox(text)
        self.check.setObjectName(f"{prefix}_save")
        self.edit = QLineEdit(str(folder))
        self.edit.setObjectName(f"{prefix}_folder")
        self.edit.setEnabled(False)
        self.check.toggled.connect(self.edit.setEnabled)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.browse)
        self.row = QHBoxLayout()
        self.row.addWidget(self.edit, 1)
        self.row.addWidget(browse)

    def browse(self) -> None:
        folder = dialogs.folder(self.parent, self.browse_title, self.edit.text())
        if folder:
            self.edit.setText(folder)
            self.check.setChecked(True)
