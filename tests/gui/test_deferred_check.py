"""The window draws an uncompressed .trx before checking its positions (issue 41: open to first
frame), then checks them on a worker: a file with a NaN point is still refused, with the message
opening gave before, and the layer goes; what the user had open stays. Real window, Xvfb."""

from __future__ import annotations

import shutil
import threading
import zipfile

import numpy as np

from tests.benchmarks.bench_render import synthetic_trx
from tests.conftest import ARTIFACTS
from tractlens.app import loaders
from tractlens.widgets.controllers import files


def nan_trx(tmp_path, n=3000):
    """A copy of the synthetic .trx with point 1234's y made NaN in place (still uncompressed)."""
    path = tmp_path / "damaged.trx"
    shutil.copy(synthetic_trx(tmp_path / "cache", n, 40), path)
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.startswith("positions"))
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    with open(path, "r+b") as handle:
        handle.seek(start + (1234 * 3 + 1) * 4)
        handle.write(np.float32(np.nan).tobytes())
    return path


def test_a_trx_with_a_nan_point_is_drawn_then_refused_and_nothing_else_is_lost(
    window, qtbot, tmp_path, monkeypatch, request
):
    good = synthetic_trx(tmp_path / "good", 2000, 40)
    window.open_paths([good])
    assert window.wait_for_jobs(120) and window.errors == []
    kept = window.document.layers[0]
    kept.set_selection(np.arange(len(kept.data)) % 2 == 0, by="a test")
    # the check waits until the damaged file is in the document and drawn
    drawn, checking = threading.Event(), []
    real_check = files.check_opened

    def held_check(layer):
        checking.append(layer)
        assert drawn.wait(60)
        return real_check(layer)

    monkeypatch.setattr(files, "check_opened", held_check)
    request.addfinalizer(drawn.set)  # a failure below must not leave the worker waiting
    window.open_paths([nan_trx(tmp_path)])
    view = window.view3d
    qtbot.waitUntil(lambda: len(window.document.layers) == 2 and bool(checking), timeout=60_000)
    damaged = window.document.layers[1]
    assert damaged.name == "damaged" and loaders.check_pending(damaged)
    qtbot.waitUntil(lambda: id(damaged) in view._fibers, timeout=10_000)
    view._render_now()
    ARTIFACTS.mkdir(exist_ok=True)
    window.save_screenshot(ARTIFACTS / "deferred_check_drawn.png")  # both drawn: the check still running
    drawn.set()
    assert window.wait_for_jobs(120)
    # refused as opening refused it before, and taken out of the view
    assert len(window.errors) == 1, window.errors
    assert "damaged.trx" in window.errors[0] and "NaN or infinite" in window.errors[0]
    assert window.document.layers == [kept] and id(damaged) not in view._fibers
    assert "NaN or infinite" in window.statusBar().currentMessage()
    # what the user had: the other tractogram, its selection, the grid
    assert kept.selection is not None and kept.selection.sum() == 1000
    np.testing.assert_array_equal(window.document.reference_affine, kept.data.affine)
    view._render_now()
    window.save_screenshot(ARTIFACTS / "deferred_check_refused.png")


def test_a_sound_trx_is_checked_after_it_is_drawn_and_the_slices_then_draw_it(window, qtbot, tmp_path):
    path = synthetic_trx(tmp_path, 2000, 40)
    window.open_paths([path])
    assert window.wait_for_jobs(120) and window.errors == []
    (layer,) = window.document.layers
    assert layer.data.mapped is not None and layer.data.mapped.checked and layer.data.mapped.positions_fit()
    assert not loaders.check_pending(layer)
    names = [job.name for job in window.runner.jobs.values()]
    assert names == [f"open {path.name}", f"check the positions of {path.name}"]


def test_a_trx_with_a_nan_point_opened_alone_leaves_an_empty_window_and_one_message(window, tmp_path):
    window.open_paths([nan_trx(tmp_path)])
    assert window.wait_for_jobs(120)
    assert window.document.layers == [] and window.document.reference_affine is None
    assert len(window.errors) == 1 and "NaN or infinite" in window.errors[0], window.errors
    window.save_screenshot(ARTIFACTS / "deferred_check_alone.png")
    # the window is as before: a sound file opened next is framed and drawn (no NaN left in the camera)
    window.open_paths([synthetic_trx(tmp_path / "good", 2000, 40)])
    assert window.wait_for_jobs(120) and len(window.errors) == 1
    view = window.view3d
    view._render_now()
    assert np.isfinite(view.plotter.camera.position).all()
    assert int((view.screenshot().max(axis=-1) > 40).sum()) > 2000


def test_cancelling_the_check_takes_the_file_back_out(window, qtbot, tmp_path, monkeypatch, request):
    path = synthetic_trx(tmp_path, 2000, 40)
    release = threading.Event()
    request.addfinalizer(release.set)
    real_check = files.check_opened
    monkeypatch.setattr(files, "check_opened", lambda layer: release.wait(60) and real_check(layer))
    window.open_paths([path])
    name = f"check the positions of {path.name}"
    qtbot.waitUntil(lambda: any(job.name == name for job in window.runner.jobs.values()), timeout=60_000)
    (job_id,) = [job_id for job_id, job in window.runner.jobs.items() if job.name == name]
    assert len(window.document.layers) == 1  # drawn meanwhile
    window.runner.cancel(job_id)
    release.set()
    assert window.wait_for_jobs(120)
    assert window.document.layers == [] and window.errors == []
