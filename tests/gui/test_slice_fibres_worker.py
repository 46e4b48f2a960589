"""Whole-brain tractograms on the slice views are drawn by a worker into an image the paint only
scales (widgets.slice_fibers, issue 41): the GUI thread draws none of their segments, the picture
is the one the paint itself draws, and a selection shows the previous picture until the new one
arrives (its worker started after the paint that asked for it). Real window, Xvfb; the size limit lowered so that a small synthetic tractogram takes the
worker's path."""

from __future__ import annotations

import threading

import numpy as np

from tests.benchmarks.bench_render import synthetic_trx
from tests.conftest import ARTIFACTS
from tractlens.widgets import slice_fibers


def fibre_pixels(view) -> np.ndarray:
    """(H, W) bool: pixels of the view's grab that are neither the black background nor grey
    (the slice's own image is grey: a tractogram alone over a blank reference)."""
    image = view.grab().toImage().convertToFormat(view.grab().toImage().Format.Format_RGB888)
    width, height = image.width(), image.height()
    rgb = np.frombuffer(image.constBits(), dtype=np.uint8, count=image.bytesPerLine() * height)
    rgb = rgb.reshape(height, image.bytesPerLine())[:, : 3 * width].reshape(height, width, 3).astype(int)
    return (rgb.max(axis=2) - rgb.min(axis=2)) > 40  # coloured: direction colours, not grey


def open_tractogram(window, tmp_path):
    path = synthetic_trx(tmp_path / "cache", 20_000, 40)
    window.open_paths([path])
    assert window.wait_for_jobs(120) and window.errors == []
    return next(layer for layer in window.document.layers if layer.kind == "tractogram")


def test_a_large_tractogram_is_drawn_on_the_slices_by_a_worker_as_the_paint_draws_it(
    window, qtbot, tmp_path, monkeypatch
):
    layer = open_tractogram(window, tmp_path)
    view = window.views["axial"]
    direct = fibre_pixels(view)  # small: drawn by the paint itself
    assert direct.sum() > 500

    painted_on = []
    real = slice_fibers.paint_segments
    monkeypatch.setattr(slice_fibers, "paint_segments", lambda *a: painted_on.append(threading.get_ident()) or real(*a))
    monkeypatch.setattr(slice_fibers, "WORKER_MIN_POINTS", 0)
    for each in window.views.values():
        each.update()
    assert window.wait_for_jobs(60)
    qtbot.waitUntil(lambda: view._fibres.ready() and view._fibres._image is not None, timeout=30_000)
    worker = fibre_pixels(view)
    window.save_screenshot(ARTIFACTS / "slice_fibres_worker.png")
    assert painted_on and threading.get_ident() not in painted_on  # none on the GUI thread
    # the same picture: the image is drawn at a whole multiple of the slice's pixels and scaled
    overlap = (direct & worker).sum() / max(direct.sum(), worker.sum())
    assert overlap > 0.6, overlap

    # A selection: until its picture arrives the previous one stays; then fewer fibres.
    built = view._fibres._image
    painted = len(painted_on)
    layer.set_selection(np.arange(len(layer.data)) % 4 == 0, by="a test")
    view.grab()  # a paint at once, before the worker can have finished: the previous picture
    assert view._fibres._image is built or view._fibres._image[0] != built[0]
    # The new picture is wanted from this paint on, but its worker starts only once the event
    # loop has finished the paint (the 3-D frame of the same change first): none started yet.
    task = view._fibres._task
    assert not view._fibres.ready() and task._waiting is not None and not task._running
    assert len(painted_on) == painted
    assert window.wait_for_jobs(60)
    qtbot.waitUntil(lambda: view._fibres.ready() and view._fibres._image is not built, timeout=30_000)
    selected = fibre_pixels(view)
    assert 0 < selected.sum() < 0.8 * worker.sum()

    # Hidden: no picture, nothing asked for.
    layer.set(visible=False)
    assert window.wait_for_jobs(60)
    view.grab()  # a paint now, exposed or not
    assert view._fibres._image is None and fibre_pixels(view).sum() < 0.05 * worker.sum()


def test_the_report_waits_for_the_slice_views_worker_drawn_segments(window, qtbot, tmp_path, monkeypatch):
    """A report grabs the slice views right after moving the cursor to the lesion: a new slice
    position has no picture yet, so it waits for the worker's (widgets.report.settled)."""
    from tractlens.widgets import report

    monkeypatch.setattr(slice_fibers, "WORKER_MIN_POINTS", 0)
    open_tractogram(window, tmp_path)
    view = window.views["axial"]
    assert window.wait_for_jobs(60)
    drawn = fibre_pixels(view).sum()
    assert drawn > 500
    window.document.set_cursor(window.document.cursor + np.array([0, 0, 2]))  # a new slice: no picture yet
    view.grab()  # a paint now, exposed or not
    assert view._fibres._image is None or not view._fibres.ready()
    report.settled(view)
    assert view._fibres.ready() and view._fibres._image is not None
    assert fibre_pixels(view).sum() > 0.5 * drawn
