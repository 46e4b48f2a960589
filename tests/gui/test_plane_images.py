"""The slice views' images and the 3-D cursor planes follow the cursor: a step along one axis
composites again only the plane whose slice moved (the others show the same slice), and every
plane shows what a fresh composite of the document gives, after steps along each axis, a layer
change and an ROI stroke on a moved slice."""

import numpy as np

import tractlens.widgets.slice_view as slice_view_module
import tractlens.widgets.view3d as view3d_module
from tractlens.widgets.render import composite, display_oversample, plane_geometry


def counted(monkeypatch, module) -> list:
    calls = []
    original = module.composite

    def counting(doc, geometry, oversample=1):
        calls.append(int(geometry.normal_axis))
        return original(doc, geometry, oversample)

    monkeypatch.setattr(module, "composite", counting)
    return calls


def settle(qtbot, win) -> None:
    """The pending frame drawn (its planes patched or composited) and the slice views painted."""
    qtbot.waitUntil(lambda: not win.view3d._render_pending, timeout=10_000)
    for view in win.views.values():
        view.grab()  # a paint now, exposed or not


def assert_planes_match(win) -> None:
    doc = win.document
    factor = display_oversample(doc)
    for name, view in win.views.items():
        fresh = composite(doc, plane_geometry(doc, name, view.radiological), factor)
        np.testing.assert_array_equal(view.image_array(), fresh, err_msg=f"slice view {name}")
    for name, (grid, _actor) in win.view3d._planes.items():
        fresh = composite(doc, plane_geometry(doc, name), factor).reshape(-1, 3)
        np.testing.assert_array_equal(np.asarray(grid.point_data["rgb"]), fresh, err_msg=f"3-D plane {name}")


def test_a_cursor_step_composites_only_the_moved_plane(demo_window, qtbot, monkeypatch):
    win = demo_window
    doc = win.document
    settle(qtbot, win)
    assert_planes_match(win)
    in_views = counted(monkeypatch, slice_view_module)
    in_3d = counted(monkeypatch, view3d_module)
    normal_of = {name: plane_geometry(doc, name).normal_axis for name in win.views}

    for axis in range(3):
        in_views.clear(), in_3d.clear()
        doc.set_cursor(doc.cursor + np.eye(3, dtype=int)[axis])
        settle(qtbot, win)
        moved = [name for name, normal in normal_of.items() if normal == axis]
        assert sorted(in_views) == [axis] * len(moved), (axis, in_views)  # the moved slice's view only
        assert in_3d == [axis], (axis, in_3d)  # and its 3-D plane only
        assert_planes_match(win)

    # Anything but the cursor still makes every image again.
    fa = doc.layer("FA") if any(layer.name == "FA" for layer in doc.layers) else None
    layer = fa or next(layer for layer in doc.layers if layer.kind == "scalar")
    in_views.clear(), in_3d.clear()
    layer.set(opacity=0.5)
    settle(qtbot, win)
    assert sorted(in_3d) == [0, 1, 2] and sorted(in_views) == [0, 1, 2]
    assert_planes_match(win)


def test_a_stroke_after_a_cursor_step_lands_on_the_slice_shown(demo_window, qtbot):
    """An ROI stroke patches a cached image only when that image is of the slice shown now."""
    win = demo_window
    doc = win.document
    settle(qtbot, win)
    roi = win.new_roi()
    settle(qtbot, win)
    for step in ([0, 0, 2], [0, 1, 0], [-1, 0, 0]):
        doc.set_cursor(doc.cursor + np.array(step))
        x, y, z = (int(v) for v in doc.cursor)
        assert doc.paint(roi, [(x + d, y, z) for d in range(-2, 3)] + [(x, y + 3, z + 1)], True) > 0
        settle(qtbot, win)
        assert_planes_match(win)
