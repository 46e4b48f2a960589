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
``integer``, ``text``, ``colour``, ``fields``, ``series``; :func:`answers` takes them as keywords::

    with dialogs.answers(save_file=["/tmp/seed.nii.gz"], question=[True]):
        window.save_roi_dialog()
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QColorDialog, QFileDialog, QInputDialog, QMessageBox

KINDS = ("open_file", "open_files", "save_file", "folder", "question", "choice", "integer", "text", "colour")
KINDS += ("fields",)  # a form of labelled text fields (the report's patient and scan fields)
KINDS += ("series",)  # which DICOM series to open (several diffusion series in one folder)

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
    from pathlib import Path

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
