"""The main window driven like a user: pytest-qt on a real window under Xvfb."""

import subprocess
import sys

import nibabel as nib
import numpy as np
from PySide6.QtCore import QEvent, QPoint, Qt

from tests.conftest import ARTIFACTS, installed_tool
from tractlens.app.model import Layer, Volume


def non_blank(image: np.ndarray) -> bool:
    return image is not None and image.size > 0 and (image.max(axis=-1) > 20).mean() > 0.05


def test_demo_opens_with_every_view_showing_data(demo_window, qtbot):
    names = {layer.name for layer in demo_window.document.layers}
    assert names == {"dwi", "tensors", "FA", "MD", "colour FA", "bundles"}
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
    cmd = [exe] if exe else [sys.executable, "-m", "tractlens.widgets.launcher"]
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
    pixels = np.frombuffer(ptr.constBits(), np.uint8).reshape(800, ptr.bytesPerLine())[:, : 1200 * 3].copy()
    assert pixels.std() > 10
    (ARTIFACTS / "cli_screenshot.png").write_bytes(out.read_bytes())


def _blob_aspects(image: np.ndarray) -> np.ndarray:
    """Width / height of each bright blob in a rendered image."""
    from scipy import ndimage

    labels, _ = ndimage.label(image.max(axis=-1) > 40)
    aspects = []
    for box in ndimage.find_objects(labels):
        height, width = box[0].stop - box[0].start, box[1].stop - box[1].start
        if height * width >= 12:
            aspects.append(width / height)
    return np.array(aspects)


def test_glyphs_are_elongated_along_the_screen_axis_that_shows_x(window, qtbot):
    from tractlens.gpu import sym3

    shape = (9, 9, 3)
    evals = np.array([1.7e-3, 3e-4, 3e-4])
    for direction, expect_wide in (((1, 0, 0), True), ((0, 1, 0), False)):
        e1 = np.array(direction, float)
        e2 = np.cross(e1, [0, 0, 1.0])
        e3 = np.cross(e1, e2)
        mat = sum(lam * np.outer(v, v) for lam, v in zip(evals, (e1, e2, e3)))
        tensor = np.broadcast_to(sym3.from_matrix(np, mat), (*shape, 6)).copy()
        doc = window.document
        for layer in list(doc.layers):
            doc.remove_layer(layer)
        doc.reference_affine = None
        layer = Layer(
            "t",
            Volume("t", tensor, np.diag([3.0, 3.0, 3.0, 1.0]), kind="tensor"),
            "tensor",
            glyph_step=1,
            glyph_size=0.9,
        )
        doc.add_layer(layer)
        doc.set_cursor([4, 4, 1])
        view = window.view3d
        qtbot.waitUntil(view.glyphs_ready, timeout=10_000)  # built on a worker thread
        qtbot.wait(20)  # let the coalesced render (and its first-camera reset) run before we set the camera
        view.plotter.view_xy()  # looking down z: screen x = world x, screen y = world y
        view.plotter.reset_camera()
        image = view.screenshot()
        aspects = _blob_aspects(image)
        assert len(aspects) >= 20, (len(aspects), image.shape)
        if expect_wide:
            assert np.median(aspects) > 2.5, np.median(aspects)
        else:
            assert np.median(aspects) < 0.4, np.median(aspects)
        from PySide6.QtGui import QImage

        rgb = np.ascontiguousarray(image[..., :3])
        QImage(rgb.data, rgb.shape[1], rgb.shape[0], 3 * rgb.shape[1], QImage.Format.Format_RGB888).save(
            str(ARTIFACTS / f"glyphs_{'x' if expect_wide else 'y'}.png")
        )
        # The axial slice view draws the same glyphs as ellipses.
        axial = window.views["axial"]
        axial.show_crosshair = False
        qtbot.waitUntil(axial.glyphs_ready, timeout=10_000)
        grabbed = axial.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
        grabbed.save(str(ARTIFACTS / f"glyphs_2d_{'x' if expect_wide else 'y'}.png"))
        pixels = np.frombuffer(grabbed.constBits(), np.uint8).reshape(grabbed.height(), grabbed.bytesPerLine()).copy()
        pixels = pixels[:, : 3 * grabbed.width()].reshape(grabbed.height(), grabbed.width(), 3)
        channel = 0 if expect_wide else 1  # red for x, green for y (|e1| colouring)
        other = 1 - channel
        glyph_pixels = (pixels[..., channel] > 100) & (pixels[..., other] < 100)
        aspects2d = _blob_aspects(np.repeat(glyph_pixels[..., None] * 255, 3, axis=-1).astype(np.uint8))
        assert len(aspects2d) >= 50, (len(aspects2d), pixels.shape)
        if expect_wide:
            assert np.median(aspects2d) > 2.5, np.median(aspects2d)
        else:
            assert np.median(aspects2d) < 0.4, np.median(aspects2d)


def test_fibers_can_be_coloured_by_a_streamline_scalar(demo_window, qtbot):
    doc = demo_window.document
    for name in ("colour FA", "FA", "MD"):
        doc.layer(name).set(visible=False)
    bundles = doc.layer("bundles")
    panel = demo_window.layer_panel
    panel.list.setCurrentItem(panel.item_for(bundles))
    view = demo_window.view3d
    before = view.screenshot()
    axial_before = demo_window.views["axial"].grab().toImage()
    panel.color_by.setCurrentText("bundle")
    assert bundles.color_by == "bundle"
    assert bundles.clim[0] >= 1 and bundles.clim[1] <= 5  # range follows the scalar
    assert panel.colormap.isEnabled() and panel.vmax.value() == bundles.clim[1]
    after = view.screenshot()
    lit = after.max(axis=-1) > 40
    colours = {tuple(c) for c in (after[lit] // 32)}
    assert len(colours) >= 3  # several bundle colours, not one
    assert np.abs(after.astype(int) - before.astype(int)).sum() > 0
    assert any("bundle" in title for title in view.plotter.scalar_bars.keys())
    assert demo_window.views["axial"].grab().toImage() != axial_before  # 2-D slab colours follow
    demo_window.save_screenshot(ARTIFACTS / "fibers_by_bundle.png")
    panel.color_by.setCurrentText("direction")
    assert len(view.plotter.scalar_bars) == 0
    panel.color_by.setCurrentText("bundle")
    doc.remove_layer(bundles)  # its colour bar goes with it
    assert len(view.plotter.scalar_bars) == 0


def test_hovering_shows_values_without_moving_the_cursor(demo_window, qtbot):
    doc = demo_window.document
    axial = demo_window.views["axial"]
    before = doc.cursor.copy()
    target = np.array([30, 20, int(doc.cursor[2])])
    point = axial.widget_point_of_voxel(target)
    # The move as the window system delivers it (QTest's moves the X pointer, and no event comes
    # when it is already there: a flaky test under xdist)
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    move = QMouseEvent(
        QEvent.Type.MouseMove,
        point,
        axial.mapToGlobal(point),
        Qt.MouseButton.NoButton,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(axial, move)
    qtbot.waitUntil(lambda: "mouse (30, 20" in demo_window.hover_label.text(), timeout=10_000)
    fa = doc.layer("FA").data.data[tuple(target)]
    assert f"FA {fa:.4g}" in demo_window.hover_label.text()
    np.testing.assert_array_equal(doc.cursor, before)


def test_fibers_as_tubes(demo_window, qtbot):
    doc = demo_window.document
    bundles = doc.layer("bundles")
    panel = demo_window.layer_panel
    panel.list.setCurrentItem(panel.item_for(bundles))
    before = demo_window.view3d.screenshot()
    qtbot.mouseClick(panel.tubes, Qt.MouseButton.LeftButton)
    assert bundles.tubes
    actor = demo_window.view3d._fibers[id(bundles)]["actor"]
    assert actor.GetProperty().GetRenderLinesAsTubes()
    after = demo_window.view3d.screenshot()
    assert (after.max(-1) > 40).sum() > (before.max(-1) > 40).sum()  # tubes cover more pixels


def test_drag_and_drop_opens_files(window, qtbot, demo_dir):
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDropEvent

    mime = QMimeData()
    mime.setUrls(
        [QUrl.fromLocalFile(str(demo_dir / "labels.nii.gz")), QUrl.fromLocalFile(str(demo_dir / "bundles.trk"))]
    )
    event = QDropEvent(
        QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    window.dropEvent(event)
    assert window.wait_for_jobs(60)
    kinds = {layer.name: layer.kind for layer in window.document.layers}
    assert kinds == {"labels": "labels", "bundles": "tractogram"}
    image = window.views["axial"].image_array()
    labels = window.document.layer("labels").data.data[:, :, window.document.cursor[2]]
    assert len(np.unique(labels)) >= 3
    assert len({tuple(c) for c in image.reshape(-1, 3)}) == len(np.unique(labels))  # one colour per label


def test_window_layout_and_recent_files_are_remembered(qtbot, demo_dir):
    from tractlens.widgets.main_window import MainWindow

    first = MainWindow(device="cpu")
    qtbot.addWidget(first)
    first.resize(1000, 700)
    first.show()
    first.open_paths([demo_dir / "mask.nii.gz"])
    assert first.wait_for_jobs(60)
    first.close()
    second = MainWindow(device="cpu")
    qtbot.addWidget(second)
    assert (second.width(), second.height()) == (1000, 700)
    recent = [action.text() for action in second.recent_menu.actions()]
    assert recent and recent[0].endswith("mask.nii.gz")
    second.close()


def test_a_layout_saved_by_other_docks_is_not_restored(qtbot):
    """A layout saved by a version with other docks (here: everything floating, saved as the
    releases before LAYOUT_VERSION did, version 0) would scatter the docks this version has; it
    is ignored and the default tabs are kept."""
    from PySide6.QtWidgets import QDockWidget

    from tractlens.widgets.main_window import MainWindow, settings

    old = MainWindow(device="cpu")
    qtbot.addWidget(old)
    for dock in old.findChildren(QDockWidget):
        dock.setFloating(True)
    settings().setValue("window/state", old.saveState(0))
    old.runner.shutdown(10)
    old.view3d.close_plotter()
    new = MainWindow(device="cpu")
    qtbot.addWidget(new)
    new.show()
    qtbot.waitExposed(new)
    connectivity = new.findChild(QDockWidget, "dock_connectivity")
    assert not connectivity.isFloating()
    tabbed = {d.objectName() for d in new.tabifiedDockWidgets(connectivity)}
    assert {"dock_probabilistic_tracking", "dock_presurgical", "dock_commit_filtering"} <= tabbed
    new.close()
