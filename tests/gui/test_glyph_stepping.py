"""Tensor glyphs on a whole-brain-sized tensor field: stepping through slices keeps the GUI
thread free (the glyphs are built on worker threads, their number bounded), and the glyphs
follow the cursor in 3-D and on the slices. Checked by where the glyphs are built, not by the
clock; how long the GUI thread is busy per step is measured by
tests/benchmarks/bench_gui_latency.py (not in the default run)."""

import threading

import numpy as np
import pyvista as pv
from PySide6.QtGui import QImage
from vtkmodules.vtkCommonCore import vtkObject

from tests.conftest import ARTIFACTS
from tractlens.app.model import Layer, Volume
from tractlens.gpu import sym3
from tractlens.widgets.glyphs import (
    COLOUR_LEVELS,
    MAX_GLYPHS_PER_PLANE,
    OnGuiThread,
    glyph_step_3d,
    tensor_glyph_job,
)

SHAPE = (128, 128, 70)
AFFINE = np.diag([1.75, 1.75, 2.0, 1.0])


def tensor_field() -> np.ndarray:
    """Prolate tensors (1.5, 0.4, 0.3 µm²/ms) whose main direction lies nearly in the axial plane
    and turns with z (each slice has its own colour) and a little with x."""
    x, _y, z = np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij")
    theta = 0.35 * z + 0.01 * x
    e1 = np.stack([np.cos(theta), np.sin(theta), np.full(theta.shape, 0.15)], -1)
    e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
    lam = np.array([1.5e-3, 4e-4, 3e-4])
    matrices = lam[2] * np.eye(3) + (lam[0] - lam[2]) * e1[..., :, None] * e1[..., None, :]
    return sym3.from_matrix(np, matrices).astype(np.float32)


def grab_rgb(widget) -> np.ndarray:
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.bytesPerLine())
    return pixels[:, : 3 * image.width()].reshape(image.height(), image.width(), 3).copy()


def all_glyphs_ready(window) -> bool:
    return window.view3d.glyphs_ready() and all(view.glyphs_ready() for view in window.views.values())


def quantised(rgb: np.ndarray) -> np.ndarray:
    levels = COLOUR_LEVELS - 1
    return np.rint(np.rint(np.clip(rgb, 0, 1) * levels) * 255 / levels).astype(int)


def test_stepping_through_slices_with_glyphs_never_blocks_the_gui_thread(window, qtbot, monkeypatch):
    from tractlens.widgets.glyph_prefetch import GlyphPrefetch
    from tractlens.widgets.glyphs import LatestTask

    built_on = []  # the thread each glyph build ran on: a step's own, or one built ahead
    request, ahead = LatestTask.request, GlyphPrefetch.ahead

    def recording(fn):
        def build(*args, **kwargs):
            built_on.append(threading.get_ident())
            return fn(*args, **kwargs)

        return build

    monkeypatch.setattr(LatestTask, "request", lambda task, key, fn, **o: request(task, key, recording(fn), **o))
    monkeypatch.setattr(GlyphPrefetch, "ahead", lambda self, jobs: ahead(self, [(recording(b), *r) for b, *r in jobs]))
    gui_thread = threading.get_ident()
    doc = window.document
    tensors = tensor_field()
    fa = Volume("FA", np.full(SHAPE, 0.5, np.float32), AFFINE)
    doc.add_layer(Layer("FA", fa, "scalar", clim=(0.0, 1.0), colormap="hot"))
    layer = doc.add_layer(Layer("tensors", Volume("tensors", tensors, AFFINE, kind="tensor"), "tensor"))
    assert layer.glyph_step == 2
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    qtbot.wait(100)

    axial = window.views["axial"]
    follow = []
    for _ in range(6):
        axial.step(1)  # what the wheel, Up or Page Up do
        qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
        # the new slice's glyphs were built (in this step, or ahead of it: widgets.glyph_prefetch)
        # on worker threads: the GUI thread only shows them
        assert built_on and gui_thread not in built_on, built_on
        qtbot.wait(80)  # the frame that shows the new glyphs
        # 3-D: the mesh shown is the one built for this cursor.
        (actor,) = window.view3d.glyphs.actors(layer)
        built = tensor_glyph_job(layer, doc, window.view3d._software())[0]()  # what a worker makes
        assert isinstance(built, OnGuiThread) and not any(isinstance(a, vtkObject) for a in built.args)
        expected = built()  # the VTK mesh, made on the GUI thread
        shown = pv.wrap(actor.GetMapper().GetInput())
        follow.append(shown.n_points == expected.n_points)
        np.testing.assert_allclose(shown.points, expected.points, atol=1e-4)
        # 2-D: the ellipse at a glyph cell of this slice has this slice's main-direction colour.
        step = axial.glyphs.tasks[id(layer)].delivered[4]
        z = int(doc.cursor[2])
        voxel = np.array([SHAPE[0] // 2 // step * step + step // 2, SHAPE[1] // 2 // step * step + step // 2, z])
        matrix = sym3.to_matrix(np, tensors[tuple(voxel)].astype(np.float64)[None])[0]
        e1 = np.abs(np.linalg.eigh(matrix)[1][:, 2])
        axial.show_crosshair = False
        point = axial.widget_point_of_voxel(voxel)
        colour = grab_rgb(axial)[int(point.y()), int(point.x())]
        axial.show_crosshair = True
        np.testing.assert_allclose(colour, quantised(e1), atol=2)
    assert all(follow)
    window.save_screenshot(ARTIFACTS / "glyphs_128x128x70.png")


def test_glyph_counts_are_bounded_and_colour_by_fa_is_grey(window, qtbot):
    doc = window.document
    layer = doc.add_layer(
        Layer("tensors", Volume("tensors", tensor_field(), AFFINE, kind="tensor"), "tensor", glyph_step=1)
    )
    # 3-D: the step grows so that a 128×128 plane has at most MAX_GLYPHS_PER_PLANE cells.
    step3d = glyph_step_3d(1, SHAPE)
    assert ((128 + step3d - 1) // step3d) ** 2 <= MAX_GLYPHS_PER_PLANE < ((128 + step3d - 2) // (step3d - 1)) ** 2
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    axial = window.views["axial"]
    axial.show_crosshair = False
    geometry = axial.geometry_now()
    target = axial._target_rect(geometry)
    cell_px = target.width() / geometry.voxels.shape[1]
    step2d = axial.glyphs.tasks[id(layer)].delivered[4]
    assert step2d * cell_px >= 5  # ellipses at least MIN_GLYPH_CELL_PX apart
    inner = (
        slice(int(target.top()) + 20, int(target.bottom()) - 20),
        slice(int(target.left()) + 20, int(target.right()) - 20),
    )
    by_direction = grab_rgb(axial)[inner]
    lit = by_direction.max(-1) > 30
    assert lit.mean() > 0.1
    assert (np.ptp(by_direction[lit].astype(int), axis=-1) > 30).mean() > 0.5  # coloured

    layer.set(color_by="fa")
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    by_fa = grab_rgb(axial)[inner]
    lit = by_fa.max(-1) > 30
    assert lit.mean() > 0.1
    assert (np.ptp(by_fa[lit].astype(int), axis=-1) <= 1).all()  # grey
    rgb = pv.wrap(window.view3d.glyphs.actors(layer)[0].GetMapper().GetInput()).point_data["rgb"]
    assert (rgb[:, 0] == rgb[:, 1]).all() and (rgb[:, 1] == rgb[:, 2]).all()
    # And so they are drawn: grey, shaded by the light kit (whose warm and cool lights tint it a little).
    shot = window.view3d.screenshot()[..., :3].astype(int)
    from tractlens.widgets.view3d_overlays import MARKER_VIEWPORT

    height, width = shot.shape[:2]  # leave out the orientation cube (coloured letters) in its corner
    x0, y0, x1, y1 = MARKER_VIEWPORT  # VTK viewport: fractions from the bottom left
    shot[int((1 - y1) * height) : int((1 - y0) * height) + 1, int(x0 * width) : int(x1 * width) + 1] = 0
    lit = shot.max(-1) > 30
    saturation = np.ptp(shot[lit], axis=-1) / shot[lit].max(-1)
    assert lit.mean() > 0.01 and (saturation < 0.15).mean() > 0.99, np.percentile(saturation, [50, 99])
    window.save_screenshot(ARTIFACTS / "glyphs_colour_by_fa.png")


def test_a_step_fills_the_glyphs_of_the_moved_slice_only_and_draws_what_filling_them_drew(window, qtbot, monkeypatch):
    """The slice views keep their glyphs as a picture between paints: a step along z refills the
    axial view's only (the others repaint for the crosshair), and the picture is what filling
    the paths at each paint draws, zoomed in too. A hidden glyph layer (no glyphs) beside the
    shown one does not make every paint fill again."""
    from PySide6.QtCore import QPointF

    from tractlens.widgets.glyph_raster import GlyphRaster, fill_layers

    doc = window.document
    hidden = doc.add_layer(Layer("hidden", Volume("hidden", tensor_field(), AFFINE, kind="tensor"), "tensor"))
    hidden.set(visible=False)
    doc.add_layer(Layer("tensors", Volume("tensors", tensor_field(), AFFINE, kind="tensor"), "tensor"))
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    qtbot.wait(100)
    views = window.views
    fills = {name: view.glyphs.raster.fills for name, view in views.items()}
    assert all(fills.values())
    views["axial"].step(1)
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    for view in views.values():
        view.grab()  # a paint now (repaint() paints nothing while the window is not exposed)
    assert views["axial"].glyphs.raster.fills > fills["axial"]
    assert [views[name].glyphs.raster.fills for name in ("coronal", "sagittal")] == [
        fills["coronal"], fills["sagittal"]]  # fmt: skip

    def filled_each_paint(self, painter, layers, target, visible, scale, ratio):  # what paints did before
        painter.save()
        painter.translate(QPointF(target.left(), target.top()))
        fill_layers(painter, layers, scale)
        painter.restore()

    axial = views["axial"]
    for zoom in (1, 4):
        if zoom > 1:
            axial.navigation.zoom_at(QPointF(axial.width() / 2, axial.height() / 2), zoom)
        qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
        kept = grab_rgb(axial)
        with monkeypatch.context() as patch:
            patch.setattr(GlyphRaster, "draw", filled_each_paint)
            direct = grab_rgb(axial)
        assert (np.abs(kept.astype(int) - direct.astype(int)).max(axis=-1) > 40).mean() < 0.002
        image = axial.glyphs.raster.image
        assert image.width() <= axial.width() * axial.devicePixelRatioF() + 1  # the screen's part only


def test_the_3d_frame_of_a_step_waits_for_its_glyphs(window, qtbot, monkeypatch):
    """A slice step draws no 3-D frame of the moved planes with the old glyphs: the frame waits
    (at most GLYPH_FRAME_HOLD_S; here longer than any build) and is drawn once they arrive."""
    from tractlens.widgets import view3d_glyphs

    monkeypatch.setattr(view3d_glyphs, "GLYPH_FRAME_HOLD_S", 60.0)
    doc = window.document
    doc.add_layer(Layer("tensors", Volume("tensors", tensor_field(), AFFINE, kind="tensor"), "tensor"))
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    view = window.view3d
    qtbot.waitUntil(lambda: not view._render_pending, timeout=10_000)
    arrived = []
    show = view.glyphs._show
    monkeypatch.setattr(view.glyphs, "_show", lambda *a: arrived.append(view.frames_drawn) or show(*a))
    for _ in range(3):
        before = view.frames_drawn
        window.views["axial"].step(1)
        qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
        qtbot.waitUntil(lambda before=before: view.frames_drawn > before, timeout=10_000)  # drawn once they came
        assert arrived[-1] == before  # no frame between the step and the glyphs


def test_2d_glyphs_that_arrive_while_a_3d_frame_is_held_are_drawn_with_it(window, qtbot, monkeypatch):
    """A slice view's new glyphs that come while the 3-D view holds a frame (a slice step's,
    waiting for its 3-D glyphs) are drawn when that frame is: the view asks for its repaint in
    the call that asks for the frame (one window update: Qt composes and flushes the window
    once), not at once in an update of its own; with no frame held, at once."""
    doc = window.document
    layer = doc.add_layer(Layer("tensors", Volume("tensors", tensor_field(), AFFINE, kind="tensor"), "tensor"))
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    view, axial = window.view3d, window.views["axial"]
    qtbot.waitUntil(lambda: not view._render_pending, timeout=10_000)
    asked = []  # (frames drawn, a frame pending) when the slice view asked for its repaint
    monkeypatch.setattr(axial, "update", lambda *args: asked.append((view.frames_drawn, view._render_pending)))
    ellipses = axial.glyphs.built[id(layer)]

    view.hold_frames(60.0)
    view.request_render()
    qtbot.wait(50)
    frames = view.frames_drawn
    axial.glyphs._arrived(layer, list(ellipses))  # new glyphs arrive while the frame is held
    qtbot.wait(200)
    assert asked == [] and view.frames_drawn == frames
    view.release_frames()
    qtbot.waitUntil(lambda: view.frames_drawn > frames, timeout=10_000)
    assert asked == [(frames, True)]  # asked with the frame, just before it was drawn

    asked.clear()  # no frame held: at once
    axial.glyphs._arrived(layer, list(ellipses))
    assert asked == [(view.frames_drawn, False)]
