"""Connectivity and presurgical analysis in the GUI: the connectome heat map whose cells select
their streamlines in 3-D, along-tract profiles, and the distance of the bundles to a lesion
(real window, demo data, CPU backend)."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pyvista as pv
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget

from tests.conftest import ARTIFACTS
from tractlens.app.pipelines.connectivity import (
    DEFAULT_MARGIN_MM,
    DISTANCE_POINT_SCALAR,
    DISTANCE_STREAMLINE_SCALAR,
    compute_lesion_distance,
    compute_profile,
)
from tractlens.widgets.connectivity_panel import ORDERS
from tractlens.widgets.render import LUTS


def open_like_a_user(win, *paths) -> None:
    win.open_paths(list(paths))
    assert win.wait_for_jobs(60)
    assert win.errors == []


def analysis_action(win, text: str):
    menu = next(a.menu() for a in win.menuBar().actions() if a.text() == "&Analysis")
    return next(action for action in menu.actions() if action.text() == text)


def raise_from_menu(win, qtbot, text: str, dock_name: str) -> QDockWidget:
    dock = win.findChild(QDockWidget, dock_name)
    analysis_action(win, text).trigger()
    qtbot.waitUntil(lambda: not dock.visibleRegion().isEmpty(), timeout=3000)
    return dock


def click_cell(qtbot, panel, row: int, column: int) -> None:
    heatmap = panel.heatmap
    qtbot.mouseClick(heatmap, Qt.MouseButton.LeftButton, pos=heatmap.cell_rect(row, column).center())


def endpoint_counts(tract, labels) -> np.ndarray:
    """Brute force: the parcellation's label under each streamline's two end points."""
    points = np.rint(tract.points_on(labels.affine)).astype(int)
    data = np.asarray(labels.data)
    n = int(data.max())
    counts = np.zeros((n, n), dtype=np.int64)
    for i in range(len(tract)):
        a = data[tuple(points[tract.offsets[i]])]
        b = data[tuple(points[tract.offsets[i + 1] - 1])]
        if a > 0 and b > 0:
            counts[a - 1, b - 1] += 1
            if a != b:
                counts[b - 1, a - 1] += 1
    return counts


def test_connectome_heatmap_cells_select_streamlines(demo_window, demo_dir, qtbot):
    win, doc = demo_window, demo_window.document
    open_like_a_user(win, demo_dir / "parcellation.nii.gz")
    bundles, parcellation = doc.layer("bundles"), doc.layer("parcellation")
    panel = win.connectivity_panel
    raise_from_menu(win, qtbot, "Connectivity &matrix…", "dock_connectivity")
    assert panel.tract_box.layer() is bundles and panel.labels_box.layer() is parcellation
    assert panel.weight_box.currentText() == "count" and panel.radius_box.value() == 4.0

    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    assert panel.job_id is not None
    assert win.wait_for_jobs(60)
    assert win.errors == []
    matrix = panel.matrix
    assert matrix is not None and matrix.symmetric and panel.heatmap.matrix is matrix
    assert matrix.row_names[:2] == ["crossing_lr_start", "crossing_lr_end"]  # names from parcellation.txt
    brute = endpoint_counts(bundles.data, parcellation.data)
    np.testing.assert_array_equal(matrix.counts, brute)
    np.testing.assert_array_equal(matrix.values, brute)
    assert np.count_nonzero(np.triu(matrix.counts)) == 5 and set(matrix.counts[np.triu(matrix.counts) > 0]) == {13}
    assert "65 of 65 streamlines" in panel.status.text() and "5 connections" in panel.status.text()

    # Clicking the cell of bundle 2 (regions 3 and 4) selects exactly its 13 streamlines.
    bundle = np.asarray(bundles.data.streamline_scalars["bundle"]).reshape(-1)
    row, column = 2, 3
    click_cell(qtbot, panel, row, column)
    expected = matrix.cell_streamlines(row, column)
    assert bundles.selection is not None
    np.testing.assert_array_equal(bundles.selection, expected)
    np.testing.assert_array_equal(bundles.selection, bundle == 2)
    assert "13 of 65 streamlines selected" in panel.status.text()
    text = panel.heatmap.tooltip_text(row, column)
    assert text == "crossing_ap_start ↔ crossing_ap_end: 13 (13 streamlines)"

    # Another order moves the cells; the same original cell still selects the same streamlines.
    qtbot.mouseClick(panel.show_all_button, Qt.MouseButton.LeftButton)
    assert bundles.selection is None
    before = panel.heatmap.cell_rect(row, column)
    panel.sort_box.setCurrentIndex(list(ORDERS).index("name"))
    assert panel.heatmap.row_order == sorted(range(10), key=lambda i: matrix.row_names[i])
    assert panel.heatmap.column_order == panel.heatmap.row_order
    assert panel.heatmap.cell_rect(row, column) != before
    click_cell(qtbot, panel, row, column)
    np.testing.assert_array_equal(bundles.selection, bundle == 2)
    click_cell(qtbot, panel, 9, 8)  # the lower triangle: the same connection either way round
    np.testing.assert_array_equal(bundles.selection, bundle == 5)
    panel.log_box.setChecked(True)
    assert panel.heatmap.log_scale
    click_cell(qtbot, panel, 0, 1)
    np.testing.assert_array_equal(bundles.selection, bundle == 1)
    qtbot.wait(300)
    panel.grab().save(str(ARTIFACTS / "connectivity_panel.png"))
    win.save_screenshot(ARTIFACTS / "connectivity_heatmap.png")

    # A probabilistic run's seeds × targets (a stand-in for the Probabilistic panel's last run):
    # rows are the parcellation's regions holding seeds; its cells only report their counts.
    labels = np.asarray(parcellation.data.data)
    seeds = np.concatenate([np.argwhere(labels == 1)[:4], np.argwhere(labels == 3)[:6]])
    seed_targets = np.arange(20).reshape(10, 2)
    samples = SimpleNamespace(mask=labels > 0, affine=parcellation.data.affine)
    panel.probabilistic = SimpleNamespace(
        run=SimpleNamespace(seeds=seeds, targets=["t1", "t2"], samples=samples),
        result=SimpleNamespace(seed_targets=seed_targets),
    )
    qtbot.mouseClick(panel.prob_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(30)
    prob = panel.matrix
    assert not prob.symmetric and panel.matrix_layer is None
    assert prob.row_names == ["crossing_lr_start", "crossing_ap_start"] and prob.column_names == ["t1", "t2"]
    np.testing.assert_array_equal(prob.counts, [seed_targets[:4].sum(0), seed_targets[4:].sum(0)])
    selection = bundles.selection.copy()
    click_cell(qtbot, panel, 1, 0)
    assert "crossing_ap_start → t1: 78 (78 streamlines)" in panel.status.text()
    assert "keeps no streamlines" in panel.status.text()
    np.testing.assert_array_equal(bundles.selection, selection)  # nothing selected in 3-D

    # The cell's selection stays when an unrelated file is opened (no ROI drew it)...
    win.open_paths([demo_dir / "lesion.nii.gz"])
    assert win.wait_for_jobs(30)
    qtbot.wait(200)  # the ROI-selection timer (40 ms) has had its chance
    np.testing.assert_array_equal(bundles.selection, selection)
    # ...and, once the user filters the layer by ROIs, an ROI takes over: the streamlines through
    # it, and without ROIs again, all
    from tractlens.app.model import Layer, RoiMask

    bundles.set(filter_by_rois=True)  # the layer menu's "Filter by ROIs"

    roi = RoiMask("through_arc", np.zeros(win.document.reference_shape, bool), win.document.reference_affine)
    roi.mask[labels == 5] = True  # arc_start
    win.document.add_layer(Layer("through_arc", roi, "roi"))
    qtbot.waitUntil(
        lambda: bundles.selection is not None and np.array_equal(bundles.selection, bundle == 3), timeout=10_000
    )
    win.document.remove_layer(win.document.layer("through_arc"))
    qtbot.waitUntil(lambda: bundles.selection is None, timeout=10_000)


def test_profile_plot_and_csv(demo_window, qtbot, tmp_path):
    win, doc = demo_window, demo_window.document
    panel = win.connectivity_panel
    raise_from_menu(win, qtbot, "Connectivity &matrix…", "dock_connectivity")
    panel.tabs.setCurrentIndex(1)
    bundles, fa = doc.layer("bundles"), doc.layer("FA")
    assert panel.bundle_box.layer() is bundles and panel.map_box.layer() is fa
    assert panel.points_box.value() == 100

    qtbot.mouseClick(panel.profile_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    assert win.errors == []
    profile = panel.profile
    expected = compute_profile(bundles.data, fa.data, 100, device="cpu")
    assert len(profile.mean) == 100 and panel.plot.profile is profile
    np.testing.assert_allclose(profile.mean, expected.mean, equal_nan=True)
    assert np.isfinite(profile.mean).all() and 0 < np.nanmean(profile.mean) < 1

    # The plot is not blank: the mean line's colour is painted.
    image = panel.plot.grab().toImage()
    colours = {image.pixelColor(x, y).name() for x in range(0, image.width(), 2) for y in range(0, image.height(), 2)}
    assert "#ffc83c" in colours

    path = tmp_path / "profile.csv"
    panel.save_profile_csv(path)
    assert win.wait_for_jobs(30)
    rows = list(csv.reader(path.open()))
    assert rows[0][:5] == ["point", "position", "FA_mean", "FA_sd", "n"]
    assert len(rows) == 101
    np.testing.assert_allclose([float(r[2]) for r in rows[1:]], profile.mean, rtol=1e-5)

    # With a selection, only the selected streamlines make the profile.
    bundle = np.asarray(bundles.data.streamline_scalars["bundle"]).reshape(-1)
    bundles.set_selection(bundle == 3)
    panel.compute_profile()
    assert win.wait_for_jobs(60)
    assert panel.profile.provenance["streamlines"] == 13
    panel.plot.resize(520, 320)
    panel.plot.grab().save(str(ARTIFACTS / "profile_plot.png"))


def test_presurgical_distance_to_lesion(demo_window, demo_dir, qtbot):
    win, doc = demo_window, demo_window.document
    open_like_a_user(win, demo_dir / "lesion.nii.gz")
    lesion = doc.layer("lesion")
    original = doc.layer("bundles")
    panel = win.presurgical_panel
    raise_from_menu(win, qtbot, "&Distance to lesion…", "dock_presurgical")
    assert panel.lesion_box.layer() is lesion
    assert panel.margin_mm == DEFAULT_MARGIN_MM
    assert "safety" in LUTS

    qtbot.mouseClick(panel.measure_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(60)
    assert win.errors == []
    bundles = doc.layer("bundles")
    tract = bundles.data
    assert DISTANCE_POINT_SCALAR in tract.point_scalars and DISTANCE_STREAMLINE_SCALAR in tract.streamline_scalars
    assert bundles.color_by == DISTANCE_POINT_SCALAR and bundles.colormap == "safety"
    assert bundles.clim == (0.0, 2 * DEFAULT_MARGIN_MM)
    np.testing.assert_array_equal(tract.points, original.data.points)
    expected = compute_lesion_distance(original.data, lesion.data.data != 0, lesion.data.affine, device="cpu")
    distance = panel.distances["bundles"]
    np.testing.assert_allclose(distance.per_streamline, expected.per_streamline)
    np.testing.assert_allclose(tract.point_scalars[DISTANCE_POINT_SCALAR], expected.per_point, rtol=1e-6)

    per = distance.per_streamline
    row = next(r for r in panel.rows if r.name == "bundles")
    assert row.streamlines == 65 and row.min_mm == per.min()
    assert row.within_margin == int((per <= DEFAULT_MARGIN_MM).sum()) > 0
    assert panel.table.item(0, 0).text() == "bundles" and panel.table.item(0, 2).text() == f"{per.min():.2f}"
    # The crossing_lr bundle (bundle 1) passes closest to the lesion.
    bundle = np.asarray(tract.streamline_scalars["bundle"]).reshape(-1)
    assert bundle[np.argmin(per)] == 1
    assert per[bundle == 1].min() < per[bundle != 1].min()
    assert set(bundle[per <= DEFAULT_MARGIN_MM]) == {1}

    # A wider margin: more streamlines within, the colours' range follows, nothing recomputed.
    counts = []
    for margin in (3.0, 8.0, 12.0):
        panel.margin_box.setValue(margin)
        row = next(r for r in panel.rows if r.name == "bundles")
        assert row.within_margin == int((per <= margin).sum())
        assert bundles.clim == (0.0, 2 * margin)
        counts.append(row.within_margin)
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert panel.distances["bundles"] is distance

    # A selection adds a row over the selected streamlines.
    bundles.set_selection(bundle == 3)
    selected = next(r for r in panel.rows if r.name == "bundles (selected)")
    assert selected.streamlines == 13 and selected.min_mm == per[bundle == 3].min()
    assert panel.table.rowCount() == 2
    bundles.set_selection(None)
    assert panel.table.rowCount() == 1
    panel.margin_box.setValue(DEFAULT_MARGIN_MM)

    for layer in doc.layers:  # the fibres in front: hide the slices
        if layer.kind != "tractogram":
            layer.set(visible=False)
    win.view3d.reset_camera()
    win.view3d.plotter.camera.zoom(1.4)
    qtbot.wait(400)  # past the 3-D view's switch to the settled level of detail
    entry = win.view3d._fibers[id(bundles)]
    mesh = pv.wrap(entry["actor"].GetMapper().GetInput())
    assert mesh.active_scalars_name == DISTANCE_POINT_SCALAR  # drawn by distance, not by direction
    win.save_screenshot(ARTIFACTS / "presurgical.png")
