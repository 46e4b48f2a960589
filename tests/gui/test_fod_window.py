"""fODFs in the window: a fit-csd folder shown as SH glyphs on the slices and in 3-D, Fit CSD… from
the DWI layer's menu (to completion, and cancelled), the fODF choice of the tracking panel."""

from __future__ import annotations

import subprocess
import sys
import time

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QContextMenuEvent, QDropEvent, QImage
from PySide6.QtWidgets import QApplication

from tests.conftest import ARTIFACTS, installed_tool
from tests.gui.test_ballstick_gui import cells, grab, offsets_in_cells, principal_angle, save_rgb, stick_pixels
from tests.test_fod_display import PHANTOM_SHAPE, fit_csd_folder, phantom_dwi
from tractlens.app.io.dwi import save_gradients
from tractlens.widgets.csd_dialog import FIT_CSD
from tractlens.widgets.fod_glyphs import SCALING_TEXT

Z = 1  # the phantom's middle axial slice
X_BUNDLE, CROSSING, Y_BUNDLE = (1, 2), (3, 4), (6, 7)  # voxel x of each region (every y)


def drop(window, path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    point, action = QPointF(50, 50), Qt.DropAction.CopyAction
    window.dropEvent(QDropEvent(point, action, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier))


def region(xs) -> list[tuple[int, int, int]]:
    return [(x, y, Z) for x in xs for y in range(1, PHANTOM_SHAPE[1] - 1)]


def angle_of(view, mask, voxels) -> float:
    return principal_angle(np.concatenate(offsets_in_cells(view, mask, voxels)))


def colour_share(mask, view, voxels) -> float:
    """Fraction of the voxels whose cell holds at least 20 pixels of ``mask``."""
    return float(np.mean([mask[y0:y1, x0:x1].sum() >= 20 for x0, x1, y0, y1 in cells(view, voxels)]))


def test_a_fit_csd_folder_shows_fodf_glyphs_on_the_slices_and_in_3d(window, tmp_path, qtbot):
    fit_csd_folder(tmp_path / "csd")
    drop(window, tmp_path / "csd")
    assert window.wait_for_jobs(60)
    assert window.errors == []
    doc = window.document
    assert [layer.kind for layer in doc.layers] == ["scalar", "dyads", "fod"]
    layer = doc.layer("csd fODF")
    doc.set_cursor([3, 3, Z])
    assert window.wait_for_jobs(30)
    axial = window.views["axial"]
    axial.show_crosshair = False
    image = grab(axial)
    save_rgb(image, ARTIFACTS / "fod_axial.png")
    colours = stick_pixels(image)  # red: lobes along x (left-right), green: along y
    # A bundle along x: red lobes lying horizontally; along y: green, vertical; the crossing: both.
    assert colour_share(colours["red"], axial, region(X_BUNDLE)) > 0.95
    assert colour_share(colours["green"], axial, region(X_BUNDLE)) == 0
    assert colour_share(colours["green"], axial, region(Y_BUNDLE)) > 0.95
    assert colour_share(colours["red"], axial, region(Y_BUNDLE)) == 0
    assert colour_share(colours["red"], axial, region(CROSSING)) > 0.95
    assert colour_share(colours["green"], axial, region(CROSSING)) > 0.95
    for xs in (X_BUNDLE, CROSSING):
        assert (
            min(angle_of(axial, colours["red"], region(xs)) % 180, 180 - angle_of(axial, colours["red"], region(xs)))
            < 10
        )
    for xs in (Y_BUNDLE, CROSSING):
        assert abs(angle_of(axial, colours["green"], region(xs)) - 90) < 10

    # Zoomed in and panned: the sections' picture is made again for the slice's new place (drawn
    # on a worker for it), and the lobes are where their voxels are now.
    from tractlens.widgets.section_raster import GlyphPicture

    centre = axial.widget_point_of_voxel((X_BUNDLE[0], PHANTOM_SHAPE[1] // 2, Z))
    axial.navigation.zoom_at(centre, 2.0)
    axial.navigation.pan_by(15.0, -10.0)
    qtbot.waitUntil(axial.glyphs_ready, timeout=10_000)
    zoomed = grab(axial)
    save_rgb(zoomed, ARTIFACTS / "fod_axial_zoomed.png")
    picture = axial.glyphs.built[id(layer)]
    assert isinstance(picture, GlyphPicture)
    assert picture.target == pytest.approx(axial._target_rect(axial.geometry_now()).getRect())
    height, width = zoomed.shape[:2]
    shown = [v for v, (x0, x1, y0, y1) in zip(region(X_BUNDLE), cells(axial, region(X_BUNDLE)), strict=True)
             if x0 >= 0 and y0 >= 0 and x1 <= width and y1 <= height]  # fmt: skip
    assert len(shown) >= 3
    colours_zoomed = stick_pixels(zoomed)
    assert colour_share(colours_zoomed["red"], axial, shown) > 0.95
    assert colour_share(colours_zoomed["green"], axial, shown) == 0
    axial.navigation.reset()
    qtbot.waitUntil(axial.glyphs_ready, timeout=10_000)

    # Relative sizes from the layer's menu: the crossing's lobes (half the density each) shrink.
    crossing_red = sum(colours["red"][y0:y1, x0:x1].sum() for x0, x1, y0, y1 in cells(axial, region(CROSSING)))
    choose_from_layer_menu(window, qtbot, layer, SCALING_TEXT["global"])
    assert layer.fod_scaling == "global"
    assert window.wait_for_jobs(30)
    relative = stick_pixels(grab(axial))["red"]
    shrunk = sum(relative[y0:y1, x0:x1].sum() for x0, x1, y0, y1 in cells(axial, region(CROSSING)))
    assert shrunk < 0.8 * crossing_red, (shrunk, crossing_red)
    layer.set(fod_scaling="voxel")

    # 3-D: the SH surfaces of every fitted voxel on the three cursor planes, one actor per plane
    # (whole planes: the glyphs on two planes are in both).
    assert window.wait_for_jobs(30)
    view = window.view3d
    n_cells = [actor.mapper.dataset.n_cells for actor in view.glyphs.actors(layer)]
    nx, ny, nz = PHANTOM_SHAPE
    on_planes = [ny * nz, nx * nz, nx * ny]
    assert len(n_cells) == 3 and {c % n for c, n in zip(n_cells, on_planes)} == {0}, (n_cells, on_planes)
    assert len({c // n for c, n in zip(n_cells, on_planes)}) == 1 and n_cells[0] // on_planes[0] in (80, 320, 1280)
    doc.layer("csd fODF l=0").set(visible=False)
    view.plotter.view_xy()
    view.plotter.reset_camera()
    qtbot.wait(50)
    shot = view.screenshot()
    save_rgb(shot, ARTIFACTS / "fod_3d.png")
    seen = stick_pixels(shot)
    assert seen["red"].sum() > 500 and seen["green"].sum() > 500, (seen["red"].sum(), seen["green"].sum())
    window.save_screenshot(ARTIFACTS / "fod_window.png")

    # Moving the cursor rebuilds on the new planes.
    doc.set_cursor([6, 3, Z])
    assert window.wait_for_jobs(30)
    assert view.glyphs.tasks[id(layer)].delivered[4] == (6, 3, Z)
    qtbot.waitUntil(view.glyphs_ready, timeout=10_000)
    # A step along y gives the coronal plane's actor a new mesh; the other two keep theirs.
    meshes = [actor.GetMapper().GetInput() for actor in view.glyphs.actors(layer)]
    doc.set_cursor([6, 4, Z])
    qtbot.waitUntil(lambda: view.glyphs.tasks[id(layer)].delivered[4] == (6, 4, Z), timeout=10_000)
    qtbot.waitUntil(view.glyphs_ready, timeout=10_000)
    after = [actor.GetMapper().GetInput() for actor in view.glyphs.actors(layer)]
    assert [a is b for a, b in zip(meshes, after)] == [True, False, True]


def test_the_tracking_panel_lists_fodf_layers(window, tmp_path):
    from tractlens.widgets import dialogs

    fit_csd_folder(tmp_path / "csd")
    file_menu = window.menuBar().actions()[0].menu()
    with dialogs.answers(open_files=[[tmp_path / "csd" / "fod.nii.gz"]]):  # File ▸ Open…, the file picked
        next(action for action in file_menu.actions() if action.text() == "&Open…").trigger()
    assert window.wait_for_jobs(60)
    assert [layer.kind for layer in window.document.layers] == ["scalar", "fod"]
    choice = window.deterministic_panel.field_choice
    texts = [choice.itemText(i) for i in range(choice.count())]
    assert texts == ["fODF"]  # the name says the kind: not "fODF (fODF)"
    assert choice.model().item(0).isEnabled()
    assert choice.choose(window.document.layer("fODF"))


def test_track_on_an_fodf_layer_from_the_deterministic_panel(window, tmp_path, qtbot):
    """Whole-brain deterministic tracking with the fODF layer as the direction field: the
    streamlines come from the fODF tracker (its provenance says so) and appear as a layer."""
    from tractlens.widgets import dialogs

    fit_csd_folder(tmp_path / "csd")
    file_menu = window.menuBar().actions()[0].menu()
    with dialogs.answers(open_files=[[tmp_path / "csd"]]):  # a fit-csd folder: fODF, peaks, tissues
        next(action for action in file_menu.actions() if action.text() == "&Open…").trigger()
    assert window.wait_for_jobs(60)
    panel = window.deterministic_panel
    assert panel.field_choice.choose(next(layer for layer in window.document.layers if layer.kind == "fod"))
    panel.whole_brain.setChecked(True)
    panel.form.editors["min_length_mm"].setValue(4.0)  # the phantom is a few voxels across
    qtbot.mouseClick(panel.track_button, Qt.MouseButton.LeftButton)
    assert window.wait_for_jobs(180)
    assert window.errors == []
    summary = panel.summary
    assert summary is not None and "fod" in summary and summary["streamlines"] > 0, summary.get("empty_reason")
    assert len(panel.result_layer.data) == summary["streamlines"]


PAD = 3  # background voxels around the phantom: the automatic brain mask needs some


def write_phantom_dwi(folder):
    """The phantom as a DWI file with its gradients, with :data:`PAD` empty voxels around it in x and y."""
    dwi = phantom_dwi()
    folder.mkdir()
    data = np.pad(dwi.data, ((PAD, PAD), (PAD, PAD), (0, 0), (0, 0)))
    affine = dwi.affine.copy()
    affine[:3, 3] -= affine[:3, :3] @ [PAD, PAD, 0]
    nib.save(nib.Nifti1Image(data, affine), folder / "dwi.nii.gz")
    save_gradients(dwi.bvals, dwi.bvecs, dwi.affine, folder / "dwi.bval", folder / "dwi.bvec")
    return folder / "dwi.nii.gz"


def choose_from_layer_menu(win, qtbot, layer, text: str) -> None:
    """Right-click ``layer`` in the layer list and click the menu item ``text``, as a user would
    (see :func:`tests.gui.test_ballstick_gui.open_fit_dialog` for why the context-menu event is sent)."""
    panel = win.layer_panel
    viewport = panel.list.viewport()
    pos = panel.list.visualItemRect(panel.item_for(layer)).center()
    event = QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, viewport.mapToGlobal(pos))
    QApplication.sendEvent(viewport, event)
    qtbot.waitUntil(lambda: panel.menu is not None and panel.menu.isVisible(), timeout=3000)
    menu = panel.menu
    action = next(action for action in menu.actions() if action.text() == text)
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(action).center())


def open_csd_dialog(win, qtbot):
    """Right-click the DWI layer and choose Fit CSD…."""
    dwi = next(layer for layer in win.document.layers if layer.kind == "dwi")
    choose_from_layer_menu(win, qtbot, dwi, FIT_CSD)
    qtbot.waitUntil(lambda: getattr(win, "csd_dialog", None) is not None and win.csd_dialog.isVisible(), timeout=3000)
    return win.csd_dialog


def test_fit_csd_from_the_dwi_menu_adds_the_fodf_and_peaks(window, qtbot, tmp_path):
    window.open_paths([write_phantom_dwi(tmp_path / "data")])
    assert window.wait_for_jobs(60)
    doc = window.document
    before, jobs_before = len(doc.layers), len(window.runner.jobs)
    dialog = open_csd_dialog(window, qtbot)
    qtbot.keyClick(dialog.form.editors["msmt"], Qt.Key.Key_Space)  # tick it: one shell, refused here
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "two or more shells" in dialog.message.text()
    assert len(window.runner.jobs) == jobs_before
    qtbot.keyClick(dialog.form.editors["msmt"], Qt.Key.Key_Space)
    lmax = dialog.form.editors["lmax"]
    lmax.selectAll()
    qtbot.keyClicks(lmax, "6")
    qtbot.mouseClick(dialog.save, Qt.MouseButton.LeftButton)
    dialog.folder_edit.clear()
    qtbot.keyClicks(dialog.folder_edit, str(tmp_path / "out"))
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    job = window.runner.jobs[max(window.runner.jobs)]
    assert job.name == "CSD (dwi)"
    assert window.wait_for_jobs(120)
    assert window.errors == [] and job.state == "done"
    assert len(doc.layers) == before + 2
    fod, peaks = doc.layer("CSD fODF"), doc.layer("CSD peaks")
    padded = (PHANTOM_SHAPE[0] + 2 * PAD, PHANTOM_SHAPE[1] + 2 * PAD, PHANTOM_SHAPE[2])
    assert fod.kind == "fod" and fod.data.data.shape == (*padded, 28)  # lmax 6
    assert peaks.kind == "dyads" and not peaks.visible
    sticks = peaks.data.data[PAD + 3, PAD + 4, Z]  # the crossing: one peak along x, one along y
    assert sorted(int(np.argmax(np.abs(s[:3]))) for s in sticks[:2]) == [0, 1]
    assert (tmp_path / "out" / "fod.nii.gz").exists()
    assert fod.data.source == str(tmp_path / "out" / "fod.nii.gz")  # what a session keeps of it
    assert "CSD:" in window.statusBar().currentMessage()


def test_cancelling_a_csd_fit_leaves_the_document_unchanged(demo_window, qtbot):
    win = demo_window
    before = list(win.document.layers)
    dialog = open_csd_dialog(win, qtbot)
    qtbot.mouseClick(dialog.fit_button, Qt.MouseButton.LeftButton)
    job = win.runner.jobs[max(win.runner.jobs)]
    # The fit goes batch by batch (progress shows, Cancel is heard between batches), not in one piece.
    qtbot.waitUntil(lambda: job.state == "running" and 1 < job.total and 0 < job.done < job.total, timeout=120_000)
    start = time.perf_counter()
    qtbot.mouseClick(win.job_panel.cancel_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(120)
    print(f"\nCSD cancel took {time.perf_counter() - start:.1f} s, at {job.done} of {job.total} voxels")
    assert job.state == "cancelled" and job.done < job.total
    assert win.document.layers == before
    assert win.errors == []


def test_the_launcher_opens_a_fit_csd_folder(tmp_path):
    fit_csd_folder(tmp_path / "csd")
    out = tmp_path / "view.png"
    exe = installed_tool("tractlens")
    cmd = [exe] if exe else [sys.executable, "-m", "tractlens.widgets.launcher"]
    args = ["view", str(tmp_path / "csd"), "--screenshot", str(out), "--size", "1200x800", "--exit", "--device", "cpu"]
    result = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    image = QImage(str(out)).convertToFormat(QImage.Format.Format_RGB888)
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())
    colours = stick_pixels(pixels[:, : 3 * image.width()].reshape(image.height(), image.width(), 3))
    assert colours["red"].sum() > 500 and colours["green"].sum() > 500
