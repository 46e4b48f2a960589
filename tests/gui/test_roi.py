"""ROI drawing with the mouse: exact voxels, undo/redo, save/load round trip."""

import nibabel as nib
import numpy as np
from PySide6.QtCore import QPoint, Qt

from app.model import Layer, Volume
from tests.conftest import ARTIFACTS


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


def press_drag_release(qtbot, view, voxels):
    points = [view.widget_point_of_voxel(v) for v in voxels]
    qpoints = [QPoint(int(p.x()), int(p.y())) for p in points]
    qtbot.mousePress(view, Qt.MouseButton.LeftButton, pos=qpoints[0])
    for point in qpoints[1:]:
        qtbot.mouseMove(view, pos=point)
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=qpoints[-1])


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
