"""The window's first impression (issue 45), what was left: one unit per quantity in the
tracking panels (the geodesic step in mm), messages in the window's words (no command-line
flags), the same Track feedback for every tracking panel, units in the Statistics table and
the first-steps hint as the first thing a newcomer reads. Each on the real window, with a
screenshot in tests/_artifacts/first_impression_*.png."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QLabel

from tests.conftest import ARTIFACTS
from tests.gui.test_first_impression import on_screen, resize_to
from tractlens.gpu.geodesic_params import GeodesicParams

FLAG = re.compile(r"(?<![\w-])--[a-z]")  # a command-line flag: "--tensor-order", "--device"


def test_probabilistic_track_brings_its_panel_forward_selects_centres_and_counts(
    window, demo_bedpostx, demo_dir, qtbot
):
    win = window
    win.open_paths([demo_bedpostx])
    assert win.wait_for_jobs(60)
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    assert win.wait_for_jobs(60)
    panel = win.probabilistic_panel
    panel.form.editors["n_samples"].setValue(20)
    win.findChild(QDockWidget, "dock_deterministic_tracking").raise_()  # another panel in front
    before = np.array(win.document.cursor, dtype=float)
    menu = next(action for action in win.menuBar().actions() if action.text() == "&Track").menu()
    next(action for action in menu.actions() if action.text() == "&Probabilistic (probtrackx)").trigger()
    assert panel.job_id is not None
    counted = win.statusBar().findChild(QLabel, "last_result")  # the permanent part of the status bar
    qtbot.waitUntil(lambda: "Probabilistic tracking" in counted.text(), timeout=120_000)
    assert win.wait_for_jobs(120) and win.errors == [], win.errors
    result = panel.result_layer
    kept = int(panel.result.waytotal)
    assert kept > 0 and f"{kept:,} streamlines kept in layer {result.name}" in counted.text()
    assert not win.first_steps.hint.isVisible() and "New ROI" not in win.statusBar().currentMessage()
    assert counted.isVisible()
    assert on_screen(win.findChild(QDockWidget, "dock_probabilistic_tracking").widget())
    assert win.layer_panel.selected_layer() is result
    # centred: the cursor moved into the path distribution
    cursor = np.array(win.document.cursor, dtype=float)
    assert not np.allclose(cursor, before)
    to_paths = np.linalg.solve(result.data.affine, win.document.reference_affine)
    ijk = np.rint(to_paths[:3, :3] @ cursor + to_paths[:3, 3]).astype(int)
    near = result.data.data[tuple(slice(max(0, c - 2), c + 3) for c in ijk)]
    assert near.any()
    win.save_screenshot(ARTIFACTS / "first_impression_probabilistic_tracked.png")


def test_after_the_demo_the_status_bar_says_the_first_steps(demo_window, qtbot):
    from tractlens.widgets.controllers.first_steps import HINT

    win = demo_window
    resize_to(win, qtbot, 1280, 800)
    message = win.statusBar().currentMessage()
    assert message == HINT, message
    assert "lesion" not in message.lower()
    assert win.errors == []
    win.save_screenshot(ARTIFACTS / "first_impression_first_screen_status.png")


def test_the_statistics_table_gives_diffusivities_their_unit(demo_window, demo_dir, qtbot):
    win = demo_window
    panel = win.statistics_panel
    win.findChild(QDockWidget, "dock_statistics").raise_()
    panel.layer_box.choose(win.document.layer("bundles"))
    panel.refresh()
    assert win.wait_for_jobs(60) and win.errors == []
    qtbot.waitUntil(lambda: panel.statistics is not None, timeout=10_000)
    rows = {panel.table.item(r, 0).text(): panel.table.item(r, 1).text() for r in range(panel.table.rowCount())}
    assert rows["MD along mean"].endswith(" mm²/s") and "±" in rows["MD along mean"], rows
    value = float(rows["MD along mean"].split()[0])
    assert 1e-4 < value < 3e-3  # a white-matter MD in mm²/s (the unit is the values', not a label)
    assert not rows["FA along mean"].endswith("/s")  # FA has no unit
    win.save_screenshot(ARTIFACTS / "first_impression_statistics_units.png")

    roi = win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    panel.layer_box.choose(roi)
    panel.refresh()
    assert win.wait_for_jobs(60)
    qtbot.waitUntil(lambda: panel.statistics is not None and panel.statistics.kind == "roi", timeout=10_000)
    rows = {panel.table.item(r, 0).text(): panel.table.item(r, 1).text() for r in range(panel.table.rowCount())}
    assert rows["MD inside mean"].endswith(" mm²/s"), rows


def test_the_geodesic_step_is_in_mm_like_the_other_panels_and_the_command_line(demo_window, demo_dir, qtbot):
    from tractlens.app.cli.parser import build_command_parser
    from tractlens.app.cli.track import geodesic_params
    from tractlens.app.pipelines.track import tensor_field_of
    from tractlens.gpu.params import default_of, field_of

    win = demo_window
    panel = win.geodesic_panel
    step = panel.form.editors["step"]
    others = (win.deterministic_panel.form.editors["step_mm"], win.probabilistic_panel.form.editors["step_mm"])
    assert [box.suffix() for box in others] == [step.suffix()] * 2 == [" mm"] * 2
    tensors = win.document.layer("tensors")
    voxel_mm = float(np.min(tensors.data.voxel_size))
    assert voxel_mm == pytest.approx(2.0)  # the demo's 2 mm voxels: mm and voxels differ
    # the default is the dataclass's (voxels), shown in mm for these tensors; so are the limits
    assert step.value() == pytest.approx(default_of(GeodesicParams, "step") * voxel_mm)
    lo, hi = field_of(GeodesicParams, "step").metadata["limits"]
    assert (step.minimum(), step.maximum()) == pytest.approx((lo * voxel_mm, hi * voxel_mm))

    win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    win.open_roi(demo_dir / "roi_arc_target.nii.gz", role="target")
    assert win.wait_for_jobs(60)
    assert step.value() == pytest.approx(default_of(GeodesicParams, "step") * voxel_mm)
    panel.directions.setValue(30)
    step.setValue(0.5)  # mm
    win.open_roi(demo_dir / "lesion.nii.gz", role="lesion")  # a new layer keeps what was typed
    assert win.wait_for_jobs(60) and step.value() == pytest.approx(0.5)
    win.findChild(QDockWidget, "dock_geodesic_tracking").raise_()
    qtbot.mouseClick(panel.track_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(180) and win.errors == [], win.errors
    used = panel.result_layer.provenance["parameters"]["step"]
    assert used == pytest.approx(0.5 / voxel_mm)  # voxels, as the engine takes it
    # the same number as the command line's --step 0.5 on these tensors
    args = build_command_parser().parse_args(
        ["track", "geodesic", "--tensor", "t.nii.gz", "--seed", "s.nii.gz", "--step", "0.5", "-o", "o.trk"]
    )
    assert geodesic_params(args, tensor_field_of(win.document, tensors.data)).step == pytest.approx(used)
    win.save_screenshot(ARTIFACTS / "first_impression_geodesic_step_mm.png")


def test_messages_in_the_window_name_no_command_line_flag(demo_window, demo_dir, qtbot, tmp_path):
    import nibabel as nib

    from tractlens.app.errors import InputError
    from tractlens.app.io import load_tensor

    win = demo_window
    # A 6-volume tensor file that does not say its element order: the command line's message names
    # --tensor-order (its tests hold it to that); the window's says it in words.
    path = tmp_path / "tensor_of_unknown_order.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((6, 6, 6, 6), np.float32), np.eye(4)), path)
    try:
        load_tensor(path)
        raise AssertionError("an order-less tensor file was read")
    except InputError as exc:
        assert "--tensor-order fsl" in str(exc)
    win.open_paths([path])
    assert win.wait_for_jobs(60)
    assert win.errors and "element order" in win.errors[-1], win.errors
    assert "dtifit" in win.errors[-1] and not FLAG.search(win.errors[-1]), win.errors[-1]
    shown = win.statusBar().currentMessage()
    assert "element order" in shown and not FLAG.search(shown), shown
    failed = [j for j in win.runner.jobs.values() if j.error]  # the Jobs dock shows these
    assert failed and all(not FLAG.search(j.error) for j in failed), [j.error for j in failed]
    win.findChild(QDockWidget, "dock_jobs").raise_()
    labels = [label.text() for label in win.findChildren(QLabel) if label.isVisible()]
    assert any("element order" in text for text in labels) and not any(FLAG.search(t) for t in labels), labels
    win.save_screenshot(ARTIFACTS / "first_impression_message_without_flags.png")

    # A panel's status line too: two-point tracking with the eikonal method (a use-case error
    # that names --two-point and --method on the command line).
    panel = win.geodesic_panel
    win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    win.open_roi(demo_dir / "roi_arc_target.nii.gz", role="target")
    assert win.wait_for_jobs(60)
    panel.method.setCurrentText("eikonal")
    panel.two_point.setChecked(True)
    panel.track()
    assert win.wait_for_jobs(60)
    assert "ray tracing" in panel.status.text() and not FLAG.search(panel.status.text()), panel.status.text()
    assert "“Two-point”" in panel.status.text() and not FLAG.search(win.errors[-1]), win.errors[-1]
