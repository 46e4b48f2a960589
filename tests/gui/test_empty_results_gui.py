"""Empty results through every panel (issue 22): 0 streamlines, an empty tractogram layer, a
target nothing reaches. Each is an ordinary state: no internal error, the panel says why in its
own words, the views draw nothing, and sessions and the report take the empty layer."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS
from tractlens.app.model import Layer, RoiMask, Tractogram


def click(qtbot, button):
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def no_internal_error(win) -> None:
    assert not [e for e in win.errors if "internal error" in e.lower() or "Traceback" in e], win.errors


def add_empty_tractogram(win, name="nothing") -> Layer:
    doc = win.document
    tract = Tractogram(
        np.zeros((0, 3), np.float32),
        np.zeros(1, np.int64),
        doc.reference_affine,
        doc.reference_shape,
        point_scalars={"fa": np.zeros(0, np.float32)},
        streamline_scalars={"length_mm": np.zeros(0, np.float32)},
        name=name,
    )
    for layer in [layer for layer in doc.layers if layer.kind == "tractogram"]:
        doc.remove_layer(layer)  # the only tractogram: every panel picks it
    layer = doc.add_layer(Layer(name, tract, "tractogram"))
    assert win.wait_for_jobs(60)
    no_internal_error(win)
    return layer


def test_deterministic_tracking_to_a_target_nothing_reaches(demo_window, demo_dir, qtbot):
    """Defect 2: the demo's crossing_lr seed and target with default settings."""
    win = demo_window
    panel = win.deterministic_panel
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    win.open_roi(demo_dir / "roi_crossing_lr_target.nii.gz", role="target")
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    assert win.errors == []
    layer = win.document.layer("deterministic")
    assert layer is panel.result_layer and len(layer.data) == 0
    status = panel.status.text()
    assert status.startswith("0 streamlines: none of the") and "reached the target region" in status
    assert "minimum length" not in status
    win.view3d.reset_camera()
    win.view3d.screenshot()
    win.save_screenshot(ARTIFACTS / "empty_deterministic.png")


def test_geodesic_tracking_to_a_target_nothing_reaches(demo_window, demo_dir, qtbot):
    win, doc = demo_window, demo_window.document
    panel = win.geodesic_panel
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    corner = np.zeros(doc.reference_shape, bool)
    corner[0, 0, 0] = True  # outside the brain: no fibre gets there
    doc.add_layer(Layer("corner", RoiMask("corner", corner, doc.reference_affine, role="target"), "roi"))
    panel.directions.setValue(8)
    panel.method.setCurrentText("rays")
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    assert win.errors == []
    assert len(panel.result_layer.data) == 0
    assert panel.status.text().startswith("0 streamlines: none of the")
    assert "reached the target region" in panel.status.text()
    panel.top.setValue(50)  # the top-x % slider over nothing
    assert win.wait_for_jobs(30) and win.errors == []
    panel.method.setCurrentText("eikonal")  # no path of mask voxels to the corner: said so
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120) and win.errors == []
    assert len(panel.result_layer.data) == 0
    assert panel.status.text().startswith("0 streamlines: the tracking mask does not join"), panel.status.text()


PANELS = ["presurgical", "connectivity", "profile", "commit", "selection", "session", "report"]


@pytest.mark.parametrize("panel_name", PANELS)
def test_an_empty_tractogram_layer_through_every_panel(demo_window, demo_dir, qtbot, tmp_path, panel_name):
    win, doc = demo_window, demo_window.document
    layer = add_empty_tractogram(win)
    if panel_name == "presurgical":
        win.open_paths([demo_dir / "lesion.nii.gz"])
        assert win.wait_for_jobs(60)
        panel = win.presurgical_panel
        click(qtbot, panel.measure_button)
        assert win.wait_for_jobs(60)
        assert win.errors == []
        row = next(r for r in panel.rows if r.name == layer.name)
        assert row.streamlines == 0 and row.within_margin == 0
        texts = [panel.table.item(0, c).text() for c in range(panel.table.columnCount())]
        assert not any("inf" in t.lower() for t in texts), texts
    elif panel_name == "connectivity":
        win.open_paths([demo_dir / "parcellation.nii.gz"])
        assert win.wait_for_jobs(60)
        panel = win.connectivity_panel
        assert panel.tract_box.layer() is doc.layer(layer.name)
        click(qtbot, panel.compute_button)
        assert win.wait_for_jobs(60)
        no_internal_error(win)
        assert "holds 0 streamlines" in panel.status.text()
    elif panel_name == "profile":
        panel = win.connectivity_panel
        click(qtbot, panel.profile_button)
        assert win.wait_for_jobs(60)
        no_internal_error(win)
        assert "holds 0 streamlines" in panel.status.text()
    elif panel_name == "commit":
        panel = win.show_commit_panel(layer)
        click(qtbot, panel.filter_button)
        assert win.wait_for_jobs(60)
        no_internal_error(win)
        assert "holds 0 streamlines" in panel.status.text()  # the use case's message, as the command says it
        assert panel.result is None
    elif panel_name == "selection":
        win.open_roi(demo_dir / "roi_crossing_lr_target.nii.gz", role="target")
        assert win.wait_for_jobs(60)
        qtbot.wait(300)  # the selection's throttle
        assert win.wait_for_jobs(60)
        assert win.errors == []
        shown = doc.layer(layer.name)
        assert shown.selection is None or shown.selection.shape == (0,)
    elif panel_name == "session":
        win.save_session(tmp_path / "empty")
        assert win.wait_for_jobs(60) and win.errors == []
        win.open_session(tmp_path / "empty.tractlens")
        assert win.wait_for_jobs(60) and win.errors == []
        reopened = doc.layer(layer.name)
        assert reopened is not layer and len(reopened.data) == 0
        assert set(reopened.data.point_scalars) == {"fa"}
    else:
        from tractlens.widgets.report import export_report

        files = export_report(win, tmp_path / "report.pdf")
        assert files[0].exists() and files[0].stat().st_size > 5_000
        no_internal_error(win)
    win.save_screenshot(ARTIFACTS / f"empty_{panel_name}.png")


def test_probabilistic_tracking_through_a_waypoint_nothing_reaches(window, demo_bedpostx, demo_dir, qtbot, tmp_path):
    win, doc = window, window.document
    win.open_paths([demo_bedpostx])
    assert win.wait_for_jobs(60) and win.errors == []
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    corner = np.zeros(doc.reference_shape, bool)
    corner[0, 0, 0] = True  # outside the brain: no path gets there
    doc.add_layer(Layer("corner", RoiMask("corner", corner, doc.reference_affine, role="waypoint"), "roi"))
    panel = win.probabilistic_panel
    panel.form.editors["n_samples"].setValue(10)
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    assert win.errors == []
    paths = panel.result_layer.data.data
    assert paths.sum() == 0
    assert panel.status.text().startswith("0 streamlines kept: none of the 750 passed every waypoint region")
    win.save_session(tmp_path / "paths")  # an all-zero integer layer saves (issue 22, defect 1)
    assert win.wait_for_jobs(60) and win.errors == []
    assert (tmp_path / "paths.tractlens").exists()


@pytest.mark.parametrize("suffix", [".trk", ".tck", ".trx"])
def test_the_window_opens_a_zero_streamline_file(demo_window, tmp_path, suffix):
    """Defect 3: a 0-streamline file nibabel reads was refused as damaged."""
    from tractlens.app.io.tractogram import save_tractogram

    win, doc = demo_window, demo_window.document
    empty = Tractogram(np.zeros((0, 3)), np.zeros(1, np.int64), doc.reference_affine, doc.reference_shape)
    path = save_tractogram(empty, tmp_path / f"none{suffix}")
    win.open_paths([path])
    assert win.wait_for_jobs(60)
    assert win.errors == []
    assert len(doc.layer("none").data) == 0


def test_the_report_of_a_measured_empty_tractogram_says_0_not_inf(demo_window, demo_dir, qtbot, tmp_path):
    import re
    import subprocess

    from tractlens.widgets.report import export_report

    win = demo_window
    add_empty_tractogram(win)
    win.open_paths([demo_dir / "lesion.nii.gz"])
    assert win.wait_for_jobs(60)
    win.presurgical_panel.measure()
    assert win.wait_for_jobs(60) and win.errors == []
    pdf = export_report(win, tmp_path / "report.pdf")[0]
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "nothing" in text  # its row is in the table
    assert not re.search(r"\binf\b", text), "a tractogram of 0 streamlines has no closest approach"
    assert "inf" not in win.presurgical_panel.status.text()


@pytest.mark.parametrize("panel_name", ["deterministic", "geodesic", "probabilistic"])
def test_an_empty_seed_roi_is_refused_in_words(window, demo_dir, demo_bedpostx, qtbot, panel_name):
    """A seed ROI painted and then erased: every tracking panel says so, nothing is computed."""
    win, doc = window, window.document
    win.open_paths([demo_bedpostx if panel_name == "probabilistic" else demo_dir / "dwi.nii.gz"])
    assert win.wait_for_jobs(120) and win.errors == []
    empty = np.zeros(doc.reference_shape, bool)
    doc.add_layer(Layer("seed", RoiMask("seed", empty, doc.reference_affine, role="seed"), "roi"))
    panel = getattr(win, f"{panel_name}_panel")
    layers_before = [layer.name for layer in doc.layers]
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(120)
    no_internal_error(win)
    assert "empty" in panel.status.text().lower(), panel.status.text()
    assert [layer.name for layer in doc.layers] == layers_before
