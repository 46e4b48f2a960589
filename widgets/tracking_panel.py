"""The Deterministic tracking panel: parameters, seeding, Track / Cancel, live results.

The panel holds no algorithm. Track takes a snapshot of the direction field chosen (a tensor
layer, or an fODF layer tracked through :func:`app.fod_layers.track_on_fod`) and of the
ROIs (:func:`app.regions.roi_snapshot`), brings them into their roles on the tensor grid
(:mod:`app.regions`: seed; every target and waypoint passed; exclusion avoided; stop
ends streamlines), and runs :func:`app.pipelines.track.deterministic_from_regions` on
a worker. Batches of streamlines arrive while the rest is computed and replace the
panel's result layer, so the fibres grow on screen; a cancelled run keeps what it
had shown.
"""

from __future__ import annotations

import time

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.fod_layers import track_on_fod
from tractlens.app.model import Document, Layer, Tractogram
from tractlens.app.params import PLACEMENTS, GeodesicSeedingParams, SeedingParams, field_of
from tractlens.app.pipelines.track import (
    INTERACTIVE_FIRST_BATCH,
    DeterministicParams,
    GeodesicParams,
    MetricParams,
    deterministic_from_regions,
    geodesic_from_regions,
    geodesic_metric_of,
    tensor_field_of,
    tracking_choices,
)
from tractlens.app.regions import regions_on_grid, roi_snapshot
from tractlens.app.selection import shown_of
from tractlens.app.window_words import computed_on, seconds

from . import dialogs
from .direction_field import DirectionFieldChoice
from .geodesic_step import StepInMm
from .job_panel import JobPanelBase
from .params_form import ParamsForm, default_of, limits_of

PARTIAL_INTERVAL_S = 0.25  # at most four screen updates a second while tracking
GUI_BATCH = 20_000  # seeds per batch: the first fibres show within a fraction of a second


class TrackingPanel(JobPanelBase):
    """What every tracking panel shares: Track/Cancel, a status line, the result layer that
    grows while batches arrive, the tensor field of the open tensor layer. Subclasses build
    their parameter widgets and :meth:`_job` (the work to run, or a refusal)."""

    finished = Signal(object)  # the result layer (also after a cancel, with what was shown)
    paint_seed_requested = Signal()  # "Paint a seed ROI": a new seed ROI with the brush (the window's)
    job_title = "tracking"
    job_label = "Tracking"

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.result_layer: Layer | None = None
        self.summary: dict | None = None
        self.track_button = QPushButton("Track")
        self.track_button.setToolTip("Track with these settings from the seed ROIs (Track menu)")
        self.track_button.clicked.connect(self.track)
        self.paint_seed_button = QPushButton("Paint a seed ROI")
        self.paint_seed_button.setToolTip(
            "A new seed ROI with the brush ready (New ROI, Ctrl+N): drag on a slice view to paint it, then Track"
        )
        self.paint_seed_button.clicked.connect(self.paint_seed_requested.emit)
        # Room for three lines of status from the start: a message never makes the form scroll.
        self.status.setMinimumHeight(3 * self.status.fontMetrics().lineSpacing() + 4)
        self.status.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self._summary_line = ""  # the last run's summary; what is shown of it follows the selection
        self._next_step = True  # the status line says what to do next (until a run or a refusal)
        document.connect(self._selection_changed)
        document.connect(self._rois_changed)

    def _layout(self, *parts) -> None:
        buttons = QHBoxLayout()
        buttons.addWidget(self.track_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.paint_seed_button)
        for part in parts:
            if isinstance(part, QWidget):
                layout.addWidget(part)
            else:
                layout.addLayout(part)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addStretch(1)

    # ---------------------------------------------------------------- actions
    def tensor_layer(self) -> Layer | None:
        tensors = [layer for layer in self.document.layers if layer.kind == "tensor"]
        return tensors[-1] if tensors else None

    def track(self) -> int | None:
        """Start tracking with the current parameters and ROIs; returns the job id (None if refused)."""
        doc = self.document
        tensor = self.tensor_layer()
        if tensor is None:
            return self._refuse("Open a DWI series or a tensor file first: tracking follows its tensors.")
        rois = roi_snapshot(doc)
        try:
            work = self._job(tensor.data, rois)
        except ValueError as exc:
            return self._refuse(f"Check the parameters: {exc}.")
        if isinstance(work, str):
            return self._refuse(work)
        token = self._next_token()
        self._next_step = False
        self.track_button.setText("Re-track")
        self.status.setText("Tracking…")
        return self._start(self.job_title, work, on_partial=self._show_partial, on_done=self._done, token=token)

    def _job(self, volume, rois):
        raise NotImplementedError

    def next_step_text(self) -> str:
        """What to do next, from the document's seed ROIs (the status line before the first run)."""
        seeds = [
            layer
            for layer in self.document.layers
            if layer.kind == "roi" and layer.data.role == "seed" and layer.visible
        ]
        painted = [layer for layer in seeds if layer.data.mask.any()]
        if painted:
            voxels = sum(int(np.count_nonzero(layer.data.mask)) for layer in painted)
            names = ", ".join(layer.name for layer in painted)
            return f"Seed ROI {names} ready ({voxels:,} voxels): press Track (Ctrl+T)."
        if seeds:
            return f"Seed ROI {seeds[-1].name} is empty: drag on a slice view to paint it, then Track."
        return "Press “Paint a seed ROI”, drag on a slice view to paint it, then Track."

    def _rois_changed(self, _source, event, **info) -> None:
        layer = info.get("layer")
        if event in ("layers", "roi") or (event == "display" and layer is not None and layer.kind == "roi"):
            if self._next_step and self.job_id is None:
                self.status.setText(self.next_step_text())

    def _no_seed(self, otherwise: str) -> str:
        return no_seed_message(self.document, otherwise)

    def _streaming(self, ctx, name: str):
        """An ``on_batch`` callback that hands the growing result to the GUI, throttled."""
        shown = {"batches": [], "last": 0.0}

        def on_batch(tract):
            shown["batches"].append(tract)
            now = time.perf_counter()
            if now - shown["last"] >= PARTIAL_INTERVAL_S:
                shown["last"] = now
                ctx.partial(self._result_layer(name, Tractogram.concatenate(shown["batches"])))

        return on_batch

    # -------------------------------------------------------------- results
    def _result_layer(self, name: str, tractogram) -> Layer:
        return _result_layer(name, tractogram, self.document.fiber_arrays)

    def _show_partial(self, layer: Layer) -> None:
        earlier = self.result_layer
        if not len(layer.data) and earlier is not None and earlier in self.document.layers and len(earlier.data):
            return  # an empty batch never hides a good result; the run's end asks (_replace_with)
        self._show(layer)

    def _show(self, layer: Layer) -> None:
        self._summary_line = ""
        if self.result_layer is not None and self.result_layer in self.document.layers:
            layer.set(
                visible=self.result_layer.visible,
                opacity=self.result_layer.opacity,
                color_by=self.result_layer.color_by,
                tubes=self.result_layer.tubes,
            )
            self.document.replace_layer(self.result_layer, layer)
        else:
            self.document.add_layer(layer)
        self.result_layer = layer

    def _done(self, outcome) -> None:
        layer, result = outcome
        layer.provenance = {"computed": f"{result.provenance.get('method', 'tensor')} tracking", **result.provenance}
        if not self._replace_with(layer):
            self._job_ended()
            kept = len(self.result_layer.data)
            reason = result.provenance.get("empty_reason") or "none passed the ROIs"
            self.status.setText(f"0 streamlines ({reason}); the earlier result ({kept:,} streamlines) is kept.")
            self.finished.emit(self.result_layer)
            return
        self._show(layer)
        self._job_ended()
        self.summary = result.summary()
        reason = result.provenance.get("empty_reason")
        if reason:  # an empty result is an ordinary one: its cause first, in the panel's words
            empty = f"0 streamlines: {reason}"
            notes = [note for note in result.notes if note != empty]
            text = " ".join([empty + ".", *notes])
        else:
            text = " ".join([self._summary_text(result.provenance), *result.notes])
        self._summary_line = text
        self.status.setText(self._with_shown(text))
        self.finished.emit(layer)

    def _replace_with(self, layer: Layer) -> bool:
        """May an empty result replace a good earlier one? The user is asked (no: keep it)."""
        earlier = self.result_layer
        if len(layer.data) or earlier is None or earlier not in self.document.layers or not len(earlier.data):
            return True
        return dialogs.question(
            self,
            "Replace the earlier result?",
            f"This run found no streamline. Replace {earlier.name} ({len(earlier.data):,} streamlines) with nothing?",
            default=False,
        )

    def _with_shown(self, text: str) -> str:
        layer = self.result_layer
        if layer is None or layer not in self.document.layers or not shown_of(layer).hides:
            return text
        return f"{text} Now {shown_of(layer).text}."

    def _selection_changed(self, _source, event, **info) -> None:
        if event == "display" and info.get("layer") is self.result_layer and self._summary_line:
            if "selection" in info.get("changed", ()):
                self.status.setText(self._with_shown(self._summary_line))

    def _summary_text(self, prov: dict) -> str:
        raise NotImplementedError

    def _cancelled(self) -> None:
        kept = len(self.result_layer.data) if self.result_layer in self.document.layers else 0
        self.status.setText(f"Cancelled; the {kept} streamlines shown so far are kept.")
        if self.result_layer is not None:
            self.finished.emit(self.result_layer)

    def _tensor_field(self, volume):
        """The tracking view of a tensor layer (FA, fitted voxels), kept by the document."""
        return tensor_field_of(self.document, volume)


class DeterministicPanel(TrackingPanel):
    """Parameters of deterministic tracking and the buttons that run it."""

    job_title = "deterministic tracking"

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.form = ParamsForm(DeterministicParams, tracking_choices("deterministic"))
        seeding = QFormLayout()
        self.whole_brain = QCheckBox("whole brain (FA ≥ threshold)")
        self.whole_brain.setObjectName("whole_brain")
        self.whole_brain.setToolTip(
            "Seed in every voxel with FA ≥ the FA threshold instead of in the seed ROIs; waypoints and exclusions still apply"
        )
        self.seeds_per_voxel = _spin(
            "seeds_per_voxel", *_range(SeedingParams, "seeds_per_voxel"), "Seeds in every seed voxel"
        )
        self.placement = QComboBox()
        self.placement.setObjectName("seed_placement")
        self.placement.addItems(list(PLACEMENTS))
        self.placement.setCurrentText(SeedingParams.placement)
        self.placement.setToolTip("Random within the voxel, or an m×m×m grid (seeds per voxel must be a cube)")
        self.rng_seed = _spin(
            "seed_rng",
            *_range(SeedingParams, "rng_seed"),
            "The same number gives the same seeds, and so the same streamlines",
        )
        self.field_choice = DirectionFieldChoice(document)
        seeding.addRow("Direction field", self.field_choice)
        seeding.addRow(self.whole_brain)
        seeding.addRow("Seeds per voxel", self.seeds_per_voxel)
        seeding.addRow("Placement", self.placement)
        seeding.addRow("Random seed", self.rng_seed)
        self.track_button.setObjectName("track_deterministic")
        self.track_button.setToolTip("Track from the seed ROIs with these settings (Ctrl+T)")
        self.cancel_button.setObjectName("cancel_tracking")
        self.status.setObjectName("tracking_status")
        self.status.setText(self.next_step_text())
        self._layout(self.form, seeding)

    def tensor_layer(self) -> Layer | None:
        """The direction field chosen (a tensor or an fODF layer; by default the newest tensors)."""
        return self.field_choice.layer()

    def _job(self, volume, rois):
        params = self.form.value()
        whole = self.whole_brain.isChecked()
        if not whole and not any(roi.role == "seed" for roi in rois):
            return self._no_seed("Paint or open a seed ROI, or tick whole brain.")
        options = {
            "seeds_per_voxel": self.seeds_per_voxel.value(),
            "placement": self.placement.currentText(),
            "rng_seed": self.rng_seed.value(),
        }
        name = "deterministic"

        def job(ctx):
            if volume.kind == "fod":  # the fODF tracker, on the layer's own grid
                grid, track = volume, track_on_fod
            else:
                grid, track = self._tensor_field(volume), deterministic_from_regions
            result = track(
                grid,
                regions_on_grid(rois, "deterministic", grid),
                whole_brain=whole,
                params=params,
                device=self.device,
                progress=ctx.progress,
                cancelled=ctx.cancelled,
                on_batch=self._streaming(ctx, name),
                max_batch=GUI_BATCH,
                name=name,
                **options,
            )
            return self._result_layer(name, result.tractogram), result

        return job

    def _summary_text(self, prov: dict) -> str:
        text = (
            f"{prov['streamlines']:,} streamlines from {prov['seeds']:,} seeds in {seconds(prov['tracking_s'])} "
            f"{computed_on(prov)}."
        )
        if prov["streamlines_removed_by_rois"]:
            text += f" {prov['streamlines_removed_by_rois']:,} removed by the target, waypoint and exclusion ROIs."
        return text


def no_seed_message(document: Document, otherwise: str) -> str:
    """Why a tracking panel has no seed: seed ROIs that are all empty (painted, then erased) are
    named; with none at all, ``otherwise``."""
    seeds = [layer.name for layer in document.layers if layer.kind == "roi" and layer.data.role == "seed"]
    if not seeds:
        return otherwise
    return f"The seed ROI {', '.join(seeds)} is empty: paint into it, or open a seed ROI."


def _range(params_type: type, name: str) -> tuple[int, int, int]:
    """A field's limits and default, for :func:`_spin`."""
    lo, hi = limits_of(params_type, name)
    return int(lo), int(hi), int(default_of(params_type, name))


def _spin(name: str, lo: int, hi: int, value: int, tip: str) -> QSpinBox:
    box = QSpinBox()
    box.setObjectName(name)
    box.setRange(lo, hi)
    box.setValue(value)
    box.setToolTip(tip)
    return box


def _result_layer(name: str, tractogram, fiber_arrays) -> Layer:
    layer = Layer(name, tractogram, "tractogram")
    fiber_arrays.prepare(layer)  # O(points) display work on the worker, not the GUI thread
    return layer


class GeodesicPanel(TrackingPanel):
    """Geodesic ray tracing: metric and integration parameters, directions per seed point,
    a top-x % slider over the fibres that reach the target (ranked by CM), and a live mode
    that re-tracks when a seed or target ROI changes (a newer edit cancels the older run).

    Live mode starts at the first edit, then re-tracks at most every ``LIVE_INTERVAL_MS``
    while edits keep coming (a brush stroke sends many), with the latest ROIs; results of
    a run overtaken by a newer one are dropped, never queued."""

    job_title = "geodesic tracking"
    LIVE_INTERVAL_MS = 60

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.form = ParamsForm(GeodesicParams, tracking_choices("geodesic"))
        self.step = StepInMm(self.form, self.tensor_layer)  # in mm, as the other panels' steps
        self.metric_form = ParamsForm(MetricParams)
        seeding = QFormLayout()
        self.seeds_per_voxel = _spin(
            "geo_seeds_per_voxel", *_range(GeodesicSeedingParams, "seeds_per_voxel"), "Seed points in every seed voxel"
        )
        self.directions = _spin(
            "directions",
            *_range(GeodesicSeedingParams, "directions"),
            field_of(GeodesicSeedingParams, "directions").metadata["help"],
        )
        self.directions.setSpecialValueText("auto")  # 0: sized for the engine
        two_point = field_of(GeodesicSeedingParams, "two_point").metadata
        self.two_point = QCheckBox(two_point["label"])
        self.two_point.setObjectName("two_point")
        self.two_point.setToolTip(two_point["help"])
        self.two_point.setChecked(bool(default_of(GeodesicSeedingParams, "two_point")))
        method = field_of(GeodesicSeedingParams, "method").metadata
        self.method = QComboBox()
        self.method.setObjectName("geodesic_method")
        self.method.addItems(list(method["choices"]))
        self.method.setCurrentText(default_of(GeodesicSeedingParams, "method"))
        self.method.setToolTip(method["help"])
        self.use_cone = QCheckBox("within a cone around ±e1")
        self.use_cone.setObjectName("use_cone")
        self.cone = QDoubleSpinBox()
        self.cone.setObjectName("cone_deg")
        self.cone.setRange(*limits_of(GeodesicSeedingParams, "cone_deg"))
        self.cone.setValue(GeodesicSeedingParams.CONE_DEG_WHEN_ON)  # the cone is off until ticked
        self.cone.setSuffix(" °")
        self.cone.setToolTip("Half-angle of the cone of initial directions (otherwise the whole sphere)")
        self.rng_seed = _spin(
            "geo_seed_rng", *_range(GeodesicSeedingParams, "rng_seed"), "The same number gives the same seed points"
        )
        self.top = QSlider(Qt.Orientation.Horizontal)
        self.top.setObjectName("top_percent")
        self.top.setRange(*(int(v) for v in limits_of(GeodesicSeedingParams, "top_percent")))
        self.top.setValue(int(GeodesicSeedingParams.top_percent))
        self.top.setToolTip("Show the x % of streamlines with the highest connectivity measure")
        self.top_label = QLabel(f"top {self.top.value()} %")
        self.live = QCheckBox("live: re-track as the ROIs change")
        self.live.setObjectName("live_tracking")
        self.live.setToolTip(
            "Re-track when a seed, target or exclusion ROI changes (a newer edit cancels the older run)"
        )
        seeding.addRow("Seed points per voxel", self.seeds_per_voxel)
        seeding.addRow("Directions per point", self.directions)
        seeding.addRow(self.use_cone, self.cone)
        seeding.addRow("Method", self.method)
        seeding.addRow(self.two_point)
        seeding.addRow("Random seed", self.rng_seed)
        seeding.addRow(self.top_label, self.top)
        seeding.addRow(self.live)
        self.track_button.setObjectName("track_geodesic")
        self.track_button.setToolTip("Track from the seed ROIs with these settings (Ctrl+G)")
        self.cancel_button.setObjectName("cancel_geodesic")
        self.status.setObjectName("geodesic_status")
        self._layout(self.form, self.metric_form, seeding)
        self.ranked = None  # every kept fibre, best CM first
        self._live_timer = QTimer(self)
        self._live_timer.setSingleShot(True)
        self._live_timer.setInterval(self.LIVE_INTERVAL_MS)
        self._live_timer.timeout.connect(self._live_interval_over)
        self._live_pending: float | None = None  # time of the first edit not tracked yet
        self._top_timer = QTimer(self)
        self._top_timer.setSingleShot(True)
        self._top_timer.setInterval(40)
        self._top_timer.timeout.connect(self.apply_top)
        self.top.valueChanged.connect(self._top_changed)
        self.edit_time: float | None = None
        self.latency_s: float | None = None  # ROI edit → first fibres in the document, live mode
        self.shown_at: float | None = None  # when they were (the next 3-D render draws them)
        self.show_s: float | None = None
        document.connect(self._on_document)

    # ------------------------------------------------------------------ live
    def _on_document(self, _source, event, **info) -> None:
        layer = info.get("layer")
        if event == "layers":
            self.step.follow_tensors()
        if not self.live.isChecked() or layer is None or layer.kind != "roi":
            return
        if event == "roi" or (event == "display" and "role" in info.get("changed", ())):
            if layer.data.role in ("seed", "target", "exclusion"):
                now = time.perf_counter()
                if self._live_timer.isActive():  # within the interval: once more at its end
                    self._live_pending = self._live_pending or now
                else:
                    self._live_track(now)

    def _live_track(self, edit_time: float) -> None:
        self._live_timer.start()
        if self.document.roi_masks_by_role()["seed"]:
            self.edit_time = edit_time
            self.track()

    def _live_interval_over(self) -> None:
        if self._live_pending is not None:
            edit_time, self._live_pending = self._live_pending, None
            self._live_track(edit_time)

    def _show(self, layer: Layer) -> None:
        start = time.perf_counter()
        super()._show(layer)
        if self.edit_time is not None:
            self.shown_at = time.perf_counter()
            self.show_s = self.shown_at - start  # the GUI thread's part: actors, layer list
            self.latency_s = self.shown_at - self.edit_time  # edit → fibres in the document
            self.edit_time = None

    # ------------------------------------------------------------------- job
    def _job(self, volume, rois):
        params = self.step.params()
        metric = self.metric_form.value()
        if not any(roi.role == "seed" for roi in rois):
            return self._no_seed("Paint or open a seed ROI (and a target ROI to rank the streamlines by connectivity).")
        options = {
            "seeds_per_voxel": self.seeds_per_voxel.value(),
            "directions": self.directions.value(),
            "cone_deg": self.cone.value() if self.use_cone.isChecked() else None,
            "rng_seed": self.rng_seed.value(),
            "two_point": self.two_point.isChecked(),
            "method": self.method.currentText(),
        }
        name = "geodesic"

        def job(ctx):
            field_ = self._tensor_field(volume)
            regions = regions_on_grid(rois, "geodesic", field_)
            result = geodesic_from_regions(
                field_,
                regions,
                metric=metric,
                params=params,
                device=self.device,
                progress=ctx.progress,
                cancelled=ctx.cancelled,
                on_batch=self._streaming(ctx, name),
                max_batch=GUI_BATCH,
                first_batch=INTERACTIVE_FIRST_BATCH,
                name=name,
                # per metric as the method resolves it (auto differs for rays and the distance map)
                metric_field=lambda resolved: geodesic_metric_of(self.document, volume, resolved, self.device),
                **options,
            )
            return self._result_layer(name, result.tractogram), result

        return job

    def _result_layer(self, name: str, tractogram) -> Layer:
        return self.document.fiber_arrays.cm_layer(name, tractogram)

    def _done(self, outcome) -> None:
        layer, _result = outcome
        self.ranked = layer.data
        super()._done(outcome)
        if self.top.value() < 100:
            self.apply_top()

    def _summary_text(self, prov: dict) -> str:
        reached = "" if prov["reached_target"] is None else f", {prov['reached_target']} reached the target"
        return (
            f"{prov['fibers']:,} streamlines{reached}; {prov['steps'] / 1e6:.1f} million steps in "
            f"{seconds(prov['tracking_s'])} {computed_on(prov)}."
        )

    # ---------------------------------------------------------------- top x %
    def _top_changed(self, value: int) -> None:
        self.top_label.setText(f"top {value} %")
        self._top_timer.start()

    def apply_top(self) -> None:
        """Show the chosen top percentage of the ranked fibres (prepared on a worker)."""
        ranked = self.ranked
        if ranked is None or len(ranked) == 0:
            return
        percent = self.top.value()
        count = int(np.ceil(len(ranked) * percent / 100.0))

        def job(ctx):
            return self._result_layer("geodesic", ranked.subset(np.arange(count)))

        self.runner.submit("top streamlines", job, on_done=self._show_top, on_error=self.report)

    def _show_top(self, layer: Layer) -> None:
        if self.ranked is not None and len(layer.data) <= len(self.ranked):
            if self.result_layer is not None:
                base = {k: v for k, v in self.result_layer.provenance.items() if k != "shown_top_percent"}
                layer.provenance = {**base, "shown_top_percent": self.top.value()}
            self._show(layer)
            self.status.setText(
                f"Showing the top {self.top.value()} %: {len(layer.data):,} of {len(self.ranked):,} streamlines."
            )
