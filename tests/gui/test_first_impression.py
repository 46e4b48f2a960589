"""The window's first impression (issue 45), checked at the three screen sizes a clinician has:
geometry (nothing overlaps, four equal views, tables that fit, forms that do not jump), a
newcomer's way from the demo to streamlines using only visible, labelled controls, and
screenshots of every panel in tests/_artifacts/first_impression_*.png."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractSpinBox,
    QComboBox,
    QDockWidget,
    QLabel,
    QPushButton,
    QScrollArea,
    QToolButton,
    QWidget,
)

from tests.conftest import ARTIFACTS
from tractlens.widgets.dock_tabs import SHORT_TITLES

SIZES = [(1280, 800), (1600, 1000), (1920, 1080)]
METHOD_DOCKS = list(SHORT_TITLES)


def resize_to(window, qtbot, width: int, height: int) -> None:
    window.resize(width, height)
    qtbot.waitUntil(lambda: window.width() == width and window.height() == height, timeout=5000)
    # the docks' shares are applied and stray tab bars hidden by events posted on the resize
    qtbot.waitUntil(lambda: not _stray_bars(window), timeout=5000)


def _stray_bars(window):
    from tractlens.widgets.window_layout import stray_tab_bars

    return stray_tab_bars(window)


def _internal(widget: QWidget) -> bool:
    """Parts of a compound widget that Qt lays out itself (inside a scroll area, a spin box, a
    combo box, a tool bar's extension) or VTK's render window: not what this test is about."""
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractSpinBox | QComboBox) or type(parent).__name__ == "QtInteractor":
            return True
        parent = parent.parentWidget()
    return widget.objectName().startswith("qt_")


def on_screen(widget: QWidget) -> bool:
    """Visible and not moved off the window (Qt's place for the docks behind a tab)."""
    # QWidget's own methods: a panel may keep other things in attributes named "window" or "size"
    if not QWidget.isVisible(widget):
        return False
    window = QWidget.window(widget)
    return QRect(QWidget.mapTo(widget, window, QPoint(0, 0)), QWidget.size(widget)).intersects(window.rect())


def overlapping_siblings(window) -> list[tuple[str, str]]:
    """Pairs of visible sibling widgets whose rectangles overlap (children of one parent; a
    scroll area's viewport and its bars are siblings too)."""
    found = []
    for parent in [window, *window.findChildren(QWidget)]:
        if not on_screen(parent) or _internal(parent) or isinstance(parent, QAbstractItemView):
            continue
        children = [
            child
            for child in parent.children()
            if isinstance(child, QWidget) and on_screen(child) and not child.isWindow() and not _internal(child)
        ]
        children = [c for c in children if c.objectName() != "first_steps_hint"]  # drawn on its view, on purpose
        for i, a in enumerate(children):
            for b in children[i + 1 :]:
                if QWidget.geometry(a).intersects(QWidget.geometry(b)) and not _tabbed_together(window, a, b):
                    found.append((_describe(a), _describe(b)))
    return found


def _tabbed_together(window, a: QWidget, b: QWidget) -> bool:
    """Docks in one tab group share their place (Qt shows the current one)."""
    return isinstance(a, QDockWidget) and isinstance(b, QDockWidget) and b in window.tabifiedDockWidgets(a)


def _describe(widget: QWidget) -> str:
    text = getattr(widget, "text", None)
    label = text() if callable(text) and isinstance(text(), str) else ""
    return f"{type(widget).__name__}({widget.objectName() or label!r} in {type(widget.parentWidget()).__name__})"


def dock(window, name: str) -> QDockWidget:
    return window.findChild(QDockWidget, name)


def raise_dock(window, qtbot, name: str) -> QDockWidget:
    widget = dock(window, name)
    widget.raise_()
    qtbot.waitUntil(lambda: on_screen(widget.widget()), timeout=3000)
    return widget


def dock_tables(widget: QDockWidget) -> list[QAbstractItemView]:
    return [view for view in widget.findChildren(QAbstractItemView) if view.isVisible()]


@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_window_is_tidy_at_common_screen_sizes(demo_window, qtbot, demo_dir, width, height):
    win = demo_window
    resize_to(win, qtbot, width, height)
    win.open_roi(demo_dir / "lesion.nii.gz", role="lesion")  # chosen by its role
    assert win.wait_for_jobs(60)
    assert win.presurgical_panel.measure() is not None  # its table filled with the demo bundles' rows
    win.statistics_panel.refresh()
    assert win.wait_for_jobs(120)

    views = [win.view3d, *win.views.values()]
    widths, heights = [v.width() for v in views], [v.height() for v in views]
    assert min(widths) >= 0.9 * max(widths), widths  # four equal views, within 10 %
    assert min(heights) >= 0.9 * max(heights), heights

    for name in [*METHOD_DOCKS, "dock_statistics", "dock_jobs"]:
        shown = raise_dock(win, qtbot, name)
        qtbot.waitUntil(lambda: not _stray_bars(win), timeout=3000)
        overlaps = overlapping_siblings(win)
        assert overlaps == [], (name, overlaps)
        area = shown.widget()
        if isinstance(area, QScrollArea):  # no sideways scroll bar: a panel wider than its dock is cut
            fits = lambda a=area: a.widget().width() <= a.viewport().width()  # noqa: E731
            qtbot.waitUntil(fits, timeout=3000)  # once the posted layout has run (a final state)
        for table in dock_tables(shown) + dock_tables(dock(win, "dock_layers")):
            assert not table.horizontalScrollBar().isVisible(), (name, table.objectName())
        win.save_screenshot(ARTIFACTS / f"first_impression_{width}x{height}_{name.removeprefix('dock_')}.png")
    assert not dock(win, "dock_layers").findChild(QScrollArea).horizontalScrollBar().isVisible()


@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_no_form_gains_a_scrollbar_when_its_status_line_speaks(demo_window, qtbot, width, height):
    win = demo_window
    resize_to(win, qtbot, width, height)
    message = "A status line of three lines: " + "the run said something long about what it found. " * 3
    for name in METHOD_DOCKS:
        shown = raise_dock(win, qtbot, name)
        area = shown.findChild(QScrollArea)
        status = area.widget().status  # every method panel's status line
        status.setText("")
        area.widget().layout().activate()
        before = area.verticalScrollBar().isVisible()
        status.setText(message)
        area.widget().layout().activate()  # the layout is synchronous: no waiting on time
        assert area.verticalScrollBar().isVisible() == before, name
    win.save_screenshot(ARTIFACTS / f"first_impression_{width}x{height}_status.png")


def _visible_button(window, text: str) -> QPushButton | QToolButton:
    """A visible button whose text or tool tip starts with ``text`` (what a user sees)."""
    for button in window.findChildren(QPushButton) + window.findChildren(QToolButton):
        label = button.text().replace("&", "")
        if on_screen(button) and button.isEnabled() and (label == text or button.toolTip().startswith(text)):
            return button
    raise AssertionError(f"no visible, enabled button says {text!r}")


def test_a_newcomer_gets_from_the_demo_to_streamlines_with_labelled_controls(demo_window, qtbot):
    win = demo_window
    resize_to(win, qtbot, 1280, 800)
    doc = win.document
    # The first screen: the Deterministic panel in front, a visible map selected, the hint on the view.
    assert on_screen(dock(win, "dock_deterministic_tracking").widget())
    assert not on_screen(dock(win, "dock_probabilistic_tracking").widget())
    selected = win.layer_panel.selected_layer()
    assert selected is not None and selected.visible and selected.kind != "dwi"
    hint = win.first_steps.hint
    assert hint.isVisible() and "New ROI" in hint.text() and "Track" in hint.text()
    win.save_screenshot(ARTIFACTS / "first_impression_newcomer_1_demo.png")

    # New ROI (its role box is labelled and says seed), then paint on the axial view.
    role_box = next(box for box in win.findChildren(QComboBox) if box.isVisible() and box.currentText() == "seed")
    assert any(label.buddy() is role_box and "New ROI" in label.text() for label in win.findChildren(QLabel))
    qtbot.mouseClick(_visible_button(win, "New ROI"), Qt.MouseButton.LeftButton)
    roi = win.layer_panel.selected_layer()
    assert roi is not None and roi.kind == "roi" and roi.data.role == "seed"
    assert "brush" in win.statusBar().currentMessage() or "(B)" in win.statusBar().currentMessage()
    brush = _visible_button(win, "Brush")
    assert "(B)" in brush.toolTip() and brush.isChecked()
    axial = win.views["axial"]
    z = int(doc.cursor[2])
    points = [axial.widget_point_of_voxel(v) for v in [(14, 28, z), (18, 28, z)]]
    qtbot.mousePress(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(points[0].x()), int(points[0].y())))
    qtbot.mouseMove(axial, pos=QPoint(int(points[1].x()), int(points[1].y())))
    qtbot.mouseRelease(axial, Qt.MouseButton.LeftButton, pos=QPoint(int(points[1].x()), int(points[1].y())))
    assert roi.data.mask.any()
    status = win.deterministic_panel.status
    qtbot.waitUntil(lambda: "ready" in status.text() and "Track" in status.text(), timeout=5000)
    # Painting a seed filters no tractogram: the demo bundles all stay on screen.
    assert doc.layer("bundles").selection is None
    win.save_screenshot(ARTIFACTS / "first_impression_newcomer_2_seed.png")

    qtbot.mouseClick(_visible_button(win, "Track"), Qt.MouseButton.LeftButton)
    counted = win.statusBar().findChild(QLabel, "last_result")  # a permanent part of the status bar
    qtbot.waitUntil(lambda: "streamlines in layer" in counted.text(), timeout=120_000)
    assert win.wait_for_jobs(120) and win.errors == [], win.errors
    result = doc.layer("deterministic")
    count = len(result.data)
    assert count > 0 and f"{count:,} streamline" in counted.text() and counted.isVisible()
    assert win.layer_panel.selected_layer() is result  # selected, and centred: the cursor is on it
    assert on_screen(dock(win, "dock_deterministic_tracking").widget())
    assert not hint.isVisible()  # the first tract exists: the hint has done its work
    assert win.statusBar().currentMessage() != hint.text()  # in the status bar too
    entry = win.view3d._fibers[id(result)]
    assert entry["actor"].GetVisibility()  # on screen in 3-D
    assert doc.layer("bundles").selection is None and doc.layer("bundles").visible
    win.save_screenshot(ARTIFACTS / "first_impression_newcomer_3_tracked.png")


def test_filtering_a_tractogram_by_rois_is_the_users_choice_per_layer(demo_window, qtbot, demo_dir):
    from tests.gui.actions import choose_from_layer_menu
    from tractlens.widgets.panels import FILTER_BY_ROIS

    win = demo_window
    doc = win.document
    bundles = doc.layer("bundles")
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    assert win.wait_for_jobs(60)
    assert bundles.selection is None  # an ROI alone hides nothing
    choose_from_layer_menu(win, qtbot, bundles, FILTER_BY_ROIS)
    qtbot.waitUntil(lambda: bundles.selection is not None, timeout=10_000)
    assert bundles.filter_by_rois and 0 < bundles.selection.sum() < len(bundles.data)
    choose_from_layer_menu(win, qtbot, bundles, FILTER_BY_ROIS)  # unticked: every streamline again
    qtbot.waitUntil(lambda: bundles.selection is None, timeout=10_000)


def test_a_retrack_that_finds_nothing_asks_before_replacing_a_good_result(demo_window, qtbot, demo_dir):
    from tractlens.widgets import dialogs

    win = demo_window
    win.open_roi(demo_dir / "roi_crossing_lr_seed.nii.gz", role="seed")
    assert win.wait_for_jobs(60)
    panel = win.deterministic_panel
    panel.track()
    assert win.wait_for_jobs(120) and win.errors == []
    good = win.document.layer("deterministic")
    assert len(good.data) > 0
    panel.form.editors["min_length_mm"].setValue(200.0)  # no demo streamline is that long
    with dialogs.answers(question=[False]):  # "Replace the earlier result?" No
        panel.track()
        assert win.wait_for_jobs(120)
    assert win.document.layer("deterministic") is good and len(good.data) > 0
    assert "kept" in panel.status.text()


def test_an_empty_window_writes_no_report_of_black_panels(window, qtbot, tmp_path):
    from tractlens.app.errors import InputError
    from tractlens.widgets import dialogs

    out = tmp_path / "out"
    out.mkdir()
    with dialogs.answers(save_file=[out / "report.pdf"]):
        window.reports.report_dialog()
    assert window.errors and "nothing to report" in window.errors[-1]
    with pytest.raises(InputError, match="nothing to report"):
        window.export_report(out / "report.pdf")
    assert list(out.iterdir()) == []
