"""An ROI edit on a tractogram filtered by ROIs: the selection starts at once, and the 3-D view
holds the edit's frame for it, so that the stroke and the new selection come in one frame (the
GUI thread is free for the selection sooner). Checked by the frames drawn, not by the clock."""

import numpy as np

from tractlens.app.model import Layer, RoiMask, Tractogram, Volume

SHAPE = (20, 20, 10)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def filtered_by_a_seed(window, qtbot):
    """An image, three parallel streamlines filtered by ROIs and a seed ROI on the third: the
    (tractogram, seed) layers, once the selection is shown."""
    doc = window.document
    doc.add_layer(Layer("FA", Volume("FA", np.zeros(SHAPE, np.float32), AFFINE), "scalar"))
    lines = [np.array([[x, y, 5.0] for x in range(2, 18)], np.float32) for y in (5, 10, 15)]
    tracts = doc.add_layer(
        Layer("fibres", Tractogram.from_list(lines, affine=AFFINE, dimensions=SHAPE), "tractogram", filter_by_rois=True)
    )
    mask = np.zeros(SHAPE, dtype=bool)
    mask[8, 15, 5] = True
    seed = doc.add_layer(Layer("seed", RoiMask("seed", mask, AFFINE, role="seed"), "roi"))
    qtbot.waitUntil(lambda: tracts.selection is not None and window.selection.job is None, timeout=10_000)
    return tracts, seed


def test_the_3d_frame_of_an_roi_edit_waits_for_its_selection(window, qtbot, monkeypatch):
    from tractlens.widgets import main_window
    from tractlens.widgets.controllers import selection as selection_module

    monkeypatch.setattr(main_window, "SELECTION_FRAME_HOLD_S", 30.0)  # longer than anything here: released, not expired
    doc, view = window.document, window.view3d
    tracts, seed = filtered_by_a_seed(window, qtbot)
    assert tracts.selection.tolist() == [False, False, True]
    qtbot.waitUntil(lambda: not view._render_pending and not window.selection.timer.isActive(), timeout=10_000)
    # The selection job waits until released, so that a frame drawn before it came would be seen.
    import threading

    release = threading.Event()
    select = selection_module.select_fibres
    monkeypatch.setattr(selection_module, "select_fibres", lambda *a, **k: release.wait(10) and select(*a, **k))
    frames_at_selection = []
    tracts.connect(
        lambda _layer, event, **info: (
            "selection" in info.get("changed", ()) and frames_at_selection.append(view.frames_drawn)
        )
    )
    before = view.frames_drawn
    doc.paint(seed, np.array([[8, 5, 5]]), True)  # a stroke on the first fibre
    qtbot.wait(100)
    assert view.frames_drawn == before  # the edit's frame waits for the selection
    release.set()
    qtbot.waitUntil(lambda: bool(frames_at_selection), timeout=10_000)
    assert frames_at_selection == [before]  # nothing drawn in between
    qtbot.waitUntil(lambda: view.frames_drawn > before and not view._render_pending, timeout=10_000)
    assert tracts.selection.tolist() == [True, False, True]
    # Without a selection to wait for (an unfiltered tractogram) the edit's frame is not held.
    tracts.set(filter_by_rois=False)
    qtbot.waitUntil(lambda: not view._render_pending and not window.selection.timer.isActive(), timeout=10_000)
    qtbot.wait(200)
    before = view.frames_drawn
    doc.paint(seed, np.array([[8, 10, 5]]), True)
    qtbot.waitUntil(lambda: view.frames_drawn > before, timeout=10_000)


def test_roi_edits_draw_the_moving_level_until_they_pause(window, qtbot, monkeypatch):
    """While ROIs are edited on a tractogram filtered by them, the 3-D view draws the moving
    level, as while the camera moves (a whole-brain selection's full frame took longer than the
    rest of the edit), says so, and places and draws everything again once the edits pause."""
    from tractlens.app import fiber_arrays

    for level in ("moving", "moving_software"):  # a moving level of one streamline of this selection
        monkeypatch.setitem(fiber_arrays.LEVELS, level, (10, level == "moving_software"))
    monkeypatch.setattr(fiber_arrays, "INTERACTIVE_STREAMLINES", 1)
    doc, view = window.document, window.view3d
    tracts, seed = filtered_by_a_seed(window, qtbot)
    qtbot.waitUntil(lambda: not view._moving and not view._render_pending, timeout=10_000)
    assert view.lod_text() == ""
    view._lod_timer.setInterval(600_000)  # the pause comes when the test says (below), not by the clock
    doc.paint(seed, np.array([[8, 5, 5]]), True)  # a stroke on the first fibre: two selected now
    assert view._moving and view._lod_timer.isActive()  # at once, for the edit's own frame
    qtbot.waitUntil(lambda: tracts.selection.sum() == 2 and not view._render_pending, timeout=10_000)
    assert view.lod_text() == "showing 1 of 2 streamlines while editing ROIs"
    entry = next(iter(view._fibers.values()))
    assert entry["scene"].drawn_streamlines("moving") == 1
    # the rest level's cells are placed when the edits pause (a whole-brain selection's are made
    # meanwhile on the later thread, not before the edit's frame): until then the selection before
    assert entry["scene"].drawn_streamlines("actor") == 1 and entry.get("rest_due")
    view._lod_timer.timeout.emit()  # the edits paused: everything again
    assert not view._moving and view.lod_text() == ""
    assert entry["scene"].drawn_streamlines("actor") == 2


def test_a_selection_shown_while_the_3d_frame_is_held_repaints_the_slice_views_with_that_frame(window, qtbot):
    """A new selection comes while the 3-D view holds the ROI edit's frame for it: the slice
    views' repaint joins that frame (one window update, not one for them and another for the
    frame), and the frame is asked of the window as soon as it is released."""
    view = window.view3d
    tracts, _seed = filtered_by_a_seed(window, qtbot)
    qtbot.waitUntil(lambda: not view._render_pending and not window.selection.timer.isActive(), timeout=10_000)
    view.hold_frames(30.0)
    view.request_render()
    qtbot.waitUntil(lambda: view._hold_timer.isActive(), timeout=10_000)  # the frame waits
    tracts.set_selection(np.array([True, True, True]))
    assert all(slice_view in view._joining for slice_view in window.views.values())
    before = view.frames_drawn
    view.release_frames()
    assert view._joining == [] and not view._render_pending  # asked of the window at once
    qtbot.waitUntil(lambda: view.frames_drawn > before, timeout=10_000)


def test_an_edits_selection_is_on_its_way_before_the_views_draw_it_and_holds_all_of_it(window, qtbot, monkeypatch):
    """An ROI edit's selection starts at the next turn of the event loop, before the 3-D view's
    frame work and the slice views' paints of the edit (the GUI thread does those while the
    worker selects), and with every event of the edit's turn: a shape moved is erased, then
    painted, and no selection of the half-made edit is ever shown."""
    from tractlens.widgets.slice_view import SliceView
    from tractlens.widgets.view3d import View3D

    tracts, seed = filtered_by_a_seed(window, qtbot)
    qtbot.waitUntil(lambda: not window.selection.timer.isActive() and window.selection.job is None, timeout=10_000)
    qtbot.waitUntil(lambda: not window.view3d._render_pending, timeout=10_000)
    submitted_when = []
    for cls, name in ((SliceView, "paintEvent"), (View3D, "_render_now")):
        original = getattr(cls, name)

        def recording(self, *args, _original=original, _name=name):
            submitted_when.append((_name, window.selection.job is not None))
            return _original(self, *args)

        monkeypatch.setattr(cls, name, recording)
    shown = []
    tracts.connect(lambda _l, event, **info: "selection" in info.get("changed", ()) and shown.append(tracts.selection))
    doc = window.document
    doc.paint(seed, np.array([[8, 15, 5]]), False)  # the seed moved: erased from the third fibre ...
    doc.paint(seed, np.array([[8, 5, 5]]), True, merge_with_last=True)  # ... and painted on the first
    qtbot.waitUntil(lambda: len(shown) >= 1 and window.selection.job is None, timeout=10_000)
    qtbot.wait(300)  # (a second selection, were there one, would come after the throttle's 40 ms)
    assert [s.tolist() for s in shown] == [[True, False, False]]  # the whole edit's, alone
    first = {}
    for name, submitted in submitted_when:
        first.setdefault(name, submitted)
    assert first.get("_render_now") is True  # the edit's frame work came after the submit
    assert first.get("paintEvent", True) is True  # and the slice views' paints, where they repainted
