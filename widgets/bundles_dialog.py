"""Track ▸ Named bundles…: which bundles (a checklist of :func:`app.bundles.bundle_names`, each in
its standard colour), from which data (a bedpostX, fit-csd or dtifit folder), through which MNI
registration folder, into which output folder, and the settings of :class:`app.params.BundleParams`
(a generated form). Non-blocking: on OK it holds the choice and emits ``accepted``; the window's
bundles controller (:mod:`widgets.controllers.bundles`) runs the job. It computes nothing and
checks nothing the use case checks (a missing folder is the use case's message, shown in the Jobs
panel)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.bundles import bundle_colour, bundle_names, protocol_of
from tractlens.app.params import BundleParams
from tractlens.app.window_words import window_words

from . import dialogs
from .fit_dialog_parts import message_label, submit_buttons
from .params_form import ParamsForm

#: The data sources: (keyword of run_bundles, what the combo box says).
SOURCES = (
    ("samples", "bedpostX samples (probabilistic)"),
    ("fod", "fODF, fit-csd folder (iFOD1)"),
    ("tensor", "tensor, dtifit / fit-dti folder (deterministic)"),
)


def colour_icon(rgb) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(QColor.fromRgbF(*rgb))
    return QIcon(pixmap)


class FolderField(QWidget):
    """A folder path: a line to type it and a Browse… button."""

    def __init__(self, object_name: str, title: str, parent=None):
        super().__init__(parent)
        self.title = title
        self.line = QLineEdit()
        self.line.setObjectName(object_name)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.line, 1)
        layout.addWidget(browse)

    def _browse(self) -> None:
        chosen = dialogs.folder(self, self.title, self.line.text())
        if chosen:
            self.line.setText(chosen)

    def text(self) -> str:
        return self.line.text().strip()


class BundlesDialog(QDialog):
    """After OK: :attr:`names`, :attr:`source` (keyword, folder), :attr:`registration`,
    :attr:`output` and :attr:`params` hold the choice."""

    def __init__(self, parent=None, *, registration: str = "", source: tuple[str, str] | None = None):
        super().__init__(parent)
        self.setObjectName("bundles_dialog")
        self.setWindowTitle("Named bundles")
        self.setMinimumWidth(520)
        self.names: list[str] = []
        self.source = self.params = None
        self.registration = self.output = ""
        self.checklist = QListWidget()
        self.checklist.setObjectName("bundles_checklist")
        for name in bundle_names():
            item = QListWidgetItem(colour_icon(bundle_colour(name)), name)
            protocol = protocol_of(name)
            item.setToolTip(f"{protocol.title}\n{protocol.protocol}: {protocol.citation}\n{protocol.adapted}")
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked)
            self.checklist.addItem(item)
        every, none = QPushButton("All"), QPushButton("None")
        every.clicked.connect(lambda: self.check_all(True))
        none.clicked.connect(lambda: self.check_all(False))
        self.source_box = QComboBox()
        self.source_box.setObjectName("bundles_source_kind")
        self.source_box.addItems([label for _, label in SOURCES])
        self.source_field = FolderField("bundles_source", "The diffusion model's folder")
        self.registration_field = FolderField(
            "bundles_registration", "The MNI registration folder (tractlens register)"
        )
        self.output_field = FolderField("bundles_output", "Where the bundles are written")
        if source is not None:
            self.source_box.setCurrentIndex([key for key, _ in SOURCES].index(source[0]))
            self.source_field.line.setText(source[1])
        self.registration_field.line.setText(registration)
        self.form = ParamsForm(BundleParams)
        self.message = message_label("bundles_message")
        form = QFormLayout()
        form.addRow("Data", self.source_box)
        form.addRow("Folder", self.source_field)
        form.addRow("Registration to MNI", self.registration_field)
        form.addRow("Write to", self.output_field)
        form.addRow(self.form)
        buttons, self.ok_button = submit_buttons(self, "Track bundles", "bundles_ok")
        row = QHBoxLayout()
        row.addWidget(every)
        row.addWidget(none)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.checklist, 1)
        layout.addLayout(row)
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(buttons)

    def check_all(self, checked: bool) -> None:
        state = Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked
        for row in range(self.checklist.count()):
            self.checklist.item(row).setCheckState(state)

    def item(self, name: str) -> QListWidgetItem:
        return self.checklist.findItems(name, Qt.MatchFlag.MatchExactly)[0]

    def checked(self) -> list[str]:
        items = (self.checklist.item(row) for row in range(self.checklist.count()))
        return [item.text() for item in items if item.checkState() == Qt.CheckState.Checked]

    def _say(self, text: str) -> None:
        self.message.setText(text)
        self.adjustSize()

    def accept(self) -> None:
        try:
            params = self.form.value()
        except ValueError as exc:
            self._say(window_words(f"Check the settings: {exc}."))
            return
        names = self.checked()
        empty = [label for label, text in (("a bundle", names), ("the data folder", self.source_field.text()),
                 ("the registration folder", self.registration_field.text()), ("where to write", self.output_field.text()))
                 if not text]  # fmt: skip
        if empty:
            self._say(f"Choose {', '.join(empty)}.")
            return
        self.names, self.params = names, params
        self.source = (SOURCES[self.source_box.currentIndex()][0], self.source_field.text())
        self.registration, self.output = self.registration_field.text(), self.output_field.text()
        super().accept()
