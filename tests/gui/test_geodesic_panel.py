"""The Geodesic tracking panel: region-to-region fibres ranked by CM, the top-x % slider, live mode."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS, DEVICES

ENGINE = {"cpu": "NumPy engine", "gpu": "GPU engine"}
WAIT = {"cpu": "the worker still tracking the rest holds the GIL", "gpu": "the worker waits on the GPU for the rest"}


def _gl_renderer(win) -> str:
    """The OpenGL renderer string VTK reports for the 3-D view (llvmpipe, an NVIDIA GPU, ...)."""
    info = win.view3d.plotter.ren_win.ReportCapabilities() or ""
    return next((line.split(":", 1)[1].strip() for line in info.splitlines() if "renderer string" in line), "unknown")


# ``window_device`` is the window's compute device: the CPU (NumPy) by default; the ``gpu``
# variant (pytest -m gpu, on a machine with CUDA, Qt and a display) runs the same path on CuPy.
@pytest.mark.parametrize("window_device", DEVICES)
def test_region_to_region_fibres_are_ranked_filtered_and_retracked_live(demo_window, demo_dir, qtbot, window_device):
    win = demo_window
    panel = win.geodesic_panel
    seed = win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    target = win.open_roi(demo_dir / "roi_arc_target.nii.gz", role="target")
    panel.directions.setValue(30)
    panel.form.editors["step"].setValue(0.5)  # mm: 0.25 of the demo's 2 mm voxels
    qtbot.mouseClick(panel.track_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(180)
    assert win.errors == []
    layer = panel.result_layer
    tract = layer.data
    assert layer.color_by == "cm" and len(tract) > 20
    cm = tract.streamline_scalars["cm"]
    assert np.all(np.diff(cm) <= 1e-6)  # best first
    from tractlens.gpu.select import select_streamlines

    assert select_streamlines(tract.points, tract.offsets, [target.data.mask], device="cpu").selected.all()
    assert "reached the target" in panel.status.text()

    panel.top.setValue(10)
    qtbot.waitUntil(lambda: len(panel.result_layer.data) == int(np.ceil(len(tract) * 0.1)), timeout=20000)
    assert win.wait_for_jobs(30)
    best = panel.result_layer.data.streamline_scalars["cm"]
    np.testing.assert_allclose(best, cm[: len(best)])
    # The 3-D view reused the actor for the new result: its colours follow the new range.
    mapper = win.view3d._fibers[id(panel.result_layer)]["actor"].GetMapper()
    np.testing.assert_allclose(mapper.GetScalarRange(), panel.result_layer.clim)
    np.testing.assert_allclose(mapper.GetLookupTable().GetTableRange(), panel.result_layer.clim)
    print("top 10 %: colour range", panel.result_layer.clim)
    for name in ("colour FA", "bundles", "FA"):
        win.document.layer(name).set(visible=False)
    win.save_screenshot(ARTIFACTS / "geodesic_top10.png")

    # Live: moving the seed ROI re-tracks by itself; a newer edit supersedes an older run.
    panel.top.setValue(100)
    panel.live.setChecked(True)
    before = panel.result_layer
    voxels = np.argwhere(seed.data.mask)
    t0 = time.perf_counter()  # before the edit: the panel's latency is measured from it
    win.document.paint(seed, voxels[:5], False)
    win.document.paint(seed, voxels[5:10], False)
    qtbot.waitUntil(lambda: panel.job_id is not None or panel.result_layer is not before, timeout=5000)
    assert win.wait_for_jobs(180)
    assert panel.result_layer is not before and win.errors == []
    # consistent, not fast (the time is the benchmark's, tests/benchmarks/bench_geodesic.py): measured
    # from the edit to the document, within the time this test waited
    assert panel.latency_s is not None and 0 < panel.latency_s <= time.perf_counter() - t0
    shown = panel.shown_at
    qtbot.waitUntil(lambda: any(start >= shown for start, _ in win.view3d.renders), timeout=5000)
    start, end = next((s, e) for s, e in win.view3d.renders if s >= shown)
    assert start >= shown  # the 3-D view drew the new result after it reached the document
    drawn = panel.latency_s + (end - shown)
    first = len(panel.result_layer.data) if panel.job_id is None else None
    print(
        f"live re-track ({ENGINE[window_device]}, {_gl_renderer(win)}): first fibres drawn "
        f"{drawn * 1000:.0f} ms after the edit: {panel.latency_s * 1000:.0f} ms to the document (of which "
        f"{panel.show_s * 1000:.0f} ms on the GUI thread: actors), {(start - shown) * 1000:.0f} ms until the "
        f"render ({WAIT[window_device]}), {(end - start) * 1000:.0f} ms drawing; {first} streamlines in the end"
    )
