"""What a brush stroke redraws: the slice it is on at once (only the pixels it changed), not the
slices it misses, the 3-D planes' changed pixels with the next frame; frames held while a live
result is on its way are drawn, with the final state, once released or when the hold ends."""

import numpy as np

from tests.conftest import ARTIFACTS
from tests.gui.actions import press_drag_release
from tractlens.app.model import Layer, Volume
from tractlens.widgets import slice_view
from tractlens.widgets.render import composite, plane_geometry

SEED_GREEN = (0, 200, 0)  # not a colour the grey image has


def window_with_image(window):
    """A 40×30×12 grid of 2 mm, a grey random image, the cursor at (20, 15, 6), an empty seed ROI."""
    data = np.random.default_rng(0).uniform(size=(40, 30, 12)).astype(np.float32)
    window.document.add_layer(Layer("anat", Volume("anat", data, np.diag([2.0, 2.0, 2.0, 1.0])), "scalar"))
    window.document.set_cursor((20, 15, 6))
    seed = window.new_roi()
    window.document.set_layer_color(seed, np.array(SEED_GREEN) / 255)
    window.radius_box.setValue(2)
    return seed


def plane_colours(view3d, view: str) -> np.ndarray:
    grid, _actor = view3d._planes[view]
    return np.asarray(grid.point_data["rgb"])


def greenish(shot: np.ndarray) -> int:
    """Pixels of a screenshot clearly green (the seed's colour over the grey image)."""
    shot = shot[..., :3].astype(int)
    return int(((shot[..., 1] > 1.5 * shot[..., 0] + 20) & (shot[..., 1] > 80)).sum())


def drawn(view3d, qtbot) -> None:
    qtbot.waitUntil(lambda: not view3d._render_pending, timeout=10000)


def test_a_stroke_redraws_only_what_it_changed_and_every_view_shows_the_same_as_a_full_redraw(
    window, qtbot, monkeypatch
):
    seed = window_with_image(window)
    doc, view3d = window.document, window.view3d
    axial, coronal, sagittal = (window.views[name] for name in ("axial", "coronal", "sagittal"))
    for view in window.views.values():
        view.image_array()
    drawn(view3d, qtbot)
    untouched = {name: window.views[name].image_array() for name in ("coronal", "sagittal")}
    copies = {name: image.copy() for name, image in untouched.items()}
    full = {"slices": 0, "planes": 0}  # whole planes composited while the stroke is drawn
    monkeypatch.setattr(
        slice_view, "composite", lambda *a, **k: full.__setitem__("slices", full["slices"] + 1) or composite(*a, **k)
    )
    original = view3d._update_planes
    monkeypatch.setattr(view3d, "_update_planes", lambda: full.__setitem__("planes", full["planes"] + 1) or original())

    # Drawn before the stroke: the planes' colours are on the GPU (green so far: the marker's A).
    green_before = greenish(view3d.screenshot())
    view3d._roi_timer.stop()  # the ROI surface waits: the planes' own pixels are checked first
    view3d._roi_timer.setInterval(60_000)
    # A stroke on the axial slice (z = 6) from x = 8 to 12 along y = 22: it misses the coronal
    # slice (y = 15) and the sagittal one (x = 20).
    press_drag_release(qtbot, axial, [(8, 22, 6), (10, 22, 6), (12, 22, 6)])
    assert seed.data.mask.sum() > 0 and set(np.argwhere(seed.data.mask)[:, 2]) == {6}
    drawn(view3d, qtbot)
    qtbot.wait(50)

    assert full == {"slices": 0, "planes": 0}  # patched, not composited again
    for view in (axial, coronal, sagittal):
        np.testing.assert_array_equal(view.image_array(), composite(doc, view.geometry_now()))
    for name, view in (("coronal", coronal), ("sagittal", sagittal)):
        assert view.image_array() is untouched[name]  # not redrawn
        np.testing.assert_array_equal(view.image_array(), copies[name])
    image = axial.image_array().astype(int)
    assert (image[..., 1] > image[..., 0]).sum() == seed.data.mask.sum()  # the seed's pixels, greener than grey
    for name in ("axial", "coronal", "sagittal"):
        expected = composite(doc, plane_geometry(doc, name)).reshape(-1, 3)
        np.testing.assert_array_equal(plane_colours(view3d, name), expected)
    # On screen: the patched colours reach the GPU (the ROI's own surface is not built yet here).
    assert view3d.roi_surface(seed) is None
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "stroke_redraw_planes_only.png")
    assert greenish(view3d.screenshot()) > green_before + 20
    view3d._roi_timer.setInterval(1)
    view3d._roi_timer.start()
    qtbot.waitUntil(lambda: view3d.roi_surface(seed) is not None, timeout=10000)
    window.save_screenshot(ARTIFACTS / "stroke_redraw_window.png")


def test_frames_held_for_a_coming_result_are_drawn_once_released_with_the_final_state(window, qtbot):
    seed = window_with_image(window)
    doc, view3d = window.document, window.view3d
    drawn(view3d, qtbot)
    green_before = greenish(view3d.screenshot())
    qtbot.wait(300)  # the ROI surface timer and the frames asked for, if any
    before = view3d.frames_drawn
    view3d.hold_frames(60.0)
    for x in (10, 12, 14):
        doc.paint(seed, [(x, y, 6) for y in range(10, 20)], True)
        qtbot.wait(30)
    doc.layer("anat").set(opacity=0.8)
    qtbot.wait(400)  # the ROI surface's timer fires meanwhile: its rebuild waits for the frame too
    assert view3d.frames_drawn == before and view3d._render_pending
    assert view3d.roi_surface(seed) is None

    view3d.release_frames()
    qtbot.waitUntil(lambda: view3d.frames_drawn > before, timeout=10000)
    qtbot.wait(300)
    assert view3d.frames_drawn == before + 1  # what was asked meanwhile: one frame
    assert view3d.roi_surface(seed) is not None
    for name in ("axial", "coronal", "sagittal"):
        expected = composite(doc, plane_geometry(doc, name)).reshape(-1, 3)
        np.testing.assert_array_equal(plane_colours(view3d, name), expected)
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "stroke_frames_released.png")
    assert greenish(view3d.screenshot()) > green_before + 50  # the green seed shows

    # A hold that nobody releases ends by itself, and the state as it is then is drawn.
    frames = view3d.frames_drawn
    view3d.hold_frames(0.3)
    doc.paint(seed, [(16, y, 6) for y in range(10, 20)], True)
    qtbot.waitUntil(lambda: view3d.frames_drawn > frames, timeout=10000)
    drawn(view3d, qtbot)
    expected = composite(doc, plane_geometry(doc, "axial")).reshape(-1, 3)
    np.testing.assert_array_equal(plane_colours(view3d, "axial"), expected)


def test_radiological_slices_are_composited_mirrored(window, qtbot):
    seed = window_with_image(window)
    doc = window.document
    doc.paint(seed, [(5, 15, 6), (6, 15, 6)], True)  # on the patient's right: the screen's left in neurological
    axial = window.views["axial"]
    neurological = axial.image_array().copy()
    window.view_controls.toggle_radiological()  # View > Radiological convention
    assert axial.radiological
    image = axial.image_array()
    np.testing.assert_array_equal(image, composite(doc, plane_geometry(doc, "axial", radiological=True)))
    np.testing.assert_array_equal(image, neurological[:, ::-1])
    doc.paint(seed, [(7, 15, 6)], True)  # a stroke on a mirrored slice patches the mirrored image
    np.testing.assert_array_equal(axial.image_array(), composite(doc, plane_geometry(doc, "axial", radiological=True)))


def test_the_3d_planes_are_drawn_from_the_grids_own_colours_so_a_stroke_only_resends_them(window, qtbot):
    """Each cursor plane is drawn as a surface holding its grid's points and colours (the same
    VTK arrays), by a polygon mapper: a stroke's patched colours are sent again, nothing is
    extracted again (drawn as a grid, VTK re-extracted the plane's surface at every stroke that
    touched it: 13-15 ms of the ROI edit's 3-D frame on the H200 machine). Also after the planes
    are composited anew (another slice)."""
    from vtkmodules.vtkRenderingCore import vtkPolyDataMapper

    window_with_image(window)
    view3d = window.view3d
    drawn(view3d, qtbot)
    for step in range(2):
        for grid, actor in view3d._planes.values():
            mapper = actor.GetMapper()
            assert isinstance(mapper, vtkPolyDataMapper)  # (a DataSetMapper would extract a surface)
            surface = mapper.GetInput()
            assert surface.GetPointData().GetArray("rgb") is grid.GetPointData().GetArray("rgb")
            assert surface.GetPoints() is grid.GetPoints()
        if step == 0:
            window.document.set_cursor((22, 15, 6))  # the sagittal plane composited anew
            drawn(view3d, qtbot)
