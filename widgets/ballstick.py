"""Ball & sticks from the GUI: the parameter dialog and the background job.

The DWI layer's menu opens :class:`BallStickDialog` (FSL bedpostx's defaults);
on "Fit" the main window runs the use case :func:`app.usecases.fits.fit_ballstick` on the job
runner. It calls :func:`app.pipelines.ballstick.fit_ballstick_pipeline` (inside a brain
mask from the b=0 images, or inside an ROI for a quick look at one region;
progress per batch of voxels; cooperative cancel), optionally writes the
bedpostX folder, and returns the layers to add: the sticks (``dyads``) and the
first stick's mean fraction (hidden: the series' FA stays the background). Nothing reaches the document before the job
has finished, so a cancelled or failed fit changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtWidgets import (
    QDialog,
    QFormLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.estimates import JobEstimate, ballstick_estimate
from tractlens.app.model import Layer
from tractlens.app.pipelines.ballstick import BallStickParams
from tractlens.app.window_words import window_words

from . import dialogs
from .fit_dialog_parts import SaveFolder, default_folder, message_label, region_choice, submit_buttons
from .params_form import ParamsForm


class BallStickDialog(QDialog):
    """MCMC settings for one DWI layer, where to fit (the brain or one of ``rois``), and
    optionally where to save the bedpostX folder.

    Non-blocking (:meth:`open`); on Fit the settings are validated by building
    :class:`~gpu.ballstick.BallStickParams` (a refusal is shown in the dialog,
    which stays open), then :attr:`params`, :attr:`roi` (None: the brain) and
    :attr:`folder` (None: not saved) hold them and ``accepted`` is emitted.
    """

    def __init__(self, layer: Layer, rois: list[Layer], parent: QWidget | None = None, device: str = "auto"):
        super().__init__(parent)
        self.device = device
        self.setWindowTitle(f"Ball & sticks: {layer.name}")
        self.setObjectName("ballstick_dialog")
        self.dwi = layer.data.dwi
        self.rois = list(rois)
        self.params: BallStickParams | None = None
        self.roi: Layer | None = None
        self.folder: Path | None = None
        self.region = region_choice(self.rois, "bs_region")
        self.region.setToolTip("Fit every brain voxel, or only an ROI's (much faster on the CPU)")
        self.form = ParamsForm(BallStickParams)
        self.form.set_values(b0_threshold=self.dwi.b0_threshold)
        editors = self.form.editors
        self.n_fibres, self.burnin, self.njumps = editors["n_fibres"], editors["burnin"], editors["njumps"]
        self.sample_every = editors["sample_every"]
        self.samples = QLabel()
        self.estimate_label = QLabel()
        self.estimate_label.setObjectName("bs_estimate")
        self.estimate_label.setWordWrap(True)
        saving = SaveFolder(
            self,
            "Save a bedpostX folder to",
            default_folder(self.dwi, ".bedpostX"),
            "bs",
            "The bedpostX folder to write",
        )
        self.save, self.folder_edit, where = saving.check, saving.edit, saving.row
        self.message = message_label("bs_message")
        form = QFormLayout()
        form.addRow("Fit inside", self.region)
        form.addRow(self.form)
        form.addRow("", self.samples)
        form.addRow("", self.estimate_label)
        form.addRow(self.save, where)
        buttons, self.fit_button = submit_buttons(self, "Fit", "bs_fit")
        layout = QVBoxLayout(self)
        x, y, z = self.dwi.shape3
        layout.addWidget(QLabel(f"{x}×{y}×{z} voxels, {len(self.dwi.bvals)} volumes"))
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(buttons)
        for box in (self.njumps, self.sample_every, self.burnin):
            box.valueChanged.connect(self._count_samples)
        self.region.currentIndexChanged.connect(self._count_samples)
        self._brain_voxels: int | None = None
        self._count_samples()

    def _count_samples(self) -> None:
        self.samples.setText(f"{self.njumps.value() // self.sample_every.value()} samples per parameter")
        estimate = self.estimate()
        self.estimate_label.setText(f"Expected: {estimate.text}" if estimate.text else "")

    def estimate(self) -> JobEstimate:
        """How long the fit will take as set now (:func:`app.estimates.ballstick_estimate`)."""
        index = self.region.currentIndex()
        if index > 0:
            voxels = self.rois[index - 1].data.voxel_count
        else:
            if self._brain_voxels is None:
                self._brain_voxels = brain_voxels_upper_bound(self.dwi)
            voxels = self._brain_voxels
        return ballstick_estimate(voxels, len(self.dwi.bvals), self.burnin.value(), self.njumps.value(), self.device)

    def accept(self) -> None:
        try:
            params = self.form.value()
        except ValueError as exc:
            self.message.setText(window_words(f"Check the settings: {exc}."))
            return
        folder = self.folder_edit.text().strip()
        if self.save.isChecked() and not folder:
            self.message.setText("Choose the folder to save to, or untick saving.")
            return
        estimate = self.estimate()
        if estimate.long and not dialogs.confirm_long_job(self, estimate):
            self.message.setText(f"Not started: it would take {estimate.text}. Fit inside an ROI for a quick look.")
            return
        self.params = params
        self.roi = self.rois[self.region.currentIndex() - 1] if self.region.currentIndex() > 0 else None
        self.folder = Path(folder) if self.save.isChecked() else None
        super().accept()


def brain_voxels_upper_bound(dwi) -> int:
    """Voxels with signal in every b=0 volume: at least the brain mask the fit will compute
    (that one is found on the worker, with filters too slow for the GUI thread)."""
    b0 = dwi.data[..., dwi.b0_mask]
    return int(np.count_nonzero((np.nan_to_num(b0) > 0).all(axis=-1)))
