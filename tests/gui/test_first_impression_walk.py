"""The window walked through once more as a newcomer (issue 45, what was left), at 1280×800 and
1920×1080: nothing cut, nothing said twice, no developer words. Each check is what the
screenshots in tests/_artifacts/first_impression_walk_*.png showed before the fix:

* fields whose text was cut: the probabilistic envelope levels (",90,95"), COMMIT's mask and
  peaks placeholders, job names in the Jobs list ("deterministic trac…");
* doubled words: "tensors (tensors)" and "fODF (fODF)" in the direction-field choice, "lesion [roi]"
  in the lesion and statistics choices while the layer list says "lesion (ROI)", "Isosurface at % of
  max 5.0 %", "1 tractogram(s)";
* a stale message: "seed 1 (seed): paint it…" stayed in the status bar after the seed was painted
  and tracked; a run "in 0.00 s".
"""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import QComboBox, QDockWidget, QLabel, QLineEdit, QWidget

from tests.conftest import ARTIFACTS
from tests.gui.test_first_impression import METHOD_DOCKS, on_screen, raise_dock, resize_to
from tractlens.widgets.job_panel import NAME_MARGIN

SIZES = [(1280, 800), (1920, 1080)]
DOUBLED = re.compile(r"\b(\w+)s? \(\1s?\)", re.IGNORECASE)  # "tensors (tensors)", "fODF (fODF)"


def _shows_whole(widget: QWidget) -> str | None:
    """Why ``widget``'s text does not show whole in it, or None."""
    if isinstance(widget, QComboBox):
        text, room = widget.currentText(), widget.width() - 34  # the arrow and the frame
    elif isinstance(widget, QLineEdit) and not widget.isReadOnly():
        text = widget.text() or widget.placeholderText()
        room = widget.width() - 12 - (22 if widget.isClearButtonEnabled() else 0)
    else:
        return None
    needed = widget.fontMetrics().horizontalAdvance(text)
    return (
        None
        if needed <= room
        else f"{widget.objectName() or type(widget).__name__}: {text!r} needs {needed} px of {room}"
    )


@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_no_field_of_a_panel_cuts_its_text_and_no_word_is_said_twice(demo_window, qtbot, demo_dir, width, height):
    win = demo_window
    resize_to(win, qtbot, width, height)
    win.open_roi(demo_dir / "lesion.nii.gz", role="lesion")
    assert win.wait_for_jobs(60)
    cut, doubled = [], []
    for name in METHOD_DOCKS:
        shown = raise_dock(win, qtbot, name)
        for widget in shown.widget().findChildren(QWidget):
            if on_screen(widget) and (why := _shows_whole(widget)):
                cut.append(f"{name}: {why}")
        texts = [label.text() for label in shown.findChildren(QLabel) if on_screen(label)]
        for box in shown.findChildren(QComboBox):
            texts += [box.itemText(i) for i in range(box.count())]
        doubled += [f"{name}: {text!r}" for text in texts if DOUBLED.search(text) or "(s)" in text or "% %" in text]
        doubled += [f"{name}: {t!r}" for t in texts if re.search(r"\[(roi|scalar|labels|tensor|fod|rgb)\]", t)]
        win.save_screenshot(ARTIFACTS / f"first_impression_walk_{width}x{height}_{name.removeprefix('dock_')}.png")
    assert cut == [], cut
    assert doubled == [], doubled
    iso = win.probabilistic_panel.iso_percent
    assert iso.text() == "5.0 % of max"  # one percent sign, the label says the rest
    lesion_choice = win.presurgical_panel.findChild(QComboBox)
    assert "lesion  (ROI)" in [lesion_choice.itemText(i) for i in range(lesion_choice.count())]
    items = [win.layer_panel.list.item(i).text() for i in range(win.layer_panel.list.count())]
    assert "lesion  (ROI)" in items and not any(DOUBLED.search(text) for text in items), items


def test_job_names_show_whole_in_the_jobs_list_at_1280(demo_window, qtbot, demo_dir):
    win = demo_window
    resize_to(win, qtbot, 1280, 800)
    win.open_roi(demo_dir / "roi_arc_seed.nii.gz", role="seed")
    assert win.wait_for_jobs(60)
    win.deterministic_panel.track()
    assert win.wait_for_jobs(120) and win.errors == [], win.errors
    raise_dock(win, qtbot, "dock_jobs")
    tree = win.job_panel.tree
    names = [tree.topLevelItem(i).text(0) for i in range(tree.topLevelItemCount())]
    assert "deterministic tracking" in names, names
    room = tree.header().sectionSize(0) - NAME_MARGIN
    cut = []
    for i in range(tree.topLevelItemCount()):  # each name whole: on one line, or wrapped onto two
        item = tree.topLevelItem(i)
        flags = int(Qt.AlignmentFlag.AlignLeft) | int(Qt.TextFlag.TextWordWrap)
        needed = tree.fontMetrics().boundingRect(QRect(0, 0, room, 1000), flags, item.text(0))
        if needed.width() > room or needed.height() > tree.visualItemRect(item).height():
            cut.append((item.text(0), needed, tree.visualItemRect(item)))
    assert cut == [], (cut, room)
    assert not tree.horizontalScrollBar().isVisible()
    win.save_screenshot(ARTIFACTS / "first_impression_walk_1280x800_jobs.png")


def test_the_message_to_paint_a_new_roi_goes_once_it_is_painted(demo_window, qtbot):
    win = demo_window
    resize_to(win, qtbot, 1280, 800)
    roi = win.roi_toolbar.new_roi("seed")  # the tool bar's New ROI
    status = win.statusBar()
    assert "paint it" in status.currentMessage()
    axial = win.views["axial"]
    z = int(win.document.cursor[2])
    point = axial.widget_point_of_voxel((14, 28, z))
    qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(point.x()), int(point.y())))
    assert roi.data.mask.any()
    assert "paint it" not in status.currentMessage(), status.currentMessage()
    win.findChild(QDockWidget, "dock_deterministic_tracking").raise_()
    win.deterministic_panel.track()
    assert win.wait_for_jobs(120) and win.errors == [], win.errors
    text = win.deterministic_panel.status.text()
    assert "on the CPU" in text and "0.00 s" not in text, text
    win.save_screenshot(ARTIFACTS / "first_impression_walk_1280x800_painted.png")
