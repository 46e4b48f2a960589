"""Cancelling any job at any moment leaves the document consistent (app.integrity).

Every kind of job the window runs is started and cancelled at several moments: at once, while
it is queued or starting, and while it runs (after a delay, or after its first partial result).
After each, :func:`app.integrity.document_problems` must find nothing, no error may have been
reported, and what a cancelled job leaves is either nothing or something whole.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QCoreApplication, Qt

from tractlens.app.integrity import document_problems
from tractlens.app.model import Document, Layer, RoiMask, Tractogram, Volume

DELAYS_S = (0.0, 0.05, 0.4)


def click(qtbot, button):
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def wait(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QCoreApplication.processEvents()
        time.sleep(0.005)


def cancel_all_after(win, seconds: float) -> None:
    wait(seconds)
    win.runner.cancel_all()
    assert win.wait_for_jobs(120)


def assert_consistent(win, what: str) -> None:
    assert document_problems(win.document) == [], what
    assert win.errors == [], what


def test_the_integrity_check_finds_broken_documents():
    doc = Document()
    doc.add_layer(Layer("a", Volume("a", np.zeros((4, 4, 4)), np.eye(4)), "scalar"))
    assert document_problems(doc) == []
    doc.add_layer(Layer("a", RoiMask("a", np.zeros((3, 3, 3), bool), np.eye(4)), "roi"))
    tract = Tractogram.from_list([np.zeros((2, 3))], affine=np.eye(4), dimensions=(4, 4, 4))
    bad = Layer("t", tract, "tractogram")
    bad.selection = np.ones(5, bool)
    doc.add_layer(bad)
    doc.cursor = np.array([9, 0, 0])
    problems = document_problems(doc)
    assert any("used twice" in p for p in problems)
    assert any("(3, 3, 3) on a (4, 4, 4) grid" in p for p in problems)
    assert any("selection" in p for p in problems)
    assert any("cursor" in p for p in problems)


@pytest.mark.parametrize("delay", DELAYS_S)
def test_cancelled_loads_add_all_their_layers_or_none(window, demo_dir, delay):
    win = window
    win.open_paths([demo_dir / "dwi.nii.gz"])  # loads the series and fits tensors on a worker
    cancel_all_after(win, delay)
    assert_consistent(win, f"open cancelled after {delay} s")
    names = sorted(layer.name for layer in win.document.layers)
    assert names in ([], sorted(["dwi", "FA", "MD", "colour FA", "tensors"])), names


def test_cancelling_every_job_of_the_window_keeps_the_document_consistent(
    demo_window, demo_dir, qtbot, tmp_path, monkeypatch
):
    """Tracking (deterministic, geodesic), COMMIT, ball & sticks, sessions: each cancelled at
    several moments on the demo."""
    from tractlens.widgets import tracking_panel

    monkeypatch.setattr(tracking_panel, "GUI_BATCH", 200)  # many partial results to cancel between
    monkeypatch.setattr(tracking_panel, "PARTIAL_INTERVAL_S", 0.0)
    win = demo_window
    seed = win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    win.open_roi(demo_dir / "roi_arc_target.nii.gz", role="target")
    assert_consistent(win, "demo opened")

    deterministic = win.deterministic_panel
    deterministic.whole_brain.setChecked(True)
    deterministic.seeds_per_voxel.setValue(4)
    for delay in DELAYS_S:
        click(qtbot, deterministic.track_button)
        cancel_all_after(win, delay)
        assert_consistent(win, f"deterministic cancelled after {delay} s")
    deterministic.whole_brain.setChecked(False)

    geodesic = win.geodesic_panel
    for delay in DELAYS_S:
        click(qtbot, geodesic.track_button)
        cancel_all_after(win, delay)
        assert_consistent(win, f"geodesic cancelled after {delay} s")

    commit = win.commit_panel
    commit.choose(win.document.layer("bundles"))
    layers_before = list(win.document.layers)
    for delay in DELAYS_S:
        click(qtbot, commit.filter_button)
        cancel_all_after(win, delay)
        assert_consistent(win, f"COMMIT cancelled after {delay} s")
        if win.document.layers != layers_before:  # finished before the cancel: whole results
            added = [layer for layer in win.document.layers if layer not in layers_before]
            assert sorted(layer.kind for layer in added) == ["scalar", "tractogram"], added
            for layer in added:
                win.document.remove_layer(layer)

    from tractlens.gpu.ballstick import BallStickParams

    dwi = win.document.layer("dwi")
    params = BallStickParams(n_fibres=2, burnin=20, njumps=20, sample_every=5)
    states = set()
    for delay in DELAYS_S:
        before = list(win.document.layers)
        job = win.fit_ballstick(dwi, params, roi=seed)
        cancel_all_after(win, delay)
        assert_consistent(win, f"ball & sticks cancelled after {delay} s")
        state = win.runner.jobs[job].state
        states.add(state)
        added = [layer for layer in win.document.layers if layer not in before]
        if state == "cancelled":
            assert added == []  # a cancelled fit adds nothing
        else:  # it finished before the cancel came: its layers are all there
            assert state == "done" and sorted(layer.kind for layer in added) == ["dyads", "scalar"]
            for layer in added:
                win.document.remove_layer(layer)
    assert "cancelled" in states

    session = tmp_path / "case.tractlens"
    for delay in DELAYS_S:
        win.save_session(session)
        cancel_all_after(win, delay)
        assert_consistent(win, f"session save cancelled after {delay} s")
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written
    win.save_session(session)
    assert win.wait_for_jobs(60) and session.exists()
    names = [layer.name for layer in win.document.layers]
    for delay in DELAYS_S:
        win.open_session(session)
        cancel_all_after(win, delay)
        assert_consistent(win, f"session open cancelled after {delay} s")
        assert [layer.name for layer in win.document.layers] == names  # replaced whole, or not at all
