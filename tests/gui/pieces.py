"""A tractogram opened in pieces (50 k points each), the 3-D view's next-piece turns queued for
the test to run one at a time: what the GUI tests of pieces coming in share."""

from __future__ import annotations

from tests.benchmarks.bench_render import synthetic_trx
from tractlens.app import fiber_arrays
from tractlens.widgets import view3d_fibers


def open_in_pieces(window, qtbot, tmp_path, monkeypatch, streamlines: int = 6000, points: int = 40):
    """(layer, its 3-D scene, the queued turns) once the layer is in the view."""
    monkeypatch.setattr(fiber_arrays, "PIECE_POINTS", 50_000)
    queued = []

    class Timer:  # the view's next-piece turns, run by the test one at a time
        @staticmethod
        def singleShot(_ms, callback):
            queued.append(callback)

    monkeypatch.setattr(view3d_fibers, "QTimer", Timer)
    window.open_paths([synthetic_trx(tmp_path, streamlines, points)])
    assert window.wait_for_jobs(120) and window.errors == []
    layer = next(layer for layer in window.document.layers if layer.kind == "tractogram")
    view = window.view3d
    qtbot.waitUntil(lambda: id(layer) in view._fibers, timeout=10_000)
    return layer, view._fibers[id(layer)]["scene"], queued
