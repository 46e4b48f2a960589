"""The Presurgical panel: how close each tractogram's streamlines come to a lesion.

The panel holds no algorithm: "Measure" runs, in one job, :func:`compute_lesion_distance` for
every visible tractogram layer against the chosen lesion (an ROI, labels or scalar layer; its
non-zero voxels are the lesion). Each measured layer is replaced (same name, display settings
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
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from tractlens.app.model import Document, Layer
from tractlens.app.params import LesionDistanceParams
from tractlens.app.pipelines.connectivity import (
    DEFAULT_MARGIN_MM,
    DISTANCE_POINT_SCALAR,
    DistanceRow,
    RegionDistance,
    compute_lesion_distance,
    distance_row,
    with_distances,
)

from . import fiber_display
from .job_panel import JobPanelBase
from .layer_combo import LayerCombo
from .params_form import limits_of

SAFETY_MAP = "safety"
COLUMNS = ("tractogram", "streamlines", "closest (mm)", "within margin", "%")


def lesion_mask(layer: Layer) -> np.ndarray:
    """The lesion as a bool mask: an ROI's voxels, or a labels/scalar image's finite non-zero
    voxels."""
    if layer.kind == "roi":
        return np.asarray(layer.data.mask, dtype=bool)
    data = np.asarray(layer.data.data)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    return (data != 0) & np.isfinite(data)


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
        self.lesion_name = ""
        self.lesion_box = LayerCombo(
            document,
            ("roi", "labels", "scalar"),
            prefer=lambda layer: "lesion" in layer.name.lower(),
            show_kind=True,
        )
        self.lesion_box.setObjectName("presurgical_lesion")
        self.lesion_box.setToolTip("The lesion: the non-zero voxels of an ROI, labels or scalar layer")
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
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)

        form = QFormLayout()
        form.addRow("Lesion", self.lesion_box)
        form.addRow("Margin", self.margin_box)
        buttons = QHBoxLayout()
        buttons.addWidget(self.measure_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.table, 1)
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
            self.lesion_box.refresh()
            if self.measured:
                self.refresh_table()
        elif event == "display":
            layer = info.get("layer")
            if layer is not None and "selection" in info.get("changed", ()) and layer in self.measured.values():
                self.refresh_table()

    # --------------------------------------------------------------- measure
    def measure(self) -> int | None:
        """Measure every visible tractogram's distance to the chosen lesion (one job); the job id."""
        lesion = self.lesion_box.layer()
        if lesion is None:
            return self._refuse("Open or draw the lesion first (an ROI, a labels or a scalar image).")
        tracts = [layer for layer in self.document.layers if layer.kind == "tractogram" and layer.visible]
        if not tracts:
            return self._refuse("Show or open a tractogram first: its streamlines are measured.")
        device, clim, affine = self.device, self.clim, lesion.data.affine.copy()
        lesion_name = lesion.name
        token = self._next_token()
        self.status.setText(f"Distance of {len(tracts)} tractogram(s) to {lesion.name}…")
        mask = lesion_mask(lesion).copy()  # a snapshot: the lesion may be edited while the job runs

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
                fiber_display.prepare(new)  # display arrays off the GUI thread
                out.append((layer, new, distance))
            ctx.check()
            return out

        return self._start(
            f"distance to {lesion_name}",
            job,
            on_done=lambda out, token=token: self._done(token, out, lesion_name),
            token=token,
        )

    def _done(self, token: int, out, lesion_name: str) -> None:
        if token != self._token:
            return
        self._job_ended()
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
        if self.rows:
            closest = min(self.rows, key=lambda row: row.min_mm)
            where = (  # a tractogram of 0 streamlines has no closest approach
                f"closest {closest.name} at {closest.min_mm:.1f} mm"
                if np.isfinite(closest.min_mm)
                else "no streamline to measure (0 streamlines)"
            )
            self.status.setText(
                f"Distance to {lesion_name}: {len(self.measured)} tractogram(s); {where}. "
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
            rows.append(distance_row(name, per_streamline, self.margin_mm))
            if layer.selection is not None and len(layer.selection) == len(per_streamline):
                rows.append(distance_row(f"{name} (selected)", per_streamline[layer.selection], self.margin_mm))
        self.rows = rows
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            cells = (
                row.name,
                f"{row.streamlines:,}",
                f"{row.min_mm:.2f}" if np.isfinite(row.min_mm) else "–",
                f"{row.within_margin:,}",
                f"{row.percent_within:.1f}",
            )
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        return rows
