"""ROI files in the window: an ROI opened from a NIfTI mask (onto the document's grid, see
:func:`tractlens.app.loaders.load_roi_file`) and an ROI saved as one, asking before a file is
replaced. Creating, deleting and renaming ROIs are document edits
(:class:`~tractlens.widgets.roi_tools.RoiTools`, :meth:`Document.remove_layer`,
:meth:`Document.rename_layer`).

The controller holds no widget: the question whether to replace a file is a callable the window
gives it, and what the user should read arrives by :attr:`RoiController.message` and
:attr:`RoiController.error`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, Signal

from tractlens.app.errors import InputError
from tractlens.app.grid import Grid
from tractlens.app.io import save_volume
from tractlens.app.layers import next_roi_colour
from tractlens.app.loaders import load_roi_file
from tractlens.app.model import Document, Layer

ROI_SUFFIXES = (".nii", ".nii.gz")


class RoiController(QObject):
    """Opens and saves ROI layers of ``document``. ``role()`` is the role of an ROI opened
    without one (the ROI tool bar's); ``ask_overwrite(path)`` says whether to replace a file."""

    message = Signal(str, int)  # status text, milliseconds
    error = Signal(str, str)  # message, details

    def __init__(
        self,
        document: Document,
        *,
        role: Callable[[], str] = lambda: "seed",
        ask_overwrite: Callable[[Path], bool] = lambda path: False,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.document = document
        self.role = role
        self.ask_overwrite = ask_overwrite

    def open_roi(self, path: str | os.PathLike, role: str | None = None) -> Layer | None:
        """Load a mask as an ROI layer on the reference grid (resampled, with a notice, if needed);
        an undoable edit. A mask that lies outside the image is refused; an empty one is added
        with a warning (a blank to draw in). None when it was refused (the user is told why)."""
        doc = self.document
        reference = None if doc.reference_affine is None else Grid(doc.reference_affine, doc.reference_shape)
        try:
            roi, notices = load_roi_file(
                path, reference, role=role or self.role(), taken=[layer.name for layer in doc.layers]
            )
        except InputError as exc:
            self.error.emit(str(exc), "")
            return None
        layer = doc.add_layer(Layer(roi.name, roi, "roi", color=next_roi_colour(doc.layers, roi.role)), undoable=True)
        if notices:
            self.message.emit("; ".join(notices), 15000)
        return layer

    def save_roi(self, layer: Layer, path: str | os.PathLike, *, overwrite: bool = False) -> Path | None:
        """Write an ROI as a uint8 NIfTI mask on its grid (FSL, MRtrix and DIPY read it).

        A name without .nii or .nii.gz gets .nii.gz. An existing file is replaced only when
        ``ask_overwrite`` says so or ``overwrite`` is given; the written path, or None when
        nothing was written (declined, or an error the user was shown)."""
        path = Path(path)
        if not path.name.lower().endswith(ROI_SUFFIXES):
            path = path.with_name(path.name + ".nii.gz")
        if path.exists() and not overwrite and not self.ask_overwrite(path):
            self.message.emit(f"ROI not saved: {path.name} exists and was not replaced", 15000)
            return None
        try:
            written = save_volume(layer.data.mask.astype(np.uint8), layer.data.affine, path)
        except InputError as exc:  # SaveError: disk full, no permission, ...
            self.error.emit(f"The ROI could not be saved: {exc}", "")
            return None
        self.message.emit(f"ROI {layer.name} saved to {written}", 8000)
        return written
