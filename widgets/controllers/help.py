"""The Help menu: the keyboard shortcuts (listed from the window's own actions, so the list can
never drift from the menus) and About TractLens."""

from __future__ import annotations

import html
from importlib.metadata import PackageNotFoundError, version

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QTextDocumentFragment
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from .. import dialogs
from .menus import add_action, plain, shortcut_text, window_actions


def build_help_menu(window) -> None:
    """Help ▸ Keyboard shortcuts (F1) and About TractLens, as the menu bar's last menu."""
    menu = window.menuBar().addMenu("&Help")
    add_action(
        window, menu, "&Keyboard shortcuts", lambda: show_shortcuts(window), QKeySequence.StandardKey.HelpContents
    )
    add_action(window, menu, "&About TractLens", lambda: show_about(window))


def shortcut_rows(window) -> list[tuple[str, str, str]]:
    """(menu, command, shortcut) of every menu action that has a shortcut, in menu order."""
    rows = []
    for path, action in window_actions(window):
        keys = shortcut_text(action)
        if keys:
            rows.append((path, plain(action.text()).rstrip("…"), keys))
    return rows


#: What the mouse does on a slice view (not menu actions, so listed here): (gesture, effect).
MOUSE_ROWS = (
    ("Click (slice)", "move the cursor (navigate tool)"),
    ("Wheel", "next or previous slice"),
    ("Ctrl+wheel", "zoom about the pointer"),
    ("Right-drag", "window/level of the map under it"),
    ("Space+drag, middle-drag", "pan (Shift+drag with the navigate tool)"),
    ("Drag", "paint with the brush, erase, draw a rectangle"),
    ("Double-click", "close a polygon"),
    ("Drag, wheel (3-D view)", "turn the camera, zoom"),
)


def _table(title: str, rows, *, keys_first: bool = False) -> str:
    """A titled two-column table; the keys (or gestures) in a fixed-width font."""
    cells = "".join(
        f"<tr><td><tt>{html.escape(b)}</tt>&nbsp;&nbsp;</td><td>{html.escape(a)}</td></tr>"
        if keys_first
        else f"<tr><td>{html.escape(a)}&nbsp;&nbsp;</td><td><tt>{html.escape(b)}</tt></td></tr>"
        for a, b in rows
    )
    return f"<p><b>{html.escape(title)}</b></p><table cellspacing='0' cellpadding='2'>{cells}</table>"


def shortcut_columns(window, count: int = 3) -> list[str]:
    """The shortcut list as ``count`` HTML columns (menus grouped, in menu order; the mouse last),
    each split where its share of the lines is: short enough for an 800 px screen."""
    groups: dict[str, list] = {}
    for menu, command, keys in shortcut_rows(window):
        groups.setdefault(menu, []).append((command, keys))
    blocks = [(_table(menu, rows), len(rows) + 2) for menu, rows in groups.items()]
    mouse = [(effect, gesture) for gesture, effect in MOUSE_ROWS]
    blocks.append((_table("Mouse", mouse, keys_first=True), len(MOUSE_ROWS) + 2))
    share, columns, lines_before = sum(n for _, n in blocks) / count, [[] for _ in range(count)], 0
    for block, lines in blocks:
        columns[min(count - 1, int(lines_before // share))].append(block)
        lines_before += lines
    return ["".join(column) for column in columns]


def shortcuts_html(window) -> str:
    """The whole list as one HTML text (its columns one after the other)."""
    return "".join(shortcut_columns(window))


class ShortcutsDialog(QDialog):
    """Help ▸ Keyboard shortcuts: three columns of keys and the mouse; scrolls only on a screen
    too small for it."""

    def __init__(self, window):
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts and mouse")
        columns = QWidget()
        row = QHBoxLayout(columns)
        self.labels = []
        for html_text in shortcut_columns(window):
            label = QLabel(html_text)
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
            row.addWidget(label)
            self.labels.append(label)
        self.area = QScrollArea()
        self.area.setWidget(columns)
        self.area.setWidgetResizable(True)
        self.area.setFrameShape(QScrollArea.Shape.NoFrame)
        self.area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.area)
        layout.addWidget(buttons)
        natural = columns.sizeHint()
        screen = window.screen().availableGeometry() if window.screen() is not None else None
        limit = min(MAX_HEIGHT_PX, int(0.9 * screen.height())) if screen is not None else MAX_HEIGHT_PX
        self.area.setMinimumWidth(natural.width() + self.area.verticalScrollBar().sizeHint().width())
        self.resize(natural.width() + 60, min(natural.height() + 70, limit))

    def plain_text(self) -> str:
        return "\n".join(QTextDocumentFragment.fromHtml(label.text()).toPlainText() for label in self.labels)


MAX_HEIGHT_PX = 740  # an 800 px screen less its panel and title bar


def show_shortcuts(window):
    """Help ▸ Keyboard shortcuts: the dialog, not blocking (None when nobody can be asked)."""
    if not dialogs.interactive():
        return None
    dialog = ShortcutsDialog(window)
    dialog.open()
    return dialog


def about_text() -> str:
    try:
        number = version("tractlens")
    except PackageNotFoundError:
        number = "development"
    return (
        f"<b>TractLens {html.escape(number)}</b><br>Diffusion MRI tractography on the GPU: tensors, geodesic, "
        "deterministic and probabilistic tracking, ball &amp; sticks, COMMIT, connectivity and presurgical "
        "planning.<br><br>Not a certified medical device: check every result before clinical use."
    )


def show_about(window):
    """Help ▸ About TractLens (nothing when scripted)."""
    return dialogs.information(window, "About TractLens", about_text(), rich=True)
