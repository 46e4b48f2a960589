"""The Probabilistic tracking panel on a real window: a bedpostX folder and ROIs opened as a user
would, parameters typed in, the path distribution filling in on the slices and as an isosurface,
cancel, re-track, refusals."""

from __future__ import annotations

from itertools import pairwise

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from scipy import ndimage

from tests.conftest import ARTIFACTS, DEVICES
from tractlens.app.model import Document, Layer, Volume
from tractlens.app.window_units import degrees_to_cosine
from tractlens.gpu.probabilistic_params import ProbParams
from tractlens.widgets.render import LUTS

SEED, TARGET = "roi_crossing_lr_seed", "roi_crossing_lr_target"


def click(qtbot, button):
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def type_into(qtbot, box, text: str) -> None:
    """Replace a spin box's text by typing, as a user would, and confirm with Enter."""
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Return)


@pytest.fixture
def bedpostx_window(window, demo_bedpostx, demo_dir):
    """The demo bedpostX folder opened (as File ▸ Open folder does), its seed and target ROIs loaded."""
    window.open_paths([demo_bedpostx])
    assert window.wait_for_jobs(60)
    assert window.errors == []
    window.open_roi(demo_dir / f"{SEED}.nii.gz", role="seed")
    window.open_roi(demo_dir / f"{TARGET}.nii.gz", role="target")
    return window


def save_rgb(image: np.ndarray, path) -> None:
    rgb = np.ascontiguousarray(image[..., :3])
    QImage(rgb.data, rgb.shape[1], rgb.shape[0], 3 * rgb.shape[1], QImage.Format.Format_RGB888).save(str(path))


def expected_run(demo_bedpostx, demo_dir, params: ProbParams):
    """The same inputs through the pipeline, from the files (not from the window)."""
    from tractlens.app.loaders import load_layers
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic_masks

    samples = next(layer for layer in load_layers(demo_bedpostx) if layer.kind == "dyads").data.samples

    def mask(name):
        return np.asarray(nib.load(demo_dir / f"{name}.nii.gz").dataobj) > 0

    return prepare_probabilistic_masks(samples, mask(SEED), targets=[(TARGET, mask(TARGET))], params=params)


def surface_values(mesh, paths: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """The path distribution, trilinearly interpolated, at the surface's points (world mm)."""
    ijk = (np.asarray(mesh.points, dtype=np.float64) - affine[:3, 3]) @ np.linalg.inv(affine[:3, :3]).T
    return ndimage.map_coordinates(paths.astype(np.float64), ijk.T, order=1, mode="constant")


def test_paths_fill_in_on_the_slices_and_in_3d_and_equal_the_pipeline(
    bedpostx_window, demo_bedpostx, demo_dir, qtbot, monkeypatch, tmp_path
):
    from tractlens.widgets import probabilistic_panel as module

    monkeypatch.setattr(module, "PARTIAL_INTERVAL_S", 0.0)
    win = bedpostx_window
    panel = win.probabilistic_panel
    panel.first_pass, panel.later_pass = 100, 200  # 1500 streamlines: 100, then 200 a pass: watch them add up
    form = panel.form.editors
    type_into(qtbot, form["n_samples"], "20")
    type_into(qtbot, form["seed"], "7")
    type_into(qtbot, form["cthr"], "60")  # max angle in degrees: the engine's cosine 0.5
    type_into(qtbot, panel.iso_percent, "10")
    assert (form["n_samples"].value(), form["seed"].value(), form["cthr"].value()) == (20, 7, 60.0)
    assert panel.form.value().cthr == pytest.approx(0.5, abs=1e-12)
    assert panel.iso_percent.value() == 10.0
    partials, updates, levels = [], [], []
    win.runner.job_partial.connect(
        lambda job_id, shown: job_id == panel.job_id and partials.append(shown.result.streamlines)
    )
    win.document.connect(
        lambda _doc, event, **info: (
            event == "display"
            and "data" in info["changed"]
            and updates.append((info["layer"], int(info["layer"].data.data.sum())))
        )
    )
    set_surface = win.view3d.set_layer_surface

    def spy(layer, mesh, **style):
        levels.append(float(mesh.field_data["level"][0]))
        set_surface(layer, mesh, **style)

    monkeypatch.setattr(win.view3d, "set_layer_surface", spy)
    # The level typed in is applied (its timer has fired, with nothing to draw yet) before Track.
    qtbot.waitUntil(lambda: not panel._iso_timer.isActive(), timeout=5000)
    click(qtbot, panel.track_button)
    assert panel.job_id is not None
    assert win.wait_for_jobs(60)
    assert win.errors == []

    expected = expected_run(
        demo_bedpostx, demo_dir, ProbParams(n_samples=20, seed=7, cthr=degrees_to_cosine(60.0))
    ).track(device="cpu")
    layer = win.document.layer(module.RESULT_NAME)
    assert layer is panel.result_layer and layer.kind == "scalar" and layer.colormap == "hot"
    assert layer.provenance["parameters"]["n_samples"] == 20 and layer.provenance["waytotal"] == expected.waytotal
    assert np.array_equal(layer.data.data, expected.paths)  # the same numbers as the pipeline, exactly
    assert panel.result.waytotal == expected.waytotal
    assert np.array_equal(panel.result.seed_targets, expected.seed_targets)
    np.testing.assert_array_equal(layer.data.affine, panel.run.samples.affine)
    top = int(expected.paths.max())
    assert top > 0 and layer.clim == (0.0, float(top))
    total = 75 * 20
    assert partials[0] == 100 and len(partials) >= 2, partials  # the coarse pass first, then pass by pass
    assert all(b > a for a, b in pairwise(partials)) and partials[-1] < total
    assert panel.updates == len(partials)
    # One layer (added with the first totals), its values replaced in place as the totals grew
    # (the later partials and the final result); the 3-D surface followed every step.
    assert len(updates) == len(partials) and all(item is layer for item, _ in updates)
    sums = [total_visits for _, total_visits in updates]
    assert sums == sorted(sums) and sums[0] < sums[-1] == int(expected.paths.sum())
    # Every state shown got its surface (and possibly a redraw at the same level): the levels
    # rise with the totals and end at 10 % of the final maximum.
    assert len(levels) >= len(partials) + 1 and levels == sorted(levels) and levels[0] < levels[-1]
    assert levels[-1] == pytest.approx(0.1 * int(expected.paths.max()))
    status = panel.status.text()
    assert "Done" in status and f"{total:,} of {total:,} streamlines" in status
    assert " s on the CPU." in status and f"({expected.provenance['device']})" not in status  # words, not "(x86_64)"
    assert f"to {TARGET} {int(expected.seed_targets.sum()):,}" in status

    # 3-D: the isosurface at 10 % of the maximum, where the distribution crosses that level.
    actor, mesh = win.view3d.layer_surface(layer)
    level = 0.1 * top
    assert actor.GetVisibility() and panel.iso_level == pytest.approx(level)
    assert mesh.field_data["level"][0] == pytest.approx(level) and mesh.n_cells > 100
    assert f"(the maximum is {top})" in panel.iso_label.text()
    np.testing.assert_allclose(surface_values(mesh, expected.paths, layer.data.affine), level, rtol=1e-3)

    # A new percentage: a new surface (computed on a worker), higher and smaller.
    type_into(qtbot, panel.iso_percent, "50")
    qtbot.waitUntil(lambda: panel.iso_level == pytest.approx(0.5 * top), timeout=10000)
    assert win.wait_for_jobs(10)
    _actor, high = win.view3d.layer_surface(layer)
    assert _actor is actor and high.n_points < mesh.n_points
    np.testing.assert_allclose(surface_values(high, expected.paths, layer.data.affine), 0.5 * top, rtol=1e-3)

    # Slices: hot where paths are, the mean f1 image (grey) through where none are.
    doc = win.document
    peak = np.unravel_index(np.argmax(expected.paths), expected.paths.shape)
    doc.set_cursor(peak)
    axial = win.views["axial"]
    image = axial.image_array()
    geometry = axial.geometry_now()
    plane = expected.paths[:, :, peak[2]]
    lowest = np.argwhere(plane == plane[plane > 0].min())[0]
    upper = np.argwhere(plane == plane[plane >= 0.5 * top].min())[0]
    colours = []
    for voxel in (peak, (*upper, peak[2]), (*lowest, peak[2])):  # white, yellow, dark red on the hot map
        rows, cols = geometry.pixel_of(np.array(voxel, dtype=float))
        colours.append(image[int(rows), int(cols)].tolist())
        hot = LUTS["hot"][int(expected.paths[tuple(voxel)] / top * 255)]
        assert colours[-1] == [int(c * 255 + 0.5) for c in hot], (voxel, colours[-1])
    assert colours[0] == [255, 255, 255] and colours[1][0] == 255 and colours[1][2] == 0 and colours[2][0] > 0
    mean_f1 = next(item for item in doc.layers if item.name.endswith("mean f1")).data.data
    empty = np.argwhere((expected.paths[:, :, peak[2]] == 0) & (mean_f1[:, :, peak[2]] > 0.2))[0]
    rows, cols = geometry.pixel_of(np.array([*empty, peak[2]], dtype=float))
    grey = image[int(rows), int(cols)].astype(int)
    assert grey.max() - grey.min() <= 2 and grey.max() > 40, grey  # the grey image beneath, not black

    win.layer_panel.list.setCurrentItem(win.layer_panel.item_for(layer))
    type_into(qtbot, panel.iso_percent, "5")
    qtbot.waitUntil(lambda: panel.iso_level == pytest.approx(0.05 * top), timeout=10000)
    assert win.wait_for_jobs(10)
    doc.set_cursor((28, 27, 13))  # planes beside the bundle's axis: the 3-D view shows its surface whole
    win.view3d.reset_camera()
    win.save_screenshot(ARTIFACTS / "probabilistic_paths.png")
    image = win.view3d.screenshot()[..., :3]
    save_rgb(image, ARTIFACTS / "probabilistic_3d.png")
    r, g, b = (image[..., c].astype(int) for c in range(3))
    orange = (r > 120) & (g > 0.3 * r) & (g < 0.8 * r) & (b < 0.3 * r)  # the isosurface's colour, shaded
    assert orange.sum() > 300, orange.sum()
    layer.set(visible=False)  # hidden with its layer
    assert not win.view3d.layer_surface(layer)[0].GetVisibility()
    layer.set(visible=True)

    # Save outputs: what is shown, as probtrackx files.
    panel.save_outputs(tmp_path / "out")
    assert win.wait_for_jobs(30)
    assert win.errors == []
    saved = np.asarray(nib.load(tmp_path / "out" / "fdt_paths.nii.gz").dataobj)
    assert np.array_equal(saved, expected.paths)
    assert (tmp_path / "out" / "waytotal").read_text().strip() == str(expected.waytotal)
    assert (tmp_path / "out" / f"seeds_to_{TARGET}.nii.gz").exists()
    assert "Saved" in panel.status.text()


def test_cancel_keeps_the_totals_shown_and_a_retrack_replaces_the_layer(
    bedpostx_window, demo_bedpostx, demo_dir, qtbot, monkeypatch
):
    import threading

    from tractlens.app.pipelines.probabilistic import ProbabilisticRun
    from tractlens.widgets import probabilistic_panel as module

    # The run holds after its first pass until the cancel was clicked (the compiled CPU loop tracks
    # the 15 000 streamlines in about a second: the click must not race the end of the run).
    clicked, real_run = threading.Event(), ProbabilisticRun.run

    def held_run(self, **options):
        passes = real_run(self, **options)
        yield next(passes)
        clicked.wait(30)
        yield from passes

    monkeypatch.setattr(ProbabilisticRun, "run", held_run)
    monkeypatch.setattr(module, "PARTIAL_INTERVAL_S", 0.0)
    win = bedpostx_window
    panel = win.probabilistic_panel
    panel.first_pass = panel.later_pass = 150  # passes of 150 of the 15 000 streamlines
    type_into(qtbot, panel.form.editors["n_samples"], "200")
    click(qtbot, panel.track_button)
    try:
        qtbot.waitUntil(lambda: panel.updates >= 1, timeout=30000)
        click(qtbot, panel.cancel_button)
    finally:
        clicked.set()
    assert win.wait_for_jobs(30)
    assert win.errors == []
    kept = panel.result
    layer = panel.result_layer
    total = 75 * 200
    assert layer in win.document.layers and 0 < kept.streamlines < total
    assert kept.streamlines % 150 == 0
    assert np.array_equal(layer.data.data, kept.paths)
    status = panel.status.text()
    assert status.startswith(f"Cancelled after {kept.streamlines:,} of {total:,} streamlines"), status
    assert not panel.cancel_button.isEnabled()
    win.save_screenshot(ARTIFACTS / "probabilistic_cancelled.png")
    # What is kept is exactly the running total of the first streamlines of that run.
    run = expected_run(demo_bedpostx, demo_dir, ProbParams(n_samples=200))
    for running in run.run(device="cpu", batch_streamlines=150):
        if running.streamlines == kept.streamlines:
            break
    assert np.array_equal(running.paths, kept.paths) and running.waytotal == kept.waytotal
    assert win.view3d.layer_surface(layer) is not None

    # Track again: a new layer in the old one's place, the old surface gone.
    layer.set(opacity=0.7)
    type_into(qtbot, panel.form.editors["n_samples"], "4")
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(30)
    names = [item.name for item in win.document.layers]
    assert names.count(module.RESULT_NAME) == 1
    new = win.document.layer(module.RESULT_NAME)
    assert new is not layer and new.opacity == 0.7 and panel.result.streamlines == 75 * 4
    assert win.view3d.layer_surface(layer) is None and win.view3d.layer_surface(new) is not None
    assert panel.status.text().startswith("Done")


# ``window_device``: the window's compute device, the CPU by default; the ``gpu`` variant (pytest -m gpu,
# on a machine with CUDA, Qt and a display) runs the same strokes on CuPy, against the same engine.
@pytest.mark.parametrize("window_device", DEVICES)
def test_live_mode_retracks_at_every_stroke_coarse_first_and_ends_on_the_last_rois(
    bedpostx_window, demo_bedpostx, demo_dir, qtbot, window_device
):
    """Strokes on the seed and target ROIs re-track by themselves: a coarse first pass drawn first,
    then refined to the panel's samples; strokes during a run are gathered, the stale run is
    cancelled, and what stays on screen is exactly the pipeline's result for the last ROIs."""
    win = bedpostx_window
    panel = win.probabilistic_panel
    type_into(qtbot, panel.form.editors["n_samples"], "40")
    panel.first_pass, panel.later_pass = 300, 600  # 3000 streamlines at most: coarse, then refined
    seed = win.document.layer(SEED)
    target = win.document.layer(TARGET)
    firsts: list[int] = []
    win.runner.job_partial.connect(
        lambda job_id, shown: job_id == panel.job_id and shown.result.streamlines == 300 and firsts.append(job_id)
    )
    filled = set()  # the layers the runs' totals go to
    win.runner.job_partial.connect(lambda job_id, shown: filled.add(id(shown.layer)))
    panel.live.setChecked(True)
    voxels = np.argwhere(seed.data.mask)
    cursor = win.document.cursor.copy()
    win.document.paint(seed, voxels[:5], False)  # strokes: erase part of the seed…
    started = panel.live_runs
    assert started == 1 and panel.job_id is not None  # the first stroke tracks at once
    assert win.view3d._frames_held_until > 0  # the stroke's 3-D frame waits for the first map (or a while)
    win.document.paint(seed, voxels[5:10], False)
    win.document.paint(target, np.argwhere(target.data.mask)[:3], False)  # …and of the target
    qtbot.waitUntil(lambda: panel.job_id is None and panel._live_pending is None, timeout=60000)
    assert win.wait_for_jobs(60)
    assert win.errors == []
    assert panel.live_runs == 2  # the strokes during the first run were gathered into one re-track
    # The re-track filled the first run's layer in place: a stroke changes values, not the layer list.
    assert filled == {id(panel.result_layer)}
    assert firsts, "the coarse first pass was drawn before the refined map"
    assert panel.first_map_s is not None and panel.converged_s is not None
    assert 0 < panel.first_map_s and 0 < panel.converged_s
    # The held frame was drawn with the map: nothing is held any more, a frame came after the last
    # map, and the slices stayed where the strokes were drawn (a live result is not centred on).
    assert win.view3d._frames_held_until == 0
    qtbot.waitUntil(lambda: any(start >= panel.shown_at for start, _end in win.view3d.renders), timeout=10000)
    np.testing.assert_array_equal(win.document.cursor, cursor)

    # What is shown is the whole run on the ROIs as the last stroke left them.
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic_masks

    run = panel.run
    samples = run.samples
    expected = prepare_probabilistic_masks(
        samples, seed.data.mask, targets=[(TARGET, target.data.mask)], params=ProbParams(n_samples=40)
    ).track(device=window_device)
    assert len(run.seeds) == int(seed.data.mask.sum()) == 75 - 10
    assert panel.result.streamlines == 65 * 40
    assert np.array_equal(panel.result_layer.data.data, expected.paths)
    assert np.array_equal(panel.result.seed_targets, expected.seed_targets)
    assert f"waytotal {expected.waytotal:,}" in panel.status.text()
    assert win.document.layer(module_result_name()) is panel.result_layer

    # A stroke that leaves no seed voxel inside the brain is said on the status line, not in a dialog.
    errors = len(win.errors)
    panel.live.setChecked(False)
    win.document.paint(seed, voxels, False)
    roi_outside = np.array([[0, 0, 0]])
    panel.live.setChecked(True)
    win.document.paint(seed, roi_outside, True)
    qtbot.waitUntil(lambda: panel.job_id is None, timeout=30000)
    assert win.wait_for_jobs(30)
    assert "Live:" in panel.status.text() and "brain mask" in panel.status.text()
    assert len(win.errors) == errors


def test_envelopes_are_nested_surfaces_in_3d_and_outlines_on_the_slices(bedpostx_window, qtbot, tmp_path):
    from tractlens.app.envelopes import envelopes
    from tractlens.widgets.envelope_display import is_envelope
    from tractlens.widgets.roi_outlines import roi_outlines

    win = bedpostx_window
    panel = win.probabilistic_panel
    type_into(qtbot, panel.form.editors["n_samples"], "20")
    click(qtbot, panel.track_button)
    assert win.wait_for_jobs(60) and win.errors == []
    click(qtbot, panel.envelope_button)  # the default levels: 50, 90, 95 %
    assert win.wait_for_jobs(30) and win.errors == []
    layers = [layer for layer in win.document.layers if is_envelope(layer)]
    assert [layer.name for layer in layers] == ["envelope 50 %", "envelope 90 %", "envelope 95 %"]
    expected = envelopes(panel.result.paths, panel.run.samples.affine, (50, 90, 95))
    masks = [layer.data.data.astype(bool) for layer in layers]
    for mask, envelope in zip(masks, expected.envelopes):
        assert np.array_equal(mask, envelope.mask)
    assert not (masks[0] & ~masks[1]).any() and not (masks[1] & ~masks[2]).any()  # nested
    opacities = []
    for layer in layers:
        actor, mesh = win.view3d.layer_surface(layer)
        assert actor.GetVisibility() and mesh.n_points > 0
        opacities.append(actor.GetProperty().GetOpacity())
    assert opacities == sorted(opacities, reverse=True) and opacities[-1] < 1.0  # translucent, inner the most opaque
    assert "smallest region" in panel.envelope_label.text()
    peak = np.unravel_index(np.argmax(panel.result.paths), panel.result.paths.shape)
    win.document.set_cursor(peak)
    outlined = [layer for layer, _segments in roi_outlines(win.document, win.views["axial"].geometry_now())]
    assert all(layer in outlined for layer in layers)  # every level outlined on the slice through the peak

    # The presurgical table and the report carry each level's distance to the lesion, and say
    # what a level means.
    from tractlens.app.envelopes import lesion_distances
    from tractlens.widgets.report import gather, render

    win.role_box.setCurrentText("lesion")
    lesion = win.new_roi()
    outside = np.argwhere(~masks[2] & panel.run.samples.mask)
    far = outside[np.argmax(np.linalg.norm(outside - np.array(peak), axis=1))]
    win.document.paint(lesion, far[None, :], True)
    presurgical = win.presurgical_panel
    presurgical.lesion_box.choose(lesion)
    presurgical.measure()
    assert win.wait_for_jobs(60) and win.errors == []
    reference = lesion_distances(expected, lesion.data.mask, lesion.data.affine)
    rows = presurgical.envelope_rows
    assert [row.name for row in rows] == [layer.name for layer in layers]
    for row, distance in zip(rows, reference):
        assert row.min_mm == pytest.approx(distance.min_mm, abs=1e-3) and row.min_mm > 0
    table = presurgical.table
    texts = [table.item(r, 0).text() for r in range(table.rowCount())]
    assert texts[-3:] == [layer.name for layer in layers]
    assert table.item(table.rowCount() - 1, 2).text() == rows[-1].closest_text
    assert presurgical.meaning.isVisibleTo(presurgical) and "smallest region" in presurgical.meaning.text()
    content = gather(win)
    assert [row.name for row in content.envelopes] == [layer.name for layer in layers]
    pages = render(content, tmp_path / "report.pdf", png=True)  # the pages as images too
    assert pages and (tmp_path / "report.pdf").stat().st_size > 1000

    # Bad levels: said, and the envelopes shown stay as they are.
    panel.envelope_levels.setText("0, 50")
    click(qtbot, panel.envelope_button)
    assert win.wait_for_jobs(30)
    assert "outside (0, 100)" in panel.status.text() and "outside (0, 100)" in win.errors[-1]
    assert [layer for layer in win.document.layers if is_envelope(layer)] == layers


def module_result_name() -> str:
    from tractlens.widgets.probabilistic_panel import RESULT_NAME

    return RESULT_NAME


def test_track_refuses_without_samples_or_seed_and_shows_input_errors(window, demo_bedpostx, qtbot):
    panel = window.probabilistic_panel
    menu = next(action for action in window.menuBar().actions() if action.text() == "&Track").menu()
    action = next(action for action in menu.actions() if action.text() == "&Probabilistic (probtrackx)")
    assert action.shortcut().toString() == "Ctrl+Shift+P"
    action.trigger()
    assert "bedpostX" in panel.status.text() and window.runner.active() == [] and panel.job_id is None
    assert window.errors and "bedpostX" in window.errors[-1]

    window.open_paths([demo_bedpostx])
    assert window.wait_for_jobs(60)
    click(qtbot, panel.track_button)
    assert "seed ROI" in panel.status.text() and window.runner.active() == [] and panel.job_id is None

    # A seed outside the brain: the pipeline's own message, as it is.
    window.role_box.setCurrentText("seed")
    roi = window.new_roi()
    window.document.paint(roi, np.array([[0, 0, 0]]), True)
    click(qtbot, panel.track_button)
    assert window.wait_for_jobs(30)
    assert "no seed voxel lies inside the bedpostX brain mask" in panel.status.text()
    assert "seed ROI" in window.errors[-1] and "Check that the seed mask belongs" in window.errors[-1]
    assert panel.result_layer is None

    # Bad parameters never start a job either.
    window.document.paint(roi, np.argwhere(panel.samples_layer().data.samples.mask)[:3], True)
    panel.form.editors["waycond"].addItem("XOR")
    panel.form.editors["waycond"].setCurrentText("XOR")
    click(qtbot, panel.track_button)
    assert "waycond" in panel.status.text() and window.runner.active() == []


def test_scalar_layers_can_let_the_layers_beneath_show_through():
    from tractlens.widgets.render import colorize

    layer = Layer("p", Volume("p", np.zeros((2, 2, 1)), np.eye(4)), "scalar", colormap="hot", clim=(0, 10))
    values = np.array([[0.0, 0.5], [1.0, 10.0]])
    inside = np.ones((2, 2), bool)
    assert np.array_equal(colorize(layer, values, inside)[1], np.ones((2, 2)))  # drawn everywhere by default
    layer.set(transparent_below=1)
    rgb, alpha = colorize(layer, values, inside)
    assert alpha.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    np.testing.assert_allclose(rgb[1, 1], [1.0, 1.0, 1.0])  # the top of the hot map

    doc = Document()  # composited over a grey image: the grey shows where the overlay is clear
    grey = np.full((2, 2, 1), 0.5)
    doc.add_layer(Layer("grey", Volume("grey", grey, np.eye(4)), "scalar", clim=(0, 1)))
    doc.add_layer(layer)
    layer.set_data(values[..., None])
    from tractlens.widgets.render import composite, plane_geometry

    doc.set_cursor((0, 0, 0))
    image = composite(doc, plane_geometry(doc, "axial"))
    geometry = plane_geometry(doc, "axial")
    low = image[tuple(int(v) for v in geometry.pixel_of(np.array([0.0, 0.0, 0.0])))]
    high = image[tuple(int(v) for v in geometry.pixel_of(np.array([1.0, 1.0, 0.0])))]
    assert low.tolist() == [127, 127, 127] and high.tolist() == [255, 255, 255]
