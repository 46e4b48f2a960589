"""The Connectivity panel: a region × region matrix of a tractogram over a parcellation, shown
as a heat map whose cells select their streamlines in 3-D, and along-tract profiles.

The panel holds no algorithm: "Compute" runs :func:`app.pipelines.connectivity.compute_connectome`
on a worker (the chosen tractogram layer, the chosen labels layer with its lookup table, the
weight and the endpoint search radius); "Probabilistic run" builds the seeds × targets counts of
the Probabilistic tracking panel's last run (:func:`seed_target_matrix`, on a worker too), whose
streamlines are not kept, so its cells only report counts. "Profile" (second tab) runs
:func:`compute_profile` of a bundle (a tractogram layer; its selected streamlines only when it
has a selection) over a scalar map. CSV files are written on workers.

:class:`~widgets.connectivity_plots.HeatMap` and :class:`~widgets.connectivity_plots.ProfilePlot`
(in :mod:`widgets.connectivity_plots`) are plain QPainter widgets (no matplotlib).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.grid import Grid
from tractlens.app.io.lut import load_lut
from tractlens.app.model import Document, Layer
from tractlens.app.params import ConnectomeParams, ProfileParams
from tractlens.app.pipelines.connectivity import (
    WEIGHTS,
    ConnectivityMatrix,
    compute_connectome,
    compute_profile,
    profile_csv_text,
    seed_target_matrix,
    write_matrix_csv,
    write_text_atomic,
)

from . import dialogs
from .connectivity_plots import ORDERS, HeatMap, ProfilePlot
from .job_panel import JobPanelBase
from .layer_combo import LayerCombo
from .params_form import limits_of, spin_for

CSV_FILTER = "CSV (*.csv);;All files (*)"
LUT_FILTER = "Lookup tables (*.txt *.tsv *.csv *.ctbl *.lut);;All files (*)"


def _has_lut(layer: Layer) -> bool:
    return getattr(layer.data, "lut", None) is not None


class ConnectivityPanel(JobPanelBase):
    """Matrix tab: tractogram, labels, weight, radius, Lookup table…, Compute, Probabilistic
    run, log scale, order, Show all, Save CSV… and the heat map. Profile tab: bundle, map,
    points, Profile, Save CSV… and the plot.

    For scripts and tests: :meth:`compute`, :meth:`probabilistic_matrix`, :meth:`select_cell`,
    :meth:`show_all`, :meth:`save_csv`, :meth:`load_lookup_table`, :meth:`compute_profile`,
    :meth:`save_profile_csv`; attributes ``matrix`` (the shown :class:`ConnectivityMatrix`),
    ``matrix_layer`` (the tractogram it was computed from; None for a probabilistic run),
    ``profile`` (the last :class:`gpu.tractometry.Profile`), ``heatmap``, ``plot``, ``job_id``."""

    job_label = "Connectivity"

    def __init__(
        self, document: Document, runner, *, device: str = "auto", report=None, probabilistic=None, parent=None
    ):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.probabilistic = probabilistic  # the Probabilistic tracking panel (its .run and .result)
        self.matrix: ConnectivityMatrix | None = None
        self.matrix_layer: Layer | None = None
        self.profile = None
        self.profile_map: str = ""
        self._profile_affine: np.ndarray | None = None

        # ---- matrix tab
        self.tract_box = LayerCombo(document, ("tractogram",))
        self.tract_box.setObjectName("connectivity_tractogram")
        self.labels_box = LayerCombo(document, ("labels",), prefer=_has_lut)
        self.labels_box.setObjectName("connectivity_labels")
        self.labels_box.setToolTip("The parcellation: each non-zero label is a region")
        self.weight_box = QComboBox()
        self.weight_box.setObjectName("connectivity_weight")
        for i, (name, text) in enumerate(WEIGHTS.items()):
            self.weight_box.addItem(name)
            self.weight_box.setItemData(i, text, Qt.ItemDataRole.ToolTipRole)
        self.radius_box = QDoubleSpinBox()
        self.radius_box.setObjectName("connectivity_radius")
        self.radius_box.setRange(*limits_of(ConnectomeParams, "radius_mm"))
        self.radius_box.setDecimals(1)
        self.radius_box.setSuffix(" mm")
        self.radius_box.setValue(ConnectomeParams.radius_mm)
        self.radius_box.setToolTip("Search this far from a streamline's end for a region (0: the end's voxel only)")
        self.lut_button = QPushButton("Lookup table…")
        self.lut_button.setToolTip("Names for the labels (FreeSurfer colour table or 'index name' lines)")
        self.lut_button.clicked.connect(self._lut_clicked)
        self.compute_button = QPushButton("Compute")
        self.compute_button.setObjectName("connectivity_compute")
        self.compute_button.clicked.connect(self.compute)
        self.prob_button = QPushButton("Probabilistic run")
        self.prob_button.setToolTip(
            "The seeds × targets counts of the last probabilistic run (rows: the labels' regions when "
            "the parcellation is on the run's grid)"
        )
        self.prob_button.clicked.connect(self.probabilistic_matrix)
        self.log_box = QCheckBox("log scale")
        self.log_box.setToolTip("Colour by log(1 + value)")
        self.sort_box = QComboBox()
        self.sort_box.setObjectName("connectivity_order")
        for mode, text in ORDERS.items():
            self.sort_box.addItem(text, mode)
        self.show_all_button = QPushButton("Show all")
        self.show_all_button.setToolTip("Show every streamline of the tractogram again")
        self.show_all_button.clicked.connect(self.show_all)
        self.save_button = QPushButton("Save CSV…")
        self.save_button.setEnabled(False)
        self.save_button.clicked.connect(lambda: self.save_csv())
        self.heatmap = HeatMap()
        self.heatmap.cell_clicked.connect(self.select_cell)
        self.log_box.toggled.connect(self.heatmap.set_log_scale)
        self.sort_box.currentIndexChanged.connect(lambda _i: self.heatmap.set_order(self.sort_box.currentData()))

        form = QFormLayout()
        form.addRow("Tractogram", self.tract_box)
        form.addRow("Labels", self.labels_box)
        form.addRow("Weight", self.weight_box)
        form.addRow("Radius", self.radius_box)
        row1 = QHBoxLayout()
        for widget in (self.lut_button, self.compute_button, self.cancel_button):
            row1.addWidget(widget)
        row2 = QHBoxLayout()
        for widget in (self.prob_button, self.show_all_button, self.save_button):
            row2.addWidget(widget)
        row3 = QHBoxLayout()
        row3.addWidget(self.log_box)
        row3.addWidget(self.sort_box, 1)
        matrix_tab = QWidget()
        matrix_layout = QVBoxLayout(matrix_tab)
        matrix_layout.setContentsMargins(2, 2, 2, 2)
        matrix_layout.addLayout(form)
        matrix_layout.addLayout(row1)
        matrix_layout.addLayout(row2)
        matrix_layout.addLayout(row3)
        matrix_layout.addWidget(self.heatmap, 1)

        # ---- profile tab
        self.bundle_box = LayerCombo(document, ("tractogram",))
        self.bundle_box.setObjectName("profile_bundle")
        self.bundle_box.setToolTip("The bundle (its selected streamlines only, when it has a selection)")
        self.map_box = LayerCombo(document, ("scalar",), prefer=lambda layer: layer.name.upper() == "FA")
        self.map_box.setObjectName("profile_map")
        self.points_box = QSpinBox()
        self.points_box.setObjectName("profile_points")
        spin_for(ProfileParams, "n_points", self.points_box)
        self.profile_button = QPushButton("Profile")
        self.profile_button.clicked.connect(self.compute_profile)
        self.profile_save_button = QPushButton("Save CSV…")
        self.profile_save_button.setEnabled(False)
        self.profile_save_button.clicked.connect(lambda: self.save_profile_csv())
        self.plot = ProfilePlot()
        pform = QFormLayout()
        pform.addRow("Bundle", self.bundle_box)
        pform.addRow("Map", self.map_box)
        pform.addRow("Points", self.points_box)
        prow = QHBoxLayout()
        prow.addWidget(self.profile_button)
        prow.addWidget(self.profile_save_button)
        profile_tab = QWidget()
        profile_layout = QVBoxLayout(profile_tab)
        profile_layout.setContentsMargins(2, 2, 2, 2)
        profile_layout.addLayout(pform)
        profile_layout.addLayout(prow)
        profile_layout.addWidget(self.plot, 1)

        self.tabs = QTabWidget()
        self.tabs.addTab(matrix_tab, "Matrix")
        self.tabs.addTab(profile_tab, "Profile")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.status)
        self.combos = (self.tract_box, self.labels_box, self.bundle_box, self.map_box)
        document.connect(self._on_document)

    # ------------------------------------------------------------- document
    def _on_document(self, _source, event, **info) -> None:
        if event != "layers":
            return
        if "replaced" in info:
            old, new = info["replaced"]
            for box in self.combos:
                box.follow(old, new)
            if self.matrix_layer is old and new.kind == "tractogram" and len(new.data) == len(old.data):
                self.matrix_layer = new
        for box in self.combos:
            box.refresh()

    # ---------------------------------------------------------------- matrix
    def compute(self) -> int | None:
        """Start the connectome of the chosen tractogram over the chosen labels; the job id."""
        tract_layer, labels_layer = self.tract_box.layer(), self.labels_box.layer()
        if tract_layer is None:
            return self._refuse("Open or track a tractogram first: the matrix counts its streamlines.")
        if len(tract_layer.data) == 0:
            return self._refuse(f"{tract_layer.name} holds 0 streamlines: no connection to count.")
        if labels_layer is None:
            return self._refuse("Open a parcellation (a labels image) first: its regions are the matrix's rows.")
        weight = self.weight_box.currentText()
        radius = float(self.radius_box.value())
        tract, labels, lut, device = tract_layer.data, labels_layer.data, labels_layer.data.lut, self.device
        token = self._next_token()
        self.status.setText(f"Connectome of {tract_layer.name} over {labels_layer.name} ({weight})…")

        def job(ctx):
            ctx.progress(0, 1, "assigning streamline ends to regions")
            matrix = compute_connectome(
                tract,
                labels,
                weight=weight,
                lut=lut,
                radius_mm=radius,
                device=device,
                progress=lambda done, total: ctx.progress(done, total, "assigning streamline ends"),
                cancelled=ctx.cancelled,
            )
            ctx.check()
            return matrix

        return self._start(
            f"connectome ({tract_layer.name})",
            job,
            on_done=lambda matrix, token=token: self._matrix_done(token, matrix, tract_layer),
            token=token,
        )

    def _matrix_done(self, token: int, matrix: ConnectivityMatrix, layer: Layer | None) -> None:
        if token != self._token:
            return
        self._job_ended()
        self.show_matrix(matrix, layer)
        if matrix.symmetric:
            prov = matrix.provenance
            links = int(np.count_nonzero(np.triu(np.asarray(matrix.counts))))
            self.status.setText(
                f"{prov.get('assigned', 0):,} of {prov.get('streamlines', 0):,} streamlines join two regions; "
                f"{links} connection{'s' if links != 1 else ''} among {len(matrix.row_names)} regions "
                f"({matrix.measure}). Click a cell to select its streamlines."
            )

    def show_matrix(self, matrix: ConnectivityMatrix | None, layer: Layer | None = None) -> None:
        """Show a matrix in the heat map (``layer``: the tractogram whose streamlines it counts)."""
        self.matrix, self.matrix_layer = matrix, layer
        self.heatmap.set_matrix(matrix)
        self.save_button.setEnabled(matrix is not None)

    def probabilistic_matrix(self) -> int | None:
        """The seeds × targets counts of the Probabilistic panel's last run (on a worker)."""
        panel = self.probabilistic
        run = getattr(panel, "run", None)
        result = getattr(panel, "result", None)
        if run is None or result is None:
            return self._refuse("Run probabilistic tracking first (Probabilistic tracking panel).")
        if not run.targets:
            return self._refuse("The last probabilistic run had no target ROI: there is nothing to count.")
        labels_layer = self.labels_box.layer()
        labels, lut, grouped = None, None, ""
        if labels_layer is not None:
            vol, samples = labels_layer.data, run.samples
            if Grid.of(vol).matches((samples.affine, samples.mask.shape[:3])):
                labels, lut, grouped = vol, vol.lut, f" grouped by {labels_layer.name}"
            else:
                grouped = f" ({labels_layer.name} is not on the run's grid: one row for all seeds)"
        seeds, counts, targets = run.seeds, np.array(result.seed_targets, copy=True), list(run.targets)
        token = self._next_token()

        def job(ctx):
            ctx.progress(0, 1, "seed × target counts")
            return seed_target_matrix(seeds, counts, targets, labels=labels, lut=lut)

        def done(matrix, token=token):
            if token != self._token:
                return
            self._job_ended()
            self.show_matrix(matrix, None)
            self.status.setText(
                f"Probabilistic run: {len(seeds):,} seed voxels × {len(targets)} targets{grouped}. Its "
                "streamlines are not kept: a cell shows its count only."
            )

        return self._start("seed × target matrix", job, on_done=done, token=token)

    def select_cell(self, row: int, column: int) -> np.ndarray | None:
        """Select the streamlines of a cell (original indices) in 3-D; the selection (None for a
        probabilistic run's matrix, whose streamlines are not kept)."""
        m = self.matrix
        if m is None:
            return None
        self.heatmap.highlight = (int(row), int(column))
        self.heatmap.update()
        label = self.heatmap.tooltip_text(row, column)
        selected = m.cell_streamlines(row, column)
        if selected is None:
            self.status.setText(f"{label}. A probabilistic run keeps no streamlines: nothing to select in 3-D.")
            return None
        layer = self.matrix_layer
        if layer is None or layer not in self.document.layers or len(layer.data) != len(selected):
            self.status.setText(f"{label}. The tractogram of this matrix is no longer open: Compute again.")
            return None
        layer.set_selection(selected)
        n = int(selected.sum())
        self.status.setText(
            f"{label}: {n:,} of {len(selected):,} streamlines selected in {layer.name} (Show all to see every one)."
        )
        return selected

    def show_all(self) -> None:
        layer = self.matrix_layer or self.tract_box.layer()
        if layer is not None and layer in self.document.layers:
            layer.set_selection(None)
            self.heatmap.highlight = None
            self.heatmap.update()
            self.status.setText(f"Every streamline of {layer.name} shown.")

    def _ask_save_path(self, title: str, name: str) -> str:
        """The file the user picks ("" if none); tests pass a path instead."""
        return dialogs.save_file(self, title, name, CSV_FILTER) or ""

    def save_csv(self, path=None) -> int | None:
        """Write the shown matrix as CSV (on a worker); asks for the file when ``path`` is None."""
        if self.matrix is None:
            return self._refuse("Compute a matrix first: there is nothing to save yet.")
        if path is None:
            path = self._ask_save_path("Save the connectivity matrix", "connectome.csv")
            if not path:
                return None
        matrix, path = self.matrix, Path(path)

        def job(ctx):
            ctx.progress(0, 1, f"writing {path.name}")
            return write_matrix_csv(matrix, path)

        self.status.setText(f"Saving {path.name}…")
        return self.runner.submit(
            "save connectivity CSV",
            job,
            on_done=lambda written: self.status.setText(f"Saved the matrix to {written}."),
            on_error=self._save_failed,
        )

    def _save_failed(self, message: str, details: str) -> None:
        self.status.setText(f"Saving failed: {message}")
        self.report(message, details)

    def _lut_clicked(self) -> None:
        path = dialogs.open_file(self, "Lookup table for the labels", LUT_FILTER)
        if path:
            self.load_lookup_table(path)

    def load_lookup_table(self, path, layer: Layer | None = None) -> int | None:
        """Read a lookup table (on a worker) into the labels layer's volume (``.lut``): the
        region names of the next matrix."""
        layer = layer or self.labels_box.layer()
        if layer is None:
            return self._refuse("Open a parcellation (a labels image) first, then its lookup table.")
        path = Path(path)

        def job(ctx):
            ctx.progress(0, 1, f"reading {path.name}")
            return load_lut(path)

        def done(lut):
            layer.data.lut = lut
            self.status.setText(f"{path.name}: names for {layer.name}'s labels; Compute to use them.")

        return self.runner.submit("read lookup table", job, on_done=done, on_error=self._save_failed)

    # --------------------------------------------------------------- profile
    def compute_profile(self) -> int | None:
        """Start the profile of the chosen bundle over the chosen map; the job id."""
        bundle, scalar = self.bundle_box.layer(), self.map_box.layer()
        if bundle is None:
            return self._refuse("Open or track a tractogram first: the profile follows its streamlines.")
        if len(bundle.data) == 0:
            return self._refuse(f"{bundle.name} holds 0 streamlines: there is no course to profile.")
        if scalar is None:
            return self._refuse("Open a scalar map (FA, MD, …) first: the profile samples it.")
        selection = None if bundle.selection is None else bundle.selection.copy()
        if selection is not None and not selection.any():
            return self._refuse(f"No streamline of {bundle.name} is selected: Show all, or select some.")
        tract, volume, n_points, device = bundle.data, scalar.data, int(self.points_box.value()), self.device
        map_name, affine = scalar.name, scalar.data.affine.copy()
        token = self._next_token()
        which = "selected streamlines" if selection is not None else "streamlines"
        self.status.setText(f"Profile of {scalar.name} along {bundle.name}…")

        def job(ctx):
            ctx.progress(0, 1, "resampling the bundle")
            part = tract if selection is None else tract.subset(selection)
            return compute_profile(part, volume, n_points, device=device)

        def done(profile, token=token):
            if token != self._token:
                return
            self._job_ended()
            self.profile, self.profile_map, self._profile_affine = profile, map_name, affine
            streamlines = profile.provenance.get("streamlines", "?")
            self.plot.set_profile(profile, map_name, f"{bundle.name}: {streamlines} {which}")
            self.profile_save_button.setEnabled(True)
            self.tabs.setCurrentIndex(1)
            self.status.setText(
                f"Profile of {map_name} along {bundle.name}: {streamlines} {which}, {len(profile.mean)} points "
                f"(mean {np.nanmean(profile.mean):.4g})."
            )

        return self._start(f"profile ({bundle.name})", job, on_done=done, token=token)

    def save_profile_csv(self, path=None) -> int | None:
        """Write the last profile as CSV (on a worker); asks for the file when ``path`` is None."""
        if self.profile is None:
            return self._refuse("Compute a profile first: there is nothing to save yet.")
        if path is None:
            path = self._ask_save_path("Save the profile", f"profile_{self.profile_map}.csv")
            if not path:
                return None
        profile, affine, name, path = self.profile, self._profile_affine, self.profile_map, Path(path)

        def job(ctx):
            ctx.progress(0, 1, f"writing {path.name}")
            return write_text_atomic(profile_csv_text(profile, affine, name), path)

        self.status.setText(f"Saving {path.name}…")
        return self.runner.submit(
            "save profile CSV",
            job,
            on_done=lambda written: self.status.setText(f"Saved the profile to {written}."),
            on_error=self._save_failed,
        )
