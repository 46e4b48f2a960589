"""Microstructure models in the window: the DWI layer's "Fit microstructure model…", maps as
layers batch by batch, cancel and refusal leave the document as it was."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QContextMenuEvent
from PySide6.QtWidgets import QApplication

from tests.conftest import ARTIFACTS
from tractlens.app.model import Layer, RoiMask
from tractlens.widgets.panels import FIT_MODEL


def open_model_dialog(win, qtbot):
    """Right-click the DWI layer and choose the model fit, as a user would (the context-menu
    event is sent by hand: QTest's clicks do not pass through the window system)."""
    panel = win.layer_panel
    viewport = panel.list.viewport()
    pos = panel.list.visualItemRect(panel.item_for(win.document.layer("dwi"))).center()
    qtbot.mouseClick(viewport, Qt.MouseButton.RightButton, pos=pos)
    QApplication.sendEvent(viewport, QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, viewport.mapToGlobal(pos)))
    qtbot.waitUntil(lambda: panel.menu is not None and panel.menu.isVisible(), timeout=3000)
    menu = panel.menu
    action = next(action for action in menu.actions() if action.text() == FIT_MODEL)
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(action).center())
    qtbot.waitUntil(lambda: win.model_dialog is not None and win.model_dialog.isVisible(), timeout=3000)
    return win.model_dialog


def add_box_roi(doc, name: str, centre, radius: int) -> Layer:
    roi = RoiMask(name, np.zeros(doc.reference_shape, bool), doc.reference_affine, role="seed")
    roi.apply_shape({"kind": "box", "centre": centre, "radius": radius})
    return doc.add_layer(Layer(name, roi, "roi"))


def test_noddi_from_the_dwi_menu_adds_its_maps_as_layers(demo_window, qtbot, tmp_path):
    win = demo_window
    doc = win.document
    roi = add_box_roi(doc, "crossing", (28, 28, 15), 3)
    partials = []
    win.runner.job_partial.connect(lambda job_id, maps: partials.append(sorted(maps)))
    dialog = open_model_dialog(win, qtbot)
    assert dialog.model.currentText() == "noddi-watson"
    qtbot.keyClick(dialog.region, Qt.Key.Key_Down)  # brain -> ROI crossing
    assert dialog.region.currentText().startswith("ROI crossing")
    qtbot.mouseClick(dialog.save, Qt.MouseButton.LeftButton)
    dialog.folder_edit.setText(str(tmp_path / "noddi"))
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(300)
    assert win.errors == []
    assert partials and partials[0] == ["FWF", "NDI", "ODI"]  # shown while the fit ran, batch by batch
    ndi = doc.layer("noddi-watson NDI (dwi)")
    assert ndi.visible and not doc.layer("noddi-watson ODI (dwi)").visible
    inside = roi.data.mask
    values = ndi.data.data
    assert (values[~inside] == 0).all()
    assert 0.05 < np.median(values[inside]) < 0.95
    sticks = doc.layer("noddi-watson orientation (dwi)")
    assert sticks.kind == "dyads" and np.allclose(np.linalg.norm(sticks.data.data[inside][:, 0, :3], axis=1), 1.0)
    assert (tmp_path / "noddi" / "NDI.nii.gz").exists() and (tmp_path / "noddi" / "fit_model.json").exists()
    win.save_screenshot(ARTIFACTS / "noddi_window.png")


def test_cancelling_a_model_fit_takes_its_partial_layers_away(demo_window, qtbot):
    win = demo_window
    before = list(win.document.layers)
    dialog = open_model_dialog(win, qtbot)
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)  # the whole brain: several batches
    job = win.runner.jobs[max(win.runner.jobs)]
    names = lambda: [layer.name for layer in win.document.layers]  # noqa: E731
    qtbot.waitUntil(lambda: "noddi-watson NDI (dwi)" in names(), timeout=120000)  # the first batch is shown
    assert job.state == "running"
    qtbot.mouseClick(win.job_panel.cancel_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(120)
    assert job.state == "cancelled"
    assert win.document.layers == before
    assert win.errors == []


def test_a_single_shell_series_is_refused_in_the_dialog(demo_window, qtbot):
    win = demo_window
    dwi = win.document.layer("dwi").data.dwi
    dwi.bvals = np.where(dwi.bvals > 1500, 1000.0, dwi.bvals)  # this window's copy, made single-shell
    jobs = len(win.runner.jobs)
    dialog = open_model_dialog(win, qtbot)
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "single-shell" in dialog.message.text()
    assert len(win.runner.jobs) == jobs
