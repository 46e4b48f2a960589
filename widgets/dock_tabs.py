"""The dock tabs of the main window, legible: the six method panels share one tab group on the
right, with short titles on vertical tabs along the window's right edge, never elided.

Six titles side by side need more width than the dock has, so Qt cut them to "Geode…",
"C…", "P…"; along the edge they take height, of which a window has enough for all six, and
the views keep their width. The full title is each tab's tool tip.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QDockWidget, QFrame, QScrollArea, QTabBar, QTabWidget, QWidget

SHORT_TITLES = {  # dock object name -> its tab's title
    "dock_deterministic_tracking": "Deterministic",
    "dock_geodesic_tracking": "Geodesic",
    "dock_probabilistic_tracking": "Probabilistic",
    "dock_commit_filtering": "COMMIT",
    "dock_connectivity": "Connectivity",
    "dock_presurgical": "Presurgical",
}


def scrollable(panel: QWidget) -> QScrollArea:
    """``panel`` in a frameless scroll area: a tall method panel scrolls instead of setting the
    window's minimum height (the geodesic form alone needs ~570 px; a laptop screen has ~700)."""
    area = QScrollArea()
    area.setObjectName(f"scroll_{panel.objectName() or type(panel).__name__}")
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setWidget(panel)
    # Never narrower than the form (with no horizontal scroll bar, a narrower dock cut its right
    # edge), also when the form widens later (a combo box filled with layer names).
    _FitWidth(area, panel)
    return area


class _FitWidth(QObject):
    """Keeps a scroll area at least as wide as its panel's minimum, as the panel's layout changes."""

    def __init__(self, area: QScrollArea, panel: QWidget):
        super().__init__(area)
        self.area, self.panel = area, panel
        panel.installEventFilter(self)
        self.fit()

    def fit(self) -> None:
        needed = self.panel.minimumSizeHint().width() + self.area.verticalScrollBar().sizeHint().width()
        if needed != self.area.minimumWidth():
            self.area.setMinimumWidth(needed)

    def eventFilter(self, watched, event) -> bool:
        if watched is self.panel and event.type() == QEvent.Type.LayoutRequest:
            QTimer.singleShot(0, self.fit)
        return False


def fit_dock_tabs(window) -> None:
    """Short titles, vertical tabs on the right dock area, no elision (again whenever a dock
    moves: Qt makes new tab bars then)."""
    full_titles = {}
    for dock in window.findChildren(QDockWidget):
        short = SHORT_TITLES.get(dock.objectName())
        if short is not None:
            full_titles[short] = dock.windowTitle()
            dock.setWindowTitle(short)
        dock.dockLocationChanged.connect(lambda *_: QTimer.singleShot(0, lambda: _unelide(window, full_titles)))
    window.setTabPosition(Qt.DockWidgetArea.RightDockWidgetArea, QTabWidget.TabPosition.East)
    _unelide(window, full_titles)


def _unelide(window, full_titles: dict) -> None:
    for bar in dock_tab_bars(window):
        bar.setElideMode(Qt.TextElideMode.ElideNone)
        for index in range(bar.count()):
            bar.setTabToolTip(index, full_titles.get(bar.tabText(index), bar.tabText(index)))


def dock_tab_bars(window) -> list[QTabBar]:
    """The tab bars of the window's tabbed docks (not those inside panels)."""
    return [bar for bar in window.findChildren(QTabBar) if bar.parent() is window]
