"""COMMIT in the GUI: the panel from a tractogram's menu, the weights as a per-streamline scalar,
the weight threshold, the NRMSE map, cancel and refusals (real window, NumPy backend)."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QContextMenuEvent
from PySide6.QtWidgets import QApplication, QDockWidget

from app.io import load_dwi
from app.model import DWIVolume, Layer
from app.pipelines.commit import commit_pipeline
from gpu.commit import CommitParams
from tests.conftest import ARTIFACTS
from widgets.commit_panel import NRMSE_NAME, THRESHOLD_STEPS, WEIGHT
from widgets.panels import FILTER_COMMIT


def open_like_a_user(win, *paths) -> None:
    for path in paths:
        win.open_paths([path])
        assert win.wait_for_jobs(120)
    assert win.errors == []


def choose_from_layer_menu(win, qtbot, layer, text: str) -> None:
    """Right-click a layer in the layer list and pick ``text`` (the context-menu event is sent
    by hand: QTest's mouse events do not pass through the window system)."""
    panel = win.layer_panel
    viewport = panel.list.viewport()
    pos = panel.list.visualItemRect(panel.item_for(layer)).center()
    qtbot.mouseClick(viewport, Qt.MouseButton.RightButton, pos=pos)
    QApplication.sendEvent(viewport, QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, viewport.mapToGlobal(pos)))
    qtbot.waitUntil(lambda: panel.menu is not None and panel.menu.isVisible(), timeout=3000)
    menu = panel.menu
    action = next(action for action in menu.actions() if action.text() == text)
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(action).center())


def type_into(qtbot, box, text: str) -> None:
    box.selectAll()
    qtbot.keyClicks(box, text)


def test_commit_weights_threshold_and_nrmse_map(window, demo_dir, qtbot):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    bundles = doc.layer("bundles")
    panel = win.commit_panel
    dock = win.findChild(QDockWidget, "dock_commit_filtering")

    # The tractogram's menu raises the panel with that tractogram chosen.
    win.findChild(QDockWidget, "dock_geodesic_tracking").raise_()
    choose_from_layer_menu(win, qtbot, bundles, FILTER_COMMIT)
    qtbot.waitUntil(lambda: not dock.visibleRegion().isEmpty(), timeout=3000)
    assert panel.tractogram_layer() is bundles
    assert panel.tract_box.currentText() == "bundles"
    # COMMIT 2's defaults in the form.
    defaults = CommitParams()
    assert (panel.lambda_box.value(), panel.max_iter_box.value()) == (defaults.lambda_, defaults.max_iter)
    assert panel.tol_box.value() == defaults.tol

    type_into(qtbot, panel.max_iter_box, "100")
    assert panel.params() == CommitParams(max_iter=100)
    before = list(doc.layers)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is not None
    assert win.wait_for_jobs(60)
    assert win.errors == []

    expected = commit_pipeline(doc.layer("dwi").data.dwi, bundles.data, params=CommitParams(max_iter=100), device="cpu")
    result = doc.layer("bundles (COMMIT)")
    assert result is panel.result_layer and result.kind == "tractogram"
    assert [layer for layer in doc.layers if layer not in before] == [result, doc.layer(NRMSE_NAME)]
    assert WEIGHT not in bundles.data.streamline_scalars  # the opened layer is left as it was
    np.testing.assert_array_equal(result.data.streamline_scalars[WEIGHT], expected.weights)
    np.testing.assert_array_equal(result.data.points, bundles.data.points)
    assert result.color_by == WEIGHT and result.clim == (0.0, float(expected.weights.max()))
    nrmse = doc.layer(NRMSE_NAME)
    np.testing.assert_array_equal(nrmse.data.data, expected.maps()["fit_NRMSE"])
    np.testing.assert_array_equal(nrmse.data.affine, expected.affine)
    assert nrmse.kind == "scalar" and nrmse.clim == (0.0, 0.5)
    summary = expected.summary()
    text = panel.status.text()
    assert f"kept {summary['kept']} of {len(bundles.data)} streamlines" in text
    assert f"{summary['iterations']} iterations" in text and f"on {summary['backend']} (" in text

    # Fibres coloured by weight (the original hidden): the screenshot to look at.
    bundles.set(visible=False)
    doc.layer("colour FA").set(visible=False)
    win.view3d.reset_camera()
    qtbot.wait(300)
    shot = win.save_screenshot(ARTIFACTS / "commit_weights.png")
    assert shot.exists()

    # The threshold: leftmost every streamline, then weight > (step - 1) / (steps - 1) × max.
    weights = expected.weights
    full = panel.full_layer
    for step in (THRESHOLD_STEPS // 2, THRESHOLD_STEPS * 3 // 4, 1, 0):
        panel.threshold.setValue(step)
        threshold = weights.max() * (step - 1) / (THRESHOLD_STEPS - 1)
        count = len(weights) if step == 0 else int((weights > threshold).sum())
        qtbot.waitUntil(lambda count=count: len(panel.result_layer.data) == count, timeout=10000)
        shown = panel.result_layer
        assert shown in doc.layers and shown.name == "bundles (COMMIT)" and shown.color_by == WEIGHT
        assert shown.clim == full.clim
        if step:
            assert 0 < count <= len(weights)
            np.testing.assert_array_equal(shown.data.streamline_scalars[WEIGHT], weights[weights > threshold])
        if step == THRESHOLD_STEPS // 2:
            assert count < len(weights)  # the demo's weights spread over the range: some are hidden
        assert f"{count} of {len(weights)} shown" in panel.threshold_label.text() or step == 0
    assert panel.result_layer is full
    assert win.wait_for_jobs(10)

    # The Filter menu raises the panel too.
    win.findChild(QDockWidget, "dock_geodesic_tracking").raise_()
    filter_menu = next(a.menu() for a in win.menuBar().actions() if a.text() == "F&ilter")
    next(a for a in filter_menu.actions() if a.text() == "&COMMIT filtering…").trigger()
    qtbot.waitUntil(lambda: not dock.visibleRegion().isEmpty(), timeout=3000)


def test_cancel_adds_nothing(window, demo_dir, qtbot):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    panel = win.commit_panel
    before = list(doc.layers)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    assert doc.layers == before
    assert panel.result_layer is None and panel.nrmse_layer is None
    assert "cancelled" in panel.status.text().lower()
    assert not panel.cancel_button.isEnabled() and not panel.threshold.isEnabled()
    assert win.errors == []


def test_refusals_without_dwi_or_tractogram(window, demo_dir, qtbot):
    win, doc = window, window.document
    panel = win.commit_panel
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is None and "Open a DWI series" in panel.status.text()
    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    doc.add_layer(Layer("dwi", DWIVolume("dwi", dwi), "dwi", visible=False))
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is None and "tractogram" in panel.status.text()
    assert panel.tract_box.count() == 0
    assert len(doc.layers) == 1 and len(win.errors) == 2
