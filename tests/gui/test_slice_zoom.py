"""Slice views: zoom (Ctrl+wheel), pan (middle, Shift or Space drag), reset (0, Ctrl+0) and the
ruler (two clicks, a distance in mm drawn on the slice, Esc removes it)."""

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QKeySequence, QWheelEvent
from PySide6.QtWidgets import QApplication

from tests.conftest import ARTIFACTS
from tests.gui.test_view_controls import grab_rgb, view_action
from tractlens.app.model import Layer, Volume

SHAPE = (40, 30, 20)
AFFINE = np.diag([2.0, 3.0, 4.0, 1.0])  # anisotropic voxels: the ruler must use each axis' size


def image_window(window):
    doc = window.document
    ramp = np.add.outer(np.arange(SHAPE[0]), np.arange(SHAPE[1]))[..., None] * np.ones(SHAPE[2])
    doc.add_layer(Layer("ramp", Volume("ramp", ramp.astype(np.float32), AFFINE), "scalar"))
    doc.set_cursor([20, 15, 10])
    return doc


def wheel(view, pos: QPointF, notches: int, modifiers=Qt.KeyboardModifier.NoModifier) -> None:
    event = QWheelEvent(
        pos,
        view.mapToGlobal(pos.toPoint()).toPointF(),
        QPoint(),
        QPoint(0, 120 * notches),
        Qt.MouseButton.NoButton,
        modifiers,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(view, event)


def test_ctrl_wheel_zooms_about_the_pointer_and_the_plain_wheel_still_steps_slices(window, qtbot):
    doc = image_window(window)
    axial = window.views["axial"]
    voxel = np.array([10, 8, 10])
    pos = axial.widget_point_of_voxel(voxel)
    size_before = axial.widget_point_of_voxel([11, 8, 10]).x() - pos.x()
    wheel(axial, pos, 2, Qt.KeyboardModifier.ControlModifier)
    assert axial.navigation.zoom == pytest.approx(1.25**2)
    assert np.array_equal(axial.voxel_at(pos.x(), pos.y()), voxel)  # the voxel under the pointer stays
    size_after = axial.widget_point_of_voxel([11, 8, 10]).x() - axial.widget_point_of_voxel(voxel).x()
    assert size_after == pytest.approx(size_before * 1.25**2, rel=1e-6)
    assert doc.cursor[2] == 10  # zooming stepped no slice
    wheel(axial, pos, 1)
    assert doc.cursor[2] == 11 and axial.navigation.zoom == pytest.approx(1.25**2)
    wheel(axial, pos, -20, Qt.KeyboardModifier.ControlModifier)
    assert axial.navigation.zoom == 1.0  # never smaller than the whole slice


def test_middle_shift_and_space_drags_pan_without_moving_the_cursor_or_painting(window, qtbot):
    doc = image_window(window)
    axial = window.views["axial"]
    wheel(axial, QPointF(axial.width() / 2, axial.height() / 2), 4, Qt.KeyboardModifier.ControlModifier)
    cursor = doc.cursor.copy()
    for button, modifier in (
        (Qt.MouseButton.MiddleButton, Qt.KeyboardModifier.NoModifier),
        (Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ShiftModifier),
    ):
        start = axial.widget_point_of_voxel([20, 15, 10])
        qtbot.mousePress(axial, button, modifier, start.toPoint())
        qtbot.mouseMove(axial, (start + QPointF(30, 20)).toPoint())
        qtbot.mouseRelease(axial, button, modifier, (start + QPointF(30, 20)).toPoint())
        moved = axial.widget_point_of_voxel([20, 15, 10]) - start
        assert (moved.x(), moved.y()) == pytest.approx((30, 20), abs=1.01), button
        assert np.array_equal(doc.cursor, cursor)
    # Space + drag pans with a drawing tool too, and paints nothing.
    roi = window.new_roi()
    assert window.roi_tools.tool == "brush"
    axial.setFocus()
    qtbot.keyPress(axial, Qt.Key.Key_Space)
    start = axial.widget_point_of_voxel([20, 15, 10])
    qtbot.mousePress(axial, Qt.MouseButton.LeftButton, pos=start.toPoint())
    qtbot.mouseMove(axial, (start + QPointF(-25, 0)).toPoint())
    qtbot.mouseRelease(axial, Qt.MouseButton.LeftButton, pos=(start + QPointF(-25, 0)).toPoint())
    qtbot.keyRelease(axial, Qt.Key.Key_Space)
    assert (axial.widget_point_of_voxel([20, 15, 10]) - start).x() == pytest.approx(-25, abs=1.01)
    assert not roi.data.mask.any()
    qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=start.toPoint())  # Space released: the brush paints
    assert roi.data.mask.any()


def test_zero_and_ctrl_zero_reset_zoom_and_pan_and_clash_with_no_other_shortcut(window, qtbot):
    image_window(window)
    axial, coronal = window.views["axial"], window.views["coronal"]
    fitted = axial.widget_point_of_voxel([20, 15, 10])
    for view in (axial, coronal):
        wheel(view, QPointF(30, 30), 3, Qt.KeyboardModifier.ControlModifier)
    axial.setFocus()
    qtbot.keyClick(axial, Qt.Key.Key_0)
    assert axial.navigation.zoom == 1.0 and axial.widget_point_of_voxel([20, 15, 10]) == fitted
    assert coronal.navigation.zoom > 1.0  # 0 resets the focused view only
    action = view_action(window, "Reset slice &zoom")
    assert action.shortcut() == QKeySequence("Ctrl+0")
    action.trigger()
    assert coronal.navigation.zoom == 1.0 and coronal.navigation.pan == QPointF(0, 0)
    shortcuts = [a.shortcut().toString() for a in window.findChildren(type(action)) if not a.shortcut().isEmpty()]
    duplicates = {s for s in shortcuts if shortcuts.count(s) > 1}
    assert not duplicates, duplicates
    assert "0" not in shortcuts and "Space" not in shortcuts  # handled by the focused slice view only


def yellow_pixels(view) -> int:
    pixels = grab_rgb(view).astype(int)
    return int(
        ((pixels[..., 0] > 240) & (pixels[..., 1] > 240) & (pixels[..., 2] < 80)).sum()
    )  # not the labels (255, 220, 0)


def test_the_ruler_measures_in_mm_draws_its_length_and_esc_removes_it(window, qtbot):
    doc = image_window(window)
    doc.layer("ramp").set(visible=False)  # a black slice: the ruler's yellow is easy to count
    axial = window.views["axial"]
    axial.show_crosshair = False
    window.set_tool("ruler")
    measured = []
    axial.measured.connect(measured.append)
    a, b = [10, 5, 10], [25, 25, 10]
    qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=axial.widget_point_of_voxel(a).toPoint())
    qtbot.mouseMove(axial, axial.widget_point_of_voxel([18, 12, 10]).toPoint())
    assert yellow_pixels(axial) > 20  # the ruler follows the mouse before the second click
    qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=axial.widget_point_of_voxel(b).toPoint())
    assert len(measured) == 1
    expected = np.hypot((25 - 10) * 2.0, (25 - 5) * 3.0)  # x voxels are 2 mm, y voxels 3 mm
    # Clicks land within half a screen pixel of the voxel centres.
    px_mm = (
        3.0
        * SHAPE[1]
        / (axial.widget_point_of_voxel([0, 0, 10]).y() - axial.widget_point_of_voxel([0, SHAPE[1], 10]).y())
    )
    assert measured[0].length_mm == pytest.approx(expected, abs=2 * px_mm)
    assert measured[0].label == f"{measured[0].length_mm:.1f} mm"
    assert np.array_equal(doc.cursor, [20, 15, 10])  # measuring moved no cursor
    drawn = yellow_pixels(axial)
    assert drawn > 100
    axial.grab().save(str(ARTIFACTS / "slice_ruler.png"))
    doc.set_cursor([20, 15, 11])
    assert yellow_pixels(axial) == 0  # shown on its own slice only
    doc.set_cursor([20, 15, 10])
    assert yellow_pixels(axial) == drawn
    axial.setFocus()
    qtbot.keyClick(axial, Qt.Key.Key_Escape)
    assert yellow_pixels(axial) == 0 and axial.navigation.measurements == []


def test_the_ruler_measures_the_same_distance_when_zoomed(window, qtbot):
    doc = image_window(window)
    axial = window.views["axial"]
    window.set_tool("ruler")
    wheel(axial, axial.widget_point_of_voxel([12, 10, 10]), 6, Qt.KeyboardModifier.ControlModifier)
    for voxel in ([12, 10, 10], [14, 12, 10]):
        qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=axial.widget_point_of_voxel(voxel).toPoint())
    (measurement,) = axial.navigation.measurements
    px_mm = 2.0 / (axial.widget_point_of_voxel([13, 10, 10]).x() - axial.widget_point_of_voxel([12, 10, 10]).x())
    assert measurement.length_mm == pytest.approx(np.hypot(2 * 2.0, 2 * 3.0), abs=2 * px_mm)
    assert doc.cursor[2] == 10
