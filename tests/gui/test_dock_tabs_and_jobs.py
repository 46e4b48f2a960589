"""Dock tabs that are never cut ("Geode…", "C…", "P…") and a job list that neither fills with
"select streamlines" rows nor cuts an error to "failed: in"."""

from PySide6.QtCore import Qt

from tests.conftest import ARTIFACTS
from tractlens.widgets.dock_tabs import SHORT_TITLES, dock_tab_bars


def test_the_method_dock_tabs_show_their_whole_titles(window, qtbot):
    (bar,) = [b for b in dock_tab_bars(window) if "Probabilistic" in [b.tabText(i) for i in range(b.count())]]
    titles = [bar.tabText(i) for i in range(bar.count())]
    assert set(SHORT_TITLES.values()) <= set(titles)
    assert bar.elideMode() == Qt.TextElideMode.ElideNone
    metrics = bar.fontMetrics()
    for index, title in enumerate(titles):
        rect = bar.tabRect(index)
        along = max(rect.width(), rect.height())  # vertical tabs: the text runs along the height
        assert along >= metrics.horizontalAdvance(title), title
        assert bar.rect().contains(rect), title  # every tab on screen, none scrolled away
    assert bar.mapTo(window, bar.rect().bottomRight()).y() <= window.height()
    tips = {bar.tabText(i): bar.tabToolTip(i) for i in range(bar.count())}
    assert tips["Geodesic"] == "Geodesic tracking" and tips["COMMIT"] == "COMMIT filtering"
    window.save_screenshot(ARTIFACTS / "dock_tabs.png")


def test_interactive_selection_jobs_keep_one_row_and_other_jobs_keep_theirs(qtbot, runner):
    from tractlens.widgets.panels import JobPanel

    panel = JobPanel(runner)
    qtbot.addWidget(panel)
    ids = [runner.submit("select streamlines", lambda ctx: None) for _ in range(12)]
    other = runner.submit("load FA.nii.gz", lambda ctx: None)
    assert runner.wait(10)
    qtbot.waitUntil(lambda: all(runner.jobs.get(i) is None or runner.jobs[i].state == "done" for i in ids))
    rows = [panel.tree.topLevelItem(i) for i in range(panel.tree.topLevelItemCount())]
    assert [row.text(0) for row in rows] == ["select streamlines", "load FA.nii.gz"]
    assert rows[0].data(0, Qt.ItemDataRole.UserRole) == ids[-1]  # the latest run
    assert rows[1].data(0, Qt.ItemDataRole.UserRole) == other
    assert rows[0].text(2) == "done"


def test_a_failed_job_shows_its_whole_message(qtbot, runner):
    from tractlens.widgets.panels import JobPanel

    panel = JobPanel(runner)
    qtbot.addWidget(panel)
    panel.resize(260, 300)  # the Jobs dock's width
    message = "cannot reshape array of size 0 into shape (0,newaxis) while drawing the tracking result"

    def fail(ctx):
        raise ValueError(message)

    runner.submit("deterministic tracking", fail)
    assert runner.wait(10)
    qtbot.waitUntil(lambda: "failed" in panel.tree.topLevelItem(0).text(2))
    row = panel.tree.topLevelItem(0)
    assert message in row.toolTip(2) and message in row.toolTip(0)
    assert "Traceback" in row.toolTip(2)  # the details too, for a bug report
    assert message in panel.detail.text() and panel.detail.wordWrap()
    assert panel.detail.text().startswith("deterministic tracking failed: internal error: ValueError")
