"""The Presurgical panel: how close each tractogram's streamlines come to a lesion.

The panel holds no algorithm: "Measure" runs, in one job, :func:`compute_lesion_distance` for
every visible tractogram layer against the chosen lesion. The lesion is chosen explicitly: the
panel picks one by itself only when a layer is marked as lesion (an ROI in the role "lesion", or
a layer named so); else the user picks an ROI or label map (non-zero voxels). A scalar map (FA,
MD…) is offered only when "Scalar map ≥" is ticked, and then its voxels at or above that
threshold are the lesion. A lesion removed from the document clears the choice, and the panel
says so; it never falls back to another layer. Each measured layer is replaced (same name, display settings
and selection) by a layer whose tractogram is :func:`with_distances`' copy (arrays shared)
carrying the per-point distance :data:`DISTANCE_POINT_SCALAR` and the per-streamline closest
approach :data:`DISTANCE_STREAMLINE_SCALAR`, coloured by the point distance with the "safety"
colour map over (0, 2 × margin): red within the margin, yellow at it, green beyond. A new layer
rather than scalars added to the open one, because the views prepare a layer's display arrays
(its scalars included) once per layer; the new layer's arrays are prepared on the worker.

The table has a row per measured tractogram and, for one with a selection (ROIs, a connectivity
cell), a row "<name> (selected)" over the selected streamlines: streamlines, the closest
approach (mm), how many come within the margin and their percentage. Changing the margin
re-colours and refreshes the table without measuring again.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from tractlens.app.envelopes import LEVEL_MEANING, envelope_set_of_masks, lesion_distances
from tractlens.app.model import Document, Layer
from tractlens.app.params import LesionDistanceParams
from tractlens.app.pipelines.connectivity import (
    DEFAULT_MARGIN_MM,
    DISTANCE_POINT_SCALAR,
    DistanceRow,
    RegionDistance,
    compute_lesion_distance,
    default_lesion,
    distance_rows,
    distance_to_lesion_mm,
    lesion_choices,
    lesion_mask_of,
    with_distances,
)

from .envelope_display import envelope_rows, is_envelope
from .job_panel import JobPanelBase
from .layer_combo import LayerCombo, named_with_kind
from .params_form import limits_of

SAFETY_MAP = "safety"
# Four columns fit a dock at 1280 px: the share within the margin joins its count, and what each
# row counts of its tractogram ("12 of 65 shown") is said under the table and in the row's tips.
COLUMNS = ("tractogram", "streamlines", "closest (mm)", "within margin")
NO_LESION = "(choose the lesion)"


def lesion_mask(layer: Layer, threshold: float | None = None) -> np.ndarray:
    """The lesion as a bool mask (:func:`~app.pipelines.connectivity.lesion_mask_of`)."""
    return lesion_mask_of(layer, threshold)


class LesionCombo(LayerCombo):
    """The lesion chooser: ROIs and label maps (scalar maps when :attr:`scalar_maps`), a choice
    made only by the user or by a layer marked as lesion, never a fallback to another layer."""

    def __init__(self, document: Document, parent=None):
        self.scalar_maps = False
        self.lost: str | None = None  # the name of a chosen lesion that was removed
        super().__init__(document, ("roi", "labels", "scalar"), show_kind=True, parent=parent)

    def refresh(self) -> None:
        layers = lesion_choices(self.document.layers, scalar_maps=self.scalar_maps)
        if self._chosen is not None and self._chosen not in layers:
            if self._chosen not in self.document.layers:
                self.lost = self._chosen.name
            self._chosen = None
        if self._chosen is None and self.lost is None:
            self._chosen = default_lesion(layers)
        self.layers = layers
        self.blockSignals(True)
        self.clear()
        for layer in layers:
            self.addItem(named_with_kind(layer))
        self.setCurrentIndex(layers.index(self._chosen) if self._chosen is not None else -1)
        self.setPlaceholderText(NO_LESION)
        self.blockSignals(False)

    def _picked(self, index: int) -> None:
        super()._picked(index)
        self.lost = None

    def choose(self, layer: Layer) -> None:
        self.lost = None
        if layer.kind == "scalar":
            self.scalar_maps = True
        super().choose(layer)

    def layer(self) -> Layer | None:
        return self._chosen if self._chosen in self.layers else None


class PresurgicalPanel(JobPanelBase):
    """Lesion, margin, Measure, Cancel and the distance table.

    For scripts and tests: :meth:`measure` (the job id), ``margin_mm``, ``rows`` (the table's
    :class:`~app.pipelines.connectivity.DistanceRow`), ``distances`` (layer name →
    :class:`~gpu.tractometry.RegionDistance`), ``measured`` (layer name → the measured layer),
    ``lesion_name``, ``table``."""

    job_label = "Distance to lesion"

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.distances: dict[str, RegionDistance] = {}
        self.measured: dict[str, Layer] = {}
        self.rows: list[DistanceRow] = []
        self.envelope_rows: list = []  # the uncertainty envelopes' rows (widgets.envelope_display)
        self.lesion_name = ""
        self.lesion_box = LesionCombo(document)
        self.lesion_box.setObjectName("presurgical_lesion")
        self.lesion_box.setToolTip(
            "The lesion: an ROI's voxels or a label map's non-zero voxels. Chosen by itself only when a "
            "layer is marked as lesion (ROI role 'lesion', or named so)"
        )
        self.lesion_box.activated.connect(lambda _i: self._lesion_changed())
        self.scalar_box = QCheckBox("Scalar map ≥")
        self.scalar_box.setObjectName("presurgical_scalar_lesion")
        self.scalar_box.setToolTip("Offer scalar maps too: their voxels at or above the threshold are the lesion")
        self.scalar_box.toggled.connect(self._scalar_toggled)
        self.threshold_box = QDoubleSpinBox()
        self.threshold_box.setObjectName("presurgical_threshold")
        self.threshold_box.setRange(-1e9, 1e9)
        self.threshold_box.setDecimals(3)
        self.threshold_box.setValue(0.5)
        self.threshold_box.setEnabled(False)
        self.margin_box = QDoubleSpinBox()
        self.margin_box.setObjectName("presurgical_margin")
        self.margin_box.setRange(*limits_of(LesionDistanceParams, "margin_mm"))
        self.margin_box.setDecimals(1)
        self.margin_box.setSingleStep(0.5)
        self.margin_box.setSuffix(" mm")
        self.margin_box.setValue(DEFAULT_MARGIN_MM)
        self.margin_box.setToolTip("Safety margin: streamlines closer than this are counted (and drawn red to yellow)")
        self.margin_box.valueChanged.connect(self._margin_changed)
        self.measure_button = QPushButton("Measure")
        self.measure_button.setObjectName("presurgical_measure")
        self.measure_button.setToolTip("Distance of every visible tractogram's streamlines to the lesion")
        self.measure_button.clicked.connect(self.measure)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("presurgical_table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        for column in range(len(COLUMNS)):  # every column as wide as its text; the table scrolls sideways
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)

        form = QFormLayout()
        form.addRow("Lesion", self.lesion_box)
        threshold_row = QHBoxLayout()
        threshold_row.addWidget(self.scalar_box)
        threshold_row.addWidget(self.threshold_box, 1)
        form.addRow("", threshold_row)
        form.addRow("Margin", self.margin_box)
        buttons = QHBoxLayout()
        buttons.addWidget(self.measure_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.table, 1)
        self.meaning = QLabel(LEVEL_MEANING)  # shown with envelope rows: what a level means
        self.meaning.setObjectName("envelope_meaning")
        self.meaning.setWordWrap(True)
        self.meaning.setVisible(False)
        layout.addWidget(self.meaning)
        self.shown_note = QLabel("")  # rows that count only the streamlines shown
        self.shown_note.setObjectName("presurgical_shown")
        self.shown_note.setWordWrap(True)
        self.shown_note.setVisible(False)
        layout.addWidget(self.shown_note)
        layout.addWidget(self.status)
        document.connect(self._on_document)

    @property
    def margin_mm(self) -> float:
        return float(self.margin_box.value())

    @property
    def clim(self) -> tuple[float, float]:
        return (0.0, 2.0 * self.margin_mm)

    # ------------------------------------------------------------- document
    def _on_document(self, _source, event, **info) -> None:
        if event == "layers":
            if "replaced" in info:
                self.lesion_box.follow(*info["replaced"])
            lost_before = self.lesion_box.lost
            self.lesion_box.refresh()
            if self.lesion_box.lost is not None and self.lesion_box.lost != lost_before:
                self.status.setText(
                    f"The lesion {self.lesion_box.lost} was removed: no lesion is chosen now. Choose the lesion "
                    "again before measuring."
                )
            if self.measured:
                self.refresh_table()
        elif event == "display":
            layer = info.get("layer")
            if (
                layer is not None
                and layer.kind in ("roi", "scalar")
                and {"role", "name"} & set(info.get("changed", ()))
            ):
                self.lesion_box.refresh()  # marked as lesion (or no longer)
            if layer is not None and "selection" in info.get("changed", ()) and layer in self.measured.values():
                self.refresh_table()

    # --------------------------------------------------------------- measure
    def measure(self) -> int | None:
        """Measure every visible tractogram's distance to the chosen lesion (one job); the job id."""
        lesion = self.lesion_box.layer()
        if lesion is None:
            return self._refuse(
                "Choose the lesion first: an ROI (its role 'lesion' picks it by itself) or a label map; a scalar "
                "map only with 'Scalar map ≥' and a threshold."
            )
        tracts = [layer for layer in self.document.layers if layer.kind == "tractogram" and layer.visible]
        shells = [layer for layer in self.document.layers if is_envelope(layer) and layer.visible]
        if not tracts and not shells:
            return self._refuse("Show or open a tractogram first: its streamlines are measured.")
        shell_levels = [layer.provenance["envelope_level"] for layer in shells]
        shell_masks = [layer.data.data.astype(bool) for layer in shells]  # copies: layers may change meanwhile
        shell_affine = shells[0].data.affine.copy() if shells else None
        device, clim, affine = self.device, self.clim, lesion.data.affine.copy()
        lesion_name = lesion.name
        token = self._next_token()
        self.status.setText(f"Distance of {_tractograms(len(tracts))} to {lesion.name}…")
        mask = lesion_mask(lesion, self.lesion_threshold(lesion)).copy()  # a snapshot: it may be edited meanwhile
        if not mask.any():
            return self._refuse(f"The lesion {lesion.name} has no voxel: draw it, or lower the threshold.")

        fiber_arrays = self.document.fiber_arrays

        def job(ctx):
            out = []
            for i, layer in enumerate(tracts):
                ctx.check()
                ctx.progress(i, len(tracts), f"distance to {lesion_name}: {layer.name}")
                distance = compute_lesion_distance(layer.data, mask, affine, device=device, cancelled=ctx.cancelled)
                new = Layer(
                    layer.name,
                    with_distances(layer.data, distance),
                    "tractogram",
                    colormap=SAFETY_MAP,
                    color_by=DISTANCE_POINT_SCALAR,
                    clim=clim,
                    visible=layer.visible,
                    opacity=layer.opacity,
                    tubes=layer.tubes,
                )
                new.provenance = {
                    **layer.provenance,
                    "lesion distance": {"lesion": lesion_name, **distance.provenance},
                }
                fiber_arrays.prepare(new)  # display arrays off the GUI thread
                out.append((layer, new, distance))
            ctx.check()
            if shells:  # the envelopes' distances (app.envelopes: nearest voxel centres)
                found = envelope_set_of_masks(shell_levels, shell_masks, shell_affine)
                shell_out = list(zip(shells, lesion_distances(found, mask, affine), strict=True))
                return out, shell_out
            return out, []

        return self._start(
            f"distance to {lesion_name}",
            job,
            on_done=lambda out, token=token: self._done(token, out, lesion_name),
            token=token,
        )

    def _done(self, token: int, both, lesion_name: str) -> None:
        if token != self._token:
            return
        self._job_ended()
        out, shells = both
        for layer, distance in shells:
            layer.provenance = {**layer.provenance, "lesion distance": {"lesion": lesion_name, **distance.as_dict()}}
        doc = self.document
        self.distances, self.measured, self.lesion_name = {}, {}, lesion_name
        clim = self.clim  # the margin may have changed while the job ran
        for old, new, distance in out:
            if old not in doc.layers:
                continue
            new.clim = clim
            new.selection = old.selection  # the ROI (or connectivity) selection stays
            self.distances[new.name] = distance
            self.measured[new.name] = new
            doc.replace_layer(old, new)
        self.refresh_table()
        if self.envelope_rows and not self.rows:
            levels = ", ".join(f"{row.level:g} % {row.closest_text} mm" for row in self.envelope_rows)
            self.status.setText(f"Distance to {lesion_name} of the uncertainty envelopes: {levels}.")
        if self.rows and any(np.isfinite(row.min_mm) for row in self.rows):
            closest = min(self.rows, key=lambda row: row.min_mm)
            where = (  # a tractogram of 0 streamlines has no closest approach
                f"closest {closest.name} at {closest.min_mm:.1f} mm"
                if np.isfinite(closest.min_mm)
                else "no streamline to measure (0 streamlines)"
            )
            self.status.setText(
                f"Distance to {lesion_name}: {_tractograms(len(self.measured))}; {where}. "
                f"Coloured red within the {self.margin_mm:g} mm margin, green beyond."
            )

    def _cancelled(self) -> None:
        self.status.setText("Distance to lesion cancelled: nothing was changed.")

    def _progress_text(self, job) -> str:
        return f"Distance to the lesion: tractogram {job.done + 1} of {job.total}…"

    # ----------------------------------------------------------------- table
    def _margin_changed(self, _value: float) -> None:
        clim = self.clim
        for layer in self.measured.values():
            if layer in self.document.layers and layer.color_by == DISTANCE_POINT_SCALAR:
                layer.set(clim=clim)
        self.refresh_table()

    def refresh_table(self) -> list[DistanceRow]:
        """Rebuild ``rows`` and the table from the stored distances and the margin."""
        rows = []
        for name, layer in self.measured.items():
            if layer not in self.document.layers:
                continue
            per_streamline = self.distances[name].per_streamline
            rows += distance_rows(name, per_streamline, self.margin_mm, layer.selection, layer.selection_by)
        self.rows = rows
        shells = envelope_rows(self.document, self.margin_mm)
        self.envelope_rows = shells
        self.table.setRowCount(len(rows) + len(shells))
        for r, row in enumerate(rows):
            cells = (
                row.name,
                f"{row.streamlines:,}",
                f"{row.min_mm:.2f}" if np.isfinite(row.min_mm) else "none",
                f"{row.within_margin:,} ({row.percent_within:.1f} %)",
            )
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(row.shown)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        for r, row in enumerate(shells, start=len(rows)):
            for c, text in enumerate(row.cells()):
                item = QTableWidgetItem(text)
                item.setToolTip(LEVEL_MEANING)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        self.meaning.setVisible(bool(shells))
        partial = [f"{row.name}: {row.shown}" for row in rows if not row.shown.startswith("all ")]
        self.shown_note.setText("; ".join(partial) + "." if partial else "")
        self.shown_note.setVisible(bool(partial))
        return rows

    # ---------------------------------------------------------------- lesion
    def lesion_threshold(self, layer: Layer | None = None) -> float | None:
        """The threshold of a scalar-map lesion (None for ROIs and label maps)."""
        layer = layer if layer is not None else self.lesion_box.layer()
        return float(self.threshold_box.value()) if layer is not None and layer.kind == "scalar" else None

    def _scalar_toggled(self, on: bool) -> None:
        self.threshold_box.setEnabled(on)
        self.lesion_box.scalar_maps = on
        self.lesion_box.refresh()

    def _lesion_changed(self) -> None:
        lesion = self.lesion_box.layer()
        if lesion is not None:
            self.status.setText(f"Lesion: {lesion.name}. Measure to see how close the streamlines come.")

    def cursor_distance_text(self, ijk) -> str:
        """The distance from a reference voxel (the mouse) to the chosen lesion, for the status line."""
        lesion, doc = self.lesion_box.layer(), self.document
        if lesion is None or doc.reference_affine is None or ijk is None:
            return ""
        world = doc.reference_affine[:3, :3] @ np.asarray(ijk, dtype=float) + doc.reference_affine[:3, 3]
        distance = distance_to_lesion_mm(doc, lesion, world, self.lesion_threshold(lesion))
        if distance is None:
            return ""
        return f"to {lesion.name} {distance:.1f} mm" if distance > 0 else f"in {lesion.name}"

    def lesion_choice_state(self) -> dict:
        """The lesion choice for a session: the chosen layer's name, scalar maps offered, threshold."""
        lesion = self.lesion_box.layer()
        return {
            "chosen": lesion.name if lesion is not None else "",
            "scalar_maps": self.scalar_box.isChecked(),
            "threshold": float(self.threshold_box.value()),
        }

    def restore_lesion_choice(self, state: dict) -> None:
        """Choose the lesion a session saved (by name; nothing when it is not there)."""
        self.threshold_box.setValue(float(state.get("threshold", self.threshold_box.value())))
        self.scalar_box.setChecked(bool(state.get("scalar_maps", False)))
        name = str(state.get("chosen", ""))
        layer = next((layer for layer in self.document.layers if layer.name == name), None)
        if layer is not None and layer in lesion_choices(self.document.layers, scalar_maps=self.lesion_box.scalar_maps):
            self.lesion_box.choose(layer)


def _tractograms(count: int) -> str:
    return f"{count} tractogram" + ("" if count == 1 else "s")
