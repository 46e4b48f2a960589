"""The TractLens main window: a 3-D view and three linked slice views, layers, jobs.

Widgets hold no algorithm: they edit the :class:`~app.model.Document` and start
jobs on the :class:`~app.jobs.JobRunner`; loading and fitting run on worker
threads and their layers arrive by signal.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QImage, QKeySequence, QPainter
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSpinBox,
    QTabBar,
    QWidget,
)

from tractlens.app.errors import InputError
from tractlens.app.io import save_volume
from tractlens.app.io._atomic import split_suffix
from tractlens.app.jobs import JobRunner
from tractlens.app.loaders import is_anatomical, load_layers, show_as
from tractlens.app.model import ROI_ROLES, Document, Layer, RoiMask, shape_half_sizes
from tractlens.app.pipelines.select import index_on_grid
from tractlens.app.recovery import DEFAULT_INTERVAL_S

from . import fiber_display
from .ballstick import BallStickDialog, ballstick_job
from .commit_panel import CommitPanel
from .connectivity_panel import ConnectivityPanel
from .panels import JobPanel, LayerPanel
from .presurgical_panel import PresurgicalPanel
from .probabilistic_panel import ProbabilisticPanel
from .roi_tools import RoiTools
from .session_io import WindowAutosave, offer_recovery
from .slice_view import SliceView
from .tracking_panel import DeterministicPanel, GeodesicPanel
from .view3d import View3D

MAX_RECENT = 10
SLAB_CHOICES_MM = (1.0, 2.0, 4.0, 10.0, 20.0)  # View > Fiber slab on slices
DEFAULT_SLAB_MM = 4.0
FILE_FILTER = "Images and tractograms (*.nii *.nii.gz *.trk *.tck *.trx);;All files (*)"


# The docks' layout saved at exit is restored only by a window with the same docks: bump this
# whenever docks are added, removed or regrouped (a stale layout would scatter the new ones).
# Layouts saved before it existed carry version 0.
LAYOUT_VERSION = 1


def settings() -> QSettings:
    """Application settings; ``TRACTLENS_CONFIG_DIR`` puts them elsewhere (tests, kiosks)."""
    folder = os.environ.get("TRACTLENS_CONFIG_DIR")
    if folder:
        return QSettings(str(Path(folder) / "tractlens.ini"), QSettings.Format.IniFormat)
    return QSettings("TractLens", "TractLens")


class MainWindow(QMainWindow):
    """Also the Python API for scripts and tests: :meth:`open_paths`, :meth:`open_demo`,
    :meth:`wait_for_jobs`, :meth:`save_screenshot`, ``document`` and ``views``."""

    loaded = Signal(str)  # a path finished loading

    def __init__(self, *, device: str = "auto", autosave_s: float | None = None, restore: str = "ask"):
        """``autosave_s``: seconds between autosaves (0: off; None: the saved setting, default
        30); ``restore``: what to do with an autosave a crashed window left (``ask``, ``yes``,
        ``no``: keep it for later), see :func:`widgets.session_io.offer_recovery`."""
        super().__init__()
        self.setWindowTitle("TractLens")
        self.setAcceptDrops(True)
        self.device = device
        self.document = Document()
        self.runner = JobRunner(parent=self)
        self.errors: list[str] = []

        self.view3d = View3D(self.document)
        self.roi_tools = RoiTools(self.document, lambda: self.layer_panel.selected_layer())
        self.views = {
            name: SliceView(self.document, name, tools=self.roi_tools) for name in ("axial", "coronal", "sagittal")
        }
        central = QWidget()
        grid = QGridLayout(central)
        grid.setContentsMargins(2, 2, 2, 2)
        grid.setSpacing(2)
        grid.addWidget(self.view3d, 0, 0)
        grid.addWidget(self.views["axial"], 0, 1)
        grid.addWidget(self.views["coronal"], 1, 0)
        grid.addWidget(self.views["sagittal"], 1, 1)
        self.setCentralWidget(central)

        self.layer_panel = LayerPanel(self.document)
        self.layer_panel.fit_ballstick_requested.connect(self.fit_ballstick_dialog)
        self.layer_panel.commit_requested.connect(self.show_commit_panel)
        self.layer_panel.show_as_requested.connect(self.show_layer_as)
        self._opening: dict[int, tuple[dict, int]] = {}  # open job -> (its open_paths call, slot)
        self.runner.job_cancelled.connect(self._open_cancelled)
        self.ballstick_dialog: BallStickDialog | None = None
        self.job_panel = JobPanel(self.runner)
        self.deterministic_panel = DeterministicPanel(
            self.document, self.runner, device=device, report=self._report_error
        )
        self.geodesic_panel = GeodesicPanel(self.document, self.runner, device=device, report=self._report_error)
        self.probabilistic_panel = ProbabilisticPanel(
            self.document, self.runner, device=device, report=self._report_error, view3d=self.view3d
        )
        self.commit_panel = CommitPanel(self.document, self.runner, device=device, report=self._report_error)
        self.connectivity_panel = ConnectivityPanel(
            self.document, self.runner, device=device, report=self._report_error, probabilistic=self.probabilistic_panel
        )
        self.presurgical_panel = PresurgicalPanel(self.document, self.runner, device=device, report=self._report_error)
        for title, widget, area in (
            ("Layers", self.layer_panel, Qt.DockWidgetArea.LeftDockWidgetArea),
            ("Jobs", self.job_panel, Qt.DockWidgetArea.LeftDockWidgetArea),
            ("Deterministic tracking", self.deterministic_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Geodesic tracking", self.geodesic_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Probabilistic tracking", self.probabilistic_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("COMMIT filtering", self.commit_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Connectivity", self.connectivity_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Presurgical", self.presurgical_panel, Qt.DockWidgetArea.RightDockWidgetArea),
        ):
            dock = QDockWidget(title, self)
            dock.setObjectName(f"dock_{title.lower().replace(' ', '_')}")
            dock.setWidget(widget)
            self.addDockWidget(area, dock)
        self.tabifyDockWidget(
            self.findChild(QDockWidget, "dock_deterministic_tracking"),
            self.findChild(QDockWidget, "dock_geodesic_tracking"),
        )
        self.tabifyDockWidget(
            self.findChild(QDockWidget, "dock_geodesic_tracking"),
            self.findChild(QDockWidget, "dock_probabilistic_tracking"),
        )
        self.tabifyDockWidget(
            self.findChild(QDockWidget, "dock_probabilistic_tracking"),
            self.findChild(QDockWidget, "dock_commit_filtering"),
        )
        for first, second in (("commit_filtering", "connectivity"), ("connectivity", "presurgical")):
            self.tabifyDockWidget(
                self.findChild(QDockWidget, f"dock_{first}"), self.findChild(QDockWidget, f"dock_{second}")
            )
        self._keep_tracking_docks_width()
        self.findChild(QDockWidget, "dock_probabilistic_tracking").raise_()  # the tab shown first, as before

        self.position_label = QLabel()
        self.position_label.setObjectName("position")
        self.busy = QProgressBar()
        self.busy.setMaximumWidth(160)
        self.busy.setRange(0, 0)
        self.busy.hide()
        self.hover_label = QLabel()
        self.hover_label.setObjectName("hover")
        self.statusBar().addWidget(self.position_label, 1)
        self.statusBar().addWidget(self.hover_label, 1)
        for view in self.views.values():
            view.hovered.connect(self.update_hover_label)
            view.shape_created.connect(self._shape_created)
            view.notice.connect(lambda text: self.statusBar().showMessage(text, 10000))
        self.view3d.plane_clicked.connect(self._place_shape_3d)
        self.statusBar().addPermanentWidget(self.busy)

        self._build_menus()
        # A throttle, not a debounce: the first edit starts it and later ones do not restart it,
        # so a continuous drag updates the selection every 40 ms instead of only when it stops.
        self._selection_timer = QTimer(self)
        self._selection_timer.setSingleShot(True)
        self._selection_timer.setInterval(40)
        self._selection_timer.timeout.connect(self.update_fiber_selection)
        self._selection_job: int | None = None
        self._selection_stale = False  # edited while a selection was being computed: run again
        self._roi_selection = False  # the tractograms' selections come from the ROIs
        self._fiber_indexes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._index_lock = threading.Lock()
        self.document.connect(self._on_document)
        self.runner.job_added.connect(lambda _id: self._update_busy())
        self.runner.job_changed.connect(lambda _id: self._update_busy())
        self._restore_layout()
        self._start_autosave(autosave_s)
        QTimer.singleShot(0, lambda: offer_recovery(self, restore))

    # ------------------------------------------------------------------ menus
    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("toolbar_main")
        toolbar.addAction(self._action(file_menu, "&Open…", self.open_dialog, QKeySequence.StandardKey.Open))
        self._action(file_menu, "Open &folder (dtifit, bedpostX)…", self.open_folder_dialog)
        toolbar.addAction(self._action(file_menu, "Open &demo", self.open_demo, "Ctrl+D"))
        self.recent_menu = file_menu.addMenu("Open &recent")
        self._fill_recent()
        file_menu.addSeparator()
        toolbar.addAction(self._action(file_menu, "Save &screenshot…", self._screenshot_dialog, "Ctrl+Shift+S"))
        self._action(file_menu, "Export &report…", self._report_dialog, "Ctrl+Shift+E")
        file_menu.addSeparator()
        self._action(file_menu, "Open s&ession…", self._open_session_dialog, "Ctrl+Shift+O")
        self._action(file_menu, "Save sess&ion…", self._save_session_dialog, "Ctrl+Shift+W")
        self._action(file_menu, "&Autosave interval…", self._autosave_dialog)
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        view_menu = self.menuBar().addMenu("&View")
        toolbar.addAction(self._action(view_menu, "&Reset 3-D camera", self._reset_camera, "Ctrl+R"))
        self._action(view_menu, "Next slice", lambda: self._focused_view().step(1), "Ctrl+Up")
        self._action(view_menu, "Previous slice", lambda: self._focused_view().step(-1), "Ctrl+Down")
        self._action(view_menu, "Radiological convention", self._toggle_radiological, checkable=True)
        self._build_view_controls(view_menu)
        self._build_roi_tools(file_menu)
        track_menu = self.menuBar().addMenu("&Track")
        self._action(track_menu, "&Deterministic (tensor)", self.deterministic_panel.track, "Ctrl+T")
        self._action(track_menu, "&Geodesic (ray tracing)", self.geodesic_panel.track, "Ctrl+G")
        self._action(track_menu, "&Probabilistic (probtrackx)", self.track_probabilistic, "Ctrl+Shift+P")
        filter_menu = self.menuBar().addMenu("F&ilter")
        self._action(filter_menu, "&COMMIT filtering…", self.show_commit_panel)
        analysis_menu = self.menuBar().addMenu("&Analysis")
        self._action(analysis_menu, "Connectivity &matrix…", lambda: self.show_dock("dock_connectivity"))
        self._action(analysis_menu, "&Distance to lesion…", lambda: self.show_dock("dock_presurgical"))
        jobs_menu = self.menuBar().addMenu("&Jobs")
        toolbar.addAction(self._action(jobs_menu, "Cancel all jobs", self.runner.cancel_all, "Ctrl+."))

    def track_probabilistic(self) -> int | None:
        """Track menu: show the Probabilistic tracking panel and track with its settings."""
        self.findChild(QDockWidget, "dock_probabilistic_tracking").raise_()
        return self.probabilistic_panel.track()

    def _keep_tracking_docks_width(self) -> None:
        """The tracking docks' tab bar asks for room for every tab title; without a hint the
        COMMIT, Connectivity and Presurgical tabs would widen the dock area (and shrink the
        views) by their titles' widths."""
        dock = self.findChild(QDockWidget, "dock_commit_filtering")
        added = ("COMMIT filtering", "Connectivity", "Presurgical")
        for bar in self.findChildren(QTabBar):
            titles = [bar.tabText(i) for i in range(bar.count())]
            if dock.windowTitle() in titles:
                extra = sum(bar.tabSizeHint(titles.index(t)).width() for t in added if t in titles)
                self.resizeDocks([dock], [bar.sizeHint().width() - extra], Qt.Orientation.Horizontal)

    def show_dock(self, name: str) -> QDockWidget:
        """Analysis menu: show and raise a dock (``dock_connectivity``, ``dock_presurgical``)."""
        dock = self.findChild(QDockWidget, name)
        dock.show()
        dock.raise_()
        return dock

    def show_commit_panel(self, layer: Layer | None = None) -> CommitPanel:
        """Filter menu and a tractogram layer's menu: raise the COMMIT panel with ``layer`` (or the
        selected layer, if it is a tractogram) chosen; Filter there starts the fit."""
        if layer is None:
            selected = self.layer_panel.selected_layer()
            layer = selected if selected is not None and selected.kind == "tractogram" else None
        if layer is not None:
            self.commit_panel.choose(layer)
        dock = self.findChild(QDockWidget, "dock_commit_filtering")
        dock.show()
        dock.raise_()
        return self.commit_panel

    def _build_roi_tools(self, file_menu) -> None:
        edit_menu = self.menuBar().addMenu("&Edit")
        self._action(edit_menu, "&Undo", self.document.undo, QKeySequence.StandardKey.Undo)
        self._action(edit_menu, "&Redo", self.document.redo, "Ctrl+Shift+Z")
        file_menu.addSeparator()
        self._action(file_menu, "Open R&OI…", self.open_roi_dialog)
        self._action(file_menu, "Sa&ve ROI…", self.save_roi_dialog)
        bar = self.addToolBar("ROI")
        bar.setObjectName("toolbar_roi")
        self.role_box = QComboBox()
        self.role_box.addItems(ROI_ROLES)
        self.role_box.currentTextChanged.connect(lambda role: setattr(self.roi_tools, "role", role))
        bar.addWidget(self.role_box)
        bar.addAction(self._action(edit_menu, "New ROI", self.new_roi, "Ctrl+N"))
        group = QActionGroup(self)
        self.tool_actions = {}
        for tool, key in (
            ("navigate", "N"),
            ("brush", "B"),
            ("eraser", "E"),
            ("rectangle", "R"),
            ("polygon", "P"),
            ("fill", "F"),
            ("sphere", "S"),
            ("box", "X"),
        ):
            action = self._action(edit_menu, tool.capitalize(), lambda t=tool: self.set_tool(t), key, checkable=True)
            group.addAction(action)
            bar.addAction(action)
            self.tool_actions[tool] = action
        self.tool_actions["navigate"].setChecked(True)
        self.radius_box = QSpinBox()
        self.radius_box.setRange(0, 20)
        self.radius_box.setValue(self.roi_tools.radius)
        self.radius_box.setPrefix("radius ")
        self.radius_box.valueChanged.connect(self._radius_changed)
        bar.addWidget(self.radius_box)
        self.threshold_box = QDoubleSpinBox()
        self.threshold_box.setRange(-1e6, 1e6)
        self.threshold_box.setDecimals(3)
        self.threshold_box.setSingleStep(0.05)
        self.threshold_box.setValue(self.roi_tools.threshold)
        self.threshold_box.setPrefix("fill > ")
        self.threshold_box.valueChanged.connect(lambda t: setattr(self.roi_tools, "threshold", float(t)))
        bar.addWidget(self.threshold_box)

    def _radius_changed(self, radius: int) -> None:
        """The radius box sets the brush and shape size, and resizes the active shape ROI when
        its tool is chosen (with the box tool, a box; another tool's size leaves it alone)."""
        self.roi_tools.radius = int(radius)
        layer = self.roi_tools.active_roi()
        shape = layer.data.shape if layer is not None else None
        if shape is not None and shape["kind"] == self.roi_tools.tool and shape["radius"] != radius:
            self.document.set_roi_shape(layer, dict(shape, radius=int(radius)))

    def attach_shape_widget(self, layer) -> None:
        """Put the 3-D handle on a shape ROI: moving or resizing it there is one undoable edit
        per interaction (a sphere handle on a sphere, a box handle on a box)."""

        def changed(shape: dict) -> None:
            if layer in self.document.layers:
                self.document.set_roi_shape(layer, shape)

        self.view3d.show_shape_widget(layer, changed)

    def set_tool(self, tool: str) -> None:
        self.roi_tools.tool = tool
        self.tool_actions[tool].setChecked(True)
        self.view3d.pick_planes = tool in ("sphere", "box")  # a click on a 3-D plane places one

    def _follow_shape(self, layer) -> None:
        """A shape ROI moved or resized (on a slice, in 3-D, by undo): the 3-D handle goes with it
        (onto it, if it was on another ROI) and the radius box shows its size."""
        if self.view3d.shape_layer is not layer or not self.view3d.handle_fits(layer):
            self.attach_shape_widget(layer)
        else:
            self.view3d.follow_shape(layer)
        if layer is self.roi_tools.active_roi():
            radius = round(float(np.max(shape_half_sizes(layer.data.shape))))
            self.roi_tools.radius = radius
            self.radius_box.blockSignals(True)  # showing the size is no edit
            self.radius_box.setValue(radius)
            self.radius_box.blockSignals(False)

    def _shape_created(self, layer) -> None:
        self.layer_panel.list.setCurrentItem(self.layer_panel.item_for(layer))
        self.attach_shape_widget(layer)

    def _place_shape_3d(self, ijk) -> None:
        """A click on a cursor plane in the 3-D view with the sphere or box tool: a new shape ROI there."""
        tool = self.roi_tools.tool
        if tool not in ("sphere", "box"):
            return
        try:
            layer = self.roi_tools.new_roi(shape={"kind": tool, "centre": ijk, "radius": self.roi_tools.radius})
        except ValueError as exc:
            self._report_error(str(exc), "")
            return
        self._shape_created(layer)

    def new_roi(self):
        try:
            layer = self.roi_tools.new_roi()
        except ValueError as exc:
            self._report_error(str(exc), "")
            return None
        self.layer_panel.list.setCurrentItem(self.layer_panel.item_for(layer))
        if self.roi_tools.tool == "navigate":
            self.set_tool("brush")
        return layer

    def save_roi(self, layer, path, *, overwrite: bool = False) -> Path | None:
        """Write an ROI as a uint8 NIfTI mask on its grid (FSL, MRtrix and DIPY read it).

        A name without .nii or .nii.gz gets .nii.gz. An existing file is replaced only when
        the user says so (:func:`ask_overwrite`) or ``overwrite`` is given; the written path,
        or None when nothing was written (declined, or an error the user was shown)."""
        path = Path(path)
        if not path.name.lower().endswith((".nii", ".nii.gz")):
            path = path.with_name(path.name + ".nii.gz")
        if path.exists() and not overwrite and not ask_overwrite(self, path):
            self.statusBar().showMessage(f"ROI not saved: {path.name} exists and was not replaced", 15000)
            return None
        try:
            written = save_volume(layer.data.mask.astype(np.uint8), layer.data.affine, path)
        except InputError as exc:  # SaveError: disk full, no permission, ...
            self._report_error(f"The ROI could not be saved: {exc}", "")
            return None
        self.statusBar().showMessage(f"ROI {layer.name} saved to {written}", 8000)
        return written

    def save_roi_dialog(self) -> None:
        layer = self.roi_tools.active_roi()
        if layer is None:
            self._report_error("there is no ROI to save: draw one first (New ROI)", "")
            return
        # save_roi asks before replacing a file (after adding a missing suffix, which changes the name).
        path, _ = QFileDialog.getSaveFileName(
            self,
            "Save ROI",
            f"{layer.name}.nii.gz",
            "NIfTI (*.nii.gz *.nii)",
            options=QFileDialog.Option.DontConfirmOverwrite,
        )
        if path:
            self.save_roi(layer, path)

    def open_roi(self, path, role: str | None = None):
        """Load a mask as an ROI layer on the reference grid (resampled, with a notice, if needed);
        an undoable edit. A mask that lies outside the image is refused; an empty one is added
        with a warning (a blank to draw in). None when it was refused (the user is told why)."""
        from tractlens.app.io.nifti import load_3d, load_image
        from tractlens.app.pipelines.select import resample_nearest

        path = Path(path)
        notices = []
        try:
            img = load_image(path, "ROI")
            data = np.asarray(load_3d(path, None, "ROI"))
            mask = (data != 0) & np.isfinite(data)
            empty = not mask.any()
            doc = self.document
            if doc.reference_affine is None:
                affine, shape = img.affine, mask.shape
            else:
                affine, shape = doc.reference_affine, doc.reference_shape
                if mask.shape != tuple(shape) or not np.allclose(img.affine, affine, atol=1e-3):
                    mask = resample_nearest(mask, img.affine, affine, shape)
                    if not empty and not mask.any():
                        raise InputError(
                            "the ROI lies outside the image: none of its voxels is inside the volume",
                            path=path,
                            fix="Check that it belongs to this subject and space (its affine)",
                        )
                    notices.append(f"{path.name} was on another grid: resampled (nearest neighbour)")
            if empty:
                notices.append(f"{path.name} is empty (no non-zero voxel): added as an empty ROI")
            name = self.roi_tools.unique_name(split_suffix(path)[0])
            roi = RoiMask(name, mask, affine, role=role or self.roi_tools.role)
        except InputError as exc:
            self._report_error(str(exc), "")
            return None
        layer = self.document.add_layer(Layer(roi.name, roi, "roi"), undoable=True)
        if notices:
            self.statusBar().showMessage("; ".join(notices), 15000)
        return layer

    def open_roi_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Open ROI", "", "NIfTI (*.nii.gz *.nii)")
        for path in paths:
            self.open_roi(path)

    def _action(self, menu, text, slot, shortcut=None, checkable=False) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setCheckable(checkable)
        action.triggered.connect(lambda *_: slot())
        menu.addAction(action)
        return action

    def _reset_camera(self) -> None:
        self.view3d.reset_camera()
        self.view3d.request_render()

    def _build_view_controls(self, view_menu) -> None:
        """View menu: the 3-D camera along an axis (Ctrl+1..4), one view maximised (Alt+1..4,
        Alt+0 or the same key again: all four), and the slab of fibers drawn on the slices."""
        view_menu.addSeparator()
        camera = view_menu.addMenu("3-D &camera")
        views = (
            ("axial", "&Axial (from above)"),
            ("coronal", "&Coronal (from behind)"),
            ("sagittal", "&Sagittal (from the left)"),
            ("isometric", "&Isometric"),
        )
        for key, (name, text) in enumerate(views, start=1):
            self._action(camera, text, lambda n=name: self.set_camera_view(n), f"Ctrl+{key}")
        layout = view_menu.addMenu("&Maximise view")
        for key, (name, text) in enumerate(
            (("3d", "&3-D view"), ("axial", "&Axial"), ("coronal", "&Coronal"), ("sagittal", "&Sagittal")), start=1
        ):
            self._action(layout, text, lambda n=name: self.maximise_view(n), f"Alt+{key}")
        self._action(layout, "All &four views", lambda: self.maximise_view(None), "Alt+0")
        slab_menu = view_menu.addMenu("Fiber s&lab on slices")
        group = QActionGroup(self)
        self.slab_actions: dict[float | None, QAction] = {}
        for mm in (*SLAB_CHOICES_MM, None):
            text = "&All fibers (no slab)" if mm is None else f"{mm:g} mm"
            action = self._action(slab_menu, text, lambda m=mm: self.set_fiber_slab(m), checkable=True)
            group.addAction(action)
            self.slab_actions[mm] = action
        saved = settings().value("view/slab_mm", DEFAULT_SLAB_MM)
        self.set_fiber_slab(None if saved in ("all", None) else float(saved))

    def set_fiber_slab(self, mm: float | None) -> None:
        """Draw on the slice views the fibers within ``mm`` around the slice (None: all of them,
        projected); remembered for the next start."""
        for view in self.views.values():
            view.slab_mm = None if mm is None else float(mm)
            view.update()
        if mm in self.slab_actions:
            self.slab_actions[mm].setChecked(True)
        else:
            for action in self.slab_actions.values():
                action.setChecked(False)
        settings().setValue("view/slab_mm", "all" if mm is None else float(mm))

    def set_camera_view(self, name: str) -> None:
        """Turn the 3-D camera to look along an axis (``axial``, ``coronal``, ``sagittal``) as the
        slice views show it, mirrored with the radiological convention, or ``isometric``."""
        self.view3d.view_from(name, radiological=self.views["axial"].radiological)

    def maximise_view(self, name: str | None) -> None:
        """Show one view (``3d``, ``axial``, ``coronal``, ``sagittal``) over the whole central area,
        or all four (None, or the name of the view already maximised)."""
        widgets = {"3d": self.view3d, **self.views}
        if name is not None and name not in widgets:
            raise ValueError(f"no view {name!r}: one of {', '.join(widgets)}")
        alone = [key for key, widget in widgets.items() if not widget.isHidden()]
        if name is None or alone == [name]:
            for widget in widgets.values():
                widget.show()
            return
        for key, widget in widgets.items():
            widget.setVisible(key == name)
        if name != "3d":
            widgets[name].setFocus()  # its keys (slice stepping) work at once

    def _focused_view(self) -> SliceView:
        for view in self.views.values():
            if view.hasFocus():
                return view
        return self.views["axial"]

    def _toggle_radiological(self) -> None:
        for view in self.views.values():
            view.radiological = not view.radiological
            view.update()

    # -------------------------------------------------------------- opening
    def open_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Open", "", FILE_FILTER)
        self.open_paths(paths)

    def open_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a dtifit or bedpostX folder")
        if folder:
            self.open_paths([folder])

    def open_demo(self) -> None:
        """Load the built-in phantom: DTI maps (fitted on a worker) and its ground-truth bundles."""

        def job(ctx):
            from tractlens.app.demo import demo_path

            ctx.progress(0, 1, "preparing the demo data")
            return demo_path()

        self.runner.submit(
            "demo data",
            job,
            on_done=lambda folder: self.open_paths([folder / "dwi.nii.gz", folder / "bundles.trk"]),
            on_error=self._report_error,
        )

    def open_paths(self, paths: Iterable[str | os.PathLike]) -> None:
        """Open each file on a worker thread; its layers are added when ready.

        The files of one call stack in the order given, the first at the bottom (as FSLeyes
        stacks its command line), whichever finishes loading first. An anatomical image
        (:func:`app.loaders.is_anatomical`: a T1 stored as integers, or named so) opened into a
        document that already shows images goes under them, so the maps stay on top of it."""
        image_kinds = ("scalar", "dwi", "rgb", "labels")
        call = {"slots": [], "under": [layer for layer in self.document.layers if layer.kind in image_kinds]}
        for path in paths:
            path = Path(path)
            if path.suffix.lower() == ".tractlens":  # a session (recent files, drag and drop)
                self.open_session(path)
                continue
            reference = None
            if self.document.reference_affine is not None:
                reference = (self.document.reference_affine, self.document.reference_shape)

            def job(ctx, path=path, reference=reference):
                layers = load_layers(
                    path, reference=reference, device=self.device, progress=ctx.progress, cancelled=ctx.cancelled
                )
                for layer in layers:
                    if layer.kind == "tractogram":  # O(points) display work stays off the GUI thread
                        ctx.progress(0, 1, "preparing the display")
                        fiber_display.prepare(layer)
                return layers

            slot = len(call["slots"])
            call["slots"].append({"path": path, "layers": None, "state": "loading"})

            def failed(message, details, call=call, slot=slot) -> None:
                self._report_error(message, details)
                self._opened(call, slot, None)

            job_id = self.runner.submit(
                f"open {path.name}",
                job,
                on_done=lambda layers, call=call, slot=slot: self._opened(call, slot, layers),
                on_error=failed,
            )
            self._opening[job_id] = (call, slot)

    def _open_cancelled(self, job_id: int) -> None:
        if job_id in self._opening:
            self._opened(*self._opening[job_id], None)

    def _opened(self, call: dict, slot: int, layers) -> None:
        """A file of an :meth:`open_paths` call is loaded (``layers``) or not (None): add the
        layers of every file up to the first still loading, in the call's order."""
        entry = call["slots"][slot]
        entry["layers"], entry["state"] = layers, "loaded" if layers is not None else "failed"
        self._opening = {k: v for k, v in self._opening.items() if not (v[0] is call and v[1] == slot)}
        for entry in call["slots"]:
            if entry["state"] == "loading":
                return
            if entry["state"] == "loaded":
                self._add_layers(entry["path"], entry["layers"], under=call["under"])
            entry["state"] = "added"

    def _add_layers(self, path: Path, layers, under: list[Layer] = ()) -> None:
        for layer in layers:
            self.document.add_layer(layer)
            below = [self.document.layers.index(old) for old in under if old in self.document.layers]
            if below and is_anatomical(layer):
                self.document.move_layer(layer, min(below))
        self._remember_recent(path)
        self.loaded.emit(str(path))

    def show_layer_as(self, layer: Layer, kind: str) -> int:
        """The layer menu's "Show as labels / scalar": the image converted on a worker
        (:func:`app.loaders.show_as`) and put in the layer's place; the job id."""

        def done(new: Layer) -> None:
            if layer in self.document.layers:
                self.document.replace_layer(layer, new)
                self.layer_panel.list.setCurrentItem(self.layer_panel.item_for(new))

        return self.runner.submit(
            f"show {layer.name} as {kind}", lambda ctx: show_as(layer, kind), on_done=done, on_error=self._report_error
        )

    # -------------------------------------------------------- model fitting
    def fit_ballstick_dialog(self, layer: Layer) -> BallStickDialog:
        """Ask for the ball & sticks settings of a DWI layer (non-blocking); Fit starts the job."""
        rois = [roi for roi in self.document.layers if roi.kind == "roi"]
        if self.ballstick_dialog is not None:
            self.ballstick_dialog.deleteLater()  # the previous one, closed or not
        dialog = BallStickDialog(layer, rois, self)
        dialog.accepted.connect(lambda: self.fit_ballstick(layer, dialog.params, dialog.folder, dialog.roi))
        self.ballstick_dialog = dialog
        dialog.open()
        return dialog

    def fit_ballstick(self, layer: Layer, params, folder: Path | None = None, roi: Layer | None = None) -> int:
        """Fit ball & sticks to a DWI layer's series on a worker, in the brain or inside ``roi`` (as
        it is now); the dyads and mean f1 layers are added when it is done (a cancelled or failed
        fit adds nothing). Returns the job id."""
        region = None if roi is None else (roi.data.mask.copy(), roi.data.affine.copy())

        def done(outcome) -> None:
            layers, result = outcome
            for new in layers:
                new.provenance = {"computed": "ball & sticks (bedpostX)", "dwi": layer.name, **result.fit.provenance}
                self.document.add_layer(new)
            seconds = result.fit.provenance.get("total_s")
            text = f"Ball & sticks: {int(result.samples.mask.sum())} voxels fitted"
            text += f" in {seconds:.1f} s" if seconds is not None else ""
            text += f"; saved to {folder}" if folder is not None else ""
            self.statusBar().showMessage("; ".join([text, *result.warnings]), 15000)

        return self.runner.submit(
            f"ball & sticks ({layer.name})",
            ballstick_job(layer.data.dwi, params, folder, self.device, region),
            on_done=done,
            on_error=self._report_error,
        )

    def _report_error(self, message: str, details: str) -> None:
        self.errors.append(message)
        self.statusBar().showMessage(message, 15000)
        if not os.environ.get("TRACTLENS_NO_DIALOGS"):
            box = QMessageBox(QMessageBox.Icon.Warning, "TractLens", message, parent=self)
            if details:
                box.setDetailedText(details)
            box.open()

    def wait_for_jobs(self, timeout_s: float = 120.0) -> bool:
        """Process events until no job is queued or running and the views show the document as
        it is (their glyphs built: :meth:`display_ready`), for scripts and tests; False when
        that took longer than ``timeout_s``."""
        import time

        from PySide6.QtCore import QCoreApplication, QElapsedTimer

        def idle() -> bool:
            return not self.runner.active() and self.display_ready()

        clock = QElapsedTimer()
        clock.start()
        while clock.elapsed() < timeout_s * 1000:
            QCoreApplication.processEvents()
            if idle():
                QCoreApplication.processEvents()
                if idle():
                    return True
            if self.runner.active():
                self.runner.wait(0.02)
            else:
                time.sleep(0.005)  # glyphs being built on their worker threads
        return False

    def display_ready(self) -> bool:
        """Do the 3-D and slice views show the document as it is now (tensor glyphs, which are
        built on worker threads, included)?"""
        return self.view3d.glyphs_ready() and all(view.glyphs_ready() for view in self.views.values())

    # ----------------------------------------------------------- drag & drop
    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        self.open_paths(url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile())

    # ---------------------------------------------------------------- status
    def _on_document(self, _source, event, **info) -> None:
        if event in ("cursor", "layers", "display"):
            self.update_position_label()
        layer = info.get("layer")
        roi_changed = event == "roi" or (event == "display" and layer is not None and layer.kind == "roi")
        if event == "roi" and layer is not None and layer.data.shape is not None:
            self._follow_shape(layer)
        if event == "layers" and self.view3d.shape_layer not in self.document.layers:
            self.view3d.show_shape_widget(None, None)  # its ROI was deleted (or its creation undone)
        if (roi_changed or event == "layers") and not self._selection_timer.isActive():
            self._selection_timer.start()

    def _fiber_index(self, layer: Layer, reference: np.ndarray):
        """The layer's streamlines resident on the compute device (built once, on a worker)."""
        key = reference.tobytes()
        with self._index_lock:
            cached = self._fiber_indexes.get(layer)
        if cached is None or cached[0] != key:
            cached = (key, index_on_grid(layer.data, reference, self.device))
            with self._index_lock:
                self._fiber_indexes[layer] = cached
        return cached[1]

    def update_fiber_selection(self) -> None:
        """Show the streamlines that pass the ROIs (seed, target, waypoint: all; exclusion: none),
        computed on a worker from a snapshot of the masks. One run at a time: edits made while
        one runs start another when it is done (cancelling it instead would starve the
        selection while an ROI is dragged or painted, if a run takes longer than the edits'
        pace)."""
        doc = self.document
        tracts = [layer for layer in doc.layers if layer.kind == "tractogram"]
        include, exclude = doc.roi_sets()
        if not tracts:
            return
        if not include and not exclude:
            # Without ROIs only a selection the ROIs made is cleared: one chosen another way (a
            # connectivity cell) stays through unrelated changes (a file opened, a result added).
            if self._selection_job is not None:  # its result is stale now
                self.runner.cancel(self._selection_job)
                self._selection_job, self._selection_stale = None, False
            if self._roi_selection:
                for layer in tracts:
                    layer.set_selection(None)
                self._roi_selection = False
            return
        self._roi_selection = True
        job_now = self.runner.jobs.get(self._selection_job) if self._selection_job is not None else None
        if job_now is not None and job_now in self.runner.active() and not job_now.cancel_event.is_set():
            self._selection_stale = True  # selected again with the masks of then, when it is done
            return
        include = [mask.copy() for mask in include]
        exclude = [mask.copy() for mask in exclude]
        reference = doc.reference_affine.copy()
        # Exclusion only: everything inside the volume that avoids it.
        everywhere = [np.ones(doc.reference_shape, dtype=bool)] if not include else []

        def job(ctx):
            out = {}
            for layer in tracts:
                ctx.check()
                index = self._fiber_index(layer, reference)
                result = index.select(include or everywhere, exclude, cancelled=ctx.cancelled)
                out[id(layer)] = (layer, result.selected)
            return out

        this = {}

        def done(result):
            if this["id"] != self._selection_job:  # cancelled after it had finished: stale
                return
            for layer, selected in result.values():
                if layer in doc.layers:
                    layer.set_selection(selected)
            finished()

        def failed(message, details):
            if this["id"] == self._selection_job:
                finished()
            self._report_error(message, details)

        def finished():
            self._selection_job = None
            if self._selection_stale:
                self._selection_stale = False
                self.update_fiber_selection()

        this["id"] = self._selection_job = self.runner.submit("select fibers", job, on_done=done, on_error=failed)

    def update_position_label(self) -> None:
        doc = self.document
        if doc.reference_affine is None:
            self.position_label.setText("")
            return
        i, j, k = (int(v) for v in doc.cursor)
        x, y, z = doc.cursor_world()
        parts = [f"voxel ({i}, {j}, {k})", f"RAS ({x:.1f}, {y:.1f}, {z:.1f}) mm"]
        for name, value in doc.values_at_cursor():
            parts.append(f"{name} {_format_value(value)}")
        self.position_label.setText("   ".join(parts))

    def update_hover_label(self, ijk) -> None:
        """Values under the mouse pointer (the crosshair's are in the position label)."""
        if ijk is None or self.document.reference_affine is None:
            self.hover_label.setText("")
            return
        values = "  ".join(f"{name} {_format_value(v)}" for name, v in self.document.values_at(ijk))
        self.hover_label.setText(f"mouse ({', '.join(str(int(v)) for v in ijk)})  {values}")

    def _update_busy(self) -> None:
        self.busy.setVisible(bool(self.runner.active()))

    # ----------------------------------------------------------- screenshots
    def save_screenshot(self, path: str | os.PathLike) -> Path:
        """Write the whole window, the 3-D view included, as PNG."""
        path = Path(path)
        image = self.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
        if self.view3d.isVisible():  # not when another view is maximised
            rgb = np.ascontiguousarray(self.view3d.screenshot()[..., :3])
            height, width = rgb.shape[:2]
            view_image = QImage(rgb.data, width, height, 3 * width, QImage.Format.Format_RGB888)
            origin = self.view3d.mapTo(self, self.view3d.rect().topLeft())
            painter = QPainter(image)
            painter.drawImage(origin, view_image.scaled(self.view3d.size()))
            painter.end()
        from .report import save_image

        return save_image(image, path)

    # -------------------------------------------------------- sessions, report
    def save_session(self, path: str | os.PathLike) -> int:
        """Write every layer, its display and provenance, and the window's settings to a
        ``.tractlens`` file: the document is copied now (so edits made while it is written do
        not reach the file half-way) and written on a worker; the job id."""
        from tractlens.app.session import write_session

        from .session_io import window_snapshot

        snap = window_snapshot(self)
        return self.runner.submit(
            f"save session {Path(path).name}",
            lambda ctx: write_session(snap, path),
            on_done=lambda written: self.statusBar().showMessage(f"Session saved to {written}", 8000),
            on_error=self._report_error,
        )

    def open_session(self, path: str | os.PathLike) -> int:
        """Read a session on a worker and put its layers in this window (replacing the current ones)."""
        from tractlens.app.session import load_session

        from .session_io import apply_session

        def done(session) -> None:
            apply_session(self, session)
            self._remember_recent(Path(path))
            self.loaded.emit(str(path))

        return self.runner.submit(
            f"open session {Path(path).name}", lambda ctx: load_session(path), on_done=done, on_error=self._report_error
        )

    def export_report(self, path: str | os.PathLike, **options) -> list[Path]:
        """The planning report as PDF (and PNG pages) — see :mod:`widgets.report`."""
        from .report import export_report

        return export_report(self, path, **options)

    def _report_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export report", "report.pdf", "PDF (*.pdf)")
        if path:
            try:
                files = self.export_report(path)
            except (OSError, InputError) as exc:  # InputError: SaveError, e.g. the disk is full
                self._report_error(f"The report could not be written: {exc}", "")
                return
            self.statusBar().showMessage("Report written: " + ", ".join(f.name for f in files), 8000)

    def _open_session_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open session", "", "TractLens session (*.tractlens)")
        if path:
            self.open_session(path)

    def _save_session_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save session", "session.tractlens", "TractLens session (*.tractlens)"
        )
        if path:
            self.save_session(path)

    def _screenshot_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save screenshot", "tractlens.png", "PNG (*.png)")
        if path:
            try:
                self.save_screenshot(path)
            except (OSError, InputError) as exc:
                self._report_error(f"The screenshot could not be written: {exc}", "")

    # ------------------------------------------------------ autosave, recovery
    def _start_autosave(self, interval_s: float | None) -> None:
        self._restoring = None  # the orphaned autosave being restored, deleted once autosaved again
        self._autosave_error = ""
        if interval_s is None:
            interval_s = float(settings().value("autosave/interval_s", DEFAULT_INTERVAL_S))
        try:
            self.autosave: WindowAutosave | None = WindowAutosave(self, interval_s)
        except OSError as exc:
            self.autosave = None
            self.statusBar().showMessage(f"Autosave is off: its folder cannot be written ({exc})", 15000)
            return
        self.autosave.saved.connect(self._autosaved)
        self.autosave.failed.connect(self._autosave_failed)

    def set_autosave_interval(self, seconds: float) -> None:
        """Autosave every ``seconds`` (0: off); remembered for the next start."""
        settings().setValue("autosave/interval_s", float(seconds))
        if self.autosave is not None:
            self.autosave.set_interval(seconds)

    def _autosave_dialog(self) -> None:
        from PySide6.QtWidgets import QInputDialog

        current = int(self.autosave.interval_s) if self.autosave is not None else 0
        seconds, ok = QInputDialog.getInt(
            self, "Autosave", "Autosave every (seconds, 0 = off):", current, 0, 24 * 3600, 5
        )
        if ok:
            self.set_autosave_interval(seconds)

    def _autosaved(self) -> None:
        self._autosave_error = ""
        if self._restoring is not None:  # the restored work is safe in our own autosave now
            restored = self._restoring.describe()
            self._restoring.discard()
            self._restoring = None
            self.statusBar().showMessage(f"Restored the {restored}", 15000)
            return
        self.statusBar().showMessage("Autosaved", 2000)

    def _autosave_failed(self, message: str) -> None:
        if message != self._autosave_error:  # say it once, not at every tick
            self._autosave_error = message
            self._report_error(f"Autosave failed (it is tried again): {message}", "")

    def restore_autosave(self, orphan) -> int:
        """Open an autosave a crashed window left (on a worker), replacing this window's layers."""
        from tractlens.app.session import load_session

        from .session_io import apply_session

        def done(session) -> None:
            apply_session(self, session)
            self._restoring = orphan
            self.statusBar().showMessage(f"Restored the {orphan.describe()}", 15000)
            if self.autosave is not None:
                self.autosave.save_now()

        def failed(message: str, details: str) -> None:
            orphan.release()  # kept: another start may offer it again
            self._report_error(f"The autosave could not be restored: {message}", details)

        return self.runner.submit("restore autosave", lambda ctx: load_session(orphan.folder), on_done=done,
                                  on_error=failed)  # fmt: skip

    # ------------------------------------------------------ settings, recent
    def _restore_layout(self) -> None:
        store = settings()
        geometry = store.value("window/geometry")
        state = store.value("window/state")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1400, 900)
        if state is not None:
            self.restoreState(state, LAYOUT_VERSION)  # refused (defaults kept) when saved by other docks

    def _remember_recent(self, path: Path) -> None:
        store = settings()
        recent = [str(path.resolve())] + [p for p in (store.value("recent") or []) if p != str(path.resolve())]
        store.setValue("recent", recent[:MAX_RECENT])
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for item in settings().value("recent") or []:
            action = self.recent_menu.addAction(item)
            action.triggered.connect(lambda *_, p=item: self.open_paths([p]))

    def closeEvent(self, event) -> None:
        store = settings()
        store.setValue("window/geometry", self.saveGeometry())
        store.setValue("window/state", self.saveState(LAYOUT_VERSION))
        self.runner.shutdown(10.0)
        if self._restoring is not None:  # restored but not yet autosaved again: offer it next time
            self._restoring.release()
            self._restoring = None
        if self.autosave is not None:
            self.autosave.close()  # a clean exit: nothing to recover
            self.autosave = None
        self.view3d.close_plotter()
        super().closeEvent(event)


def ask_overwrite(parent, path: Path) -> bool:
    """Ask whether to replace an existing file (tests replace this function). With
    ``TRACTLENS_NO_DIALOGS`` set nobody can be asked: the answer is no."""
    if os.environ.get("TRACTLENS_NO_DIALOGS"):
        return False
    buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
    answer = QMessageBox.question(
        parent, "Replace file?", f"{path} already exists. Replace it?", buttons, QMessageBox.StandardButton.No
    )
    return answer == QMessageBox.StandardButton.Yes


def _format_value(value) -> str:
    """A layer's value in the status bar: ``3 (crossing_ap_start)`` for a named label,
    ``FA 0.62 λ1 1.7e-03`` for a tensor, numbers with 4 significant digits."""
    if isinstance(value, dict):
        if "label" in value:
            return f"{value['label']}" + (f" ({value['name']})" if "name" in value else "")
        return " ".join(f"{key} {_format_value(number)}" for key, number in value.items())
    array = np.asarray(value)
    if array.ndim == 0:
        number = float(array)
        return f"{number:.4g}" if abs(number) >= 1e-3 or number == 0 else f"{number:.3e}"
    return "(" + ", ".join(f"{float(v):.3g}" for v in array.ravel()) + ")"
