"""Microstructure models from the GUI: the dialog, the background job, and its layers.

A DWI layer's menu "Fit microstructure model…" opens :class:`ModelFitDialog` (the model, the
fit's settings as a form generated from :class:`~gpu.models.ModelFitParams`, where to fit,
optionally where to save the maps); on Fit, :func:`start_model_fit` runs
the use case :func:`app.usecases.fits.fit_model` on the job runner. The maps (NDI, ODI, FWF; for Bingham also the
dispersion indices) appear as layers after the first batch of voxels and fill in batch by
batch; the mean orientation is added as sticks when the fit ends. A cancelled or failed fit
takes its partial layers away again, so nothing half-computed stays in the document.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.errors import InputError
from tractlens.app.model import Layer, Volume
from tractlens.app.pipelines.fit_model import (
    MODEL_NAMES,
    ModelFitParams,
    check_acquisition,
    resolve_model,
)
from tractlens.app.usecases.fits import fit_model
from tractlens.app.window_words import window_words

from .fit_dialog_parts import SaveFolder, default_folder, message_label, region_choice, submit_buttons
from .params_form import ParamsForm

#: Maps shown as layers while the fit runs (those the model has), the first one visible.
SHOWN_MAPS = ("NDI", "ODI", "FWF", "ODI_primary", "ODI_secondary", "DAI")


class ModelFitDialog(QDialog):
    """Model, settings, region and output folder for one DWI layer. Non-blocking (:meth:`open`);
    on Fit the settings are validated by building :class:`ModelFitParams` (a refusal is shown in
    the dialog, which stays open), then :attr:`model_name`, :attr:`params`, :attr:`roi` (None:
    the brain) and :attr:`folder` (None: not saved) hold them and ``accepted`` is emitted."""

    def __init__(self, layer: Layer, rois: list[Layer], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Microstructure model: {layer.name}")
        self.setObjectName("model_dialog")
        self.dwi = layer.data.dwi
        self.rois = list(rois)
        self.model_name: str | None = None
        self.params: ModelFitParams | None = None
        self.roi: Layer | None = None
        self.folder: Path | None = None
        self.model = QComboBox()
        self.model.setObjectName("model_name")
        self.model.addItems(MODEL_NAMES)
        self.region = region_choice(self.rois, "model_region")
        self.form = ParamsForm(ModelFitParams)
        self.form.set_values(b0_threshold=self.dwi.b0_threshold)
        saving = SaveFolder(
            self, "Save the maps to", default_folder(self.dwi, "_model"), "model", "The folder to write the maps to"
        )
        self.save, self.folder_edit, where = saving.check, saving.edit, saving.row
        self.message = message_label("model_message")
        form = QFormLayout()
        form.addRow("Model", self.model)
        form.addRow("Fit inside", self.region)
        form.addRow(self.form)
        form.addRow(self.save, where)
        buttons, self.fit_button = submit_buttons(self, "Fit", "model_fit")
        layout = QVBoxLayout(self)
        x, y, z = self.dwi.shape3
        layout.addWidget(QLabel(f"{x}×{y}×{z} voxels, {len(self.dwi.bvals)} volumes"))
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(buttons)

    def accept(self) -> None:
        try:
            params = self.form.value()
            check_acquisition(
                resolve_model(self.model.currentText(), params), self.dwi.bvals, params.b0_threshold, self.dwi.path
            )
        except (ValueError, InputError) as exc:
            self.message.setText(window_words(f"Cannot fit: {exc}"))
            return
        folder = self.folder_edit.text().strip()
        if self.save.isChecked() and not folder:
            self.message.setText("Choose the folder to save to, or untick saving.")
            return
        self.model_name = self.model.currentText()
        self.params = params
        self.roi = self.rois[self.region.currentIndex() - 1] if self.region.currentIndex() > 0 else None
        self.folder = Path(folder) if self.save.isChecked() else None
        super().accept()


def orientation_layer(result, name: str) -> Layer:
    """The fitted mean orientation as sticks (voxel axes), length the tissue's neurite fraction."""
    fit = result.fit
    length = fit.derived.get("NDI", np.ones(len(fit.residual))) * (1.0 - fit.derived.get("FWF", 0.0))
    dyads = np.zeros((*result.mask.shape, 1, 4), dtype=np.float32)
    dyads[result.mask, 0, :3] = fit.directions[:, 0]
    dyads[result.mask, 0, 3] = np.clip(length, 0.0, 1.0)
    return Layer(name, Volume(name, dyads, result.affine, kind="dyads"), "dyads")


def start_model_fit(window, layer: Layer, model_name: str, params: ModelFitParams, folder=None, roi=None) -> int:
    """Run the fit on the window's job runner; maps become layers as batches finish. Returns the job id."""
    files = window.files
    document, runner = files.document, files.runner
    region = None if roi is None else (roi.data.mask.copy(), roi.data.affine.copy())
    dwi = layer.data.dwi
    added: dict[str, Layer] = {}

    def partial(maps: dict) -> None:
        for name, values in maps.items():
            if name in added:
                added[name].set_data(values)
                continue
            title = f"{model_name} {name} ({layer.name})"
            # the first map shows, the others wait in the list
            volume = Volume(title, values, dwi.affine)
            new = Layer(title, volume, "scalar", colormap="hot", clim=(0.0, 1.0), visible=not added)
            new.provenance = {"computed": model_name, "dwi": layer.name, "partial": True}
            added[name] = document.add_layer(new)

    def done(result) -> None:
        maps = result.maps()
        partial({name: maps[name] for name in SHOWN_MAPS if name in maps})
        for new in added.values():
            new.provenance = {"computed": model_name, "dwi": layer.name, **result.fit.provenance}
        if result.model.orientations:
            sticks = orientation_layer(result, f"{model_name} orientation ({layer.name})")
            sticks.provenance = {"computed": model_name, "dwi": layer.name}
            document.add_layer(sticks)
        seconds = result.fit.provenance.get("total_s")
        text = f"{model_name}: {int(result.mask.sum())} voxels fitted" + (f" in {seconds:.1f} s" if seconds else "")
        text += f"; saved to {folder}" if folder is not None else ""
        files.message.emit("; ".join([text, *result.warnings]), 15000)

    def take_back(job_id: int, *_args) -> None:
        if job_id == job:
            for new in added.values():
                if new in document.layers:
                    document.remove_layer(new)
            added.clear()

    job = runner.submit(
        f"{model_name} ({layer.name})",
        lambda ctx: fit_model(
            dwi, model_name, params, folder=folder, device=files.device, roi=region, shown=SHOWN_MAPS, ctx=ctx
        ),
        on_done=done,
        on_partial=partial,
        on_error=files.error.emit,
    )
    runner.job_cancelled.connect(take_back)
    runner.job_failed.connect(take_back)
    return job


def open_model_dialog(window, layer: Layer) -> ModelFitDialog:
    """Ask for the model and settings of a DWI layer (non-blocking); Fit starts the job."""
    rois = [roi for roi in window.document.layers if roi.kind == "roi"]
    previous = getattr(window, "model_dialog", None)
    if previous is not None:
        previous.deleteLater()
    dialog = ModelFitDialog(layer, rois, window)
    dialog.accepted.connect(
        lambda: start_model_fit(window, layer, dialog.model_name, dialog.params, dialog.folder, dialog.roi)
    )
    window.model_dialog = dialog
    dialog.open()
    return dialog
