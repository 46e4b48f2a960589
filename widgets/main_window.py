"""The TractLens main window: a 3-D view and three linked slice views, layers, jobs.

Widgets hold no algorithm: they edit the :class:`~app.model.Document` and start
jobs on the :class:`~widgets.jobs.JobRunner`; loading and fitting run on worker
threads and their layers arrive by signal. The window is a shell: it builds the
views, docks, menus and tool bars and wires them to its controllers
(:mod:`widgets.controllers`: files, ROI files, the fibre selection, sessions and
autosave, screenshots and reports), which hold the use cases.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QMainWindow,
)

from tractlens.app.model import Document, Layer
from tractlens.app.pipelines.warmup import submit_gpu_warmup
from tractlens.app.window_words import window_words

from . import dialogs, glyphs, gui_gc
from .ballstick import BallStickDialog
from .commit_panel import CommitPanel
from .connectivity_panel import ConnectivityPanel
from .controllers import FibreSelection, FileController, ReportController, RoiController, SessionController
from .controllers.anatomy import AnatomyController
from .controllers.bundles import BundlesController
from .controllers.dicom import DicomController
from .controllers.first_steps import FirstSteps
from .controllers.help import build_help_menu
from .controllers.layer_saving import save_layer_dialog
from .controllers.menus import add_action, app_icon, build_file_menu, move_before
from .controllers.roi_toolbar import RoiToolbar
from .controllers.selection import SELECTION_FRAME_HOLD_S
from .controllers.settings import settings
from .controllers.view_menu import ViewControls
from .csd_dialog import open_csd_dialog
from .dock_tabs import fit_dock_tabs, scrollable
from .job_panel import BusyIndicator
from .jobs import JobRunner
from .model_dialog import open_model_dialog
from .panels import JobPanel, LayerPanel
from .presurgical_panel import PresurgicalPanel
from .probabilistic_panel import ProbabilisticPanel
from .roi_tools import RoiTools
from .session_io import WindowAutosave, apply_session, offer_recovery, window_snapshot
from .slice_view import SliceView
from .statistics_panel import StatisticsPanel
from .status_text import format_value as _format_value
from .status_text import with_unit
from .tracking_panel import DeterministicPanel, GeodesicPanel
from .view3d import View3D
from .window_layout import LEFT_DOCKS, RIGHT_DOCKS, DockProportions, central_views, fit_dock_tables

MAX_RECENT = 10
FILE_FILTER = "Images and tractograms (*.nii *.nii.gz *.mgz *.mgh *.trk *.tck *.trx);;All files (*)"


# The docks' layout saved at exit is restored only by a window with the same docks: bump this
# whenever docks are added, removed or regrouped (a stale layout would scatter the new ones).
# Layouts saved before it existed carry version 0.
LAYOUT_VERSION = 1


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
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.device = device
        self.document = Document()
        gui_gc.hold(self)  # cycles collected on the GUI thread only (widgets/gui_gc.py)
        self.runner = JobRunner(parent=self)
        self.errors: list[str] = []
        self.files = FileController(self.document, self.runner, device=device, open_session=self.open_session,
                                    before_loading=lambda: self.view3d.decide_fibre_drawing(), parent=self)  # fmt: skip
        self.files.loaded.connect(self._file_loaded)
        self.files.layer_replaced.connect(self.select_layer)
        self.rois = RoiController(
            self.document,
            role=lambda: self.roi_tools.role,
            ask_overwrite=lambda path: ask_overwrite(self, path),  # looked up when asked: tests replace it
            parent=self,
        )
        self.sessions = SessionController(
            self.runner,
            snapshot=lambda: window_snapshot(self),
            apply=lambda session: apply_session(self, session),
            make_autosave=lambda interval_s: WindowAutosave(self, interval_s),
            parent=self,
        )
        self.sessions.opened.connect(self._file_loaded)
        self.reports = ReportController(self)
        self.dicom = DicomController(self.document, self.runner, device=device, parent=self)
        self.dicom.loaded.connect(self._file_loaded)
        for controller in (self.files, self.rois, self.sessions, self.dicom):
            controller.message.connect(self._show_message)
            controller.error.connect(self.report_error)

        self.view3d = View3D(self.document)
        self.view3d.compute_device = device  # where the view makes what it computes (a simplified tractogram)
        self.roi_tools = RoiTools(self.document, lambda: self.layer_panel.selected_layer())
        self.views = {
            name: SliceView(self.document, name, tools=self.roi_tools) for name in ("axial", "coronal", "sagittal")
        }
        for view in self.views.values():
            view.frame_partner = self.view3d  # new 2-D glyphs are drawn with a held 3-D frame
        self.setCentralWidget(central_views(self.view3d, self.views))  # four equal cells
        self.view_controls = ViewControls(self, self.view3d, self.views)
        self.roi_toolbar = RoiToolbar(self)

        self.layer_panel = LayerPanel(self.document)
        self.layer_panel.fit_ballstick_requested.connect(self.fit_ballstick_dialog)
        self.layer_panel.fit_model_requested.connect(lambda layer: open_model_dialog(self, layer))
        self.layer_panel.fit_csd_requested.connect(lambda layer: open_csd_dialog(self, layer))
        self.layer_panel.commit_requested.connect(self.show_commit_panel)
        self.layer_panel.show_as_requested.connect(self.show_layer_as)
        self.layer_panel.save_as_requested.connect(lambda layer: save_layer_dialog(self, layer))
        self.layer_panel.list.currentRowChanged.connect(  # one colour bar: the selected layer's
            lambda _row: self.view3d.show_colour_bar_of(self.layer_panel.selected_layer())
        )
        self.ballstick_dialog: BallStickDialog | None = None
        self.model_dialog = None  # the microstructure model dialog (widgets.model_dialog)
        self.job_panel = JobPanel(self.runner)
        self.deterministic_panel = DeterministicPanel(
            self.document, self.runner, device=device, report=self.report_error
        )
        self.geodesic_panel = GeodesicPanel(self.document, self.runner, device=device, report=self.report_error)
        self.probabilistic_panel = ProbabilisticPanel(
            self.document, self.runner, device=device, report=self.report_error, view3d=self.view3d
        )
        self.commit_panel = CommitPanel(self.document, self.runner, device=device, report=self.report_error)
        self.connectivity_panel = ConnectivityPanel(
            self.document, self.runner, device=device, report=self.report_error, probabilistic=self.probabilistic_panel
        )
        self.presurgical_panel = PresurgicalPanel(self.document, self.runner, device=device, report=self.report_error)
        self.statistics_panel = StatisticsPanel(self.document, self.runner, report=self.report_error)
        for title, widget, area in (
            ("Layers", self.layer_panel, Qt.DockWidgetArea.LeftDockWidgetArea),
            ("Jobs", self.job_panel, Qt.DockWidgetArea.LeftDockWidgetArea),
            ("Deterministic tracking", self.deterministic_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Geodesic tracking", self.geodesic_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Probabilistic tracking", self.probabilistic_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("COMMIT filtering", self.commit_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Connectivity", self.connectivity_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Presurgical", self.presurgical_panel, Qt.DockWidgetArea.RightDockWidgetArea),
            ("Statistics", self.statistics_panel, Qt.DockWidgetArea.LeftDockWidgetArea),
        ):
            dock = QDockWidget(title, self)
            dock.setObjectName(f"dock_{title.lower().replace(' ', '_')}")
            boxed = widget in (self.job_panel, self.statistics_panel)  # their tables scroll: one scroll bar
            dock.setWidget(widget if boxed else scrollable(widget))
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
        fit_dock_tabs(self)  # short titles on vertical tabs, never cut
        self.findChild(QDockWidget, "dock_deterministic_tracking").raise_()  # it tracks at once on tensors

        jobs_dock, statistics_dock = (
            self.findChild(QDockWidget, "dock_jobs"),
            self.findChild(QDockWidget, "dock_statistics"),
        )
        self.tabifyDockWidget(jobs_dock, statistics_dock)  # a tab beside Jobs: the window keeps its minimum height
        statistics_dock.visibilityChanged.connect(self.statistics_panel.set_seen)  # measures what is seen
        jobs_dock.raise_()
        self.proportions = DockProportions(self, LEFT_DOCKS, RIGHT_DOCKS)  # docks widen with the window
        fit_dock_tables(self)  # names take the width, numbers fit: no sideways scroll bars

        self.position_label = QLabel()
        self.position_label.setObjectName("position")
        self.busy = BusyIndicator(self.runner)  # "running: …" once jobs have run half a second
        self.hover_label = QLabel()
        self.hover_label.setObjectName("hover")
        self.statusBar().addWidget(self.position_label, 1)
        self.statusBar().addWidget(self.hover_label, 1)
        for view in self.views.values():
            view.hovered.connect(self.update_hover_label)
            view.shape_created.connect(self.roi_toolbar.shape_created)
            view.notice.connect(lambda text: self.statusBar().showMessage(text, 10000))
        self.view3d.plane_clicked.connect(self.roi_toolbar.place_shape_3d)
        self.view3d.notice.connect(lambda text: self.statusBar().showMessage(text, 15000))
        self.statusBar().addPermanentWidget(self.busy)

        self.first_steps = FirstSteps(self)  # the hint, the demo's first screen, Track's feedback
        for panel in (self.deterministic_panel, self.geodesic_panel):
            panel.paint_seed_requested.connect(lambda: self.roi_toolbar.new_roi(role="seed"))
        self._build_menus()
        self.anatomy = AnatomyController(self)  # Image and ROI menus, MNI coordinate, alignment
        self.anatomy.build()
        self.selection = FibreSelection(self.document, self.runner, device=device, parent=self)
        self.selection.error.connect(self.report_error)
        self.selection.notice.connect(lambda text: self.statusBar().showMessage(text, 15000))
        self.selection.selecting.connect(lambda: self.view3d.hold_frames(SELECTION_FRAME_HOLD_S))
        self.selection.selecting.connect(self.view3d.editing)  # the moving level until the edits pause
        self.selection.selected.connect(self.view3d.release_frames)  # the edit's frame and the selection's: one
        self.selection.selected.connect(self.view3d.edit_selected)
        self.document.connect(self._on_document)
        self._restore_layout()
        self.sessions.start_autosave(autosave_s)
        QTimer.singleShot(0, lambda: offer_recovery(self, restore))
        self.warmup_job = submit_gpu_warmup(self.runner, device)  # compiles GPU kernels off the GUI thread

    # ------------------------------------------------------------------ menus
    def _build_menus(self) -> None:
        self.file_menu = file_menu = self.menuBar().addMenu("&File")
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("toolbar_main")
        self.recent_menu = build_file_menu(self, file_menu, toolbar)
        self._fill_recent()
        self.view_controls.build(self.menuBar().addMenu("&View"), toolbar)
        self.slab_actions = self.view_controls.slab_actions
        added = len(file_menu.actions())
        self.roi_toolbar.build(file_menu)
        move_before(file_menu, file_menu.actions()[added:], self.recent_menu.menuAction())  # ROIs before sessions
        dicom_open = self._action(file_menu, "Open D&ICOM folder…", self.dicom.open_folder_dialog)
        move_before(file_menu, [dicom_open], self.recent_menu.menuAction())
        report = next(a for a in file_menu.actions() if a.text() == "Export &report…")
        move_before(file_menu, [self._action(file_menu, "Export for na&vigation…", self.dicom.export_dialog)], report)
        self.role_box, self.tool_actions = self.roi_toolbar.role_box, self.roi_toolbar.tool_actions
        self.radius_box, self.threshold_box = self.roi_toolbar.radius_box, self.roi_toolbar.threshold_box
        self.track_menu = track_menu = self.menuBar().addMenu("&Track")
        track = self.first_steps.track  # the method's panel in front, then Track there
        self._action(track_menu, "&Deterministic (tensor)", lambda: track("deterministic"), "Ctrl+T", icon_name="track")
        self._action(track_menu, "&Geodesic (ray tracing)", lambda: track("geodesic"), "Ctrl+G")
        self._action(track_menu, "&Probabilistic (probtrackx)", lambda: track("probabilistic"), "Ctrl+Shift+P")
        self.bundles = BundlesController(self)  # Track ▸ Named bundles…
        self.bundles.build(track_menu)
        filter_menu = self.menuBar().addMenu("F&ilter")
        self._action(filter_menu, "&COMMIT filtering…", self.show_commit_panel)
        analysis_menu = self.menuBar().addMenu("&Analysis")
        self._action(analysis_menu, "Connectivity &matrix…", lambda: self.show_dock("dock_connectivity"))
        self._action(analysis_menu, "&Distance to lesion…", lambda: self.show_dock("dock_presurgical"))
        jobs_menu = self.menuBar().addMenu("&Jobs")
        toolbar.addAction(
            self._action(jobs_menu, "Cancel all jobs", self.runner.cancel_all, "Ctrl+.", icon_name="cancel")
        )
        build_help_menu(self)

    def track_probabilistic(self) -> int | None:
        """Track menu: show the Probabilistic tracking panel and track with its settings."""
        return self.first_steps.track("probabilistic")

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

    def new_roi(self):
        """An empty ROI of the chosen role, selected, with the brush ready (None: no image yet)."""
        return self.roi_toolbar.new_roi()

    def set_tool(self, tool: str) -> None:
        self.roi_toolbar.set_tool(tool)

    def attach_shape_widget(self, layer) -> None:
        """Put the 3-D handle on a shape ROI (:meth:`RoiToolbar.attach_shape_widget`)."""
        self.roi_toolbar.attach_shape_widget(layer)

    def save_roi(self, layer, path, *, overwrite: bool = False) -> Path | None:
        """Write an ROI as a uint8 NIfTI mask (see :meth:`RoiController.save_roi`); an existing file
        is replaced only when the user says so (:func:`ask_overwrite`) or ``overwrite`` is given."""
        return self.rois.save_roi(layer, path, overwrite=overwrite)

    def save_roi_dialog(self) -> None:
        layer = self.roi_tools.active_roi()
        if layer is None:
            self.report_error("there is no ROI to save: draw one first (New ROI)", "")
            return
        # save_roi asks before replacing a file (after adding a missing suffix, which changes the name).
        path = dialogs.save_file(
            self, "Save ROI", f"{layer.name}.nii.gz", "NIfTI (*.nii.gz *.nii)", confirm_overwrite=False
        )
        if path:
            self.save_roi(layer, path)

    def open_roi(self, path, role: str | None = None):
        """Load a mask as an ROI layer on the reference grid (see :meth:`RoiController.open_roi`);
        None when it was refused (the user is told why)."""
        return self.rois.open_roi(path, role)

    def open_roi_dialog(self) -> None:
        for path in dialogs.open_files(self, "Open ROI", "Images (*.nii.gz *.nii *.mgz *.mgh)"):
            self.open_roi(path)

    def _action(self, menu, text, slot, shortcut=None, checkable=False, icon_name=None) -> QAction:
        return add_action(self, menu, text, slot, shortcut, checkable, icon_name)

    def set_fiber_slab(self, mm: float | None) -> None:
        """Draw on the slice views the fibers within ``mm`` around the slice (None: all of them,
        projected); remembered for the next start."""
        self.view_controls.set_fiber_slab(mm)

    def set_camera_view(self, name: str) -> None:
        """Turn the 3-D camera to look along an axis (``axial``, ``coronal``, ``sagittal``) as the
        slice views show it, mirrored with the radiological convention, or ``isometric``."""
        self.view_controls.set_camera_view(name)

    def _toggle_radiological(self) -> None:
        self.view_controls.toggle_radiological()

    def maximise_view(self, name: str | None) -> None:
        """Show one view (``3d``, ``axial``, ``coronal``, ``sagittal``) over the whole central area,
        or all four (None, or the name of the view already maximised)."""
        self.view_controls.maximise_view(name)

    # -------------------------------------------------------------- opening
    def open_dialog(self) -> None:
        paths = dialogs.open_files(self, "Open", FILE_FILTER)
        if paths:
            self.open_paths(paths)

    def open_folder_dialog(self) -> None:
        folder = dialogs.folder(self, "Open a dtifit or bedpostX folder")
        if folder:
            self.open_paths([folder])

    def open_demo(self) -> int:
        """Load the built-in phantom: DTI maps (fitted on a worker) and its ground-truth bundles."""
        self.first_steps.demo_requested()  # then the Deterministic panel in front, a map selected
        return self.files.open_demo()

    def open_paths(self, paths: Iterable[str | os.PathLike]) -> list[int]:
        """Open each file on a worker thread, stacked in the order given (see
        :meth:`FileController.open_paths`); a ``.tractlens`` path opens as a session."""
        return self.files.open_paths(paths)

    def _file_loaded(self, path: Path) -> None:
        self._remember_recent(path)
        self.loaded.emit(str(path))

    def select_layer(self, layer: Layer) -> None:
        """Make ``layer`` the layer panel's current one (the ROI tools draw into it)."""
        self.layer_panel.list.setCurrentItem(self.layer_panel.item_for(layer))

    def show_layer_as(self, layer: Layer, kind: str) -> int:
        """The layer menu's "Show as labels / scalar" (:meth:`FileController.show_layer_as`)."""
        return self.files.show_layer_as(layer, kind)

    # -------------------------------------------------------- model fitting
    def fit_ballstick_dialog(self, layer: Layer) -> BallStickDialog:
        """Ask for the ball & sticks settings of a DWI layer (non-blocking); Fit starts the job."""
        rois = [roi for roi in self.document.layers if roi.kind == "roi"]
        if self.ballstick_dialog is not None:
            self.ballstick_dialog.deleteLater()  # the previous one, closed or not
        dialog = BallStickDialog(layer, rois, self, device=self.device)
        dialog.accepted.connect(lambda: self.fit_ballstick(layer, dialog.params, dialog.folder, dialog.roi))
        self.ballstick_dialog = dialog
        dialog.open()
        return dialog

    def fit_ballstick(self, layer: Layer, params, folder: Path | None = None, roi: Layer | None = None) -> int:
        """Fit ball & sticks to a DWI layer on a worker (:meth:`FileController.fit_ballstick`)."""
        return self.files.fit_ballstick(layer, params, folder, roi)

    def _show_message(self, text: str, milliseconds: int) -> None:
        self.statusBar().showMessage(text, milliseconds)

    def report_error(self, message: str, details: str) -> None:
        """Tell the user: the status bar, :attr:`errors`, and a (non-blocking) box when dialogs
        may be shown (:func:`dialogs.interactive`); in the window's words (no command-line flags)."""
        message = window_words(message)
        self.errors.append(message)
        self.statusBar().showMessage(message, 15000)
        dialogs.notify(self, "TractLens", message, details)

    def wait_for_jobs(self, timeout_s: float = 120.0) -> bool:
        """Process events until no job is queued or running and the views show the document as
        it is (their glyphs built: :meth:`display_ready`), for scripts and tests; False when
        that took longer than ``timeout_s``."""

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
        paths = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        for folder in [p for p in paths if self.dicom.handles(p)]:  # a CD or PACS export: its series
            self.dicom.open_folder(folder)
        self.open_paths(p for p in paths if not self.dicom.handles(p))

    # ---------------------------------------------------------------- status
    def _on_document(self, _source, event, **info) -> None:
        if event in ("cursor", "layers", "display"):
            self.update_position_label()
        layer = info.get("layer")
        if event == "roi" and layer is not None and layer.data.shape is not None:
            self.roi_toolbar.follow_shape(layer)
        if event == "layers" and self.view3d.shape_layer not in self.document.layers:
            self.view3d.show_shape_widget(None, None)  # its ROI was deleted (or its creation undone)

    @property
    def _selection_timer(self):
        """The fibre selection's throttle (:class:`FibreSelection`)."""
        return self.selection.timer

    def update_fiber_selection(self) -> int | None:
        """Show the streamlines that pass the ROIs (:meth:`FibreSelection.update`)."""
        return self.selection.update()

    def update_position_label(self) -> None:
        doc = self.document
        if doc.reference_affine is None:
            self.position_label.setText("")
            return
        i, j, k = (int(v) for v in doc.cursor)
        x, y, z = doc.cursor_world()
        parts = [f"voxel ({i}, {j}, {k})", f"RAS ({x:.1f}, {y:.1f}, {z:.1f}) mm"]
        for name, value in doc.values_at_cursor():
            parts.append(f"{name} {with_unit(name, _format_value(value))}")
        self.position_label.setText("   ".join(parts))

    def update_hover_label(self, ijk) -> None:
        """Values under the mouse pointer (the crosshair's are in the position label)."""
        if ijk is None or self.document.reference_affine is None:
            self.hover_label.setText("")
            return
        values = "  ".join(f"{name} {with_unit(name, _format_value(v))}" for name, v in self.document.values_at(ijk))
        lesion = self.presurgical_panel.cursor_distance_text(ijk)  # the distance to the chosen lesion
        self.hover_label.setText(
            f"mouse ({', '.join(str(int(v)) for v in ijk)})  {values}" + (f"  {lesion}" * bool(lesion))
        )

    # ------------------------------------------------- screenshots, reports
    def save_screenshot(self, path: str | os.PathLike) -> Path:
        """Write the whole window, the 3-D view included, as PNG."""
        return self.reports.save_screenshot(path)

    def export_report(self, path: str | os.PathLike, **options) -> list[Path]:
        """The planning report as PDF (and PNG pages) — see :mod:`widgets.report`."""
        return self.reports.export_report(path, **options)

    # ------------------------------------------------------ sessions, autosave
    def save_session(self, path: str | os.PathLike) -> int:
        """Write every layer, its display and provenance, and the window's settings to a
        ``.tractlens`` file on a worker (:meth:`SessionController.save_session`); the job id."""
        return self.sessions.save_session(path)

    def open_session(self, path: str | os.PathLike) -> int:
        """Read a session on a worker and put its layers in this window (replacing the current ones)."""
        return self.sessions.open_session(path)

    def _open_session_dialog(self) -> None:
        self.sessions.open_session_dialog(self)

    def _save_session_dialog(self) -> None:
        self.sessions.save_session_as_dialog(self)

    @property
    def autosave(self) -> WindowAutosave | None:
        """The window's autosave (None: its folder could not be written)."""
        return self.sessions.autosave

    @autosave.setter
    def autosave(self, value: WindowAutosave | None) -> None:
        self.sessions.autosave = value

    def set_autosave_interval(self, seconds: float) -> None:
        """Autosave every ``seconds`` (0: off); remembered for the next start."""
        self.sessions.set_autosave_interval(seconds)

    def _autosave_dialog(self) -> None:
        current = int(self.autosave.interval_s) if self.autosave is not None else 0
        seconds = dialogs.integer(self, "Autosave", "Autosave every (seconds, 0 = off):", current, 0, 24 * 3600)
        if seconds is not None:
            self.set_autosave_interval(seconds)

    def restore_autosave(self, orphan) -> int:
        """Open an autosave a crashed window left (on a worker), replacing this window's layers."""
        return self.sessions.restore_autosave(orphan)

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
            # made here, not taken from addAction's return: a wrapper Shiboken looks up by the
            # C++ address can be a stale one of a destroyed object (a CI run got a QSurface)
            action = QAction(item, self.recent_menu)
            action.triggered.connect(lambda *_, p=item: self.open_paths([p]))
            self.recent_menu.addAction(action)

    def closeEvent(self, event) -> None:
        store = settings()
        store.setValue("window/geometry", self.saveGeometry())
        store.setValue("window/state", self.saveState(LAYOUT_VERSION))
        self.runner.shutdown(10.0)
        self.sessions.close()  # a clean exit: nothing to recover
        for prefetch in [self.view3d.glyphs.ahead, *(view.glyphs.ahead for view in self.views.values())]:
            prefetch.finish()  # nor a build ahead (widgets.glyph_prefetch)
        glyphs.wait_for_builds()  # no glyph build may outlive the render window
        self.view3d.close_plotter()
        gui_gc.release(id(self))  # no worker is left: Python's own collection may run anywhere again
        super().closeEvent(event)


def ask_overwrite(parent, path: Path) -> bool:
    """Ask whether to replace an existing file; when nobody can be asked the answer is no."""
    return dialogs.question(parent, "Replace file?", f"{path} already exists. Replace it?", default=False)
