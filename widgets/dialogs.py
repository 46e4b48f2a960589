"""Every modal dialog of the window goes through this module, so that a run nobody watches
never waits for a click.

Dialogs are shown only when the application is *interactive*. It is not when
``TRACTLENS_NO_DIALOGS`` is set, nor in a scripted run (:func:`set_scripted`: ``tractlens
--exit`` / ``--screenshot``, ``tractlens report``, ``tractlens.open_window`` from a script or
a notebook). Then each dialog returns its *scripted answer* at once: the next answer queued for
that kind of dialog with :func:`answers` (tests and scripts that need a particular one), else its
safe default — no file or folder (the action is cancelled), the non-destructive choice for a
question, no input. A message that would have needed an OK goes to the status bar and the
window's error list only (the caller does that), never to a modal box.

The kinds: ``open_file``, ``open_files``, ``save_file``, ``folder``, ``question``, ``choice``,
``integer``, ``text``, ``colour``, ``fields``, ``series``, ``navigation_export``; :func:`answers`
takes them as keywords::

    with dialogs.answers(save_file=["/tmp/seed.nii.gz"], question=[True]):
        window.save_roi_dialog()
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QColorDialog,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.params import DicomExportParams

from .params_form import ParamsForm

KINDS = ("open_file", "open_files", "save_file", "folder", "question", "choice", "integer", "text", "colour")
KINDS += ("fields",)  # a form of labelled text fields (the report's patient and scan fields)
KINDS += ("series",)  # which DICOM series to open (several diffusion series in one folder)
KINDS += ("navigation_export",)  # what File > Export for navigation writes, onto what, where

_scripted = False
_queued: dict[str, deque] = defaultdict(deque)
_NOT_QUEUED = object()


def set_scripted(scripted: bool = True) -> None:
    """Mark this process as a scripted run (no dialog will be shown from now on)."""
    global _scripted
    _scripted = bool(scripted)


def interactive() -> bool:
    """True when a dialog may be shown: not scripted and ``TRACTLENS_NO_DIALOGS`` not set."""
    return not _scripted and not os.environ.get("TRACTLENS_NO_DIALOGS")


def has_answer(kind: str) -> bool:
    """Whether a scripted answer is queued for ``kind``."""
    return bool(_queued[kind])


@contextlib.contextmanager
def answers(**queued: Sequence[Any]) -> Iterator[None]:
    """Queue scripted answers by dialog kind for the block (first in, first used); whatever is
    left unused is dropped at the end. While answers are queued for a kind, its dialogs are
    answered from the queue even in an interactive session."""
    unknown = sorted(set(queued) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown dialog kinds {unknown}: one of {', '.join(KINDS)}")
    for kind, values in queued.items():
        _queued[kind].extend(values)
    try:
        yield
    finally:
        for kind in queued:
            _queued[kind].clear()


def _scripted_answer(kind: str, default: Any) -> Any:
    """The queued answer for ``kind``; else ``default`` when no dialog may be shown; else
    :data:`_NOT_QUEUED` (show the dialog)."""
    if _queued[kind]:
        return _queued[kind].popleft()
    return default if not interactive() else _NOT_QUEUED


def open_file(parent, title: str, file_filter: str = "", start: str = "") -> str | None:
    """A file to open, or None (cancelled)."""
    answer = _scripted_answer("open_file", None)
    if answer is not _NOT_QUEUED:
        return None if answer is None else str(answer)
    path, _ = QFileDialog.getOpenFileName(parent, title, start, file_filter)
    return path or None


def open_files(parent, title: str, file_filter: str = "", start: str = "") -> list[str]:
    """Files to open (empty: cancelled)."""
    answer = _scripted_answer("open_files", [])
    if answer is not _NOT_QUEUED:
        return [str(p) for p in answer]
    paths, _ = QFileDialog.getOpenFileNames(parent, title, start, file_filter)
    return list(paths)


def save_file(parent, title: str, suggested: str = "", file_filter: str = "", *, confirm_overwrite: bool = True):
    """A file to write, or None. ``confirm_overwrite=False``: the caller asks itself (with
    :func:`question`), e.g. after adding a suffix."""
    answer = _scripted_answer("save_file", None)
    if answer is not _NOT_QUEUED:
        return None if answer is None else str(answer)
    options = QFileDialog.Option(0) if confirm_overwrite else QFileDialog.Option.DontConfirmOverwrite
    path, _ = QFileDialog.getSaveFileName(parent, title, suggested, file_filter, options=options)
    return path or None


def folder(parent, title: str, start: str = "") -> str | None:
    """A folder, or None."""
    answer = _scripted_answer("folder", None)
    if answer is not _NOT_QUEUED:
        return None if answer is None else str(answer)
    path = QFileDialog.getExistingDirectory(parent, title, start)
    return path or None


def question(parent, title: str, text: str, *, default: bool = False) -> bool:
    """Yes or No; scripted: ``default``, which callers make the non-destructive answer."""
    answer = _scripted_answer("question", default)
    if answer is not _NOT_QUEUED:
        return bool(answer)
    buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
    preset = QMessageBox.StandardButton.Yes if default else QMessageBox.StandardButton.No
    return QMessageBox.question(parent, title, text, buttons, preset) == QMessageBox.StandardButton.Yes


def choice(parent, title: str, text: str, options: Sequence[tuple[str, str]], *, default: str) -> str:
    """One of ``options`` ((key, button text), the first the accepting one); the key of the
    button pressed, ``default`` when the box is closed or nobody can be asked."""
    keys = [key for key, _ in options]
    if default not in keys:
        raise ValueError(f"default {default!r} is not among {keys}")
    answer = _scripted_answer("choice", default)
    if answer is not _NOT_QUEUED:
        if answer not in keys:
            raise ValueError(f"scripted answer {answer!r} is not among {keys}")
        return answer
    box = QMessageBox(QMessageBox.Icon.Question, title, text, parent=parent)
    roles = [QMessageBox.ButtonRole.AcceptRole, QMessageBox.ButtonRole.DestructiveRole]
    buttons = {}
    for i, (key, label) in enumerate(options):
        role = roles[i] if i < len(roles) else QMessageBox.ButtonRole.RejectRole
        buttons[key] = box.addButton(label, role)
    box.exec()
    clicked = box.clickedButton()
    return next((key for key, button in buttons.items() if button is clicked), default)


def integer(parent, title: str, label: str, value: int, minimum: int, maximum: int) -> int | None:
    """An integer, or None."""
    answer = _scripted_answer("integer", None)
    if answer is not _NOT_QUEUED:
        return None if answer is None else int(answer)
    number, ok = QInputDialog.getInt(parent, title, label, value, minimum, maximum)
    return number if ok else None


def text(parent, title: str, label: str, current: str = "") -> str | None:
    """A line of text, or None."""
    answer = _scripted_answer("text", None)
    if answer is not _NOT_QUEUED:
        return None if answer is None else str(answer)
    entered, ok = QInputDialog.getText(parent, title, label, text=current)
    return entered if ok else None


def colour(parent, title: str, current: QColor) -> QColor | None:
    """A colour, or None."""
    answer = _scripted_answer("colour", None)
    if answer is not _NOT_QUEUED:
        return None if answer is None else QColor(answer)
    chosen = QColorDialog.getColor(current, parent, title)
    return chosen if chosen.isValid() else None


def gradient_files(parent, dwi_path) -> tuple[str, str] | None:
    """The b-value and b-vector files of a diffusion series that has none beside it: two
    ``open_file`` dialogs (scripted: two ``open_file`` answers); None when either is cancelled."""

    dwi_path = Path(dwi_path)
    start = str(dwi_path.parent)
    bval = open_file(parent, f"b-values of {dwi_path.name}", "b-values (*.bval *.bvals bvals);;All files (*)", start)
    if bval is None:
        return None
    bvec = open_file(parent, f"b-vectors of {dwi_path.name}", "b-vectors (*.bvec *.bvecs bvecs);;All files (*)", start)
    return None if bvec is None else (bval, bvec)


def series(parent, title: str, text: str, options: Sequence[tuple[str, str]]) -> str | None:
    """One of ``options`` ((key, label): a DICOM series' number and how it is named), chosen from a
    list; None when cancelled or nobody can be asked (scripted answer: a key, or None)."""
    keys = [key for key, _ in options]
    answer = _scripted_answer("series", None)
    if answer is not _NOT_QUEUED:
        if answer is not None and str(answer) not in keys:
            raise ValueError(f"scripted answer {answer!r} is not among {keys}")
        return None if answer is None else str(answer)
    labels = [label for _, label in options]
    chosen, ok = QInputDialog.getItem(parent, title, text, labels, 0, False)
    return keys[labels.index(chosen)] if ok and chosen in labels else None


def confirm_long_job(parent, estimate) -> bool:
    """Ask before a long job (an :class:`~tractlens.app.estimates.JobEstimate`) starts; a scripted
    run proceeds (its estimate goes to the job list and the status bar)."""
    text = f"{estimate.announcement()}\n\nStart it now?"
    return question(parent, "A long job on the CPU", text, default=True)


def information(parent, title: str, text: str, *, rich: bool = False):
    """An information box that does not block (``open``); None when nobody can be asked, else the box."""
    if not interactive():
        return None
    box = QMessageBox(QMessageBox.Icon.Information, title, text, parent=parent)
    if rich:
        box.setTextFormat(Qt.TextFormat.RichText)
    box.open()
    return box


def notify(parent, title: str, text: str, details: str = "") -> None:
    """A warning box that does not block (``open``, window-modal); nothing when nobody can be asked."""
    if not interactive():
        return
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent)
    if details:
        box.setDetailedText(details)
    box.open()


def message(parent, title: str, text: str, details: str = "") -> None:
    """A warning box with OK (and the details, folded); nothing when nobody can be asked."""
    if not interactive():
        return
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent)
    if details:
        box.setDetailedText(details)
    box.exec()


def fields(parent, title: str, values: Sequence[tuple[str, str, str]]) -> dict[str, str] | None:
    """A form of text fields, ``values`` (key, label, current); the edited values by key, or None
    when cancelled. Scripted: the queued answer (a dict of changes, or None), else the values as
    they are (the form's OK)."""
    current = {key: value for key, _label, value in values}
    answer = _scripted_answer("fields", current)
    if answer is not _NOT_QUEUED:
        return None if answer is None else {**current, **{k: str(v) for k, v in dict(answer).items()}}
    from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLineEdit

    dialog = QDialog(parent)
    dialog.setWindowTitle(title)
    form = QFormLayout(dialog)
    edits = {}
    for key, label, value in values:
        edits[key] = QLineEdit(value)
        form.addRow(label, edits[key])
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    form.addRow(buttons)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return {key: edit.text().strip() for key, edit in edits.items()}


# ------------------------------------------------------------------ export for navigation

NAVIGATION_KEYS = ("reference", "reference_series", "outdir", "bundles", "lesion")
DEIDENTIFY_OFF = (
    "De-identification is OFF: the objects carry the patient's name, ID and birth date, as the "
    "navigation system and PACS need them to file the objects with this patient."
)
DEIDENTIFY_ON = (
    "De-identification is ON: the patient's name, ID, birth date and the other identifiers are removed "
    "(the study, series and frame-of-reference UIDs stay). For teaching or research copies."
)


def _navigation_choice(values: dict, bundle_names: Sequence[str], lesions: Sequence[str]) -> dict:
    """The export chosen (``params``, a ``DicomExportParams``, and :data:`NAVIGATION_KEYS`), or a
    ValueError saying what to change."""

    unknown = sorted(set(values) - set(NAVIGATION_KEYS) - {"formats", "dilate_mm", "deidentify"})
    if unknown:
        raise ValueError(f"unknown export settings {unknown}")
    if not str(values["formats"]).strip(" ,"):
        raise ValueError("choose at least one DICOM object to write (SEG, RTSTRUCT or the coloured overlay)")
    params = DicomExportParams(
        formats=str(values["formats"]), dilate_mm=float(values["dilate_mm"]), deidentify=bool(values["deidentify"])
    )
    reference = str(values.get("reference") or "").strip()
    if not reference:
        raise ValueError("choose the reference series (the DICOM folder of the series to export onto, e.g. the T1)")
    if not Path(reference).is_dir():
        raise ValueError(f"the reference series folder {reference} does not exist")
    outdir = str(values.get("outdir") or "").strip()
    if not outdir:
        raise ValueError("choose the folder to write the DICOM objects into")
    bundles = [str(name) for name in values.get("bundles") or []]
    if not bundles:
        raise ValueError("choose at least one bundle to export")
    missing = [name for name in bundles if name not in bundle_names]
    lesion = values.get("lesion") or None
    if missing or (lesion is not None and lesion not in lesions):
        raise ValueError(f"no such bundle or lesion: {', '.join(missing) or lesion}")
    series = values.get("reference_series") or None
    return {"params": params, "reference": reference, "reference_series": series, "outdir": outdir,
            "bundles": bundles, "lesion": lesion}  # fmt: skip


def navigation_export(
    parent,
    *,
    bundles: Sequence[tuple[str, bool]],
    lesions: Sequence[str],
    lesion: str | None = None,
    reference: str = "",
    reference_series: str | None = None,
    reference_label: str = "",
    outdir: str = "",
) -> dict | None:
    """File ▸ Export for navigation…: which objects (SEG, RTSTRUCT, overlay), the dilation and
    de-identification (the form of ``DicomExportParams``), the reference series (``reference``, a
    DICOM folder, and ``reference_series`` in it, described by ``reference_label``), the bundles
    (``bundles``: (name, checked)), the lesion (one of ``lesions`` or None) and the output folder.

    Returns the choice (see :func:`_navigation_choice`) or None when cancelled. Scripted: the queued
    answer, a dict of changes over these defaults (``formats``, ``dilate_mm``, ``deidentify``,
    ``reference``, ``reference_series``, ``outdir``, ``bundles``, ``lesion``) or None; unqueued,
    None (nothing is written without being asked). A bad scripted answer raises ValueError."""

    names = [name for name, _ in bundles]
    defaults = {**{k: getattr(DicomExportParams(), k) for k in ("formats", "dilate_mm", "deidentify")},
                "reference": reference, "reference_series": reference_series, "outdir": outdir,
                "bundles": [name for name, checked in bundles if checked], "lesion": lesion}  # fmt: skip
    answer = _scripted_answer("navigation_export", None)
    if answer is not _NOT_QUEUED:
        if answer is None:
            return None
        changes = dict(answer)
        if "reference" in changes and "reference_series" not in changes:
            changes["reference_series"] = None  # another folder: its own (only) image series
        return _navigation_choice({**defaults, **changes}, names, lesions)
    dialog = _NavigationExportDialog(parent, defaults, bundles, lesions, reference_label)
    return dialog.choice if dialog.exec() == QDialog.DialogCode.Accepted else None


class _NavigationExportDialog(QDialog):
    """The form of :func:`navigation_export`; ``choice`` is set when Export is pressed on valid entries."""

    def __init__(self, parent, defaults: dict, bundles, lesions, reference_label: str):
        super().__init__(parent)
        self.setObjectName("navigation_export")
        self.setWindowTitle("Export for navigation")
        self.setMinimumWidth(560)
        self.names, self.lesions, self.choice = [n for n, _ in bundles], list(lesions), None
        self.reference_series = defaults["reference_series"]
        layout = QVBoxLayout(self)
        intro = QLabel("The bundles (and the lesion) as DICOM objects on the grid of a reference series, "
                       "in the patient's study, for the neuronavigation system and PACS.")  # fmt: skip
        intro.setWordWrap(True)
        layout.addWidget(intro)
        objects = QGroupBox("Objects")
        box = QVBoxLayout(objects)

        self.form = ParamsForm(DicomExportParams)
        self.form.set_values(**{k: defaults[k] for k in ("formats", "dilate_mm", "deidentify")})
        box.addWidget(self.form)
        self.deidentify_note = QLabel()
        self.deidentify_note.setObjectName("deidentify_note")
        self.deidentify_note.setWordWrap(True)
        box.addWidget(self.deidentify_note)
        self.form.editors["deidentify"].toggled.connect(self._show_deidentify)
        self._show_deidentify(bool(defaults["deidentify"]))
        layout.addWidget(objects)
        where = QFormLayout()
        self.reference = self._folder_row(where, "Reference series", defaults["reference"], "reference")
        self.reference_label = QLabel(reference_label or "its only image series")
        self.reference_label.setWordWrap(True)
        where.addRow("", self.reference_label)
        self.reference.textEdited.connect(self._reference_changed)
        self.bundles = QListWidget()
        self.bundles.setObjectName("navigation_bundles")
        for name, checked in bundles:
            item = QListWidgetItem(name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
            self.bundles.addItem(item)
        self.bundles.setMaximumHeight(110)
        where.addRow("Bundles", self.bundles)
        self.lesion = QComboBox()
        self.lesion.setObjectName("navigation_lesion")
        self.lesion.addItems(["none", *self.lesions])
        self.lesion.setCurrentText(defaults["lesion"] or "none")
        where.addRow("Lesion", self.lesion)
        self.outdir = self._folder_row(where, "Output folder", defaults["outdir"], "outdir")
        layout.addLayout(where)
        self.problem = QLabel("")
        self.problem.setObjectName("navigation_problem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #b01e1e;")
        layout.addWidget(self.problem)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Export")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def _folder_row(self, form, label: str, value: str, name: str) -> QLineEdit:
        edit = QLineEdit(value or "")
        edit.setObjectName(f"navigation_{name}")
        browse = QPushButton("Browse…")
        browse.clicked.connect(lambda: self._browse(edit, label))
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(edit, 1)
        line.addWidget(browse)
        form.addRow(label, row)
        return edit

    def _browse(self, edit: QLineEdit, label: str) -> None:
        chosen = folder(self, label, edit.text())
        if chosen:
            edit.setText(chosen)
            if edit is self.reference:
                self._reference_changed()

    def _reference_changed(self, *_args) -> None:
        self.reference_series = None
        self.reference_label.setText("its only image series (or the only series in it)")

    def _show_deidentify(self, on: bool) -> None:
        self.deidentify_note.setText(DEIDENTIFY_ON if on else DEIDENTIFY_OFF)
        self.deidentify_note.setStyleSheet("font-weight: bold;" + ("" if on else " color: #8a4b00;"))

    def values(self) -> dict:
        bundles = [self.bundles.item(i) for i in range(self.bundles.count())]
        return {**self.form.values(), "reference": self.reference.text(), "outdir": self.outdir.text(),
                "reference_series": self.reference_series,
                "bundles": [item.text() for item in bundles if item.checkState() == Qt.CheckState.Checked],
                "lesion": None if self.lesion.currentText() == "none" else self.lesion.currentText()}  # fmt: skip

    def accept(self) -> None:
        try:  # a bad entry is said here and the dialog stays open with everything as entered
            self.choice = _navigation_choice(self.values(), self.names, self.lesions)
        except ValueError as exc:
            self.problem.setText(str(exc))
            return
        super().accept()
