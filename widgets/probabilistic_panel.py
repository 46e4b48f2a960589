"""The Probabilistic tracking panel (probtrackx style): parameters, Track / Cancel, the path
distribution filling in on the slices and as an isosurface in 3-D.

The panel holds no algorithm. Track takes the last ``dyads`` layer that keeps its posterior
samples (a bedpostX folder opened, or a ball & sticks fit) and a snapshot (copies) of the
visible ROI layers (:func:`app.regions.roi_snapshot`), and runs the use case
:func:`app.pipelines.track_probabilistic.track_probabilistic` on a worker: it brings the ROIs
onto the samples' grid in their roles, checks them (its :class:`~app.errors.InputError`
messages are shown as they are) and tracks in passes, a coarse first one and larger ones that
refine it. The first pass's totals reach the GUI at once, the later ones at most four a second,
and update the result layer in place:
"probabilistic paths", a scalar volume on the samples' grid, hot colour map over 0..max,
transparent below 1 % of the maximum (at least one streamline) so the image beneath shows.
The 3-D view shows the isosurface at the chosen percentage of the current maximum: the worker
crops the distribution to the voxels that reach the level (NumPy, the O(grid) part) and the
GUI thread runs marching cubes over that crop (a first pass's: every 2nd voxel), since VTK filters
must not run on a worker while the views render (that can deadlock). A cancel keeps the last
totals shown; Track again replaces the layer (a live re-track fills it in place).

The curvature threshold is shown and edited in degrees ("Max angle", as the other panels), the
dataclass's cosine converted by :mod:`app.window_units`.

Live mode (the "live" switch, as the geodesic panel's): every stroke on a seed, target,
waypoint, exclusion or stop ROI re-tracks. The stale run is cancelled; strokes that come while
a run has not drawn its first pass yet are gathered into one re-track that starts as soon as it
has (on the CPU a first pass takes longer than the mouse moves). The panel hears a stroke before
the views do (its run starts before they redraw), and the 3-D view holds the stroke's frame until
the first map (at most :data:`LIVE_FRAME_HOLD_S`) and draws both in one. The status line says the
streamlines drawn so far and the waytotal; ``first_map_s`` (edit → first map) and
``converged_s`` (last edit → the map of every sample) are kept for the latency benchmark.

"Save outputs…" writes what is shown (fdt_paths, waytotal, seeds_to_…, the matrix) like the
command line, on a worker.

The engine runs sample k of every seed voxel before sample k + 1 (``gpu.probabilistic``), so
each running total is an even sample of the whole seed region and only grows denser.

The panel starts with 1000 samples per seed voxel (``app.params.GUI_PRESETS``, which the form
starts from), not probtrackx's 5000 (the command line's default): a first look at where the paths
go fills in five times sooner (on the CPU the NumPy engine tracks some thousand streamlines a
second), and the distribution's shape is already clear; set 5000 for the numbers to report.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyvista as pv
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
)

from tractlens.app.envelopes import LEVEL_MEANING, envelopes
from tractlens.app.estimates import JobEstimate, grid_diagonal_mm, probabilistic_estimate
from tractlens.app.model import Document, Layer, Volume
from tractlens.app.params import EnvelopeParams, default_of, field_of
from tractlens.app.pipelines.probabilistic import (
    ProbabilisticRun,
    ProbParams,
    ProbResult,
    device_field_of,
    sample_field_of,
    write_probabilistic_outputs,
)
from tractlens.app.pipelines.track_probabilistic import ProbInputs, ProbUpdate, track_probabilistic
from tractlens.app.regions import RoiCopy, roi_snapshot
from tractlens.app.window_words import computed_on, seconds

from . import dialogs
from .envelope_display import envelope_layers, show_envelopes
from .job_panel import JobPanelBase
from .params_form import ParamsForm
from .tracking_panel import no_seed_message

RESULT_NAME = "probabilistic paths"
PARTIAL_INTERVAL_S = 0.25  # at most four screen updates a second while refining (the first pass: at once)
LIVE_ROLES = ("seed", "target", "waypoint", "exclusion", "stop")  # strokes on these re-track in live mode
ISO_PERCENT = 5.0  # default isosurface level, % of the maximum
SLICE_FLOOR = 0.01  # slices: voxels below 1 % of the maximum are transparent (and at least 1 streamline)
ISO_COLOUR = (1.0, 0.6, 0.1)  # the top of the hot colour map, so 3-D and slices agree
ISO_OPACITY = 0.6
# A first pass's crop larger than this keeps every COARSE_STEP-th voxel (marching cubes on the GUI thread: 8x less).
COARSE_STEP = 2
COARSE_SURFACE_VOXELS = 64**3
LIVE_FRAME_HOLD_S = 0.15  # a live stroke's 3-D frame waits at most this long for its first map


@dataclass
class IsoInput:
    """What the isosurface needs, prepared on a worker (NumPy only): the path distribution
    cropped to the box of voxels that reach ``level`` (float32, with a margin of empty voxels so
    that the surface closes), where that box starts on the grid, the level and the maximum.
    ``volume`` is None when nothing reaches the level (an empty distribution). ``step``: the
    crop holds every ``step``-th voxel of the grid (a coarse surface), voxel ``step`` apart."""

    volume: np.ndarray | None
    origin: np.ndarray  # (3,) voxel index of volume[0, 0, 0]
    level: float
    top: int
    percent: float
    step: int = 1


def isosurface_input(paths: np.ndarray, percent: float, *, coarse: bool = False) -> IsoInput:
    """Crop the distribution for the surface at ``percent`` % of its maximum (the O(grid) part:
    one pass over the grid for the maximum and the box's x and y, one over the x-y box for its
    z). ``coarse``: a crop larger than :data:`COARSE_SURFACE_VOXELS` keeps every
    :data:`COARSE_STEP`-th voxel (a first look's surface)."""
    if paths.size == 0:
        return IsoInput(None, np.zeros(3, np.int64), 0.0, 0, percent)
    plane = paths.max(axis=2)  # the one pass over the whole grid
    top = int(plane.max())
    level = top * percent / 100.0
    if top <= 0:
        return IsoInput(None, np.zeros(3, np.int64), level, top, percent)
    xs = np.flatnonzero(plane.max(axis=1) >= level)
    ys = np.flatnonzero(plane.max(axis=0) >= level)
    column = paths[xs[0] : xs[-1] + 1, ys[0] : ys[-1] + 1]
    zs = np.flatnonzero(column.max(axis=(0, 1)) >= level)
    lo = [max(int(hit[0]) - 1, 0) for hit in (xs, ys, zs)]
    hi = [min(int(hit[-1]) + 2, n) for hit, n in zip((xs, ys, zs), paths.shape)]
    crop = paths[tuple(slice(a, b) for a, b in zip(lo, hi))]
    step = COARSE_STEP if coarse and crop.size > COARSE_SURFACE_VOXELS else 1
    volume = np.pad(crop[::step, ::step, ::step].astype(np.float32), 1)  # zero outside: closed at the edge
    return IsoInput(volume, np.array(lo, dtype=np.int64) - step, level, top, percent, step)


def isosurface(iso: IsoInput, affine: np.ndarray) -> pv.PolyData | None:
    """The surface where the path distribution crosses the level, in world mm (marching cubes,
    VTK's flying edges, with normals), None if there is none. VTK: on the GUI thread only (a VTK
    filter on a worker while the views render can deadlock); the crop keeps it small."""
    if iso.volume is None:
        return None
    grid = pv.ImageData(
        dimensions=iso.volume.shape, origin=tuple(float(v) for v in iso.origin), spacing=(float(iso.step),) * 3
    )
    grid.point_data["paths"] = iso.volume.ravel(order="F")
    surface = grid.contour([iso.level], scalars="paths", compute_normals=True, method="flying_edges")
    if surface.n_points == 0:
        return None
    surface = surface.transform(affine, inplace=False)
    for name in list(surface.point_data):
        if name != "Normals":
            del surface.point_data[name]
    surface.field_data["level"] = np.array([iso.level])
    return surface


@dataclass
class Shown:
    """One state of a run as the GUI shows it: the running totals and what their isosurface needs."""

    token: int  # which Track press this belongs to
    run: ProbabilisticRun
    result: ProbResult
    total: int  # streamlines the run will track
    layer: Layer  # the run's result layer (made on the worker with the first totals)
    iso: IsoInput


class ProbabilisticPanel(JobPanelBase):
    """Parameters of probabilistic tracking, the isosurface level, and the buttons that run it.

    ``view3d`` (optional): the 3-D view that shows the isosurface. Attributes for scripts and
    tests: ``result_layer``, ``run`` and ``result`` (what is shown), ``updates`` (running totals
    shown during the current run), ``job_id``."""

    finished = Signal(object)  # the result layer (also after a cancel, with what was shown)
    job_label = "Tracking"

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, view3d=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.view3d = view3d
        self.result_layer: Layer | None = None
        self.run: ProbabilisticRun | None = None
        self.result: ProbResult | None = None
        self.total = 0
        self.updates = 0
        self.iso_level: float | None = None
        self._percent = ISO_PERCENT  # read by workers (a float: no widget off the GUI thread)
        self.first_pass: int | None = None  # streamlines of the first pass (None: the use case's size)
        self.later_pass: int | None = None  # … and of the later ones
        # Live mode: the edit being answered, the last edit, and what it took to draw the maps.
        self.edit_time: float | None = None
        self.last_edit_time: float | None = None
        self.first_map_s: float | None = None  # edit → first map on screen
        self.converged_s: float | None = None  # last edit → the map of every sample on screen
        self.shown_at: float | None = None
        self.live_runs = 0
        self._rate: float | None = None  # streamlines a second of the last run (sizes the CPU's first pass)
        self._first_shown = False
        self._live_pending: float | None = None
        self._coarse_surface = False  # the surface shown is a first pass's coarse one

        self.form = ParamsForm(ProbParams, {"waycond": ("AND", "OR")})
        self.iso_percent = QDoubleSpinBox()
        self.iso_percent.setObjectName("iso_percent")
        self.iso_percent.setRange(0.1, 100.0)
        self.iso_percent.setDecimals(1)
        self.iso_percent.setSingleStep(1.0)
        self.iso_percent.setSuffix(" % of max")
        self.iso_percent.setValue(ISO_PERCENT)
        self.iso_percent.setToolTip("The 3-D surface encloses the voxels visited by at least this share of the maximum")
        self.iso_label = QLabel("")
        self.iso_label.setObjectName("iso_level")
        self.iso_label.setWordWrap(True)
        self.envelope_levels = QLineEdit(default_of(EnvelopeParams, "levels"))
        self.envelope_levels.setObjectName("envelope_levels")
        self.envelope_levels.setToolTip(field_of(EnvelopeParams, "levels").metadata["help"] + ". " + LEVEL_MEANING)
        self.envelope_button = QPushButton("Show envelopes")
        self.envelope_button.setObjectName("show_envelopes")
        self.envelope_button.setToolTip("Nested regions where the tract lies at these levels: surfaces and outlines")
        self.envelope_button.clicked.connect(self.make_envelopes)
        self.envelope_label = QLabel("")
        self.envelope_label.setObjectName("envelope_summary")
        self.envelope_label.setWordWrap(True)
        self.live = QCheckBox("live: re-track as the ROIs change")  # short: the dock's width is shared
        self.live.setObjectName("live_probabilistic")
        self.live.setToolTip(
            "Re-track at every stroke on a seed, target, waypoint or exclusion ROI. A coarse map at once, then refined up to the samples per voxel while you pause; "
            "a newer stroke cancels the older run"
        )
        display = QFormLayout()
        display.addRow("Isosurface at", self.iso_percent)
        display.addRow("", self.iso_label)
        display.addRow(self.live)
        # the levels on a row of their own, the button under them (beside it, at 1280 px, the field was cut)
        display.addRow("Envelopes at %", self.envelope_levels)
        display.addRow("", self.envelope_button)
        display.addRow("", self.envelope_label)
        self.track_button = QPushButton("Track")
        self.track_button.setObjectName("track_probabilistic")
        self.track_button.clicked.connect(self.track)
        self.cancel_button.setObjectName("cancel_probabilistic")
        self.save_button = QPushButton("Save outputs…")
        self.save_button.setObjectName("save_probabilistic")
        self.save_button.setToolTip("Write fdt_paths, waytotal, seeds_to_<target> and the matrix, as probtrackx")
        self.save_button.setEnabled(False)
        self.save_button.clicked.connect(self._save_dialog)
        self.status.setText("Open a bedpostX folder (or fit ball & sticks), paint a seed ROI, then Track.")
        self.status.setObjectName("probabilistic_status")
        buttons = QHBoxLayout()
        for button in (self.track_button, self.cancel_button, self.save_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.form)
        layout.addLayout(display)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addStretch(1)

        self._iso_timer = QTimer(self)
        self._iso_timer.setSingleShot(True)
        self._iso_timer.setInterval(120)  # spin-box steps in a row: one surface
        self._iso_timer.timeout.connect(self.update_isosurface)
        self.iso_percent.valueChanged.connect(self._percent_changed)
        # First: a live stroke's re-track starts before the views redraw for that stroke.
        document.connect(self._on_document, first=True)

    # ---------------------------------------------------------------- inputs
    def samples_layer(self) -> Layer | None:
        """The last dyads layer that keeps its posterior samples (what tracking samples from)."""
        found = [layer for layer in self.document.layers if layer.kind == "dyads"]
        found = [layer for layer in found if getattr(layer.data, "samples", None) is not None]
        return found[-1] if found else None

    def _roi_snapshot(self) -> list[RoiCopy]:
        """Copies of every visible, non-empty ROI layer (:func:`app.regions.roi_snapshot`)."""
        return roi_snapshot(self.document)

    # --------------------------------------------------------------- actions
    def track(self) -> int | None:
        """Start tracking with the current parameters and ROIs; returns the job id (None if refused)."""
        layer = self.samples_layer()
        if layer is None:
            return self._refuse(
                "Open a bedpostX folder (File ▸ Open folder) or fit ball & sticks to a DWI series first: "
                "probabilistic tracking samples their fibre orientations."
            )
        rois = self._roi_snapshot()
        if not any(roi.role == "seed" for roi in rois):
            return self._refuse(
                no_seed_message(
                    self.document, "Paint or open a seed ROI (role seed): streamlines start in every seed voxel."
                )
            )
        try:
            params = self.form.value()
        except ValueError as exc:
            return self._refuse(f"Check the parameters: {exc}.")
        estimate = self.estimate(layer, rois, params)
        live = self.live.isChecked() and self.edit_time is not None
        if estimate.long and not live and not dialogs.confirm_long_job(self, estimate):
            self.status.setText(f"Not started: it would take {estimate.text}. Use a smaller seed or fewer samples.")
            return None
        token = self._next_token()
        self.updates = 0
        self._first_shown = False
        self.track_button.setText("Re-track")
        self.status.setText(
            f"Started: {estimate.announcement()}" if estimate.long else "Preparing the samples and masks…"
        )
        return self._start(
            "probabilistic tracking" + (f", {estimate.text}" if estimate.long else ""),
            self._job(layer.data, rois, params, token, self._live_layer(layer.data) if live else None),
            on_partial=self._show,
            on_done=self._done,
            token=token,
        )

    def estimate(self, layer: Layer, rois: list[RoiCopy], params: ProbParams) -> JobEstimate:
        """How long tracking from the seed ROIs will take (:func:`app.estimates.probabilistic_estimate`;
        seed voxels counted on the ROIs' own grids)."""
        samples = layer.data.samples
        seeds = sum(int(np.count_nonzero(roi.mask)) for roi in rois if roi.role == "seed")
        diagonal = grid_diagonal_mm(samples.affine, samples.mask.shape)
        return probabilistic_estimate(seeds * params.n_samples, params.n_steps, params.step_mm, diagonal, self.device)

    def _live_layer(self, volume) -> Layer | None:
        """The layer a live re-track fills in place (the last run's, on the same samples' grid): a
        stroke changes its values, not the document's layers (the layer list and the views' scene)."""
        layer = self.result_layer
        if layer is None or layer not in self.document.layers or self.run is None:
            return None
        if self.run.samples is not volume.samples or layer.data.data.shape != volume.samples.mask.shape:
            return None
        return layer

    def _job(self, volume, rois, params: ProbParams, token: int, layer: Layer | None = None):
        """The run as a job: :func:`app.pipelines.track_probabilistic.track_probabilistic`, each
        pass's totals handed to the GUI with what their surface needs. ``layer``: the layer to
        fill (live mode), else one is made with the first totals."""
        document, device = self.document, self.device
        first_pass, later_pass, rate = self.first_pass, self.later_pass, self._rate

        def job(ctx):
            ctx.progress(0, 1, "preparing the samples")
            inputs = ProbInputs(
                volume.samples,
                rois,
                params,
                field_=sample_field_of(document, volume),
                device_field=lambda chosen: device_field_of(document, volume, chosen),
            )
            result_layer, shown = layer, None
            for update in track_probabilistic(
                inputs,
                device=device,
                progress=ctx.progress,
                cancelled=ctx.cancelled,
                first_pass=first_pass,
                later_pass=later_pass,
                interval_s=PARTIAL_INTERVAL_S,
                rate=rate,
            ):
                if result_layer is None:  # made here: a new layer measures its values, which is work
                    result_layer = _result_layer(update.result.paths, volume.samples.affine)
                shown = self._shown(token, update, result_layer)
                if not update.final:
                    ctx.partial(shown)
            return shown

        return job

    def _shown(self, token: int, update: ProbUpdate, layer: Layer) -> Shown:
        result = update.result
        coarse = update.pass_number == 0 and not update.final
        iso = isosurface_input(result.paths, self._percent, coarse=coarse)
        return Shown(token, update.run, result, update.total, layer, iso)

    # ------------------------------------------------------------------ live
    def _on_document(self, _source, event, **info) -> None:
        """A stroke on a tracking ROI (or a role changed) re-tracks in live mode."""
        layer = info.get("layer")
        if not self.live.isChecked() or layer is None or layer.kind != "roi":
            return
        if event == "roi" or (event == "display" and "role" in info.get("changed", ())):
            if layer.data.role in LIVE_ROLES:
                self.live_edit()

    def live_edit(self) -> None:
        """An ROI changed: track again now, or — while the run in flight has not drawn its first pass
        yet — as soon as it has (strokes come faster than a first pass on the CPU: they are gathered,
        never queued; the stale run is cancelled when the next starts)."""
        now = time.perf_counter()
        self.last_edit_time = now
        if self.job_id is not None and not self._first_shown:
            self._live_pending = self._live_pending or now
            return
        self._live_track(now)

    def _live_track(self, edit_time: float) -> None:
        self._live_pending = None
        if not self.document.roi_masks_by_role()["seed"]:
            return
        self.edit_time = edit_time
        self.first_map_s = self.converged_s = None
        self.live_runs += 1
        if self.view3d is not None:
            self.view3d.hold_frames(LIVE_FRAME_HOLD_S)
        self.track()

    def _live_next(self) -> None:
        """The run in flight drew its first pass (or ended): the edits gathered meanwhile go now."""
        if self._live_pending is not None and self.live.isChecked():
            self._live_track(self._live_pending)

    # --------------------------------------------------------------- display
    def _show(self, shown: Shown) -> None:
        """Running totals (or the final ones) on screen: the layer's values, range and surface."""
        if shown.token != self._token:
            return  # an older run's
        doc, layer, result = self.document, shown.layer, shown.result
        top = shown.iso.top
        display = {"clim": (0.0, float(max(top, 1))), "transparent_below": max(1.0, SLICE_FLOOR * top)}
        layer.set_data(result.paths, **display)
        if layer not in doc.layers:  # the run's first totals: its layer replaces the last run's
            old = self.result_layer
            if old is not None and old in doc.layers:
                layer.set(visible=old.visible, opacity=old.opacity, colormap=old.colormap)
                doc.replace_layer(old, layer)
            else:
                doc.add_layer(layer)
        self.result_layer, self.run, self.result, self.total = layer, shown.run, result, shown.total
        self._set_surface(layer, shown.iso)
        if shown.iso.percent != self._percent:  # the level changed while this was computed
            self._iso_timer.start()
        if result.streamlines < shown.total:
            self.updates += 1
            self.status.setText(f"{'Live: tracking' if self.live.isChecked() else 'Tracking'}… {self._counts()}")
        self.save_button.setEnabled(True)
        now = time.perf_counter()
        if self.edit_time is not None and self.first_map_s is None:
            self.first_map_s = now - self.edit_time  # edit → the first map drawn
        if result.streamlines >= shown.total and self.edit_time is not None:
            self.converged_s = now - self.last_edit_time  # last edit → the converged map
        self.shown_at = now
        if not self._first_shown:
            self._first_shown = True
            if self.view3d is not None:
                self.view3d.release_frames()  # the stroke's frame and this map's: one frame
            QTimer.singleShot(0, self._live_next)  # after this run's own ending is handled

    def _set_surface(self, layer: Layer, iso: IsoInput) -> None:
        """The isosurface in 3-D: marching cubes over the worker's crop (VTK, so here, at most as
        often as totals arrive) and the level beside the spin box."""
        self.iso_level = iso.level
        self._coarse_surface = iso.step > 1
        surface = isosurface(iso, layer.data.affine)
        if surface is None:
            self.iso_label.setText("no kept streamline yet: no surface" if iso.top == 0 else "no surface at this level")
        else:
            self.iso_label.setText(f"at {iso.level:.4g} streamlines per voxel (the maximum is {iso.top:,})")
        if self.view3d is not None:
            self.view3d.set_layer_surface(layer, surface, color=ISO_COLOUR, opacity=ISO_OPACITY)

    def _counts(self) -> str:
        """Streamlines done / total, waytotal and per-target counts of what is shown."""
        result, run = self.result, self.run
        text = f"{result.streamlines:,} of {self.total:,} streamlines, waytotal {result.waytotal:,}"
        reached = result.seed_targets.sum(axis=0)
        for name, count in zip(run.targets, reached):
            text += f", to {name} {int(count):,}"
        return text + "."

    def _done(self, shown: Shown) -> None:
        if shown.token != self._token:
            return
        shown.layer.provenance = {
            "computed": "probabilistic tracking (probtrackx)",
            "parameters": asdict(shown.run.params),
            "seed_voxels": len(shown.run.seeds),
            "targets": list(shown.run.targets),
            "waytotal": int(shown.result.waytotal),
            "streamlines": int(shown.result.streamlines),
            **shown.result.provenance,
        }
        self._show(shown)
        self._job_ended()
        prov = shown.result.provenance
        self._rate = prov.get("streamlines_per_s") or self._rate
        text = (
            f"Done: {self._counts()} {len(shown.run.seeds):,} seed voxels, "
            f"{seconds(prov.get('tracking_s', 0.0))} {computed_on(prov)}."
        )
        if shown.result.streamlines and not shown.result.waytotal:  # an empty result: its cause first
            rule = "passed every waypoint region" if shown.run.n_waypoints else "avoided the exclusion region and loops"
            text = f"0 streamlines kept: none of the {shown.result.streamlines:,} {rule}. " + text
        if shown.run.notes:
            text += " " + " ".join(shown.run.notes)
        self.status.setText(text)
        self.finished.emit(shown.layer)
        self.edit_time = None

    def _failed(self, token: int, message: str, details: str) -> None:
        if token == self._token and self.live.isChecked() and self.edit_time is not None:
            self._job_ended()  # live: a stroke that leaves nothing to track is said, not shouted
            self.status.setText(f"Live: {message}")
            self.edit_time = None
            QTimer.singleShot(0, self._live_next)
            return
        super()._failed(token, message, details)

    def _cancelled(self) -> None:
        if self._coarse_surface:  # no refined pass will replace it: the full surface of what is kept
            self._iso_timer.start()
        if self.updates and self.result is not None:
            self.status.setText(
                f"Cancelled after {self.result.streamlines:,} of {self.total:,} streamlines "
                f"(kept their path distribution: waytotal {self.result.waytotal:,})."
            )
            self.finished.emit(self.result_layer)
        else:
            kept = " (the previous result is still shown)" if self.result_layer in self.document.layers else ""
            self.status.setText(f"Cancelled before the first totals arrived{kept}.")

    # ------------------------------------------------------------ isosurface
    def _percent_changed(self, value: float) -> None:
        self._percent = float(value)
        self._iso_timer.start()

    def update_isosurface(self) -> int | None:
        """Recompute the shown layer's isosurface at the current percentage, on a worker."""
        layer, run = self.result_layer, self.run
        if layer is None or run is None or layer not in self.document.layers:
            return None
        paths, percent = layer.data.data, self._percent

        def job(ctx):
            return isosurface_input(paths, percent)

        def done(outcome) -> None:
            # Only if nothing newer came meanwhile (a partial brings its own surface).
            current = layer is self.result_layer and layer in self.document.layers
            if current and layer.data.data is paths and percent == self._percent:
                self._set_surface(layer, outcome)

        return self.runner.submit("isosurface", job, on_done=done, on_error=self.report)

    # ------------------------------------------------------------- envelopes
    def make_envelopes(self) -> int | None:
        """The uncertainty envelopes of what is shown, at the levels typed in (a worker computes
        them and their surfaces' crops; the checks are :func:`app.envelopes.envelopes`')."""
        if self.result is None or self.run is None:
            return self._refuse("Track first: envelopes are made from the path distribution.")
        paths, waytotal, affine = self.result.paths, self.result.waytotal, self.run.samples.affine
        levels = self.envelope_levels.text()

        def job(ctx):
            found = envelopes(paths, affine, levels, waytotal=waytotal)
            layers = envelope_layers(found, RESULT_NAME)
            return layers, [isosurface_input(layer.data.data, 50.0) for layer in layers]

        def done(out) -> None:
            layers, crops = out
            show_envelopes(self.document, layers, [isosurface(crop, affine) for crop in crops], self.view3d)
            parts = [f"{layer.name[len('envelope ') :]}: {layer.provenance['volume_mm3']:,.0f} mm³" for layer in layers]
            self.envelope_label.setText("; ".join(parts) + ". " + LEVEL_MEANING)

        def failed(message: str, details: str) -> None:
            self.status.setText(f"Envelopes: {message}")
            self.report(message, details)

        return self.runner.submit("uncertainty envelopes", job, on_done=done, on_error=failed)

    # ------------------------------------------------------------------ save
    def _save_dialog(self) -> None:
        folder = dialogs.folder(self, "Folder for the probtrackx outputs")
        if folder:
            self.save_outputs(folder)

    def save_outputs(self, folder) -> int | None:
        """Write what is shown (:func:`write_probabilistic_outputs`) into ``folder``, on a worker."""
        if self.run is None or self.result is None:
            return self._refuse("Track first: there is nothing to save yet.")
        run, result, folder = self.run, self.result, Path(folder)

        def job(ctx):
            ctx.progress(0, 1, f"writing {folder.name}")
            return write_probabilistic_outputs(run, result, folder)

        def done(files) -> None:
            self.status.setText(f"Saved {len(files)} files ({result.streamlines:,} streamlines) to {folder}.")

        return self.runner.submit("save probabilistic outputs", job, on_done=done, on_error=self.report)


def _result_layer(paths: np.ndarray, affine: np.ndarray) -> Layer:
    return Layer(RESULT_NAME, Volume(RESULT_NAME, paths, affine), "scalar", colormap="hot")
