"""The 3-D glyphs of the cursor's neighbouring positions are built ahead (widgets.glyph_prefetch):
a step to one of them shows glyphs equal to what the step would build, at once and with no
build of its own; a jump is built as before; builds ahead stop when newer ones are asked for;
a result is never given for a volume other than the one it was made from."""

import gc
import threading

import numpy as np
import pyvista as pv

from tests.gui.test_glyph_stepping import AFFINE, SHAPE, all_glyphs_ready, tensor_field
from tractlens.app.model import Layer, Volume
from tractlens.widgets.fod_glyphs import PlaneMeshes, volume_glyph_job
from tractlens.widgets.glyph_prefetch import MISSING, GlyphPrefetch, neighbours


def neighbour_keys(window, layer) -> list:
    doc, view = window.document, window.view3d
    return [volume_glyph_job(layer, doc, view._software(), c)[1] for c in neighbours(doc.cursor, doc.reference_shape)]


def built_ahead(window, layer) -> bool:
    ahead = window.view3d.glyphs.ahead
    return all(ahead.holds(key) for key in neighbour_keys(window, layer))


def add_fod_layer(doc, shape, seed: int):
    """An fODF layer (lmax 8) of one random lobe per voxel, on 2 mm voxels."""
    from tractlens.gpu.sh import sh_basis

    directions = np.random.default_rng(seed).normal(size=(int(np.prod(shape)), 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    sh = (sh_basis(np, directions, 8) * 0.2).astype(np.float32).reshape(*shape, 45)
    sh[..., 0] = 0.3
    return doc.add_layer(Layer("fODFs", Volume("fODFs", sh, np.diag([2.0, 2.0, 2.0, 1.0]), kind="fod"), "fod"))


def record_3d_builds(monkeypatch, view) -> list:
    """The keys the 3-D view's glyph tasks are asked to build (on their workers)."""
    from tractlens.widgets.glyphs import LatestTask

    asked = []
    request = LatestTask.request

    def recorded(task, key, fn, **options):
        if task in view.glyphs.tasks.values():
            asked.append(key)
        request(task, key, fn, **options)

    monkeypatch.setattr(LatestTask, "request", recorded)
    return asked


def test_a_step_to_a_neighbouring_slice_shows_the_glyphs_built_ahead(window, qtbot, monkeypatch):
    doc, view = window.document, window.view3d
    doc.add_layer(Layer("FA", Volume("FA", np.full(SHAPE, 0.5, np.float32), AFFINE), "scalar", clim=(0.0, 1.0)))
    layer = doc.add_layer(Layer("tensors", Volume("tensors", tensor_field(), AFFINE, kind="tensor"), "tensor"))
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    qtbot.waitUntil(lambda: built_ahead(window, layer), timeout=30_000)  # once the frame was drawn
    asked = record_3d_builds(monkeypatch, view)
    hits = view.glyphs.ahead.hits
    for view_name in ("axial", "coronal", "sagittal"):
        window.views[view_name].step(1)
        # Shown within the step itself: no build asked for, nothing to wait for.
        task = view.glyphs.tasks[id(layer)]
        assert task.ready() and not asked, asked
        assert view.glyphs.ahead.hits == hits + 1
        hits += 1
        (actor,) = view.glyphs.actors(layer)
        expected = volume_glyph_job(layer, doc, view._software())[0]()()  # what the step would build
        shown = pv.wrap(actor.GetMapper().GetInput())
        assert shown.n_points == expected.n_points > 0
        np.testing.assert_array_equal(shown.points, expected.points)
        # and the next step's neighbours are built ahead once this step's frame is drawn
        qtbot.waitUntil(lambda: built_ahead(window, layer), timeout=30_000)
    # A jump of five slices was not built ahead: built on a worker, as before.
    cursor = doc.cursor.copy()
    cursor[2] += 5
    doc.set_cursor(cursor)
    assert asked and view.glyphs.ahead.hits == hits
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    (actor,) = view.glyphs.actors(layer)
    expected = volume_glyph_job(layer, doc, view._software())[0]()()
    np.testing.assert_array_equal(pv.wrap(actor.GetMapper().GetInput()).points, expected.points)


def test_fod_glyphs_built_ahead_are_the_planes_a_step_builds(window, qtbot, monkeypatch):
    doc, view = window.document, window.view3d
    layer = add_fod_layer(doc, (40, 44, 30), seed=5)
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)
    qtbot.waitUntil(lambda: built_ahead(window, layer), timeout=30_000)
    asked = record_3d_builds(monkeypatch, view)
    moved = window.views["coronal"]
    moved.step(-1)
    assert view.glyphs.tasks[id(layer)].ready() and not asked
    expected = volume_glyph_job(layer, doc, view._software())[0]()  # PlaneMeshes: (key, surfaces) per plane
    assert isinstance(expected, PlaneMeshes)
    actors = view.glyphs.actors(layer)
    assert len(actors) == 3
    for actor, (_key, surfaces) in zip(actors, expected, strict=True):
        np.testing.assert_array_equal(pv.wrap(actor.GetMapper().GetInput()).points, surfaces[0])


def test_builds_ahead_stop_when_newer_ones_are_asked_for(qtbot):
    ahead = GlyphPrefetch()
    data = np.zeros(3)
    started, release, ran = threading.Event(), threading.Event(), []

    def first():
        started.set()
        release.wait(10)
        ran.append("first")
        return "first"

    def job(name):
        return lambda: ran.append(name) or name

    ahead.ahead([(first, "k1", data), (job("second"), "k2", data), (job("third"), "k3", data)])
    assert started.wait(10)
    ahead.ahead([(job("newer"), "k4", data)])  # while the first is in hand
    release.set()
    qtbot.waitUntil(lambda: ahead.holds("k4"), timeout=10_000)
    assert ahead.finish()
    assert ran == ["first", "newer"]  # the one in hand finished; the two after it never ran
    assert ahead.take("k1", data) == "first" and ahead.take("k2", data) is MISSING
    # asked again: what is held is not built again
    ahead.ahead([(job("again"), "k4", data)])
    assert ahead.finish() and ran == ["first", "newer"]


def test_a_result_is_given_for_the_volume_it_was_made_from_only(qtbot):
    ahead = GlyphPrefetch()
    data, other = np.zeros(3), np.zeros(3)
    ahead.ahead([(lambda: "made", "key", data)])
    qtbot.waitUntil(lambda: ahead.holds("key"), timeout=10_000)
    assert ahead.take("key", other) is MISSING  # another volume (ids can be reused)
    assert ahead.take("key", data) == "made"
    del data
    gc.collect()
    assert not ahead.holds("key")  # freed with its volume (a layer removed)
    assert ahead.take("key", other) is MISSING
    failing = GlyphPrefetch()  # a build ahead that fails is left for the step to build (and report)

    def broken():
        raise ValueError("no")

    failing.ahead([(broken, "bad", other), (lambda: "fine", "good", other)])
    qtbot.waitUntil(lambda: failing.holds("good"), timeout=10_000)
    assert not failing.holds("bad") and failing.take("good", other) == "fine"


def test_neighbours_stay_within_the_grid():
    assert neighbours([0, 5, 9], (4, 10, 10)) == [[0, 5, 8], [0, 6, 9], [0, 4, 9], [1, 5, 9]]


def test_a_slice_views_step_draws_the_sections_built_ahead_in_its_first_paint(window, qtbot, monkeypatch):
    from tractlens.widgets.glyph_prefetch import neighbour_planes
    from tractlens.widgets.glyphs import LatestTask
    from tractlens.widgets.section_raster import GlyphPicture

    doc = window.document
    layer = add_fod_layer(doc, (36, 40, 24), seed=9)
    axial = window.views["axial"]
    qtbot.waitUntil(lambda: all_glyphs_ready(window), timeout=30_000)

    def neighbours_built() -> bool:
        geometry = axial.geometry_now()
        target = axial._target_rect(geometry)
        keys = [key for plane in neighbour_planes(geometry, doc.reference_shape)
                for _layer, _build, key in axial.glyphs.jobs(plane, target)]  # fmt: skip
        return len(keys) == 2 and all(axial.glyphs.ahead.holds(key) for key in keys)

    qtbot.waitUntil(neighbours_built, timeout=30_000)
    asked = []
    request = LatestTask.request
    monkeypatch.setattr(
        LatestTask,
        "request",
        lambda task, key, fn, **o: (
            task is axial.glyphs.tasks.get(id(layer)) and asked.append(key),
            request(task, key, fn, **o),
        ),
    )
    fills = axial.glyphs.raster.fills
    after_frame, deferred = window.view3d.after_frame, []
    monkeypatch.setattr(
        window.view3d, "after_frame", lambda callback: deferred.append(callback) or after_frame(callback)
    )
    axial.step(1)
    axial.repaint()  # the step's first paint
    assert not asked and axial.glyphs.tasks[id(layer)].ready()
    assert axial.glyphs.build_ahead in deferred  # its next builds ahead: after the 3-D frame (View3D.after_frame)
    assert axial.glyphs.raster.fills == fills + 1  # the new slice's sections, drawn in that paint
    drawn = axial.glyphs.built[id(layer)]
    geometry = axial.geometry_now()
    ((_layer, build, key),) = axial.glyphs.jobs(geometry, axial._target_rect(geometry))
    assert axial.glyphs.tasks[id(layer)].delivered == key
    fresh = build()  # what a worker makes for this slice
    assert isinstance(drawn, GlyphPicture) and isinstance(fresh, GlyphPicture)
    np.testing.assert_array_equal(drawn.pixels, fresh.pixels)
    assert drawn.pixels.any()


def test_after_frame_waits_for_a_frame_that_is_due_and_runs_at_the_next_turn_without_one(window, qtbot):
    view = window.view3d
    qtbot.waitUntil(lambda: not view._render_pending, timeout=10_000)
    ran = []
    view.after_frame(lambda: ran.append(view.frames_drawn))
    assert not ran  # (not within the call)
    qtbot.waitUntil(lambda: len(ran) == 1, timeout=5_000)
    assert ran == [view.frames_drawn]  # no frame was due: none drawn before it
    before = view.frames_drawn
    view.request_render()
    view.after_frame(lambda: ran.append(view.frames_drawn))
    qtbot.waitUntil(lambda: len(ran) == 2, timeout=5_000)
    assert ran[1] == before + 1  # after that frame
    # A view not shown draws no frame: nothing waits for one.
    view.hide()
    view.request_render()
    view.after_frame(lambda: ran.append("hidden"))
    qtbot.waitUntil(lambda: ran[-1] == "hidden", timeout=5_000)
