"""Ball & sticks in the GUI: bedpostX folders shown as sticks, the DWI layer's fit menu, cancel, errors."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QContextMenuEvent, QDropEvent, QImage
from PySide6.QtWidgets import QApplication

from tests.conftest import ARTIFACTS, installed_tool
from tractlens.app.errors import InputError
from tractlens.app.io.bedpostx import BedpostSamples, save_bedpostx
from tractlens.app.loaders import load_layers
from tractlens.app.model import Layer, RoiMask
from tractlens.widgets.panels import FIT_BALLSTICK

SHAPE = (16, 16, 4)
STICK_A = np.array([1.0, 1.0, 0.0]) / np.sqrt(2.0)  # voxel axes: up-right on the axial view
STICK_B = np.array([0.0, 1.0, 0.0])
F_A, F_B = 0.7, 0.35
REGION_A = (slice(2, 7), slice(1, 15), slice(None))  # both sticks; x 9..13 is in the mask with f = 0
REGION_ZERO = (slice(9, 14), slice(1, 15), slice(None))


def grab(widget) -> np.ndarray:
    """A widget as drawn, (H, W, 3) uint8."""
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())
    return pixels[:, : 3 * image.width()].reshape(image.height(), image.width(), 3).copy()


def stick_pixels(image: np.ndarray) -> dict[str, np.ndarray]:
    """Masks of stick 1 (red) and stick 2 (green) pixels; grey images and other colours are neither."""
    r, g, b = (image[..., c].astype(int) for c in range(3))
    return {"red": (r > 150) & (r - g > 80) & (r - b > 80), "green": (g > 150) & (g - r > 80) & (g - b > 80)}


def write_synthetic_bedpostx(folder, affine) -> None:
    """Stick 1 along the voxel diagonal (x + y) with f 0.7 and stick 2 along y with f 0.35 in
    region A; f = 0 in region ZERO; angles in FSL's frame (x negated when det(affine) > 0)."""
    flip = np.array([-1.0, 1.0, 1.0]) if np.linalg.det(affine[:3, :3]) > 0 else np.ones(3)
    samples = 6
    theta = np.zeros((*SHAPE, 2, samples), np.float32)
    phi = np.zeros_like(theta)
    f = np.zeros_like(theta)
    jitter = np.linspace(-0.02, 0.02, samples)
    for stick, (direction, fraction) in enumerate(((STICK_A, F_A), (STICK_B, F_B))):
        v = direction * flip
        theta[(*REGION_A, stick)] = np.arccos(v[2]) + jitter
        phi[(*REGION_A, stick)] = np.arctan2(v[1], v[0]) + jitter
        f[(*REGION_A, stick)] = fraction
    mask = np.zeros(SHAPE, bool)
    mask[1:15, 1:15, :] = True
    save_bedpostx(folder, BedpostSamples(theta=theta, phi=phi, f=f, mask=mask, affine=affine))


@pytest.fixture
def bedpostx_folder(tmp_path):
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = [-15.0, -15.0, -3.0]
    folder = tmp_path / "subj.bedpostX"
    write_synthetic_bedpostx(folder, affine)
    return folder


def principal_angle(offsets: np.ndarray) -> float:
    """Direction (degrees in [0, 180), counter-clockwise from screen right) of the main axis of
    pixel offsets (x right, y down)."""
    dx, dy = offsets[:, 0], -offsets[:, 1]
    _, vectors = np.linalg.eigh(np.cov(np.stack([dx, dy])))
    x, y = vectors[:, 1]
    return float(np.degrees(np.arctan2(y, x)) % 180.0)


def save_rgb(image: np.ndarray, path) -> None:
    rgb = np.ascontiguousarray(image[..., :3])
    QImage(rgb.data, rgb.shape[1], rgb.shape[0], 3 * rgb.shape[1], QImage.Format.Format_RGB888).save(str(path))


def cells(view, voxels) -> list[tuple[int, int, int, int]]:
    """Pixel boxes (x0, x1, y0, y1) of reference voxels in a slice view, a margin inside each cell."""
    geometry = view.geometry_now()
    target = view._target_rect(geometry)
    height, width = geometry.voxels.shape[:2]
    half_w, half_h = 0.45 * target.width() / width, 0.45 * target.height() / height
    boxes = []
    for ijk in voxels:
        centre = view.widget_point_of_voxel(ijk)
        boxes.append(
            (
                int(centre.x() - half_w),
                int(centre.x() + half_w) + 1,
                int(centre.y() - half_h),
                int(centre.y() + half_h) + 1,
            )
        )
    return boxes


def offsets_in_cells(view, mask: np.ndarray, voxels) -> list[np.ndarray]:
    """Per voxel, the (x, y) offsets from its centre of the ``mask`` pixels in its cell."""
    offsets = []
    for (x0, x1, y0, y1), ijk in zip(cells(view, voxels), voxels):
        rows, cols = np.nonzero(mask[y0:y1, x0:x1])
        centre = view.widget_point_of_voxel(ijk)
        offsets.append(np.stack([cols + x0 - centre.x(), rows + y0 - centre.y()], 1))
    return offsets


def test_a_bedpostx_folder_loads_as_dyads_over_mean_f1(bedpostx_folder):
    layers = load_layers(bedpostx_folder)
    assert [(layer.name, layer.kind) for layer in layers] == [("subj mean f1", "scalar"), ("subj dyads", "dyads")]
    dyads = layers[1].data.data
    assert dyads.shape == (*SHAPE, 2, 4)
    np.testing.assert_allclose(np.abs(dyads[3, 5, 1, 0, :3]), STICK_A, atol=1e-3)  # back in voxel axes
    np.testing.assert_allclose(dyads[3, 5, 1, :, 3], [F_A, F_B], atol=1e-6)
    assert not dyads[REGION_ZERO].any()
    np.testing.assert_allclose(layers[0].data.data[3, 5, 1], F_A, atol=1e-6)
    # One of its sample files stands for the folder (File > Open picks files).
    again = load_layers(bedpostx_folder / "merged_f2samples.nii.gz")
    assert [layer.name for layer in again] == ["subj mean f1", "subj dyads"]


def test_dyads_are_drawn_as_sticks_on_the_slices_and_in_3d(window, bedpostx_folder, qtbot):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(bedpostx_folder))])
    window.dropEvent(
        QDropEvent(
            QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
        )
    )
    assert window.wait_for_jobs(60)
    assert window.errors == []
    doc = window.document
    layer = doc.layer("subj dyads")
    z = int(doc.cursor[2])
    axial = window.views["axial"]
    axial.show_crosshair = False
    image = grab(axial)
    colours = stick_pixels(image)
    region_a = [(x, y, z) for x in range(2, 7) for y in range(1, 15)]
    region_zero = [(x, y, z) for x in range(9, 14) for y in range(1, 15)]
    boxes_a, boxes_zero = cells(axial, region_a), cells(axial, region_zero)
    for name in ("red", "green"):
        with_sticks = [colours[name][y0:y1, x0:x1].sum() >= 3 for x0, x1, y0, y1 in boxes_a]
        assert np.mean(with_sticks) > 0.95, (name, np.mean(with_sticks))
        assert sum(colours[name][y0:y1, x0:x1].sum() for x0, x1, y0, y1 in boxes_zero) == 0, name

    # Stick 1 runs along the voxel diagonal x + y: up and to the right on the (RAS) axial view;
    # stick 2 along y: vertical. Stick 1 (f 0.7) is about twice as long as stick 2 (f 0.35).
    red, green = (offsets_in_cells(axial, colours[name], region_a) for name in ("red", "green"))
    assert abs(principal_angle(np.concatenate(red)) - 45) < 10
    assert abs(principal_angle(np.concatenate(green)) - 90) < 10
    red_length = np.median([np.ptp(o[:, 0] - o[:, 1]) / np.sqrt(2) for o in red if len(o)])
    green_length = np.median([np.ptp(o[:, 1]) for o in green if len(o)])
    assert 1.4 < red_length / green_length < 2.6, (red_length, green_length)
    save_rgb(image, ARTIFACTS / "dyads_axial.png")
    window.save_screenshot(ARTIFACTS / "dyads_bedpostx.png")

    # Longer sticks with a larger glyph size from the layer panel; none when hidden.
    panel = window.layer_panel
    panel.list.setCurrentItem(panel.item_for(layer))
    assert panel.glyph_size.isEnabled() and panel.glyph_step.isEnabled()
    assert not panel.glyph.isEnabled() and not panel.colormap.isEnabled()
    panel.glyph_size.setValue(1.4)
    assert layer.glyph_size == pytest.approx(1.4)
    assert stick_pixels(grab(axial))["red"].sum() > 1.2 * colours["red"].sum()
    layer.set(visible=False)
    assert not any(mask.any() for mask in stick_pixels(grab(axial)).values())
    layer.set(visible=True, glyph_size=1.0)

    # 3-D: one line per stick on the three cursor planes, following the cursor.
    def expected_lines():
        cursor = doc.cursor
        on_planes = np.zeros(SHAPE, bool)
        on_planes[cursor[0], :, :] = on_planes[:, cursor[1], :] = on_planes[:, :, cursor[2]] = True
        return int((layer.data.data[..., 3] > 0)[on_planes].sum())

    view = window.view3d
    (actor,) = view.glyphs.actors(layer)
    assert actor.mapper.dataset.n_lines == expected_lines() > 0
    doc.set_cursor([11, 8, 1])  # the sagittal plane into the f = 0 region
    (actor,) = view.glyphs.actors(layer)
    assert actor.mapper.dataset.n_lines == expected_lines() > 0
    qtbot.wait(20)
    view.plotter.view_xy()
    view.plotter.camera.Elevation(-35)  # obliquely: where lines in a plane would sink into it
    view.plotter.reset_camera()
    on_plane = stick_pixels(view.screenshot())
    doc.layer("subj mean f1").set(visible=False)  # no slice planes then: the sticks alone
    shot = view.screenshot()
    alone = stick_pixels(shot)
    assert alone["red"].sum() > 200 and alone["green"].sum() > 100, (alone["red"].sum(), alone["green"].sum())
    for name in ("red", "green"):  # the sticks lie in the axial plane but are drawn over it, whole
        assert on_plane[name].sum() > 0.7 * alone[name].sum(), (name, on_plane[name].sum(), alone[name].sum())
    save_rgb(shot, ARTIFACTS / "dyads_3d.png")

    # The status bar reads the sticks' fractions under the mouse.
    window.update_hover_label(np.array([3, 5, 1]))
    assert "subj dyads (0.7, 0.35)" in window.hover_label.text()


def test_sticks_follow_the_world_on_a_left_right_flipped_grid(window, tmp_path):
    """In an LAS file voxel x points to the patient's left, and FSL's frame is voxel axes: the
    stick along voxel x + y points up and to the LEFT on the (neurological) axial view."""
    affine = np.diag([-2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = [15.0, -15.0, -3.0]
    write_synthetic_bedpostx(tmp_path / "las.bedpostX", affine)
    window.open_paths([tmp_path / "las.bedpostX"])
    assert window.wait_for_jobs(60)
    axial = window.views["axial"]
    axial.show_crosshair = False
    z = int(window.document.cursor[2])
    red = offsets_in_cells(axial, stick_pixels(grab(axial))["red"], [(x, 7, z) for x in range(2, 7)])
    assert abs(principal_angle(np.concatenate(red)) - 135) < 10


def test_a_bedpostx_folder_opens_from_the_file_menu_and_the_command_line(
    window, bedpostx_folder, monkeypatch, tmp_path
):
    from tractlens.widgets import dialogs

    file_menu = window.menuBar().actions()[0].menu()
    with dialogs.answers(folder=[bedpostx_folder]):  # the folder the user picks
        next(action for action in file_menu.actions() if action.text().startswith("Open &folder")).trigger()
    assert window.wait_for_jobs(60)
    assert [layer.kind for layer in window.document.layers] == ["scalar", "dyads"]

    out = tmp_path / "view.png"
    exe = installed_tool("tractlens")
    cmd = [exe] if exe else [sys.executable, "-m", "tractlens.widgets.launcher"]
    args = ["view", str(bedpostx_folder), "--screenshot", str(out), "--size", "1200x800", "--exit", "--device", "cpu"]
    result = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    image = QImage(str(out)).convertToFormat(QImage.Format.Format_RGB888)
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())
    pixels = pixels[:, : 3 * image.width()].reshape(image.height(), image.width(), 3)
    assert stick_pixels(pixels)["red"].sum() > 500


# ------------------------------------------------------------- fitting from the DWI layer's menu
def open_fit_dialog(win, qtbot):
    """Right-click the DWI layer in the layer list and choose the fit action, as a user would.
    (QTest's mouse events do not pass through the window system, which turns a right click into
    a context-menu event: that event is sent here.)"""
    panel = win.layer_panel
    viewport = panel.list.viewport()
    pos = panel.list.visualItemRect(panel.item_for(win.document.layer("dwi"))).center()
    qtbot.mouseClick(viewport, Qt.MouseButton.RightButton, pos=pos)
    event = QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, viewport.mapToGlobal(pos))
    QApplication.sendEvent(viewport, event)
    qtbot.waitUntil(lambda: panel.menu is not None and panel.menu.isVisible(), timeout=3000)
    menu = panel.menu
    action = next(action for action in menu.actions() if action.text() == FIT_BALLSTICK)
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(action).center())
    qtbot.waitUntil(lambda: win.ballstick_dialog is not None and win.ballstick_dialog.isVisible(), timeout=3000)
    return win.ballstick_dialog


def type_into(qtbot, box, text: str) -> None:
    box.selectAll()
    qtbot.keyClicks(box, text)


def add_box_roi(doc, name: str, centre, radius: int) -> Layer:
    roi = RoiMask(name, np.zeros(doc.reference_shape, bool), doc.reference_affine, role="seed")
    roi.apply_shape({"kind": "box", "centre": centre, "radius": radius})
    return doc.add_layer(Layer(name, roi, "roi"))


def test_fit_from_the_dwi_menu_shows_crossing_sticks_and_saves_a_bedpostx_folder(demo_window, qtbot, tmp_path):
    """The demo's crossing_lr (along x) and crossing_ap (along y) bundles cross at 90° around
    voxel (28, 28, 15); the fit runs in a box ROI around it (the NumPy engine takes about two
    minutes for the whole demo brain even with these few iterations)."""
    win = demo_window
    doc = win.document
    assert doc.layer("dwi").kind == "dwi" and not doc.layer("dwi").visible
    add_box_roi(doc, "crossing", (28, 28, 15), 4)
    before = len(doc.layers)
    dialog = open_fit_dialog(win, qtbot)
    qtbot.keyClick(dialog.region, Qt.Key.Key_Down)  # brain -> ROI crossing
    assert dialog.region.currentText().startswith("ROI crossing")
    for box, text in (
        (dialog.n_fibres, "2"),
        (dialog.burnin, "20"),
        (dialog.njumps, "40"),
        (dialog.sample_every, "4"),
    ):
        type_into(qtbot, box, text)
    assert dialog.samples.text() == "10 samples per parameter"
    qtbot.mouseClick(dialog.save, Qt.MouseButton.LeftButton)
    dialog.folder_edit.clear()
    qtbot.keyClicks(dialog.folder_edit, str(tmp_path / "demo.bedpostX"))
    start = time.perf_counter()
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    job = win.runner.jobs[max(win.runner.jobs)]
    assert job.name == "ball & sticks (dwi)"
    assert win.wait_for_jobs(300)
    elapsed = time.perf_counter() - start
    assert win.errors == []
    assert job.state == "done" and job.total > 0
    print(f"\nball & sticks on the crossing ROI (729 voxels, 2 sticks, 60 iterations): {elapsed:.1f} s")

    assert len(doc.layers) == before + 2
    dyads, f1 = doc.layer("dyads"), doc.layer("mean f1")
    assert dyads.kind == "dyads" and f1.kind == "scalar" and not f1.visible
    data = dyads.data.data
    assert data.shape == (56, 56, 24, 2, 4)
    roi = doc.layer("crossing").data.mask
    assert not data[~roi].any()  # nothing fitted outside the ROI
    core = data[27:30, 27:30, 14:17].reshape(-1, 2, 4)
    along = [
        (np.abs(sticks[:, 0]) > 0.9).any() and (np.abs(sticks[:, 1]) > 0.9).any() and (sticks[:, 3] > 0.1).all()
        for sticks in core
    ]
    assert np.mean(along) >= 0.8, np.round(core, 2)
    assert abs(data[32, 28, 15, 0, 0]) > 0.9 and abs(data[28, 32, 15, 0, 1]) > 0.9  # single bundles
    assert "voxels fitted" in win.statusBar().currentMessage()

    doc.set_cursor([28, 28, 15])
    for name in ("colour FA", "bundles", "crossing"):
        doc.layer(name).set(visible=False)
    axial = win.views["axial"]
    axial.show_crosshair = False
    image = grab(axial)
    colours = stick_pixels(image)
    (x0, _, y0, _), (_, x1, _, y1) = cells(axial, [(23, 33, 15), (33, 23, 15)])  # the ROI and a voxel more
    for name in ("red", "green"):
        inside = colours[name][y0:y1, x0:x1].sum()
        assert inside > 50 and inside == colours[name].sum(), (name, inside, colours[name].sum())
    save_rgb(image, ARTIFACTS / "ballstick_fit_axial.png")
    qtbot.wait(300)  # the 3-D view drops the hidden ROI's surface after a short pause
    win.save_screenshot(ARTIFACTS / "ballstick_fit_demo.png")

    # The folder written on the worker opens as the same sticks.
    assert (tmp_path / "demo.bedpostX" / "merged_th1samples.nii.gz").exists()
    reloaded = load_layers(tmp_path / "demo.bedpostX")[1].data.data
    np.testing.assert_allclose(reloaded, data, atol=1e-4)


def test_cancelling_a_fit_leaves_the_document_unchanged(demo_window, qtbot):
    win = demo_window
    before = list(win.document.layers)
    dialog = open_fit_dialog(win, qtbot)
    assert dialog.region.currentText().startswith("brain")  # FSL's defaults, the whole brain
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    job = win.runner.jobs[max(win.runner.jobs)]
    qtbot.waitUntil(lambda: job.state == "running", timeout=10000)
    qtbot.wait(500)
    start = time.perf_counter()
    qtbot.mouseClick(win.job_panel.cancel_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    print(f"\ncancel took {time.perf_counter() - start:.1f} s")
    assert job.state == "cancelled"
    assert win.document.layers == before
    assert win.errors == []


def test_a_failed_fit_reports_and_changes_nothing(demo_window, qtbot, monkeypatch):
    from tractlens.app.usecases import fits

    def failing(*_args, **_kwargs):
        raise InputError("the series is unusable", fix="Check it")

    monkeypatch.setattr(fits, "fit_ballstick_pipeline", failing)
    win = demo_window
    before, jobs = list(win.document.layers), len(win.runner.jobs)
    dialog = open_fit_dialog(win, qtbot)
    type_into(qtbot, dialog.njumps, "10")
    type_into(qtbot, dialog.sample_every, "20")  # more than the jumps: refused in the dialog
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "njumps" in dialog.message.text()
    assert len(win.runner.jobs) == jobs
    type_into(qtbot, dialog.sample_every, "5")
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(30)
    job = win.runner.jobs[max(win.runner.jobs)]
    assert job.state == "failed"
    assert win.errors and "the series is unusable" in win.errors[-1]
    assert win.document.layers == before
