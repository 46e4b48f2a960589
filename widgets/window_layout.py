"""The main window's proportions: four equal views, docks that widen with the window, and no
stray dock tab bar.

- The central area is a 2×2 grid of equal cells (FSLeyes' and Slicer's equal panes): every view
  ignores its own size hint (the 3-D view's asked for 400×400 and left the slice a user paints on
  at half its width), and the rows and columns stretch alike.
- Docks keep their share of the window's width when it is resized (Qt keeps their width in
  pixels, so at 1920 px every extra pixel went to the views and the tables stayed narrow); a
  width the user drags is the new share.
- Qt (6.11) leaves a second, stale tab bar behind when two dock groups are tabified before the
  window is first shown; it sat inside the Layers dock, over its form. A dock group's real tab bar
  lies beside its docks, never on one, so any window tab bar on a visible dock is stale and hidden.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtWidgets import (
    QDockWidget,
    QHBoxLayout,
    QHeaderView,
    QScrollArea,
    QSizePolicy,
    QTabBar,
    QTableWidget,
    QTreeWidget,
    QVBoxLayout,
    QWidget,
)

VIEW_MINIMUM_PX = 120
LEFT_SHARE = 0.2  # of the window's width, when first shown
RIGHT_SHARE = 0.25
LAYERS_SHARE = 0.6  # of the left column's height: the layer list over the jobs
LEFT_DOCKS = ["dock_layers", "dock_jobs", "dock_statistics"]
RIGHT_DOCKS = [
    "dock_deterministic_tracking",
    "dock_geodesic_tracking",
    "dock_probabilistic_tracking",
    "dock_commit_filtering",
    "dock_connectivity",
    "dock_presurgical",
]


def central_views(view3d: QWidget, views: dict[str, QWidget]) -> QWidget:
    """The 3-D view and the axial, coronal and sagittal slices in 2×2 equal cells."""
    central = QWidget()
    central.setObjectName("central_views")
    # Two rows of two in box layouts, not a grid: a grid keeps the stretch of a row or column whose
    # views are hidden, so a maximised view (View ▸ Maximise) got only half the area.
    column = QVBoxLayout(central)
    column.setContentsMargins(2, 2, 2, 2)
    column.setSpacing(2)
    for pair in ((view3d, views["axial"]), (views["coronal"], views["sagittal"])):
        row = QHBoxLayout()
        row.setSpacing(2)
        for widget in pair:
            widget.setMinimumSize(VIEW_MINIMUM_PX, VIEW_MINIMUM_PX)
            widget.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
            row.addWidget(widget, 1)
        column.addLayout(row, 1)
    interactor = getattr(getattr(view3d, "plotter", None), "interactor", None)
    if interactor is not None:  # pyvistaqt's render widget asks for its window size (400×400)
        interactor.setMinimumSize(VIEW_MINIMUM_PX, VIEW_MINIMUM_PX)
        interactor.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
    return central


def fit_table_columns(table: QTableWidget | QTreeWidget) -> None:
    """The first column (names) takes the width the others leave, the others fit their contents,
    and a header of several words wraps onto two lines: a dock's table needs no sideways scroll
    bar for its columns (the presurgical "within margin" hid behind one even at 1920 px)."""
    if isinstance(table, QTreeWidget):
        header, count = table.header(), table.columnCount()
        item = table.headerItem()
        labels = [item.text(column) for column in range(count)]
    else:
        header, count = table.horizontalHeader(), table.columnCount()
        labels = [table.horizontalHeaderItem(c).text() if table.horizontalHeaderItem(c) else "" for c in range(count)]
    if count == 0:
        return
    header.setStretchLastSection(False)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    header.setMinimumSectionSize(24)
    for column in range(1, count):
        header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        words = labels[column].split(" ")
        if len(words) > 1 and "\n" not in labels[column]:
            half = (len(words) + 1) // 2
            wrapped = " ".join(words[:half]) + "\n" + " ".join(words[half:])
            if isinstance(table, QTreeWidget):
                table.headerItem().setText(column, wrapped)
            else:
                table.horizontalHeaderItem(column).setText(wrapped)
    table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)


def fit_dock_tables(window) -> None:
    """:func:`fit_table_columns` for every table and tree in the window's docks (their panels'
    scroll areas follow the widths they need: :func:`widgets.dock_tabs.scrollable`)."""
    for dock in window.findChildren(QDockWidget):
        for table in dock.findChildren(QTableWidget) + dock.findChildren(QTreeWidget):
            fit_table_columns(table)
        area = dock.widget()
        if isinstance(area, QScrollArea) and area.widget() is not None:  # the columns changed its needs
            area.widget().updateGeometry()


def stray_tab_bars(window) -> list[QTabBar]:
    """The window's dock tab bars that lie on a visible dock (stale: see the module's note)."""
    # the window's own children only (docks and their tab bars are; a walk of the whole widget
    # tree took 7 ms, and this runs after every layout request: each cursor step's status text)
    children = window.children()
    docks = [c for c in children if isinstance(c, QDockWidget) and c.isVisible() and not c.isFloating()]
    return [
        bar
        for bar in children
        if isinstance(bar, QTabBar)
        and bar.isVisible()
        and any(dock.geometry().intersects(bar.geometry()) for dock in docks)
    ]


def hide_stray_tab_bars(window) -> None:
    for bar in stray_tab_bars(window):
        bar.hide()


class DockProportions(QObject):
    """Keeps the docks' shares of the window's width through resizes, sets the first ones when the
    window is first shown, and hides stray tab bars whenever the layout may have changed."""

    def __init__(self, window, left: list[str], right: list[str]):
        super().__init__(window)
        self.window = window
        self.left, self.right = left, right
        self._shown = False
        self._width = 0
        window.installEventFilter(self)
        for dock in window.findChildren(QDockWidget):
            dock.dockLocationChanged.connect(lambda *_: QTimer.singleShot(0, self._tidy))
            dock.topLevelChanged.connect(lambda *_: QTimer.singleShot(0, self._tidy))

    def _dock(self, name: str) -> QDockWidget | None:
        return self.window.findChild(QDockWidget, name)

    def _visible(self, names: list[str]) -> list[QDockWidget]:
        docks = [self._dock(name) for name in names]
        return [dock for dock in docks if dock is not None and dock.isVisible() and not dock.isFloating()]

    def eventFilter(self, watched, event) -> bool:
        if watched is self.window:
            kind = event.type()
            if kind == event.Type.Show and not self._shown:
                self._shown = True
                QTimer.singleShot(0, self.first_layout)
            elif kind == event.Type.Resize and self._shown:
                old = event.oldSize().width()
                self._keep_shares(old, event.size().width())
            elif kind == event.Type.LayoutRequest:
                QTimer.singleShot(0, self._tidy)
        return False

    def first_layout(self) -> None:
        """The docks' first widths and the Layers/Jobs split, as shares of the window."""
        width, height = self.window.width(), self.window.height()
        self.set_width(self.left, LEFT_SHARE * width)
        self.set_width(self.right, RIGHT_SHARE * width)
        layers, jobs = self._dock("dock_layers"), self._dock("dock_jobs")
        if layers is not None and jobs is not None and layers.isVisible() and jobs.isVisible():
            column = layers.height() + jobs.height()
            share = int(LAYERS_SHARE * column) if column > 0 else int(LAYERS_SHARE * height)
            self.window.resizeDocks([layers, jobs], [share, max(1, column - share)], Qt.Orientation.Vertical)
        self._tidy()

    def set_width(self, names: list[str], pixels: float) -> None:
        docks = self._visible(names)
        if docks:
            self.window.resizeDocks(docks, [int(pixels)] * len(docks), Qt.Orientation.Horizontal)

    def _keep_shares(self, old_width: int, new_width: int) -> None:
        if old_width <= 0 or old_width == new_width:
            return
        for names in (self.left, self.right):
            docks = self._visible(names)
            if docks:
                share = max(dock.width() for dock in docks) / old_width
                self.set_width(names, share * new_width)
        QTimer.singleShot(0, self._tidy)

    def _tidy(self) -> None:
        hide_stray_tab_bars(self.window)
