"""Sessions in the window: what the panels keep, a reopened document put on screen, and the
autosave with its offer to restore after a crash.

The file format is :mod:`app.session` and the recovery store :mod:`app.recovery`; this module
only moves the window's state into and out of them (the presurgical margin and lesion, the 3-D
camera and the radiological convention, the layers into the window's own document, whose views
are already subscribed to it).
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal

from tractlens.app.pipelines.connectivity import DISTANCE_POINT_SCALAR, DISTANCE_STREAMLINE_SCALAR, RegionDistance
from tractlens.app.recovery import AutoSaver, Orphan, RecoveryStore, find_orphans
from tractlens.app.session import DocumentSnapshot, Session, load_session, snapshot

from . import dialogs

log = logging.getLogger(__name__)
RESTORE_CHOICES = ("ask", "yes", "no")


def panel_state(window) -> dict:
    """What the window keeps across a session besides the layers (plain JSON values)."""
    state = {}
    presurgical = getattr(window, "presurgical_panel", None)
    if presurgical is not None:
        state["presurgical"] = {
            "margin_mm": float(presurgical.margin_mm),
            "lesion": presurgical.lesion_name,
            **presurgical.lesion_choice_state(),
        }
    reports = getattr(window, "reports", None)
    if reports is not None and reports.session_state():
        state["report"] = reports.session_state()
    views = getattr(window, "views", None)
    view = {}
    if views:
        view["radiological"] = bool(views["axial"].radiological)
    view3d = getattr(window, "view3d", None)
    if view3d is not None and getattr(view3d, "_camera_set", False):
        camera = view3d.plotter.camera
        view["camera"] = {
            "position": [float(v) for v in camera.position],
            "focal_point": [float(v) for v in camera.focal_point],
            "view_up": [float(v) for v in camera.up],
            "view_angle": float(camera.view_angle),
        }
    state["view"] = view
    return state


def window_snapshot(window) -> DocumentSnapshot:
    """The document and the window's state as they are now (GUI thread; the writing can go elsewhere)."""
    return snapshot(window.document, panel_state(window))


def _apply_view(window, view: dict) -> None:
    if "radiological" in view:
        for slice_view in window.views.values():
            slice_view.radiological = bool(view["radiological"])
            slice_view.update()
    camera = view.get("camera")
    if camera:
        cam = window.view3d.plotter.camera
        cam.position = camera["position"]
        cam.focal_point = camera["focal_point"]
        cam.up = camera["view_up"]
        cam.view_angle = camera.get("view_angle", cam.view_angle)
        window.view3d._camera_set = True
        window.view3d.plotter.renderer.reset_camera_clipping_range()
        window.view3d.request_render()


def apply_session(window, session: Session) -> None:
    """Replace the window's layers by the session's (same Document object, so the views follow)."""
    doc = window.document
    for layer in list(doc.layers):
        doc.remove_layer(layer)
    restored = session.document
    doc.reference_affine = None if restored.reference_affine is None else restored.reference_affine.copy()
    doc.reference_shape = restored.reference_shape
    doc.registrations = dict(restored.registrations)  # before the layers: the MNI label reads them
    for layer in list(restored.layers):
        restored.remove_layer(layer)
        doc.add_layer(layer)
    if restored.reference_shape is not None:
        doc.cursor = np.array(restored.cursor)
        doc.emit("cursor")
    if getattr(window, "reports", None) is not None:
        window.reports.restore_session_state(session.panels.get("report"))
    presurgical = getattr(window, "presurgical_panel", None)
    state = session.panels.get("presurgical")
    if presurgical is not None and state:
        presurgical.lesion_name = str(state.get("lesion", ""))
        presurgical.margin_box.setValue(float(state.get("margin_mm", presurgical.margin_mm)))
        presurgical.restore_lesion_choice(state)
        # tractograms saved with their distances come back measured: table and colours without recomputing
        presurgical.measured, presurgical.distances = {}, {}
        for layer in doc.layers:
            tract = layer.data if layer.kind == "tractogram" else None
            if tract is not None and DISTANCE_STREAMLINE_SCALAR in tract.streamline_scalars:
                presurgical.measured[layer.name] = layer
                presurgical.distances[layer.name] = RegionDistance(
                    np.asarray(tract.point_scalars.get(DISTANCE_POINT_SCALAR, np.zeros(tract.n_points))),
                    np.asarray(tract.streamline_scalars[DISTANCE_STREAMLINE_SCALAR], dtype=np.float64),
                    {"restored_from": str(session.path)},
                )
        presurgical.refresh_table()
    _apply_view(window, dict(session.panels.get("view") or {}))


def open_window_session(window, path: str | os.PathLike) -> Session:
    session = load_session(path)
    apply_session(window, session)
    return session


class WindowAutosave(QObject):
    """Autosaves a window's document every ``interval_s`` seconds (0: off) to its recovery folder.

    The snapshot is taken on the GUI thread when the timer fires, the writing runs on a
    background thread; ``saved`` and ``failed(message)`` arrive on the GUI thread. Nothing is
    written while nothing changed.
    """

    saved = Signal()
    failed = Signal(str)

    def __init__(self, window, interval_s: float):
        super().__init__(window)
        self.window = window
        self.store = RecoveryStore().open()
        self.saver = AutoSaver(
            self.store, lambda: window_snapshot(window), on_saved=self.saved.emit, on_error=self.failed.emit
        )
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.saver.tick)
        self.set_interval(interval_s)

    @property
    def interval_s(self) -> float:
        return self.timer.interval() / 1000.0 if self.timer.isActive() else 0.0

    def set_interval(self, seconds: float) -> None:
        if seconds and seconds > 0:
            self.timer.start(max(100, int(seconds * 1000)))
        else:
            self.timer.stop()

    def save_now(self) -> bool:
        """Start an autosave now (e.g. right after a restore); False when one is still running."""
        return self.saver.tick()

    def close(self) -> None:
        """A clean exit: stop, let a write in flight finish, delete the recovery folder."""
        self.timer.stop()
        self.saver.wait(30)
        self.store.close()


def offer_recovery(window, policy: str = "ask") -> Orphan | None:
    """After an unclean exit, offer to restore the newest autosave left behind.

    ``policy``: ``ask`` shows a dialog (Restore / Discard / Later) when dialogs may be shown
    (:func:`dialogs.interactive`); in a scripted run it keeps the autosave for the next
    interactive start and says so on stderr and in the status bar, ``yes`` restores, ``no`` keeps
    it for a later start. A restored autosave is deleted once this window has autosaved the
    restored document itself, so a second crash in between loses nothing. Returns the orphan
    being restored, else None.
    """
    if policy not in RESTORE_CHOICES:
        raise ValueError(f"restore policy must be one of {RESTORE_CHOICES}")
    orphans = find_orphans()
    if not orphans:
        return None
    newest, older = orphans[0], orphans[1:]
    for orphan in older:
        orphan.release()  # offered at a later start
    choice = policy
    if policy == "ask":
        if dialogs.interactive() or dialogs.has_answer("choice"):
            choice = dialogs.choice(
                window,
                "Restore work?",
                "TractLens did not shut down cleanly last time. Restore the work it autosaved?\n\n" + newest.describe(),
                [("yes", "Restore"), ("discard", "Discard"), ("no", "Later")],
                default="no",
            )
        else:
            choice = "no"
    if choice == "discard":
        newest.discard()
        return None
    if choice == "no":
        kept = (
            f"An autosave from an earlier session is kept ({newest.describe()}); it is offered again at the next start."
        )
        window.statusBar().showMessage(kept, 15000)
        if not dialogs.interactive():  # a scripted run: say it where its output is read
            print(f"tractlens: {kept} ({newest.folder})", file=sys.stderr)
        newest.release()
        return None
    window.restore_autosave(newest)
    return newest
