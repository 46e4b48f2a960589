"""COMMIT in the GUI: the panel from a tractogram's menu, the weights as a per-streamline scalar,
the weight threshold, the NRMSE map, cancel and refusals, a mask layer, a peaks file and Save
outputs… (real window, NumPy backend)."""

from __future__ import annotations

import nibabel as nib
import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget

from tests.conftest import ARTIFACTS
from tests.gui.actions import choose_from_layer_menu
from tractlens.app.grid import Grid
from tractlens.app.io import load_dwi, load_tractogram
from tractlens.app.model import DWIVolume, Layer, RoiMask
from tractlens.app.pipelines.commit import COMMIT_OUTPUTS, commit_pipeline
from tractlens.gpu.commit import CommitParams
from tractlens.widgets.commit_panel import NRMSE_NAME, THRESHOLD_STEPS, WEIGHT
from tractlens.widgets.panels import FILTER_COMMIT


def open_like_a_user(win, *paths) -> None:
    for path in paths:
        win.open_paths([path])
        assert win.wait_for_jobs(120)
    assert win.errors == []


def type_into(qtbot, box, text: str) -> None:
    box.selectAll()
    qtbot.keyClicks(box, text)


def test_commit_weights_threshold_and_nrmse_map(window, demo_dir, qtbot):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    bundles = doc.layer("bundles")
    panel = win.commit_panel
    dock = win.findChild(QDockWidget, "dock_commit_filtering")

    # The tractogram's menu raises the panel with that tractogram chosen.
    win.findChild(QDockWidget, "dock_geodesic_tracking").raise_()
    choose_from_layer_menu(win, qtbot, bundles, FILTER_COMMIT)
    qtbot.waitUntil(lambda: not dock.visibleRegion().isEmpty(), timeout=3000)
    assert panel.tractogram_layer() is bundles
    assert panel.tract_box.currentText() == "bundles"
    # COMMIT 2's defaults in the form.
    defaults = CommitParams()
    assert (panel.lambda_box.value(), panel.max_iter_box.value()) == (defaults.lambda_, defaults.max_iter)
    assert panel.tol_box.value() == defaults.tol

    type_into(qtbot, panel.max_iter_box, "100")
    assert panel.params() == CommitParams(max_iter=100)
    before = list(doc.layers)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is not None
    assert win.wait_for_jobs(60)
    assert win.errors == []

    expected = commit_pipeline(doc.layer("dwi").data.dwi, bundles.data, params=CommitParams(max_iter=100), device="cpu")
    result = doc.layer("bundles (COMMIT)")
    assert result is panel.result_layer and result.kind == "tractogram"
    assert result.provenance["computed"] == "COMMIT filtering" and result.provenance["params"]["max_iter"] == 100
    assert [layer for layer in doc.layers if layer not in before] == [result, doc.layer(NRMSE_NAME)]
    assert WEIGHT not in bundles.data.streamline_scalars  # the opened layer is left as it was
    np.testing.assert_array_equal(result.data.streamline_scalars[WEIGHT], expected.weights)
    np.testing.assert_array_equal(result.data.points, bundles.data.points)
    assert result.color_by == WEIGHT and result.clim == (0.0, float(expected.weights.max()))
    nrmse = doc.layer(NRMSE_NAME)
    np.testing.assert_array_equal(nrmse.data.data, expected.maps()["fit_NRMSE"])
    np.testing.assert_array_equal(nrmse.data.affine, expected.affine)
    assert nrmse.kind == "scalar" and nrmse.clim == (0.0, 0.5)
    summary = expected.summary()
    text = panel.status.text()
    assert f"kept {summary['kept']} of {len(bundles.data)} streamlines" in text
    assert f"{summary['iterations']} iterations" in text and "in all on the CPU." in text  # words, not "cpu (x86_64)"
    assert f"({summary['device']})" not in text

    # Fibres coloured by weight (the original hidden): the screenshot to look at.
    bundles.set(visible=False)
    doc.layer("colour FA").set(visible=False)
    win.view3d.reset_camera()
    qtbot.wait(300)
    shot = win.save_screenshot(ARTIFACTS / "commit_weights.png")
    assert shot.exists()

    # The threshold: leftmost every streamline, then weight > (step - 1) / (steps - 1) × max.
    weights = expected.weights
    full = panel.full_layer
    for step in (THRESHOLD_STEPS // 2, THRESHOLD_STEPS * 3 // 4, 1, 0):
        panel.threshold.setValue(step)
        threshold = weights.max() * (step - 1) / (THRESHOLD_STEPS - 1)
        count = len(weights) if step == 0 else int((weights > threshold).sum())
        qtbot.waitUntil(lambda count=count: len(panel.result_layer.data) == count, timeout=10000)
        shown = panel.result_layer
        assert shown in doc.layers and shown.name == "bundles (COMMIT)" and shown.color_by == WEIGHT
        assert shown.clim == full.clim
        assert shown.provenance["computed"] == "COMMIT filtering"  # kept through the slider
        if step:
            assert 0 < count <= len(weights)
            np.testing.assert_array_equal(shown.data.streamline_scalars[WEIGHT], weights[weights > threshold])
        if step == THRESHOLD_STEPS // 2:
            assert count < len(weights)  # the demo's weights spread over the range: some are hidden
        assert f"{count} of {len(weights)} shown" in panel.threshold_label.text() or step == 0
    assert panel.result_layer is full
    assert win.wait_for_jobs(10)

    # The Filter menu raises the panel too.
    win.findChild(QDockWidget, "dock_geodesic_tracking").raise_()
    filter_menu = next(a.menu() for a in win.menuBar().actions() if a.text() == "F&ilter")
    next(a for a in filter_menu.actions() if a.text() == "&COMMIT filtering…").trigger()
    qtbot.waitUntil(lambda: not dock.visibleRegion().isEmpty(), timeout=3000)


def test_cancel_adds_nothing(window, demo_dir, qtbot):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    panel = win.commit_panel
    before = list(doc.layers)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    assert doc.layers == before
    assert panel.result_layer is None and panel.nrmse_layer is None
    assert "cancelled" in panel.status.text().lower()
    assert not panel.cancel_button.isEnabled() and not panel.threshold.isEnabled()
    assert win.errors == []


def test_refusals_without_dwi_or_tractogram(window, demo_dir, qtbot):
    win, doc = window, window.document
    panel = win.commit_panel
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is None and "Open a DWI series" in panel.status.text()
    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    doc.add_layer(Layer("dwi", DWIVolume("dwi", dwi), "dwi", visible=False))
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is None and "tractogram" in panel.status.text()
    assert panel.tract_box.count() == 0
    assert len(doc.layers) == 1 and len(win.errors) == 2


def pick_in_combo(qtbot, box, text: str) -> None:
    """Open a combo box's list and click the item ``text``, as a user would."""
    index = box.findText(text)
    assert index >= 0, (text, [box.itemText(i) for i in range(box.count())])
    box.showPopup()
    view = box.view()
    qtbot.waitUntil(view.isVisible, timeout=3000)
    rect = view.visualRect(view.model().index(index, 0))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=3000)
    assert box.currentText() == text


def half_brain_roi(win, demo_dir) -> Layer:
    """The demo's brain mask opened as an ROI, the half with voxel index x ≥ X / 2 erased with the
    ROI edits (as the eraser does)."""
    doc = win.document
    layer = win.open_roi(demo_dir / "mask.nii.gz", role="stop")
    assert layer is not None
    layer.set(name="half brain")
    right = np.argwhere(layer.data.mask)
    right = right[right[:, 0] >= layer.data.mask.shape[0] // 2]
    assert doc.paint(layer, right, False) == len(right) > 0
    return layer


def test_commit_within_a_mask_layer(window, demo_dir, qtbot):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    bundles, dwi = doc.layer("bundles"), doc.layer("dwi").data.dwi
    panel = win.show_commit_panel(bundles)
    assert panel.mask_box.currentText().startswith("none") and panel.mask_layer() is None

    roi = half_brain_roi(win, demo_dir)
    # An ROI on a grid twice as coarse as the DWI's, over its left half (voxel index x < X / 2).
    coarse_shape = tuple(-(-n // 2) for n in dwi.shape3)
    coarse = np.zeros(coarse_shape, bool)
    coarse[: coarse_shape[0] // 2] = True
    elsewhere = Layer("coarse ROI", RoiMask("coarse ROI", coarse, dwi.affine @ np.diag([2.0, 2.0, 2.0, 1.0])), "roi")
    doc.add_layer(elsewhere)
    items = [panel.mask_box.itemText(i) for i in range(panel.mask_box.count())]
    assert items[1:] == ["half brain", "coarse ROI"]  # every ROI: one on another grid is resampled

    pick_in_combo(qtbot, panel.mask_box, "half brain")
    assert panel.mask_layer() is roi
    type_into(qtbot, panel.max_iter_box, "100")
    mask = roi.data.mask.copy()
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is not None and "within half brain" in panel.status.text()
    roi.data.mask[...] = True  # edits after the start do not reach the job (it has a copy)
    assert win.wait_for_jobs(60)
    assert win.errors == []
    roi.data.mask[...] = mask

    params = CommitParams(max_iter=100)
    expected = commit_pipeline(dwi, bundles.data, mask=mask, params=params, device="cpu")
    np.testing.assert_allclose(panel.weights, expected.weights, rtol=0, atol=1e-10)
    np.testing.assert_allclose(
        doc.layer("bundles (COMMIT)").data.streamline_scalars[WEIGHT], expected.weights, rtol=0, atol=1e-10
    )
    # The fitted voxels: those of the mask the streamlines pass (with no mask, every one they pass).
    everywhere = commit_pipeline(dwi, bundles.data, params=CommitParams(max_iter=1), device="cpu")
    traversed = everywhere.rows >= 0
    assert panel.summary["voxels"] == int((traversed & mask).sum()) == panel.result.problem.n_rows
    np.testing.assert_array_equal(panel.result.rows >= 0, traversed & mask)
    assert 0 < panel.summary["voxels"] < int(traversed.sum())  # the mask left voxels out
    assert panel.save_button.isEnabled()

    # The panel after the run: it must not ask for more width than the tracking panels it is
    # tabbed with (the dock would widen and the views shrink).
    widest = max(
        p.minimumSizeHint().width() for p in (win.deterministic_panel, win.geodesic_panel, win.probabilistic_panel)
    )
    assert panel.minimumSizeHint().width() <= widest
    dock = win.findChild(QDockWidget, "dock_commit_filtering")
    qtbot.waitUntil(lambda: not dock.visibleRegion().isEmpty(), timeout=3000)
    assert panel.width() >= panel.minimumSizeHint().width()
    shot = ARTIFACTS / "commit_panel.png"
    assert dock.grab().save(str(shot)) and shot.exists()
    for layer in (roi, elsewhere, bundles, doc.layer("colour FA")):
        layer.set(visible=False)  # the weighted fibres over the FA
    win.view3d.reset_camera()
    qtbot.wait(200)
    win.save_screenshot(ARTIFACTS / "commit_mask_window.png")

    # An ROI on another grid: resampled onto the DWI's (nearest neighbour), as tractlens commit does.
    panel.choose_mask(elsewhere)
    assert panel.mask_box.currentText() == "coarse ROI"
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is not None and "within coarse ROI" in panel.status.text()
    assert win.wait_for_jobs(60)
    assert win.errors == []
    on_dwi_grid = Grid.of(dwi).resample_nearest(coarse, Grid.of(elsewhere.data))
    assert 0 < on_dwi_grid.sum() < on_dwi_grid.size
    expected = commit_pipeline(dwi, bundles.data, mask=on_dwi_grid, params=params, device="cpu")
    np.testing.assert_allclose(panel.weights, expected.weights, rtol=0, atol=1e-10)
    assert any("coarse ROI" in note and "resampled" in note for note in panel.result.notes)
    assert "resampled" in panel.status.text()


def write_peaks(path, dwi) -> None:
    """A peaks file on the DWI's grid: one peak, along world x, in every voxel."""
    peaks = np.zeros((*dwi.shape3, 3), np.float32)
    peaks[..., 0] = 1.0
    nib.save(nib.Nifti1Image(peaks, dwi.affine), str(path))


def test_peaks_file_refused_when_missing_and_passed_when_given(window, demo_dir, qtbot, tmp_path):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    bundles, dwi = doc.layer("bundles"), doc.layer("dwi").data.dwi
    panel = win.show_commit_panel(bundles)
    type_into(qtbot, panel.max_iter_box, "20")

    missing = tmp_path / "no such peaks.nii.gz"
    panel.peaks_edit.setFocus()
    qtbot.keyClicks(panel.peaks_edit, str(missing))
    jobs = len(win.runner.jobs)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is None and len(win.runner.jobs) == jobs and win.runner.active() == []
    text = panel.status.text()
    assert "peaks file" in text and str(missing) in text and "not found" in text  # tractlens commit's words
    assert win.errors == [text]
    assert not panel.cancel_button.isEnabled() and panel.result is None

    # Browse… fills the field (the dialog's answer supplied by the test); Filter passes the file.
    peaks = tmp_path / "peaks.nii.gz"
    write_peaks(peaks, dwi)
    panel._ask_peaks_file = lambda: str(peaks)
    qtbot.mouseClick(panel.peaks_button, Qt.MouseButton.LeftButton)
    assert panel.peaks_edit.text() == str(peaks)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is not None
    assert win.wait_for_jobs(60)
    assert len(win.errors) == 1
    expected = commit_pipeline(dwi, bundles.data, peaks=peaks, params=CommitParams(max_iter=20), device="cpu")
    np.testing.assert_allclose(panel.weights, expected.weights, rtol=0, atol=1e-10)
    # One EC compartment per fitted voxel (the file's single peak), not the segments' orientations.
    assert panel.summary["ec_compartments"] == panel.summary["voxels"] == expected.problem.n_rows


def test_save_outputs_writes_the_commit_files_and_asks_before_replacing(window, demo_dir, qtbot, tmp_path):
    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    panel = win.show_commit_panel(doc.layer("bundles"))
    assert not panel.save_button.isEnabled()
    type_into(qtbot, panel.max_iter_box, "50")
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    assert panel.save_button.isEnabled() and panel.result is not None

    out = tmp_path / "commit out"
    out.mkdir()
    asked, answers = [], []
    panel._ask_folder = lambda: str(out)
    panel._confirm_overwrite = lambda folder, existing: asked.append((folder, existing)) or answers.pop(0)

    qtbot.mouseClick(panel.save_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(30)
    assert win.errors == [] and asked == []  # an empty folder: nothing to ask
    names = sorted(name.format(ext=".trk") for name in COMMIT_OUTPUTS)
    assert sorted(p.name for p in out.iterdir()) == names
    saved = np.loadtxt(out / "streamline_weights.txt")
    np.testing.assert_allclose(saved, panel.weights, rtol=1e-8, atol=0)
    assert np.array_equal(saved == 0, panel.weights == 0)
    filtered = load_tractogram(out / "tractogram_filtered.trk")
    assert len(filtered) == panel.summary["kept"]
    assert panel.status.text() == f"Saved {len(names)} COMMIT files to {out}."

    # Again into the same folder: asked first; "No" writes nothing.
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    jobs = len(win.runner.jobs)
    answers.append(False)
    qtbot.wait(50)
    qtbot.mouseClick(panel.save_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(30)
    assert len(asked) == 1 and asked[0][0] == out and sorted(asked[0][1]) == names
    assert len(win.runner.jobs) == jobs
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert "Not saved" in panel.status.text()
    # "Yes" replaces them.
    answers.append(True)
    qtbot.mouseClick(panel.save_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(30)
    assert len(asked) == 2 and win.errors == []
    after = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert sorted(after) == names and all(after[name] > stamps[name] for name in names)


def test_filtered_tractogram_keeps_the_format_it_was_read_in(tmp_path):
    """The COMMIT panel writes its filtered tractogram in the input's format (.tck in, .tck out)."""
    from tractlens.app.io import load_tractogram, save_tractogram
    from tractlens.app.model import Layer, Tractogram
    from tractlens.widgets.commit_panel import tractogram_suffix

    rng = np.random.default_rng(0)
    tract = Tractogram.from_list([rng.uniform(0, 9, size=(4, 3))], affine=np.eye(4), dimensions=(10, 10, 10))
    for suffix in (".tck", ".trx", ".trk"):
        back = load_tractogram(save_tractogram(tract, tmp_path / f"t{suffix}"), reference=(np.eye(4), (10, 10, 10)))
        assert tractogram_suffix(Layer("t", back, "tractogram")) == suffix
    assert tractogram_suffix(Layer("t", tract, "tractogram")) == ".trk"  # computed: .trk


def test_a_commit_run_without_the_host_memory_is_refused_as_the_jobs_error(window, demo_dir, qtbot, monkeypatch):
    """The memory guard of the use case the panel's job calls: on a CPU with too little free
    memory the run is refused before it starts, its message (the need, what is free, what to
    change) shown as the job's error, and nothing is added."""
    from tractlens.app import memory_guard

    win, doc = window, window.document
    open_like_a_user(win, demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk")
    panel = win.show_commit_panel(doc.layer("bundles"))
    panel.device = "cpu"  # the guard is the CPU engine's
    monkeypatch.setattr(memory_guard, "host_free_bytes", lambda: 1 << 20)
    before = list(doc.layers)
    qtbot.mouseClick(panel.filter_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    assert len(win.errors) == 1
    text = win.errors[0]
    assert "COMMIT on the CPU needs about" in text and "only 1 MiB is free" in text and "white-matter mask" in text
    assert text in panel.status.text()
    assert list(doc.layers) == before and panel.result is None
