"""The Deterministic tracking panel on a real window: ROIs in their roles, live results, cancel."""

from __future__ import annotations

import nibabel as nib
import numpy as np
from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS


def click(qtbot, button):
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def bundle_fraction(tract, labels, label):
    from scipy import ndimage

    own = ndimage.binary_dilation(labels == label)
    index = np.clip(np.floor(tract.points + 0.5).astype(int), 0, np.array(labels.shape) - 1)
    return own[tuple(index.T)].mean()


def passes(tract, mask):
    from tractlens.gpu.select import select_streamlines

    return select_streamlines(tract.points, tract.offsets, [mask], device="cpu").selected


def test_tracking_from_a_seed_roi_grows_live_and_stays_in_the_bundle(demo_window, demo_dir, qtbot, monkeypatch):
    from tractlens.widgets import tracking_panel

    monkeypatch.setattr(tracking_panel, "GUI_BATCH", 64)  # several batches: watch the result grow
    monkeypatch.setattr(tracking_panel, "PARTIAL_INTERVAL_S", 0.0)
    win = demo_window
    panel = win.deterministic_panel
    win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    sizes = []
    win.runner.job_partial.connect(lambda _id, layer: sizes.append(len(layer.data)))
    panel.form.editors["integrator"].setCurrentText("rk4")
    panel.form.editors["min_length_mm"].setValue(10.0)
    panel.seeds_per_voxel.setValue(4)  # a denser bundle than the default one seed per voxel
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    assert win.errors == []
    result = win.document.layer("deterministic")
    assert result is panel.result_layer
    assert result.provenance["computed"] == "deterministic tracking"  # the report shows it
    assert result.provenance["parameters"]["step_mm"] > 0 and result.provenance["backend"] == "cpu"
    n = len(result.data)
    assert n >= 0.9 * 4 * 40  # 40 seed voxels x 4 seeds, nearly all long enough
    assert len(sizes) >= 2 and sizes == sorted(sizes) and sizes[-1] <= n  # it grew batch by batch
    labels = np.asarray(nib.load(demo_dir / "labels.nii.gz").dataobj)
    assert bundle_fraction(result.data, labels, 3) > 0.95
    assert "streamlines from" in panel.status.text()
    for name in ("colour FA", "bundles", "FA"):
        win.document.layer(name).set(visible=False)
    win.view3d.reset_camera()
    image = win.view3d.screenshot()
    coloured = (image.max(axis=-1).astype(int) - image.min(axis=-1)) > 60  # direction-coloured fibre pixels
    assert coloured.sum() > 500, coloured.sum()
    win.save_screenshot(ARTIFACTS / "tracking_arc.png")


def test_target_exclusion_and_stop_rois_apply(demo_window, demo_dir, qtbot):
    win = demo_window
    panel = win.deterministic_panel
    win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    target = win.open_roi(demo_dir / "roi_arc_target.nii.gz", role="target")
    panel.form.editors["min_length_mm"].setValue(5.0)
    panel.seeds_per_voxel.setValue(4)  # enough streamlines to judge each role
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    kept = panel.result_layer.data
    assert len(kept) > 50
    assert passes(kept, target.data.mask).all()

    # The target as a stop region: streamlines now end in it, none beyond.
    win.document.set_roi_role(target, "stop")
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    stopped = panel.result_layer.data
    ends = np.concatenate([stopped[i][[0, -1]] for i in range(len(stopped))])
    index = np.floor(ends + 0.5).astype(int)
    assert target.data.mask[tuple(index.T)].mean() >= 0.4  # one end of most streamlines is in the stop region
    assert len(win.document.layers) == len({id(layer) for layer in win.document.layers})
    assert sum(layer.name == "deterministic" for layer in win.document.layers) == 1  # replaced, not stacked

    # As an exclusion region: every streamline that reached it is dropped.
    win.document.set_roi_role(target, "exclusion")
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    excluded = panel.result_layer.data
    assert len(excluded) == 0 or not passes(excluded, target.data.mask).any()
    assert "removed by" in panel.status.text()
    assert win.errors == []


def test_tracking_without_seeds_or_tensors_says_what_to_do(window, demo_window, qtbot):
    bare = window.__class__(device="cpu")
    qtbot.addWidget(bare)
    click(qtbot, bare.deterministic_panel.track_button)
    assert "tensor" in bare.deterministic_panel.status.text()
    assert bare.runner.active() == []
    bare.runner.shutdown(5)
    bare.close()

    panel = demo_window.deterministic_panel
    click(qtbot, panel.track_button)
    assert "seed ROI" in panel.status.text()
    assert demo_window.errors and "seed ROI" in demo_window.errors[-1]
    assert demo_window.runner.active() == []


def test_whole_brain_tracking_can_be_cancelled_and_keeps_what_it_showed(demo_window, qtbot, monkeypatch):
    from tractlens.widgets import tracking_panel

    monkeypatch.setattr(tracking_panel, "GUI_BATCH", 200)
    monkeypatch.setattr(tracking_panel, "PARTIAL_INTERVAL_S", 0.0)
    win = demo_window
    panel = win.deterministic_panel
    panel.whole_brain.setChecked(True)
    panel.seeds_per_voxel.setValue(8)  # ~75 k seeds: far more than arrive before the cancel
    click(qtbot, panel.track_button)
    qtbot.waitUntil(lambda: panel.result_layer is not None, timeout=60000)
    click(qtbot, panel.cancel_button)
    assert win.wait_for_jobs(60)
    assert "Cancelled" in panel.status.text()
    shown = panel.result_layer
    assert shown in win.document.layers and 0 < len(shown.data) < 60000
    assert win.errors == []


def test_tracking_parameters_are_validated_in_the_panel(demo_window, demo_dir, qtbot):
    win = demo_window
    panel = win.deterministic_panel
    win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    panel.form.editors["min_length_mm"].setValue(300.0)  # longer than the max length
    click(qtbot, panel.track_button)
    assert "min length" in panel.status.text()
    assert win.runner.active() == []
    panel.placement.setCurrentText("grid")
    panel.form.editors["min_length_mm"].setValue(10.0)
    panel.seeds_per_voxel.setValue(5)  # not a cube
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(60)
    assert win.errors and "not a cube" in win.errors[-1]
