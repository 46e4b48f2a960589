"""Constrained spherical deconvolution from the GUI: the parameter dialog (the job is a use case of app).

The DWI layer's menu ("Fit CSD…") opens :class:`CsdDialog`, whose forms are generated from
:class:`gpu.csd.CSDParams` and :class:`gpu.csd_peaks.PeakParams` (:class:`widgets.params_form.ParamsForm`:
the same defaults, limits and help as ``tractlens fit-csd``); on "Fit" the window runs
the use case :func:`app.usecases.fits.fit_csd` on the job runner (:meth:`widgets.controllers.files.FileController.fit_csd`):
:func:`app.pipelines.csd.fit_csd_pipeline` with progress per batch of voxels and cooperative
cancel, optionally writing the ``fit-csd`` folder. The layers to add (the fODF, its peaks as
sticks, GM and CSF maps of a multi-tissue fit: :func:`app.fod_layers.csd_result_layers`)
reach the document only when the job has finished, so a cancelled or failed fit changes nothing.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QFormLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.model import Layer
from tractlens.app.pipelines.csd import CSDParams, PeakParams
from tractlens.app.window_words import window_words

from .fit_dialog_parts import SaveFolder, default_folder, message_label, submit_buttons
from .params_form import ParamsForm

FIT_CSD = "Fit CSD…"
# Voxels per batch of a fit started here: Cancel is heard between batches, and the CPU fits
# 200-750 voxels/s (README), so a batch takes seconds, not the minutes of a whole brain.
CANCEL_BATCH_VOXELS = 2000


class CsdDialog(QDialog):
    """CSD settings for one DWI layer and, optionally, the folder to write the ``fit-csd``
    outputs to. Non-blocking (:meth:`open`); on Fit the settings are validated by building the
    parameter dataclasses (a refusal is shown in the dialog, which stays open), then
    :attr:`params`, :attr:`peak_params` and :attr:`folder` (None: not saved) hold them and
    ``accepted`` is emitted."""

    def __init__(self, layer: Layer, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Constrained spherical deconvolution: {layer.name}")
        self.setObjectName("csd_dialog")
        self.dwi = layer.data.dwi
        self.params: CSDParams | None = None
        self.peak_params: PeakParams | None = None
        self.folder: Path | None = None
        self.form = ParamsForm(CSDParams)
        self.form.set_values(b0_threshold=self.dwi.b0_threshold)
        self.peak_form = ParamsForm(PeakParams)
        saving = SaveFolder(
            self,
            "Save the fit-csd folder to",
            default_folder(self.dwi, "_csd"),
            "csd",
            "The folder to write the CSD fit to",
        )
        self.save, self.folder_edit, row = saving.check, saving.edit, saving.row
        self.message = message_label("csd_message")
        form = QFormLayout()
        form.addRow(self.form)
        form.addRow(QLabel("Peaks"))
        form.addRow(self.peak_form)
        form.addRow(self.save, row)
        buttons, self.fit_button = submit_buttons(self, "Fit", "csd_fit")
        layout = QVBoxLayout(self)
        x, y, z = self.dwi.shape3
        self.shells = sorted({round(float(b), -2) for b in self.dwi.bvals if b > self.dwi.b0_threshold})
        shells = ", ".join(f"{b:g}" for b in self.shells)
        text = f"{x}×{y}×{z} voxels, {len(self.dwi.bvals)} volumes, shells b = {shells}"
        layout.addWidget(QLabel(text))
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(buttons)

    def accept(self) -> None:
        try:
            params, peak_params = self.form.value(), self.peak_form.value()
        except ValueError as exc:
            self.message.setText(window_words(f"Check the settings: {exc}."))
            return
        if params.msmt and len(self.shells) < 2:
            self.message.setText(
                "Multi-shell multi-tissue CSD needs two or more shells above b=0; this series has one. "
                "Untick it for single-shell CSD."
            )
            return
        folder = self.folder_edit.text().strip()
        if self.save.isChecked() and not folder:
            self.message.setText("Choose the folder to save to, or untick saving.")
            return
        self.params, self.peak_params = params, peak_params
        self.folder = Path(folder) if self.save.isChecked() else None
        super().accept()


def open_csd_dialog(window, layer: Layer) -> CsdDialog:
    """Ask for the CSD settings of a DWI layer (non-blocking); Fit starts the job on the window's
    file controller. The dialog is kept as ``window.csd_dialog`` (scripts and tests drive it)."""
    previous = getattr(window, "csd_dialog", None)
    if previous is not None:
        previous.deleteLater()  # the previous one, closed or not
    dialog = CsdDialog(layer, window)
    dialog.accepted.connect(lambda: window.files.fit_csd(layer, dialog.params, dialog.peak_params, dialog.folder))
    window.csd_dialog = dialog
    dialog.open()
    return dialog
