"""The COMMIT filtering panel: weigh a tractogram's streamlines by how well they explain the
diffusion signal, show the weights, hide the weak ones, and map the fit's error.

The panel holds no algorithm. "Filter (COMMIT)" takes the last DWI series opened (the hidden
``dwi`` layer, :class:`app.model.DWIVolume`) and a snapshot (copies of the arrays, on the GUI
thread) of the chosen tractogram layer, and runs :func:`app.pipelines.commit.commit_pipeline`
on a worker with the panel's λ, iterations and tolerance (COMMIT 2's defaults; the
diffusivities and the model keep their defaults, as in ``tractlens commit`` without options).
"Mask" restricts the fit to the voxels of an ROI layer (a copy of its voxels goes to the job;
an ROI on another grid than the DWI is resampled onto it, as ``tractlens commit`` does); "Peaks
file" is an optional NIfTI of peak directions for the extra-cellular compartments. The inputs
are checked by the use case (:func:`app.usecases.commit.check_commit_inputs`, before the job
starts; the job runs :func:`app.usecases.commit.filter_with_commit`), with the command's
messages. The status line follows the FISTA iterations; a cancel (between iterations) adds nothing.

On completion two layers are added (nothing reaches the document before):

* "<name> (COMMIT)": a copy of the tractogram whose per-streamline scalar ``commit_weight``
  holds the weights, coloured by it (viridis over 0 … the largest weight; weight 0, filtered
  out, is the darkest). A new layer rather than a scalar added to the original: the layer
  model has no "scalar added" event (views cache display arrays per layer), the original stays
  as it was loaded, and the thresholded view below can replace the result layer's streamlines
  without touching the user's own layer. A second run on the same tractogram replaces it.
* "fit NRMSE": the fit's normalised RMSE per voxel (0 outside the fitted voxels), hot colour
  map over 0 … 0.5, hidden at first (the FA stays the background; tick it to see the map).

"Hide weight below" is a slider over the weights: at its minimum every streamline is shown;
one step up hides those with weight 0 (what COMMIT filters out); further steps raise the
threshold linearly up to the largest weight, showing the streamlines with weight > threshold.
The subset (and its display arrays) is made on a worker, like the Geodesic panel's top x %,
and replaces the result layer's streamlines (colour range fixed, so colours do not shift);
the ROI fibre selection of the main window still applies on top of it.

"Save outputs…" writes the last result's files (:data:`app.pipelines.commit.COMMIT_OUTPUTS`,
as ``tractlens commit`` does) into a folder, on a worker, after asking when the folder already
holds COMMIT outputs. The filtered tractogram is written as .trk unless the source layer's
tractogram records a .tck/.trx ``source`` file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
)

from tractlens.app.errors import InputError
from tractlens.app.estimates import commit_estimate
from tractlens.app.model import Document, Layer
from tractlens.app.pipelines.commit import (
    CommitParams,
    CommitResult,
    existing_outputs,
    output_names,
    write_commit_outputs,
)
from tractlens.app.pipelines.commit import tractogram_suffix as _suffix_of
from tractlens.app.regions import RoiCopy
from tractlens.app.usecases.commit import check_commit_inputs
from tractlens.app.window_words import computed_on, seconds

from . import dialogs
from .commit_results import (
    NRMSE_CLIM,
    NRMSE_NAME,
    WEIGHT,
    CommitOutcome,
    commit_job,
    shown_label,
    snapshot_tractogram,
    weighted_layer,
)
from .job_panel import JobPanelBase
from .params_form import limits_of

THRESHOLD_STEPS = 200  # slider positions above "all shown"
NO_MASK = "none (all voxels passed)"  # short: it shows whole in a 1280 px window
PEAKS_FILTER = "NIfTI (*.nii *.nii.gz);;All files (*)"
COMBO_CHARS = 12  # combo boxes size to this many characters, not to their longest item
# Re-exported: scripts and tests name the panel's layers and outputs through this module.
__all__ = [
    "NRMSE_CLIM",
    "NRMSE_NAME",
    "THRESHOLD_STEPS",
    "WEIGHT",
    "CommitPanel",
    "existing_outputs",
    "output_names",
    "tractogram_suffix",
    "weighted_layer",
]


def tractogram_suffix(layer: Layer | None) -> str:
    """The format to write a layer's filtered tractogram in: .tck or .trx when the layer's
    tractogram (or the layer) records that it was read from such a file, otherwise .trk."""
    return _suffix_of(getattr(layer, "data", None), layer)


def _field_meta(name: str) -> dict:
    return next(f.metadata for f in dataclasses.fields(CommitParams) if f.name == name)


class CommitPanel(JobPanelBase):
    """Tractogram and mask choosers, an optional peaks file, λ / iterations / tolerance, Filter,
    Cancel and Save outputs…, the weight threshold.

    Attributes for scripts and tests: ``result_layer`` (the shown weighted tractogram, possibly
    thresholded), ``full_layer`` (every streamline), ``nrmse_layer``, ``weights``, ``summary``,
    ``result`` (the last :class:`~app.pipelines.commit.CommitResult`), ``job_id``."""

    finished = Signal(object)  # the result layer
    job_label = "COMMIT"

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.result_layer: Layer | None = None
        self.full_layer: Layer | None = None
        self.nrmse_layer: Layer | None = None
        self.source_layer: Layer | None = None
        self.weights: np.ndarray | None = None
        self.summary: dict | None = None
        self.result: CommitResult | None = None
        self._threshold_token = 0
        self._tracts: list[Layer] = []
        self._chosen: Layer | None = None  # the user's (or the menu's) choice
        self._masks: list[Layer | None] = [None]  # the mask combo's entries (None: no mask)
        self._chosen_mask: Layer | None = None

        self.tract_box = QComboBox()
        self.tract_box.setObjectName("commit_tractogram")
        self.tract_box.setToolTip("The tractogram whose streamlines COMMIT weighs")
        self.tract_box.activated.connect(self._picked)
        self.mask_box = QComboBox()
        self.mask_box.setObjectName("commit_mask")
        for box in (self.tract_box, self.mask_box):  # long layer names elide instead of widening the dock
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(12)
        self.mask_box.setToolTip(
            "Fit only the voxels of this ROI (resampled onto the DWI's grid if it is on another) that the "
            "streamlines pass; none: every voxel they pass"
        )
        self.mask_box.activated.connect(self._mask_picked)
        for box in (self.tract_box, self.mask_box):  # long layer names must not widen the dock
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(COMBO_CHARS)
        self.peaks_edit = QLineEdit()
        self.peaks_edit.setObjectName("commit_peaks")
        self.peaks_edit.setPlaceholderText("from streamlines")  # short: shows whole at 1280 px
        self.peaks_edit.setClearButtonEnabled(True)
        self.peaks_edit.setToolTip(
            "Optional NIfTI (X, Y, Z, 3K) of peak directions in world RAS on the DWI's grid (e.g. MRtrix "
            "sh2peaks): the extra-cellular compartments' orientations. Empty: the streamlines' own"
        )
        self.peaks_button = QPushButton("Browse…")
        self.peaks_button.setObjectName("commit_peaks_browse")
        self.peaks_button.clicked.connect(self._browse_peaks)
        peaks = QHBoxLayout()
        peaks.setContentsMargins(0, 0, 0, 0)
        peaks.addWidget(self.peaks_edit, 1)
        peaks.addWidget(self.peaks_button)
        defaults = CommitParams()
        self.lambda_box = QDoubleSpinBox()
        self.lambda_box.setObjectName("commit_lambda")
        self.lambda_box.setDecimals(6)
        self.lambda_box.setRange(*limits_of(CommitParams, "lambda_"))
        self.lambda_box.setSingleStep(0.001)
        self.lambda_box.setValue(defaults.lambda_)
        self.max_iter_box = QSpinBox()
        self.max_iter_box.setObjectName("commit_max_iter")
        self.max_iter_box.setRange(*(int(v) for v in limits_of(CommitParams, "max_iter")))
        self.max_iter_box.setValue(defaults.max_iter)
        self.tol_box = QDoubleSpinBox()
        self.tol_box.setObjectName("commit_tol")
        self.tol_box.setDecimals(6)
        self.tol_box.setRange(*limits_of(CommitParams, "tol"))
        self.tol_box.setSingleStep(1e-4)
        self.tol_box.setValue(defaults.tol)
        form = QFormLayout()
        form.addRow("Tractogram", self.tract_box)
        form.addRow("Mask", self.mask_box)
        form.addRow("Peaks file", peaks)
        for name, box in (("lambda_", self.lambda_box), ("max_iter", self.max_iter_box), ("tol", self.tol_box)):
            meta = _field_meta(name)
            box.setToolTip(meta.get("help", ""))
            form.addRow(meta.get("label", name), box)

        self.filter_button = QPushButton("Filter (COMMIT)")
        self.filter_button.setObjectName("commit_filter")
        self.filter_button.clicked.connect(self.filter)
        self.cancel_button.setObjectName("commit_cancel")
        self.save_button = QPushButton("Save outputs…")
        self.save_button.setObjectName("commit_save")
        self.save_button.setToolTip(
            "Write the weights, the filtered tractogram, the fit's error and compartment maps and a summary, "
            "as tractlens commit does"
        )
        self.save_button.setEnabled(False)
        self.save_button.clicked.connect(self._save_clicked)
        buttons = QGridLayout()  # two rows: the panel stays as narrow as the tracking panels it is tabbed with
        buttons.addWidget(self.filter_button, 0, 0)
        buttons.addWidget(self.cancel_button, 0, 1)
        buttons.addWidget(self.save_button, 1, 0, 1, 2)

        self.threshold = QSlider(Qt.Orientation.Horizontal)
        self.threshold.setObjectName("commit_threshold")
        self.threshold.setRange(0, THRESHOLD_STEPS)
        self.threshold.setValue(0)
        self.threshold.setEnabled(False)
        self.threshold.setToolTip(
            "Leftmost: every streamline; one step right: hide those COMMIT filtered out (weight 0); "
            "further right: hide weights up to the threshold"
        )
        self.threshold_label = QLabel("all shown")
        self.threshold_label.setObjectName("commit_threshold_label")
        self.threshold_label.setWordWrap(True)
        shown = QFormLayout()
        shown.addRow("Hide weight below", self.threshold)
        shown.addRow("", self.threshold_label)

        self.status.setText("Open a DWI series and a tractogram, then Filter.")
        self.status.setObjectName("commit_status")
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addLayout(shown)
        layout.addWidget(self.status)
        layout.addStretch(1)

        self._threshold_timer = QTimer(self)
        self._threshold_timer.setSingleShot(True)
        self._threshold_timer.setInterval(40)  # slider steps in a row: one subset
        self._threshold_timer.timeout.connect(self.apply_threshold)
        self.threshold.valueChanged.connect(self._threshold_changed)
        document.connect(self._on_document)
        self._refresh_tracts()
        self._refresh_masks()

    # ------------------------------------------------------------- chooser
    def _on_document(self, _source, event, **info) -> None:
        if event == "layers":
            replaced = info.get("replaced")
            if replaced is not None and self._chosen is replaced[0]:
                self._chosen = replaced[1]
            if replaced is not None and self._chosen_mask is replaced[0]:
                self._chosen_mask = replaced[1]
            self._refresh_tracts()
            self._refresh_masks()
        elif event == "display" and "name" in info.get("changed", ()):
            self._refresh_tracts()
            self._refresh_masks()
        if event == "display" and "selection" in info.get("changed", ()) and info.get("layer") is self.result_layer:
            self._label_threshold()

    def _refresh_tracts(self) -> None:
        tracts = [layer for layer in self.document.layers if layer.kind == "tractogram"]
        if self._chosen not in tracts:
            self._chosen = None
        current = self._chosen or (tracts[-1] if tracts else None)
        self._tracts = tracts
        self.tract_box.blockSignals(True)
        self.tract_box.clear()
        self.tract_box.addItems([layer.name for layer in tracts])
        if current is not None:
            self.tract_box.setCurrentIndex(tracts.index(current))
        self.tract_box.blockSignals(False)

    def _picked(self, index: int) -> None:
        if 0 <= index < len(self._tracts):
            self._chosen = self._tracts[index]

    def choose(self, layer: Layer) -> None:
        """Make ``layer`` (a tractogram layer of the document) the one to filter."""
        if layer in self._tracts:
            self._chosen = layer
            self.tract_box.setCurrentIndex(self._tracts.index(layer))

    def tractogram_layer(self) -> Layer | None:
        index = self.tract_box.currentIndex()
        return self._tracts[index] if 0 <= index < len(self._tracts) else None

    def dwi_layer(self) -> Layer | None:
        found = [layer for layer in self.document.layers if layer.kind == "dwi" and hasattr(layer.data, "dwi")]
        return found[-1] if found else None

    def _refresh_masks(self) -> None:
        """The mask combo: none, then every ROI layer (one on another grid than the DWI is
        resampled onto it by the use case)."""
        masks = [layer for layer in self.document.layers if layer.kind == "roi"]
        if self._chosen_mask not in masks:
            self._chosen_mask = None
        self._masks = [None, *masks]
        self.mask_box.blockSignals(True)
        self.mask_box.clear()
        self.mask_box.addItem(NO_MASK)
        self.mask_box.setItemData(0, NO_MASK, Qt.ItemDataRole.ToolTipRole)
        for layer in masks:
            self.mask_box.addItem(layer.name)
        self.mask_box.setCurrentIndex(self._masks.index(self._chosen_mask))
        self.mask_box.blockSignals(False)

    def _mask_picked(self, index: int) -> None:
        if 0 <= index < len(self._masks):
            self._chosen_mask = self._masks[index]

    def choose_mask(self, layer: Layer | None) -> None:
        """Fit within ``layer`` (an ROI layer of the document), or in every voxel the streamlines
        pass (None)."""
        if layer is not None and (layer.kind != "roi" or layer not in self.document.layers):
            raise ValueError(f"{layer.name} is not an ROI layer of the document")
        self._chosen_mask = layer
        self._refresh_masks()

    def mask_layer(self) -> Layer | None:
        """The chosen mask (an ROI layer), None for none."""
        index = self.mask_box.currentIndex()
        return self._masks[index] if 0 <= index < len(self._masks) else None

    def peaks_path(self) -> Path | None:
        """The peaks file typed or browsed (None when the field is empty)."""
        text = self.peaks_edit.text().strip()
        return Path(text).expanduser() if text else None

    def _browse_peaks(self) -> None:
        path = self._ask_peaks_file()
        if path:
            self.peaks_edit.setText(str(path))

    def _ask_peaks_file(self) -> str:
        """The peaks file the user picks ("" if none); tests override it to skip the dialog."""
        return dialogs.open_file(self, "Peaks file (X, Y, Z, 3K directions)", PEAKS_FILTER) or ""

    def params(self) -> CommitParams:
        """The form's settings (raises ValueError with the engine's message)."""
        return CommitParams(
            lambda_=float(self.lambda_box.value()),
            max_iter=int(self.max_iter_box.value()),
            tol=float(self.tol_box.value()),
        )

    # ------------------------------------------------------------- actions
    def filter(self) -> int | None:
        """Start COMMIT on the chosen tractogram and the last DWI series; the job id (None if refused)."""
        dwi_layer, source, mask_layer, peaks = (
            self.dwi_layer(),
            self.tractogram_layer(),
            self.mask_layer(),
            self.peaks_path(),
        )
        try:
            check_commit_inputs(
                None if dwi_layer is None else dwi_layer.data.dwi,
                None if source is None else source.data,
                mask=None if mask_layer is None else mask_layer.data,
                peaks=peaks,
                tractogram_name=None if source is None else source.name,
                mask_name=None if mask_layer is None else mask_layer.name,
            )
        except InputError as exc:
            return self._refuse(str(exc))
        try:
            params = self.params()
        except ValueError as exc:
            return self._refuse(f"Check the parameters: {exc}.")
        estimate = commit_estimate(source.data.n_points, params.max_iter, self.device)
        if estimate.long and not dialogs.confirm_long_job(self, estimate):
            self.status.setText(f"Not started: it would take {estimate.text}.")
            return None
        token = self._next_token()
        dwi = dwi_layer.data.dwi  # read only by the pipeline
        tract = snapshot_tractogram(source.data)
        mask = None
        if mask_layer is not None:  # a copy: the ROI may be edited while the job runs
            roi = mask_layer.data
            mask = RoiCopy(mask_layer.name, roi.role, np.array(roi.mask, dtype=bool, copy=True), roi.affine.copy())
        self._chosen = source  # stays chosen after the run adds its layer (the last tractogram)
        within = "" if mask_layer is None else f" within {mask_layer.name}"
        self.status.setText(f"Preparing COMMIT for {source.name} ({len(tract):,} streamlines){within}…")
        return self._start(
            f"COMMIT ({source.name})" + (f", {estimate.text}" if estimate.long else ""),
            self._job(dwi, tract, source, params, token, mask=mask, peaks=peaks),
            on_done=self._done,
            token=token,
        )

    def _job(self, dwi, tract, source: Layer, params: CommitParams, token: int, *, mask=None, peaks=None):
        return commit_job(
            dwi,
            tract,
            source,
            params,
            token,
            self.device,
            mask=mask,
            peaks=peaks,
            fiber_arrays=self.document.fiber_arrays,
        )

    # ------------------------------------------------------------- results
    def _progress_text(self, job) -> str:
        return f"COMMIT: iteration {job.done} / {job.total}…"

    def _done(self, outcome: CommitOutcome) -> None:
        if outcome.token != self._token:
            return
        doc = self.document
        self._job_ended()
        provenance = {"computed": "COMMIT filtering", "tractogram": outcome.source.name, **outcome.summary}
        outcome.layer.provenance = provenance
        outcome.nrmse.provenance = provenance
        same_source = outcome.source is self.source_layer
        if same_source and self.result_layer is not None and self.result_layer in doc.layers:
            doc.replace_layer(self.result_layer, outcome.layer)
        else:
            doc.add_layer(outcome.layer)
        if same_source and self.nrmse_layer is not None and self.nrmse_layer in doc.layers:
            doc.replace_layer(self.nrmse_layer, outcome.nrmse)
        else:
            doc.add_layer(outcome.nrmse)
        self.source_layer, self.result_layer, self.full_layer = outcome.source, outcome.layer, outcome.layer
        self.nrmse_layer, self.weights, self.summary = outcome.nrmse, outcome.weights, outcome.summary
        self.result = outcome.result
        self.save_button.setEnabled(True)
        self.threshold.blockSignals(True)
        self.threshold.setValue(0)
        self.threshold.blockSignals(False)
        self.threshold.setEnabled(True)
        self._threshold_token += 1
        self._label_threshold()
        s = outcome.summary
        text = (
            f"Done: kept {s['kept']:,} of {s['streamlines']:,} streamlines (weight > 0); "
            f"{s['iterations']} iterations (stopped: {s['stopped']}); fit {seconds(s.get('fit_s', 0.0))}, "
            f"{seconds(outcome.seconds)} in all {computed_on(s)}."
        )
        if outcome.notes:
            text += " " + " ".join(note.rstrip(".") + "." for note in outcome.notes)
        self.status.setText(text)
        self.finished.emit(outcome.layer)

    def _cancelled(self) -> None:
        self.status.setText("COMMIT cancelled: nothing was added.")

    # ---------------------------------------------------------------- save
    def _save_clicked(self) -> None:
        folder = self._ask_folder()
        if folder:
            self.save_outputs(folder)

    def _ask_folder(self) -> str:
        """The folder the user picks for the outputs ("" if none); tests override it."""
        return dialogs.folder(self, "Folder for the COMMIT outputs") or ""

    def _confirm_overwrite(self, folder: Path, existing: list[str]) -> bool:
        """Whether to replace the COMMIT files already in ``folder``; tests override it."""
        shown = ", ".join(existing[:4]) + (f" and {len(existing) - 4} more" if len(existing) > 4 else "")
        return dialogs.question(
            self, "Replace the COMMIT outputs?", f"{folder} already holds COMMIT outputs ({shown}). Replace them?"
        )

    def save_outputs(self, folder, *, confirm: bool = True) -> int | None:
        """Write the last result (:func:`write_commit_outputs`: weights, filtered tractogram in the
        source's format, maps, summary) into ``folder`` on a worker; asks first (unless
        ``confirm`` is False) when the folder already holds COMMIT outputs. The job id, or None
        when nothing is written."""
        if self.result is None:
            return self._refuse("Filter first: there is no COMMIT result to save yet.")
        folder = Path(folder)
        existing = existing_outputs(folder) if folder.is_dir() else []
        if existing and confirm and not self._confirm_overwrite(folder, existing):
            self.status.setText(f"Not saved: the COMMIT outputs in {folder} were left as they were.")
            return None
        result, suffix = self.result, tractogram_suffix(self.source_layer)

        def job(ctx):
            ctx.progress(0, 1, f"writing {folder.name}")
            return write_commit_outputs(result, folder, suffix)

        def done(files: dict) -> None:
            self.status.setText(f"Saved {len(files)} COMMIT files to {folder}.")

        def failed(message: str, details: str) -> None:
            self.status.setText(f"Saving the COMMIT outputs failed: {message}")
            self.report(message, details)

        self.status.setText(f"Saving the COMMIT outputs to {folder}…")
        return self.runner.submit("save COMMIT outputs", job, on_done=done, on_error=failed)

    # ----------------------------------------------------------- threshold
    def threshold_value(self) -> float | None:
        """The weight at or below which streamlines are hidden; None: every one is shown."""
        step = self.threshold.value()
        if step == 0 or self.weights is None or len(self.weights) == 0:
            return None
        return float(self.weights.max()) * (step - 1) / (THRESHOLD_STEPS - 1)

    def visible_mask(self) -> np.ndarray | None:
        """The streamlines the slider shows (bool per streamline of the full result)."""
        if self.weights is None:
            return None
        threshold = self.threshold_value()
        return np.ones(len(self.weights), bool) if threshold is None else self.weights > threshold

    def _label_threshold(self) -> None:
        shown = self.result_layer if self.result_layer in self.document.layers else None
        self.threshold_label.setText(shown_label(self.threshold_value(), self.visible_mask(), shown))

    def _threshold_changed(self, _value: int) -> None:
        self._label_threshold()
        self._threshold_timer.start()

    def apply_threshold(self) -> int | None:
        """Show the streamlines above the slider's weight (the subset made on a worker)."""
        full, mask = self.full_layer, self.visible_mask()
        if full is None or mask is None or self.result_layer not in self.document.layers:
            return None
        self._threshold_token += 1
        token = self._threshold_token
        if mask.all():
            self._show_subset(token, full)
            return None
        clim, name, fiber_arrays = full.clim, full.name, self.document.fiber_arrays

        def job(ctx):
            layer = Layer(name, full.data.subset(mask, name=name), "tractogram", colormap="viridis", color_by=WEIGHT)
            layer.clim = clim
            fiber_arrays.prepare(layer)
            return layer

        return self.runner.submit(
            "COMMIT threshold",
            job,
            on_done=lambda layer, token=token: self._show_subset(token, layer),
            on_error=self.report,
        )

    def _show_subset(self, token: int, layer: Layer) -> None:
        old = self.result_layer
        if token != self._threshold_token or old is None or old not in self.document.layers or layer is old:
            return
        layer.set(
            visible=old.visible,
            opacity=old.opacity,
            colormap=old.colormap,
            color_by=old.color_by,
            clim=old.clim,
            tubes=old.tubes,
        )
        if layer is not self.full_layer:
            full = self.full_layer.provenance if self.full_layer is not None else old.provenance
            layer.provenance = {**full, "hidden_at_or_below_weight": self.threshold_value()}
        self.document.replace_layer(old, layer)
        self.result_layer = layer
