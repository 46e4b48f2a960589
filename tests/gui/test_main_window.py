"""The main window driven like a user: pytest-qt on a real window under Xvfb."""

import subprocess
import sys

import nibabel as nib
import numpy as np
from PySide6.QtCore import QPoint, Qt

from app.model import Layer, Volume
from tests.conftest import ARTIFACTS, installed_tool


def non_blank(image: np.ndarray) -> bool:
    return image is not None and image.size > 0 and (image.max(axis=-1) > 20).mean() > 0.05


def test_demo_opens_with_every_view_showing_data(demo_window, qtbot):
    names = [layer.name for layer in demo_window.document.layers]
    assert names == ["FA", "MD", "colour FA", "bundles"] or set(names) == {"FA", "MD", "colour FA", "bundles"}
    for view in demo_window.views.values():
        assert non_blank(view.image_array()), view.view
    assert non_blank(demo_window.view3d.screenshot())
    demo_window.save_screenshot(ARTIFACTS / "main_window_demo.png")


def test_click_moves_the_cursor_links_the_views_and_shows_the_value(demo_window, qtbot):
    doc = demo_window.document
    axial = demo_window.views["axial"]
    target = np.array([20, 33, int(doc.cursor[2])])
    point = axial.widget_point_of_voxel(target)
    qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(point.x()), int(point.y())))
    np.testing.assert_array_equal(doc.cursor, target)
    # The coronal view now cuts at y = 33 and the sagittal at x = 20.
    coronal, sagittal = demo_window.views["coronal"], demo_window.views["sagittal"]
    assert coronal.geometry_now().voxels[0, 0, 1] == 33
    assert sagittal.geometry_now().voxels[0, 0, 0] == 20
    fa = doc.layer("FA").data.data[tuple(target)]
    text = demo_window.position_label.text()
    assert f"voxel (20, 33, {target[2]})" in text
    assert f"FA {fa:.4g}" in text
    world = doc.reference_affine[:3, :3] @ target + doc.reference_affine[:3, 3]
    assert f"RAS ({world[0]:.1f}, {world[1]:.1f}, {world[2]:.1f}) mm" in text


def test_keys_and_wheel_step_through_slices(demo_window, qtbot):
    doc = demo_window.document
    axial = demo_window.views["axial"]
    z = int(doc.cursor[2])
    axial.setFocus()
    qtbot.keyClick(axial, Qt.Key.Key_Up)
    assert doc.cursor[2] == z + 1
    qtbot.keyClick(axial, Qt.Key.Key_PageDown)
    qtbot.keyClick(axial, Qt.Key.Key_PageDown)
    assert doc.cursor[2] == z - 1


def test_hiding_a_layer_in_the_list_changes_the_pixels(demo_window, qtbot):
    panel = demo_window.layer_panel
    axial = demo_window.views["axial"]
    before = axial.image_array().copy()
    assert (before[..., 0] != before[..., 1]).any()  # colour FA on top: coloured pixels
    item = panel.item_for(demo_window.document.layer("colour FA"))
    rect = panel.list.visualItemRect(item)
    checkbox = QPoint(rect.left() + 10, rect.center().y())
    qtbot.mouseClick(panel.list.viewport(), Qt.MouseButton.LeftButton, pos=checkbox)
    assert not demo_window.document.layer("colour FA").visible
    after = axial.image_array()
    assert (after[..., 0] == after[..., 1]).all() and (after[..., 1] == after[..., 2]).all()  # grey FA only
    demo_window.save_screenshot(ARTIFACTS / "main_window_fa_only.png")


def test_colour_map_and_window_level_change_the_pixels(demo_window, qtbot):
    doc = demo_window.document
    doc.layer("colour FA").set(visible=False)
    fa = doc.layer("FA")
    panel = demo_window.layer_panel
    panel.list.setCurrentItem(panel.item_for(fa))
    axial = demo_window.views["axial"]
    grey = axial.image_array().copy()
    panel.colormap.setCurrentText("hot")
    assert fa.colormap == "hot"
    hot = axial.image_array()
    assert (hot[..., 0] > hot[..., 2]).any() and not np.array_equal(grey, hot)
    lo, hi = fa.clim
    centre = axial.rect().center()
    qtbot.mousePress(axial, Qt.MouseButton.RightButton, pos=centre)
    qtbot.mouseMove(axial, pos=centre + QPoint(100, 0))
    qtbot.mouseRelease(axial, Qt.MouseButton.RightButton, pos=centre + QPoint(100, 0))
    assert fa.clim[1] - fa.clim[0] > (hi - lo) * 1.2  # dragging right widens the window
    assert panel.vmax.value() == fa.clim[1]


def test_left_right_flipped_affine_shows_the_same_picture(window, qtbot):
    """A marker on the patient's left must appear on the screen's left (neurological),
    whether the file stores x left-to-right (RAS) or right-to-left (LAS)."""
    data = np.zeros((20, 16, 10), np.float32)
    data[2:5, 7:9, 5] = 1.0  # low voxel x = patient's left in a RAS file
    ras = np.diag([2.0, 2.0, 2.0, 1.0])
    ras[:3, 3] = [-19, -15, -9]
    las = ras.copy()
    las[0, 0] = -2.0
    las[0, 3] = 19  # voxel 0 now at x = +19 mm: flip the data so the world stays the same
    window.document.add_layer(Layer("ras", Volume("ras", data, ras), "scalar", clim=(0, 1)))
    axial = window.views["axial"]
    image_ras = axial.image_array().copy()
    left_half, right_half = image_ras[:, : image_ras.shape[1] // 2], image_ras[:, image_ras.shape[1] // 2 :]
    assert left_half.max() == 255 and right_half.max() == 0
    assert axial.geometry_now().labels[:2] == ("L", "R")
    window.document.remove_layer(window.document.layers[0])
    window.document.reference_affine = None
    window.document.add_layer(Layer("las", Volume("las", data[::-1].copy(), las), "scalar", clim=(0, 1)))
    image_las = axial.image_array()
    np.testing.assert_array_equal(image_las, image_ras)
    window.save_screenshot(ARTIFACTS / "orientation_las.png")


def test_cancel_button_stops_a_running_job(window, qtbot):
    import time

    def slow(ctx):
        while True:
            ctx.check()
            time.sleep(0.01)

    job_id = window.runner.submit("slow", slow)
    qtbot.waitUntil(lambda: window.runner.jobs[job_id].state == "running", timeout=5000)
    with qtbot.waitSignal(window.runner.job_cancelled, timeout=2000):
        qtbot.mouseClick(window.job_panel.cancel_button, Qt.MouseButton.LeftButton)
    assert window.runner.jobs[job_id].state == "cancelled"


def test_bad_file_reports_an_error_and_keeps_the_window(window, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4, 2), np.float32), np.eye(4)), tmp_path / "two.nii.gz")
    window.open_paths([tmp_path / "notes.txt", tmp_path / "missing.trk"])
    assert window.wait_for_jobs(30)
    assert any("cannot open this kind of file" in e for e in window.errors)
    assert any("not found" in e for e in window.errors)
    assert window.document.layers == []


def test_scripted_screenshot_from_the_command_line(tmp_path):
    out = tmp_path / "shot.png"
    exe = installed_tool("tractlens")
    cmd = [exe] if exe else [sys.executable, "-m", "widgets.launcher"]
    result = subprocess.run(
        [*cmd, "--demo", "--screenshot", str(out), "--size", "1200x800", "--exit", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert (image.width(), image.height()) == (1200, 800)
    ptr = image.convertToFormat(QImage.Format.Format_RGB888)
    pixels = np.frombuffer(ptr.constBits(), np.uint8).reshape(800, ptr.bytesPerLine())[:, : 1200 * 3]
    assert pixels.std() > 10
    (ARTIFACTS / "cli_screenshot.png").write_bytes(out.read_bytes())
