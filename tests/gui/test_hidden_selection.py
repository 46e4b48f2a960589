"""Issue 22, defect 4: an ROI selection that hides fibres is said everywhere a count is shown, and a
selection that leaves none says why."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt


def _track_with_hidden_target(win, demo_dir, qtbot):
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    target = win.open_roi(demo_dir / "roi_crossing_lr_target.nii.gz", role="target")
    target.set(visible=False)
    assert win.wait_for_jobs(60)
    qtbot.mouseClick(win.deterministic_panel.track_button, Qt.MouseButton.LeftButton)
    assert win.wait_for_jobs(120) and win.errors == []
    result = win.deterministic_panel.result_layer
    result.set(filter_by_rois=True)  # the user's choice (layer menu "Filter by ROIs"): never by itself
    return target, result


def test_showing_the_target_again_says_that_it_hides_every_fibre(demo_window, demo_dir, qtbot):
    win = demo_window
    target, result = _track_with_hidden_target(win, demo_dir, qtbot)
    total = len(result.data)
    assert total > 20
    panel = win.deterministic_panel
    assert f"{total} streamlines from" in panel.status.text()

    messages = []
    win.selection.notice.connect(messages.append)
    target.set(visible=True)  # as the user ticks it in the layer list
    qtbot.waitUntil(lambda: "target" in (result.selection_by or ""), timeout=10_000)
    assert win.wait_for_jobs(60)
    shown = int(result.selection.sum())
    assert shown == 0  # no fibre from this seed reaches this target: the situation
    expected = f"{shown} of {total} shown (selection by ROIs roi_crossing_lr_seed, roi_crossing_lr_target)"
    assert expected in panel.status.text()
    assert expected in win.layer_panel.item_for(result).toolTip()  # the row says "0 of N", its tip why
    assert messages and "none of its" in messages[-1] and "Hide an ROI" in messages[-1]
    assert "none of its" in win.statusBar().currentMessage()

    target.set(visible=False)  # hidden again: every fibre shown, and said so
    qtbot.waitUntil(lambda: result.selection is not None and result.selection.all(), timeout=10_000)
    qtbot.waitUntil(lambda: "target" not in (result.selection_by or "target"), timeout=10_000)
    assert f"all {total} shown (selection by ROI roi_crossing_lr_seed)" in win.layer_panel.item_for(result).toolTip()
    assert "Now" not in panel.status.text()


def test_distance_table_and_report_count_only_the_fibres_shown(demo_window, demo_dir, qtbot):
    from tractlens.widgets.report import distance_rows

    win = demo_window
    target, result = _track_with_hidden_target(win, demo_dir, qtbot)
    total = len(result.data)
    win.open_paths([demo_dir / "lesion.nii.gz"])
    assert win.wait_for_jobs(60)
    target.set(visible=True)
    qtbot.waitUntil(lambda: "target" in (win.document.layer("deterministic").selection_by or ""), timeout=10_000)
    panel = win.presurgical_panel
    panel.measure()
    assert win.wait_for_jobs(60) and win.errors == []
    layer = win.document.layer("deterministic")
    shown = int(layer.selection.sum())
    rows = {row.name: row for row in panel.rows}
    selected = rows["deterministic (selected)"]
    assert selected.streamlines == shown and f"{shown} of {total} shown" in selected.shown
    assert f"{shown} of {total} shown" in rows["deterministic"].shown
    tips = [panel.table.item(r, 0).toolTip() for r in range(panel.table.rowCount())]
    assert any(f"{shown} of {total} shown" in tip for tip in tips)
    assert f"{shown} of {total} shown" in panel.shown_note.text() and panel.shown_note.isVisibleTo(panel)
    report_rows = {row.name: row for row in distance_rows(win.document, panel.margin_mm)}
    assert report_rows["deterministic (selected)"].streamlines == shown  # also when it is 0
    assert shown == 0 and report_rows["deterministic (selected)"].closest_text.startswith("none")
    assert np.isfinite(rows["deterministic"].min_mm)
