"""View menu controls: the slab of fibers drawn on the slices, the 3-D camera along an axis and
one view maximised, driven through the menu and the keyboard."""

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from tests.conftest import ARTIFACTS
from tractlens.app.model import Layer, Tractogram, Volume

SHAPE = (40, 40, 30)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def grab_rgb(widget) -> np.ndarray:
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())
    return pixels[:, : 3 * image.width()].reshape(image.height(), image.width(), 3).copy()


def view_action(window, *path: str):
    """The View menu's action at ``path`` (submenu titles, then the action's text)."""
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    for title in path[:-1]:
        menu = next(a.menu() for a in menu.actions() if a.text() == title)
    return next(a for a in menu.actions() if a.text() == path[-1])


def fibers_window(window):
    """A blank image, the cursor at z = 15, and three straight fibers along x (red) at
    y = 10, 20, 30 and z = 15 (in the slice), 18 (6 mm away) and 29 (28 mm away)."""
    doc = window.document
    doc.add_layer(Layer("blank", Volume("blank", np.zeros(SHAPE, np.float32), AFFINE), "scalar"))
    x = np.linspace(5, 35, 31)
    lines = [np.stack([x, np.full_like(x, y), np.full_like(x, z)], -1) for y, z in ((10, 15), (20, 18), (30, 29))]
    tract = Tractogram.from_list(lines, affine=AFFINE, dimensions=SHAPE, name="lines")
    doc.add_layer(Layer("lines", tract, "tractogram"))
    doc.set_cursor([20, 20, 15])
    return doc


def red_rows(window, doc) -> set[int]:
    """The y voxel rows of the axial view where a red fiber is drawn."""
    axial = window.views["axial"]
    axial.show_crosshair = False
    pixels = grab_rgb(axial).astype(int)
    out = set()
    for y in (10, 20, 30):
        point = axial.widget_point_of_voxel([20, y, 15])
        row = pixels[int(point.y()) - 1 : int(point.y()) + 2, int(point.x()) - 20 : int(point.x()) + 20]
        if ((row[..., 0] > 150) & (row[..., 1] < 60) & (row[..., 2] < 60)).sum() > 10:
            out.add(y)
    return out


def test_the_fiber_slab_thickness_is_a_view_menu_choice_for_all_slice_views(window, qtbot):
    doc = fibers_window(window)
    assert all(view.slab_mm == 4.0 for view in window.views.values())  # the default
    assert view_action(window, "Streamline s&lab on slices", "4 mm").isChecked()
    assert red_rows(window, doc) == {10}  # only the fiber in the slice; 6 mm is outside ±2 mm
    view_action(window, "Streamline s&lab on slices", "20 mm").trigger()
    assert all(view.slab_mm == 20.0 for view in window.views.values())
    assert red_rows(window, doc) == {10, 20}  # ±10 mm: the second fiber too, the third still not
    view_action(window, "Streamline s&lab on slices", "&All streamlines (no slab)").trigger()
    assert all(view.slab_mm is None for view in window.views.values())
    assert red_rows(window, doc) == {10, 20, 30}
    window.save_screenshot(ARTIFACTS / "fiber_slab_all.png")
    view_action(window, "Streamline s&lab on slices", "1 mm").trigger()
    assert red_rows(window, doc) == {10}
    # The sagittal view (x = 20) cuts all three fibers: with a slab it shows the one in its slab.
    assert window.views["sagittal"].slab_mm == 1.0


def test_the_slab_choice_is_remembered(qtbot):
    from tractlens.widgets.main_window import MainWindow

    first = MainWindow(device="cpu")
    qtbot.addWidget(first)
    first.set_fiber_slab(None)
    first.close()
    second = MainWindow(device="cpu")
    qtbot.addWidget(second)
    assert second.views["axial"].slab_mm is None
    assert second.slab_actions[None].isChecked()
    second.close()


def camera(window):
    cam = window.view3d.plotter.renderer.GetActiveCamera()
    return np.array(cam.GetDirectionOfProjection()), np.array(cam.GetViewUp())


def test_camera_shortcuts_look_along_the_axes_as_the_slices_do(window, qtbot):
    fibers_window(window)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=3000)
    expected = {
        Qt.Key.Key_1: ((0, 0, -1), (0, 1, 0)),  # axial: from above, anterior up
        Qt.Key.Key_2: ((0, 1, 0), (0, 0, 1)),  # coronal: from behind, superior up
        Qt.Key.Key_3: ((1, 0, 0), (0, 0, 1)),  # sagittal: from the left, superior up
        Qt.Key.Key_4: (-np.ones(3) / np.sqrt(3), None),  # isometric
    }
    for key, (direction, up) in expected.items():
        qtbot.keyClick(window, key, Qt.KeyboardModifier.ControlModifier)
        got_direction, got_up = camera(window)
        np.testing.assert_allclose(got_direction, direction, atol=1e-6)
        if up is not None:
            np.testing.assert_allclose(got_up, up, atol=1e-6)
    # Axial from above with anterior up puts the patient's right on the screen's right: a bright
    # block at the right anterior corner of the axial plane shows top right of the fibers.
    marker = np.zeros(SHAPE, np.float32)
    marker[30:, 32:, :] = 1.0
    window.document.add_layer(Layer("marker", Volume("marker", marker, AFFINE), "scalar", clim=(0, 1)))
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    shot = window.view3d.screenshot()[..., :3].astype(int)
    red = (shot[..., 0] > 150) & (shot[..., 1] < 80)
    white = shot.min(-1) > 100  # lit by the light kit: less than 255
    red_rows, red_cols = np.nonzero(red)
    white_rows, white_cols = np.nonzero(white)
    assert red_rows.size > 50 and white_rows.size > 50
    assert white_cols.mean() > red_cols.mean() and white_rows.mean() < red_rows.min()
    window.save_screenshot(ARTIFACTS / "camera_axial.png")
    # Radiological: axial from below.
    view_action(window, "Radiological convention").trigger()
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    np.testing.assert_allclose(camera(window)[0], (0, 0, 1), atol=1e-6)


def test_a_view_is_maximised_and_restored_from_the_keyboard(window, qtbot):
    fibers_window(window)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=3000)
    axial = window.views["axial"]
    width = axial.width()
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: axial.width() > 1.6 * width, timeout=3000)
    assert window.view3d.isHidden() and window.views["coronal"].isHidden() and window.views["sagittal"].isHidden()
    window.save_screenshot(ARTIFACTS / "axial_maximised.png")
    qtbot.keyClick(axial, Qt.Key.Key_Up)  # it has the focus: the keys step its slices
    assert window.document.cursor[2] == 16
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.AltModifier)  # again: all four
    qtbot.waitUntil(lambda: not window.view3d.isHidden() and abs(axial.width() - width) <= 2, timeout=3000)
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.AltModifier)  # the 3-D view alone
    assert not window.view3d.isHidden() and axial.isHidden()
    qtbot.keyClick(window, Qt.Key.Key_0, Qt.KeyboardModifier.AltModifier)
    assert all(not view.isHidden() for view in window.views.values())
