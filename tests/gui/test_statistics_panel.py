"""The Statistics dock: a tractogram's (shown streamlines') and an ROI's numbers, CSV export."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget


def test_statistics_of_the_shown_streamlines_and_csv_export(demo_window, demo_dir, qtbot, tmp_path):
    from tractlens.app.statistics import layer_statistics
    from tractlens.widgets import dialogs

    win = demo_window
    assert win.findChild(QDockWidget, "dock_statistics") is not None
    panel = win.statistics_panel
    bundles = win.document.layer("bundles")
    panel.layer_box.choose(bundles)
    panel.refresh()
    assert win.wait_for_jobs(60) and win.errors == []
    qtbot.waitUntil(lambda: panel.statistics is not None, timeout=10_000)
    texts = {panel.table.item(r, 0).text(): panel.table.item(r, 1).text() for r in range(panel.table.rowCount())}
    assert texts["streamlines shown"] == "65" and texts["streamlines in total"] == "65"
    assert texts["length mean"].endswith(" mm") and "±" in texts["length mean"]
    assert "FA along mean" in texts and "MD along mean" in texts  # every open scalar map

    bundle = np.asarray(bundles.data.streamline_scalars["bundle"]).reshape(-1)
    jobs_tab = win.findChild(QDockWidget, "dock_jobs")
    jobs_tab.raise_()  # the Statistics tab hidden behind Jobs: a selection is not measured while unseen
    qtbot.waitUntil(lambda: not panel.seen, timeout=5_000)
    assert win.wait_for_jobs(60)
    bundles.set_selection(bundle == 3, by="connectivity cell")
    assert win.wait_for_jobs(60)
    assert panel.statistics.quantities[0].value == 65  # still the last one measured
    win.findChild(QDockWidget, "dock_statistics").raise_()  # shown: it measures what is shown now
    qtbot.waitUntil(lambda: panel.statistics.quantities[0].value == 13, timeout=10_000)
    bundles.set_selection(bundle == 2, by="connectivity cell")  # seen: the table follows at once
    qtbot.waitUntil(lambda: panel.statistics.quantities[0].value == int((bundle == 2).sum()), timeout=10_000)
    bundles.set_selection(bundle == 3, by="connectivity cell")
    qtbot.waitUntil(lambda: panel.statistics.quantities[0].value == 13, timeout=10_000)
    assert "13 of 65 streamlines shown (selection by connectivity cell)" in panel.note.text()
    expected = layer_statistics(win.document, bundles)
    assert panel.statistics.quantities[2].value == pytest.approx(expected.quantities[2].value)

    with dialogs.answers(save_file=[tmp_path / "bundles.csv"]):
        qtbot.mouseClick(panel.export_button, Qt.MouseButton.LeftButton)
    rows = list(csv.DictReader(open(tmp_path / "bundles.csv")))
    assert rows[0]["quantity"] == "streamlines shown" and rows[0]["value"] == "13"

    roi = win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    panel.layer_box.choose(roi)
    panel.refresh()
    assert win.wait_for_jobs(60)
    qtbot.waitUntil(lambda: panel.statistics.kind == "roi", timeout=10_000)
    assert panel.statistics.quantities[0].value == 40  # the demo seed ROI's voxels
