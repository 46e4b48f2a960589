"""ROI drawing with the mouse: exact voxels, undo/redo, save/load round trip."""

import nibabel as nib
import numpy as np
from PySide6.QtCore import QPoint, Qt

from tests.conftest import ARTIFACTS
from tests.gui.actions import press_drag_release
from tractlens.app.model import Layer, Volume


def disc(centre, radius, h_axis, v_axis):
    out = set()
    for du in range(-radius, radius + 1):
        for dv in range(-radius, radius + 1):
            if du * du + dv * dv <= radius * radius:
                v = list(centre)
                v[h_axis] += du
                v[v_axis] += dv
                out.add(tuple(v))
    return out


def painted(layer):
    return {tuple(v) for v in np.argwhere(layer.data.mask)}


def window_with_image(window):
    data = np.random.default_rng(0).uniform(size=(40, 30, 12)).astype(np.float32)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    window.document.add_layer(Layer("anat", Volume("anat", data, affine), "scalar"))
    return window


def test_brush_stroke_paints_exactly_the_expected_voxels_and_undo_redo_are_exact(window, qtbot):
    window_with_image(window)
    doc = window.document
    layer = window.new_roi()
    assert layer.kind == "roi" and layer.data.role == "seed" and window.roi_tools.tool == "brush"
    window.radius_box.setValue(2)
    axial = window.views["axial"]
    z = int(doc.cursor[2])
    # A quick drag from x=8 to x=20 along y=12: only the end points arrive as mouse events.
    press_drag_release(qtbot, axial, [(8, 12, z), (20, 12, z)])
    geometry = axial.geometry_now()
    expected = set()
    for x in range(8, 21):
        expected |= disc((x, 12, z), 2, geometry.h_axis, geometry.v_axis)
    assert painted(layer) == expected
    stroke = layer.data.mask.copy()
    # Erase a disc, then undo twice and redo twice: every state is restored exactly.
    window.set_tool("eraser")
    window.radius_box.setValue(1)
    press_drag_release(qtbot, axial, [(14, 12, z)])
    erased = layer.data.mask.copy()
    assert painted(layer) == expected - disc((14, 12, z), 1, geometry.h_axis, geometry.v_axis)
    window.activateWindow()  # shortcuts go to the active window, as for a user
    qtbot.waitUntil(window.isActiveWindow, timeout=3000)
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    np.testing.assert_array_equal(layer.data.mask, stroke)
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert not layer.data.mask.any()
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    np.testing.assert_array_equal(layer.data.mask, stroke)
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    np.testing.assert_array_equal(layer.data.mask, erased)
    image = axial.image_array()
    assert (image[..., 1] > image[..., 0] + 50).any()  # the green seed overlay is drawn
    window.save_screenshot(ARTIFACTS / "roi_brush.png")


def test_navigate_tool_does_not_paint(window, qtbot):
    window_with_image(window)
    layer = window.new_roi()
    window.set_tool("navigate")
    axial = window.views["axial"]
    press_drag_release(qtbot, axial, [(5, 5, int(window.document.cursor[2]))])
    assert not layer.data.mask.any()
    assert window.document.cursor[0] == 5


def test_save_and_load_round_trip_is_exact_with_the_affine(window, qtbot, tmp_path):
    window_with_image(window)
    layer = window.new_roi()
    window.document.paint(layer, np.array([[3, 4, 5], [10, 11, 6], [39, 29, 11]]), True)
    path = window.save_roi(layer, tmp_path / "seed.nii.gz")
    img = nib.load(path)
    np.testing.assert_array_equal(img.affine, window.document.reference_affine)
    np.testing.assert_array_equal(np.asarray(img.dataobj) > 0, layer.data.mask)
    loaded = window.open_roi(path, role="target")
    np.testing.assert_array_equal(loaded.data.mask, layer.data.mask)
    assert loaded.data.role == "target"


def test_mask_on_another_grid_is_resampled_with_a_notice(window, tmp_path):
    window_with_image(window)
    mask = np.zeros((20, 15, 6), np.uint8)
    mask[5, 5, 3] = 1
    nib.save(nib.Nifti1Image(mask, np.diag([4.0, 4.0, 4.0, 1.0])), tmp_path / "coarse.nii.gz")
    layer = window.open_roi(tmp_path / "coarse.nii.gz")
    assert layer.data.mask.shape == (40, 30, 12)
    assert {tuple(v) for v in np.argwhere(layer.data.mask)} == {
        (i, j, k)
        for i in (9, 10, 11)
        for j in (9, 10, 11)
        for k in (5, 6, 7)
        if round(i / 2) == 5 and round(j / 2) == 5 and round(k / 2) == 3
    }
    assert "resampled" in window.statusBar().currentMessage()


def test_fibers_are_selected_live_by_the_rois(demo_window, qtbot, demo_dir):
    doc = demo_window.document
    bundles = doc.layer("bundles")
    bundles.set(filter_by_rois=True)  # the user's choice (layer menu "Filter by ROIs")
    bundle_id = bundles.data.streamline_scalars["bundle"]
    before = demo_window.view3d.screenshot()
    demo_window.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    demo_window.open_roi(demo_dir / "roi_arc_target.nii.gz", role="target")
    qtbot.waitUntil(lambda: bundles.selection is not None and not demo_window.runner.active(), timeout=10_000)
    np.testing.assert_array_equal(bundles.selection, bundle_id == 3)  # exactly the arc
    after = demo_window.view3d.screenshot()
    assert (after.max(-1) > 40).sum() != (before.max(-1) > 40).sum()
    demo_window.save_screenshot(ARTIFACTS / "roi_selects_arc.png")
    # Turning the target into an exclusion leaves nothing; removing the ROIs shows everything again.
    target = doc.layers[-1]
    panel = demo_window.layer_panel
    panel.list.setCurrentItem(panel.item_for(target))
    panel.role.setCurrentText("exclusion")  # the user changes the ROI's role in the layer panel
    assert target.data.role == "exclusion"
    qtbot.waitUntil(lambda: bundles.selection is not None and not bundles.selection.any(), timeout=10_000)
    for layer in [layer for layer in doc.layers if layer.kind == "roi"]:
        doc.remove_layer(layer)
    qtbot.waitUntil(lambda: bundles.selection is None, timeout=10_000)


def test_painting_an_roi_selects_the_fibers_through_it(demo_window, qtbot):
    doc = demo_window.document
    bundles = doc.layer("bundles")
    bundles.set(filter_by_rois=True)  # the user's choice (layer menu "Filter by ROIs")
    bundle_id = bundles.data.streamline_scalars["bundle"]
    doc.set_cursor([12, 28, 15])  # on the left-right bundle, away from the crossing
    demo_window.new_roi()
    demo_window.radius_box.setValue(2)
    axial = demo_window.views["axial"]
    press_drag_release(qtbot, axial, [(12, 28, 15)])
    qtbot.waitUntil(lambda: bundles.selection is not None and not demo_window.runner.active(), timeout=10_000)
    assert bundles.selection.any() and set(bundle_id[bundles.selection]) == {1.0}


def test_rectangle_and_fill_tools(window, qtbot):
    window_with_image(window)
    doc = window.document
    anat = doc.layer("anat")
    z = int(doc.cursor[2])
    axial = window.views["axial"]
    layer = window.new_roi()
    window.set_tool("rectangle")
    press_drag_release(qtbot, axial, [(5, 6, z), (9, 8, z)])
    expected = {(x, y, z) for x in range(5, 10) for y in range(6, 9)}
    assert painted(layer) == expected
    # Flood fill: the connected voxels of the top scalar map above the threshold.
    other = window.new_roi()
    anat.data.data[:] = 0.0
    anat.data.data[10:14, 3:5, z - 1 : z + 1] = 1.0
    anat.data.data[30:32, 25:27, z] = 1.0  # not connected: stays out
    window.set_tool("fill")
    window.threshold_box.setValue(0.5)
    press_drag_release(qtbot, axial, [(11, 4, z)])
    assert painted(other) == {(x, y, k) for x in range(10, 14) for y in range(3, 5) for k in (z - 1, z)}
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=3000)
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert not other.data.mask.any() and painted(layer) == expected


def ball_voxels(centre, r):
    c = np.asarray(centre)
    return {
        tuple(int(v) for v in c + np.array([i, j, k]))
        for i in range(-r, r + 1)
        for j in range(-r, r + 1)
        for k in range(-r, r + 1)
        if i * i + j * j + k * k <= r * r
    }


def test_sphere_and_box_shapes_are_placed_dragged_resized_and_undone(window, qtbot):
    window_with_image(window)
    doc = window.document
    z = int(doc.cursor[2])
    axial = window.views["axial"]
    window.set_tool("sphere")
    window.radius_box.setValue(2)
    press_drag_release(qtbot, axial, [(20, 15, z)])
    sphere = doc.layers[-1]
    assert sphere.kind == "roi" and sphere.data.shape["kind"] == "sphere"
    assert painted(sphere) == ball_voxels((20, 15, z), 2)
    # Drag it by its inside: it follows the mouse in the slice's plane.
    press_drag_release(qtbot, axial, [(21, 15, z), (25, 18, z)])
    assert painted(sphere) == ball_voxels((24, 18, z), 2)
    # Resize with the radius box, then undo the resize and the drag, each one step.
    window.radius_box.setValue(3)
    assert painted(sphere) == ball_voxels((24, 18, z), 3)
    doc.undo()
    assert painted(sphere) == ball_voxels((24, 18, z), 2)
    doc.undo()
    assert painted(sphere) == ball_voxels((20, 15, z), 2)
    # In 3-D: the handle on the shape moves and resizes it (as a user's drag of the widget ends).
    widget = window.view3d.shape_widget
    assert widget is not None
    affine = doc.reference_affine
    widget.SetCenter(*(affine[:3, :3] @ np.array([10.0, 10.0, z]) + affine[:3, 3]))
    widget.SetRadius(2.0 * 1)  # 1 voxel of 2 mm
    widget.InvokeEvent("EndInteractionEvent")
    assert painted(sphere) == ball_voxels((10, 10, z), 1)
    # A box, in a new ROI of its own.
    window.set_tool("box")
    window.radius_box.setValue(1)
    press_drag_release(qtbot, axial, [(30, 5, z)])
    box = doc.layers[-1]
    assert box is not sphere and painted(box) == {
        (30 + i, 5 + j, z + k) for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)
    }
    # Painting on a shape makes it freehand; undo restores the shape exactly.
    window.set_tool("brush")
    window.radius_box.setValue(0)
    press_drag_release(qtbot, axial, [(33, 5, z)])
    assert box.data.shape is None and (33, 5, z) in painted(box)
    doc.undo()
    assert box.data.shape is not None and (33, 5, z) not in painted(box)


def test_rois_show_as_surfaces_in_3d(window, qtbot):
    window_with_image(window)
    layer = window.new_roi()
    window.document.paint(layer, np.argwhere(np.ones((4, 4, 4), bool)) + np.array([10, 10, 4]), True)
    qtbot.waitUntil(lambda: window.view3d.roi_surface(layer) is not None, timeout=3000)
    bounds = window.view3d.roi_surface(layer).GetBounds()  # world mm: voxels 10..13 at 2 mm
    np.testing.assert_allclose(bounds, [19, 27, 19, 27, 7, 15], atol=1.01)
    layer.set(visible=False)
    qtbot.waitUntil(lambda: window.view3d.roi_surface(layer) is None, timeout=3000)


def test_a_screenshot_right_after_a_stroke_shows_the_roi_as_it_is_in_3d(window, qtbot):
    """The 3-D ROI surface is rebuilt once a stroke pauses (150 ms); a screenshot taken before
    (a script's, straight after its edit) shows the ROI as it is, not as it was."""
    window_with_image(window)
    layer = window.new_roi()
    doc, view3d = window.document, window.view3d
    doc.paint(layer, np.argwhere(np.ones((4, 4, 4), bool)) + np.array([10, 10, 4]), True)
    qtbot.waitUntil(lambda: view3d.roi_surface(layer) is not None, timeout=3000)
    doc.paint(layer, np.argwhere(np.ones((4, 4, 4), bool)) + np.array([20, 10, 4]), True)  # grown along x
    image = view3d.screenshot()  # at once: the surface's rebuild was still waiting for the stroke to pause
    assert image.ndim == 3
    bounds = view3d.roi_surface(layer).GetBounds()  # world mm: voxels 10..23 along x at 2 mm
    np.testing.assert_allclose(bounds, [19, 47, 19, 27, 7, 15], atol=1.01)


def test_polygon_tool_fills_the_closed_outline(window, qtbot):
    window_with_image(window)
    z = int(window.document.cursor[2])
    layer = window.new_roi()
    window.set_tool("polygon")
    axial = window.views["axial"]
    corners = [(4, 4, z), (12, 4, z), (12, 10, z), (4, 10, z)]
    for corner in corners:
        point = axial.widget_point_of_voxel(corner)
        qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(point.x()), int(point.y())))
    assert not layer.data.mask.any()  # nothing until the outline is closed
    axial.setFocus()
    qtbot.keyClick(axial, Qt.Key.Key_Return)
    assert painted(layer) == {(x, y, z) for x in range(4, 13) for y in range(4, 11)}
    # A triangle closed by a double click: the voxels whose centres are inside or on it.
    other = window.new_roi()
    window.set_tool("polygon")
    for vertex in [(20, 2, z), (30, 2, z), (20, 12, z)]:
        point = axial.widget_point_of_voxel(vertex)
        qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(point.x()), int(point.y())))
    qtbot.mouseDClick(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(point.x()), int(point.y())))
    assert painted(other) == {(x, y, z) for x in range(20, 31) for y in range(2, 13) if (x - 20) + (y - 2) <= 10}


# ------------------------------------------------------------------ files
def test_save_roi_adds_the_suffix_and_never_replaces_a_file_without_asking(window, tmp_path, monkeypatch):
    import tractlens.widgets.main_window as main_window
    from tractlens.widgets import dialogs

    window_with_image(window)
    doc = window.document
    layer = window.new_roi()
    doc.paint(layer, np.array([[3, 4, 5], [10, 11, 6]]), True)
    first = layer.data.mask.copy()
    # A name typed without a suffix, through the dialog: written as .nii.gz.
    with dialogs.answers(save_file=[tmp_path / "seed"]):
        window.save_roi_dialog()
    path = tmp_path / "seed.nii.gz"
    assert path.exists() and not (tmp_path / "seed").exists() and window.errors == []
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj) > 0, first)
    np.testing.assert_array_equal(nib.load(path).affine, doc.reference_affine)
    doc.paint(layer, np.array([[20, 20, 6]]), True)
    # Nobody to ask (TRACTLENS_NO_DIALOGS): refused, and the status bar says so.
    assert window.save_roi(layer, path) is None
    assert "not replaced" in window.statusBar().currentMessage()
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj) > 0, first)
    # The user declines: the file stays as it was.
    asked = []
    monkeypatch.setattr(main_window, "ask_overwrite", lambda parent, p: asked.append(p) or False)
    assert window.save_roi(layer, tmp_path / "seed") is None
    assert asked == [path]
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj) > 0, first)
    # The user accepts: replaced.
    monkeypatch.setattr(main_window, "ask_overwrite", lambda parent, p: asked.append(p) or True)
    assert window.save_roi(layer, path) == path and len(asked) == 2
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj) > 0, layer.data.mask)
    # A .nii name keeps its suffix; a file that cannot be written is reported, not raised.
    assert window.save_roi(layer, tmp_path / "plain.nii") == tmp_path / "plain.nii"
    (tmp_path / "a_file").write_text("x")
    assert window.save_roi(layer, tmp_path / "a_file" / "seed.nii.gz") is None
    assert "could not be saved" in window.errors[-1]


def test_open_roi_refuses_a_mask_outside_the_image_and_warns_about_an_empty_one(window, tmp_path):
    window_with_image(window)
    doc = window.document
    n_layers = len(doc.layers)
    mask = np.zeros((10, 10, 10), np.uint8)
    mask[2:5, 2:5, 2:5] = 1
    far = np.diag([2.0, 2.0, 2.0, 1.0])
    far[:3, 3] = 500.0  # half a metre away from the image
    nib.save(nib.Nifti1Image(mask, far), tmp_path / "far.nii.gz")
    assert window.open_roi(tmp_path / "far.nii.gz") is None
    assert "the ROI lies outside the image" in window.errors[-1] and len(doc.layers) == n_layers
    # An empty mask is added (a blank to draw in), with a warning.
    nib.save(nib.Nifti1Image(np.zeros((40, 30, 12), np.uint8), doc.reference_affine), tmp_path / "blank.nii.gz")
    blank = window.open_roi(tmp_path / "blank.nii.gz")
    assert blank is not None and blank in doc.layers and not blank.data.mask.any()
    assert "empty" in window.statusBar().currentMessage()
    # A 4-D series and a file that is no NIfTI: clear errors, no layer.
    errors = len(window.errors)
    nib.save(nib.Nifti1Image(np.ones((40, 30, 12, 3), np.uint8), doc.reference_affine), tmp_path / "series.nii.gz")
    assert window.open_roi(tmp_path / "series.nii.gz") is None
    assert "must be a 3-D image" in window.errors[-1] and "(40, 30, 12, 3)" in window.errors[-1]
    (tmp_path / "notes.txt").write_text("not an image")
    assert window.open_roi(tmp_path / "notes.txt") is None
    assert "not a NIfTI file" in window.errors[-1]
    (tmp_path / "broken.nii.gz").write_bytes(b"\x1f\x8b garbage")
    assert window.open_roi(tmp_path / "broken.nii.gz") is None
    assert "could not be read as NIfTI" in window.errors[-1]
    assert len(window.errors) == errors + 3 and len(doc.layers) == n_layers + 1


# ----------------------------------------------------------------- undo/redo
def roi_state(doc):
    """Everything an undo must restore: the layer stack and each ROI's voxels, shape, role, name, colour."""
    out = []
    for layer in doc.layers:
        if layer.kind != "roi":
            out.append((layer.name,))
            continue
        shape = layer.data.shape
        shape = None if shape is None else (shape["kind"], tuple(shape["centre"]), shape["radius"])
        out.append((layer.name, layer.data.name, layer.data.role, layer.color, shape, layer.data.mask.tobytes()))
    return out


def keys(window, qtbot, redo=False):
    modifiers = Qt.KeyboardModifier.ControlModifier
    if redo:
        modifiers |= Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(window, Qt.Key.Key_Z, modifiers)


def test_every_roi_edit_is_undone_and_redone_exactly_with_the_keys(window, qtbot, tmp_path, monkeypatch):
    import tractlens.widgets.panels as panels

    window_with_image(window)
    doc = window.document
    anat = doc.layer("anat")
    z = int(doc.cursor[2])
    anat.data.data[:] = 0.0
    anat.data.data[10:14, 3:5, z] = 1.0
    axial = window.views["axial"]
    panel = window.layer_panel
    mask = np.zeros((40, 30, 12), np.uint8)
    mask[30:33, 20:22, z] = 1
    nib.save(nib.Nifti1Image(mask, doc.reference_affine), tmp_path / "loaded.nii.gz")
    monkeypatch.setattr(panels, "ask_name", lambda parent, current: "motor cortex")
    monkeypatch.setattr(panels, "ask_colour", lambda parent, current: (1.0, 0.5, 0.0))
    states = [roi_state(doc)]

    def edit(action):
        action()
        states.append(roi_state(doc))
        assert states[-1] != states[-2]  # each step changes something

    edit(window.new_roi)
    layer = doc.layers[-1]
    window.set_tool("rectangle")
    edit(lambda: press_drag_release(qtbot, axial, [(5, 6, z), (9, 8, z)]))
    window.set_tool("polygon")

    def polygon():
        for vertex in [(20, 2, z), (26, 2, z), (20, 8, z)]:
            point = axial.widget_point_of_voxel(vertex)
            qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(point.x()), int(point.y())))
        axial.finish_polygon()

    edit(polygon)
    window.set_tool("fill")
    window.threshold_box.setValue(0.5)
    edit(lambda: press_drag_release(qtbot, axial, [(11, 4, z)]))
    panel.list.setCurrentItem(panel.item_for(layer))
    edit(lambda: panel.role.setCurrentText("waypoint"))
    edit(lambda: panel._double_clicked(panel.item_for(layer)))  # rename
    edit(lambda: panel.choose_colour(layer))
    edit(lambda: window.open_roi(tmp_path / "loaded.nii.gz"))
    loaded = doc.layers[-1]
    edit(lambda: panel._remove(layer))  # the Remove button / menu item on the selected ROI
    assert layer not in doc.layers and loaded.name == "loaded"
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=3000)
    axial.setFocus()
    for expected in reversed(states[:-1]):
        keys(window, qtbot)
        assert roi_state(doc) == expected
    assert not doc.undo()  # nothing more to undo: the document is as it started
    for expected in states[1:]:
        keys(window, qtbot, redo=True)
        assert roi_state(doc) == expected
    assert not doc.redo()
    # The renamed, recoloured ROI came back as it was; its colour is drawn on the slice.
    keys(window, qtbot)
    assert layer.name == layer.data.name == "motor cortex" and layer.color == "#ff8000"
    image = axial.image_array()
    row, col = axial.geometry_now().pixel_of(np.array([7.0, 7.0, z]))
    r, g, b = image[int(row), int(col)]
    assert r > 100 and 40 < g < 80 and b < 40  # orange (x 0.45 opacity: translucent), not the waypoint's yellow
    window.save_screenshot(ARTIFACTS / "roi_renamed_coloured.png")


# ------------------------------------------------------------------ shapes
def box_voxels(centre, half):
    return {
        (x, y, k)
        for x in range(centre[0] - half[0], centre[0] + half[0] + 1)
        for y in range(centre[1] - half[1], centre[1] + half[1] + 1)
        for k in range(centre[2] - half[2], centre[2] + half[2] + 1)
    }


def test_shapes_are_moved_and_resized_on_the_slices_one_undo_step_each(window, qtbot):
    window_with_image(window)
    doc = window.document
    z = int(doc.cursor[2])
    axial = window.views["axial"]
    assert (axial.geometry_now().h_axis, axial.geometry_now().v_axis) == (0, 1)
    window.set_tool("box")
    window.radius_box.setValue(1)
    press_drag_release(qtbot, axial, [(10, 10, z)])
    box = doc.layers[-1]
    placed = box_voxels((10, 10, z), (1, 1, 1))
    assert painted(box) == placed
    # A drag from inside the box moves it in the slice's plane.
    press_drag_release(qtbot, axial, [(10, 11, z), (12, 12, z), (14, 13, z)])
    moved = box_voxels((14, 12, z), (1, 1, 1))
    assert painted(box) == moved
    # Shift+drag resizes it around its centre: the voxel under the mouse becomes a corner.
    start, end = (axial.widget_point_of_voxel(v) for v in [(15, 12, z), (17, 10, z)])
    shift = Qt.KeyboardModifier.ShiftModifier
    qtbot.mousePress(axial, Qt.MouseButton.LeftButton, shift, QPoint(int(start.x()), int(start.y())))
    qtbot.mouseMove(axial, pos=QPoint(int((start.x() + end.x()) / 2), int(start.y())))
    qtbot.mouseMove(axial, pos=QPoint(int(end.x()), int(end.y())))
    qtbot.mouseRelease(axial, Qt.MouseButton.LeftButton, shift, QPoint(int(end.x()), int(end.y())))
    resized = box_voxels((14, 12, z), (3, 2, 1))
    assert painted(box) == resized and box.data.shape["radius"] == (3.0, 2.0, 1.0)
    assert window.radius_box.value() == 3  # the box shows the shape's size
    # Each drag is one step: undo the resize, the move; redo the move, the resize.
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=3000)
    axial.setFocus()
    keys(window, qtbot)
    assert painted(box) == moved
    keys(window, qtbot)
    assert painted(box) == placed
    keys(window, qtbot, redo=True)
    assert painted(box) == moved and tuple(box.data.shape["centre"]) == (14, 12, z)
    keys(window, qtbot, redo=True)
    assert painted(box) == resized
    # A sphere: Shift+drag from its centre; the radius is the in-plane distance (3, 4 -> 5).
    window.set_tool("sphere")
    window.radius_box.setValue(2)
    press_drag_release(qtbot, axial, [(28, 20, z)])
    sphere = doc.layers[-1]
    assert sphere is not box and painted(sphere) == ball_voxels((28, 20, z), 2)
    start, end = (axial.widget_point_of_voxel(v) for v in [(28, 20, z), (31, 24, z)])
    qtbot.mousePress(axial, Qt.MouseButton.LeftButton, shift, QPoint(int(start.x()), int(start.y())))
    qtbot.mouseMove(axial, pos=QPoint(int(end.x()), int(end.y())))
    qtbot.mouseRelease(axial, Qt.MouseButton.LeftButton, shift, QPoint(int(end.x()), int(end.y())))
    assert painted(sphere) == ball_voxels((28, 20, z), 5)
    keys(window, qtbot)
    assert painted(sphere) == ball_voxels((28, 20, z), 2) and painted(box) == resized
    window.save_screenshot(ARTIFACTS / "roi_shapes_slices.png")


def display_point(view3d, world):
    """Display coordinates (VTK's: origin bottom left) of a world point in the 3-D view."""
    renderer = view3d.plotter.renderer
    renderer.SetWorldPoint(*world, 1.0)
    renderer.WorldToDisplay()
    x, y, _ = renderer.GetDisplayPoint()
    return round(x), round(y)


def vtk_drag(view3d, start, end=None):
    """A left click (``end`` None) or drag in the 3-D view as VTK interactor events, between world points."""
    interactor = view3d.plotter.iren.interactor
    interactor.SetEventInformation(*display_point(view3d, start))
    interactor.InvokeEvent("LeftButtonPressEvent")
    if end is not None:
        interactor.SetEventInformation(*display_point(view3d, end))
        interactor.InvokeEvent("MouseMoveEvent")
    interactor.InvokeEvent("LeftButtonReleaseEvent")


def test_shapes_are_placed_moved_and_resized_in_3d_on_anisotropic_voxels(window, qtbot):
    import pyvista as pv

    data = np.random.default_rng(0).uniform(size=(40, 30, 12)).astype(np.float32)
    affine = np.diag([2.0, 3.0, 4.0, 1.0])  # anisotropic voxels
    doc = window.document
    doc.add_layer(Layer("anat", Volume("anat", data, affine), "scalar"))
    z = int(doc.cursor[2])
    view3d = window.view3d
    view3d.reset_camera()
    view3d.plotter.camera.SetParallelProjection(True)  # a drag moves exactly as far as the mouse
    view3d.plotter.render()

    def world(ijk):
        return affine[:3, :3] @ np.asarray(ijk, dtype=float) + affine[:3, 3]

    # A click on the axial plane with the box tool places a box there, with a box handle around its voxels.
    # (Clicks land where the camera sees the axial plane: beyond the cursor's other two planes.)
    window.set_tool("box")
    window.radius_box.setValue(1)
    vtk_drag(view3d, world((30, 24, z)))
    box = doc.layers[-1]
    assert box.kind == "roi" and painted(box) == box_voxels((30, 24, z), (1, 1, 1))
    handle = view3d.shape_widget
    assert handle.GetClassName() == "vtkBoxWidget" and view3d.shape_layer is box
    outline = pv.PolyData()
    handle.GetPolyData(outline)
    # 3 voxels per axis, 2, 3 and 4 mm each: the handle is 6 x 9 x 12 mm around the centre.
    np.testing.assert_allclose(outline.bounds, [57, 63, 67.5, 76.5, 18, 30])
    # Drag its centre by (+6, -6, 0) mm (across the view, so exactly): 3 voxels along i, 2 along j.
    view3d.plotter.render()
    vtk_drag(view3d, world((30, 24, z)), world((30, 24, z)) + np.array([6.0, -6.0, 0.0]))
    assert painted(box) == box_voxels((33, 22, z), (1, 1, 1))
    # Drag its +x face 4 mm outwards: two more voxels along i (the box is 5 voxels long now).
    view3d.plotter.render()
    face = world((34.5, 22, z))
    vtk_drag(view3d, face, face + np.array([4.0, -4.0, 0.0]))
    assert box.data.shape["radius"] == (2.0, 1.0, 1.0)
    assert painted(box) == {(x, y, k) for x in range(32, 37) for y in (21, 22, 23) for k in (z - 1, z, z + 1)}
    handle.GetPolyData(outline)
    np.testing.assert_allclose(outline.bounds[:2], [63, 73])  # the handle is on the new box
    doc.undo()
    assert painted(box) == box_voxels((33, 22, z), (1, 1, 1))
    doc.undo()
    assert painted(box) == box_voxels((30, 24, z), (1, 1, 1))
    # A sphere: placed by a click, its handle (the sphere around the ROI: 2 voxels x 4 mm) dragged.
    window.set_tool("sphere")
    window.radius_box.setValue(2)
    vtk_drag(view3d, world((24, 19, z)))
    sphere = doc.layers[-1]
    assert sphere is not box and sphere.data.shape["kind"] == "sphere"
    assert painted(sphere) == ball_voxels((24, 19, z), 2)
    handle = view3d.shape_widget
    assert handle.GetClassName() == "vtkSphereWidget" and handle.GetRadius() == 8.0
    view3d.plotter.render()
    vtk_drag(view3d, world((24, 19, z)), world((24, 19, z)) + np.array([-8.0, 6.0, 0.0]))  # 4 voxels of 2 mm, 2 of 3
    assert painted(sphere) == ball_voxels((20, 21, z), 2)
    np.testing.assert_allclose(handle.GetCenter(), world((20, 21, z)))
    doc.undo()
    assert painted(sphere) == ball_voxels((24, 19, z), 2)
    np.testing.assert_allclose(handle.GetCenter(), world((24, 19, z)))  # the handle follows the undo
    doc.undo()  # the placement
    assert sphere not in doc.layers and view3d.shape_widget is None
    window.save_screenshot(ARTIFACTS / "roi_shapes_3d.png")


def test_flood_fill_says_why_it_filled_nothing(window, qtbot):
    window_with_image(window)
    doc = window.document
    z = int(doc.cursor[2])
    axial = window.views["axial"]
    anat = doc.layer("anat")
    anat.data.data[:] = 0.0
    anat.data.data[10:14, 3:5, z] = 1.0
    layer = window.new_roi()
    window.set_tool("fill")
    window.threshold_box.setValue(0.5)
    press_drag_release(qtbot, axial, [(20, 20, z)])  # below the threshold
    assert not layer.data.mask.any()
    message = window.statusBar().currentMessage()
    assert "did nothing" in message and "anat is 0 here" in message and "threshold 0.5" in message
    # The top visible scalar map on another grid: nothing to fill from, and the user is told.
    coarse = Volume("coarse FA", np.ones((20, 15, 6), np.float32), np.diag([4.0, 4.0, 4.0, 1.0]))
    doc.add_layer(Layer("coarse FA", coarse, "scalar"))
    press_drag_release(qtbot, axial, [(11, 4, z)])
    assert not layer.data.mask.any()
    assert "coarse FA" in window.statusBar().currentMessage() and "another grid" in window.statusBar().currentMessage()
    doc.layer("coarse FA").set(visible=False)  # anat is the top visible map again: it fills
    press_drag_release(qtbot, axial, [(11, 4, z)])
    assert painted(layer) == {(x, y, z) for x in range(10, 14) for y in range(3, 5)}
    assert window.statusBar().currentMessage().startswith("Flood fill: 8 voxels")


def test_the_selection_follows_a_paint_stroke_before_the_mouse_is_released(demo_window, qtbot):
    doc = demo_window.document
    bundles = doc.layer("bundles")
    bundles.set(filter_by_rois=True)  # the user's choice (layer menu "Filter by ROIs")
    bundle_id = bundles.data.streamline_scalars["bundle"]
    doc.set_cursor([12, 28, 15])  # on the left-right bundle, away from the crossing
    demo_window.new_roi()
    demo_window.radius_box.setValue(0)
    axial = demo_window.views["axial"]
    # A stroke from the bundle down into fibre-free voxels (x, y < 21 on this slice), then to and
    # fro there: every move paints a new voxel, about every 15 ms, faster than the 40 ms throttle
    # (a debounce restarted by each edit would wait for the stroke to end).
    path = [(12, y) for y in range(28, 19, -1)]
    for row, y in enumerate(range(18, 2, -2)):
        path += [(x, y) for x in (range(2, 21) if row % 2 == 0 else range(20, 1, -1))]
    points = [axial.widget_point_of_voxel((x, y, 15)) for x, y in path]
    qtbot.mousePress(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(points[0].x()), int(points[0].y())))
    seen = []
    for step, point in enumerate(points[1:]):
        qtbot.mouseMove(axial, pos=QPoint(int(point.x()), int(point.y())))
        qtbot.wait(15)
        if bundles.selection is not None:
            seen.append(step)
    assert seen, "the selection did not change while the ROI was painted"
    assert seen[0] < len(points) // 2  # early in the stroke, not only at its end
    assert set(bundle_id[bundles.selection]) == {1.0}
    qtbot.mouseRelease(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(points[-1].x()), int(points[-1].y())))
    assert {(x, y, 15) for x, y in path} <= painted(doc.layers[-1])  # each move painted a new voxel


def test_the_selection_timer_is_a_throttle(window):
    window_with_image(window)
    layer = window.new_roi()
    timer = window._selection_timer
    timer.stop()
    timer.setInterval(60_000)  # (not the 40 ms of use: a loaded machine's paint can outlast that)
    window.document.paint(layer, np.array([[5, 5, 5]]), True)
    assert timer.isActive()
    first = timer.remainingTime()
    import time

    time.sleep(0.02)
    window.document.paint(layer, np.array([[6, 5, 5]]), True, merge_with_last=True)
    assert timer.isActive() and timer.remainingTime() < first  # not restarted by the second edit
