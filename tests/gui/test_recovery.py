"""Autosave and crash recovery in the window: a killed process's ROIs come back exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ARTIFACTS
from tractlens.app.model import Layer, RoiMask, Volume
from tractlens.app.recovery import find_orphans, recovery_root

REPO = Path(__file__).resolve().parents[2]


def _kill_after_autosave(tmp_path) -> tuple[Path, Path]:
    """Run the drawing child until its autosave holds every edit, then SIGKILL it."""
    out = tmp_path / "expected.npz"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.gui.crash_child", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        deadline = time.monotonic() + 180
        line = ""
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if line.startswith("READY") or child.poll() is not None:
                break
        assert line.startswith("READY"), f"the child did not autosave: {line!r} {child.stderr.read()}"
        folder = Path(line.split(maxsplit=1)[1].strip())
        os.kill(child.pid, signal.SIGKILL)  # no clean-up of any kind runs
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL
    return out, folder


def test_a_killed_window_s_rois_are_restored_exactly_by_the_next_one(qtbot, tmp_path):
    from tractlens.widgets.main_window import MainWindow

    expected_file, folder = _kill_after_autosave(tmp_path)
    assert folder.parent == recovery_root() and (folder / "manifest.json").is_file()
    expected = np.load(expected_file)
    masks = {key.split(":", 1)[1]: expected[key] for key in expected.files if key.startswith("mask:")}
    roles = dict(expected["roles"].tolist())
    assert len(masks) == 3

    window = MainWindow(device="cpu", restore="yes")  # the next start
    qtbot.addWidget(window)
    window.resize(1200, 800)
    window.show()
    try:
        qtbot.waitUntil(lambda: sum(layer.kind == "roi" for layer in window.document.layers) == 3, timeout=60_000)
        doc = window.document
        np.testing.assert_array_equal(doc.layer("anat").data.data, expected["anat"])
        for name, mask in masks.items():
            layer = doc.layer(name)
            np.testing.assert_array_equal(layer.data.mask, mask)  # every voxel
            assert layer.data.role == roles[name]
        np.testing.assert_array_equal(doc.layer(name).data.affine, np.diag([2.0, 2.0, 2.0, 1.0]))
        # The restored work is autosaved by this window, then the dead window's folder goes.
        qtbot.waitUntil(lambda: not folder.exists(), timeout=30_000)
        own = window.autosave.store.folder
        manifest = json.loads((own / "manifest.json").read_text())
        assert sorted(e["name"] for e in manifest["layers"] if e["kind"] == "roi") == sorted(masks)
        assert find_orphans() == []  # nothing else is offered: our own folder is locked
        assert window.statusBar().currentMessage().startswith("Restored the autosaved")
        window.save_screenshot(ARTIFACTS / "recovery_restored.png")
    finally:
        window.runner.shutdown(10)
        window.close()
    assert not own.exists()  # a clean exit leaves no autosave behind


def _orphan_of(qtbot, tmp_path) -> Path:
    """A dead window's autosave, made in this process: a window that autosaves, then 'crashes'
    (its lock is dropped and its folder left, as the kernel does for a killed process)."""
    from tractlens.widgets.main_window import MainWindow

    window = MainWindow(device="cpu", autosave_s=0)
    qtbot.addWidget(window)
    roi = RoiMask("seed 1", np.zeros((6, 5, 4), bool), np.eye(4), role="seed")
    roi.mask[2:4, 1:3, 1] = True
    window.document.add_layer(Layer("anat", Volume("anat", np.ones((6, 5, 4), np.float32), np.eye(4)), "scalar"))
    window.document.add_layer(Layer("seed 1", roi, "roi"))
    assert window.autosave.save_now()
    assert window.autosave.saver.wait(30) and window.autosave.saver.writes == 1
    folder = window.autosave.store.folder
    window.autosave.store._lock.release()  # the process 'dies': the kernel drops its lock
    window.autosave.timer.stop()
    window.autosave = None  # nothing is cleaned up
    window.runner.shutdown(10)
    window.close()
    return folder


def test_later_keeps_the_autosave_and_discard_deletes_it(qtbot, tmp_path, monkeypatch):
    from tractlens.widgets.main_window import MainWindow
    from tractlens.widgets.session_io import offer_recovery

    folder = _orphan_of(qtbot, tmp_path)
    orphans = find_orphans()
    assert [o.folder for o in orphans] == [folder]
    assert orphans[0].roi_count == 1 and orphans[0].layer_names == ["anat", "seed 1"]
    orphans[0].release()

    window = MainWindow(device="cpu", autosave_s=0, restore="no")
    qtbot.addWidget(window)
    qtbot.wait(50)
    assert folder.exists() and window.document.layers == []  # kept, not restored
    assert "offered again" in window.statusBar().currentMessage()
    # With dialogs, the user is asked; Discard deletes the autosave.
    monkeypatch.delenv("TRACTLENS_NO_DIALOGS")
    from PySide6.QtWidgets import QMessageBox

    def click_discard(box):
        box.clickedButton = lambda: next(b for b in box.buttons() if b.text() == "Discard")
        return 0

    monkeypatch.setattr(QMessageBox, "exec", click_discard)
    assert offer_recovery(window, "ask") is None
    assert not folder.exists() and window.document.layers == []
    window.runner.shutdown(10)
    window.close()


def test_a_restore_that_fails_keeps_the_autosave(qtbot, tmp_path):
    from tractlens.widgets.main_window import MainWindow

    folder = _orphan_of(qtbot, tmp_path)
    (folder / "manifest.json").write_text("{not json")  # damaged on disk
    window = MainWindow(device="cpu", autosave_s=0, restore="yes")
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: bool(window.errors), timeout=10_000)
    window.wait_for_jobs(10)
    assert "could not be restored" in window.errors[0] and "damaged" in window.errors[0]
    assert folder.exists()
    window.runner.shutdown(10)
    window.close()


@pytest.mark.parametrize("interval", [0.2])
def test_autosave_writes_only_what_changed(qtbot, tmp_path, interval):
    from tractlens.widgets.main_window import MainWindow

    window = MainWindow(device="cpu", autosave_s=interval)
    qtbot.addWidget(window)
    doc = window.document
    doc.add_layer(Layer("anat", Volume("anat", np.ones((6, 5, 4), np.float32), np.eye(4)), "scalar"))
    roi = doc.add_layer(Layer("seed 1", RoiMask("seed 1", np.zeros((6, 5, 4), bool), np.eye(4)), "roi"))
    saver = window.autosave.saver
    qtbot.waitUntil(lambda: saver.writes >= 1 and not saver.busy, timeout=10_000)
    layers_dir = window.autosave.store.folder / "layers"
    before = {p.name: p.stat().st_mtime_ns for p in layers_dir.iterdir()}
    writes = saver.writes
    qtbot.wait(int(interval * 3000))  # several ticks with nothing changed: nothing written
    assert saver.writes == writes
    doc.paint(roi, np.array([[1, 1, 1], [2, 2, 2]]), True)
    qtbot.waitUntil(lambda: saver.writes == writes + 1 and not saver.busy, timeout=10_000)
    after = {p.name: p.stat().st_mtime_ns for p in layers_dir.iterdir()}
    anat = [name for name in before if "_data_" in name]
    assert anat and all(after.get(name) == before[name] for name in anat)  # the volume is not rewritten
    changed = set(after) - set(before)
    assert len(changed) == 1 and "_mask_" in changed.pop()  # only the painted ROI
    window.set_autosave_interval(0)
    assert window.autosave.interval_s == 0
    window.runner.shutdown(10)
    window.close()


def test_a_saved_session_keeps_the_view_settings(qtbot, tmp_path):
    """Save session in one window, open it in another: layers, cursor, radiological convention
    and the 3-D camera come back."""
    from tractlens.widgets.main_window import MainWindow

    first = MainWindow(device="cpu", autosave_s=0)
    qtbot.addWidget(first)
    first.resize(1000, 700)
    first.show()
    doc = first.document
    doc.add_layer(
        Layer("anat", Volume("anat", np.random.default_rng(1).uniform(size=(12, 10, 8)), np.eye(4)), "scalar")
    )
    doc.set_cursor((3, 4, 5))
    first._toggle_radiological()
    qtbot.wait(50)
    camera = first.view3d.plotter.camera
    camera.position, camera.focal_point, camera.up = (40.0, -30.0, 25.0), (6.0, 5.0, 4.0), (0.0, 0.0, 1.0)
    first.view3d._camera_set = True
    first.save_session(tmp_path / "view")
    assert first.wait_for_jobs(30) and first.errors == []

    second = MainWindow(device="cpu", autosave_s=0)
    qtbot.addWidget(second)
    second.resize(1000, 700)
    second.show()
    second.open_session(tmp_path / "view.tractlens")
    assert second.wait_for_jobs(30) and second.errors == []
    assert [layer.name for layer in second.document.layers] == ["anat"]
    np.testing.assert_array_equal(second.document.cursor, [3, 4, 5])
    assert all(view.radiological for view in second.views.values())
    restored = second.view3d.plotter.camera
    np.testing.assert_allclose(restored.position, (40.0, -30.0, 25.0))
    np.testing.assert_allclose(restored.focal_point, (6.0, 5.0, 4.0))
    for window in (first, second):
        window.runner.shutdown(10)
        window.close()
