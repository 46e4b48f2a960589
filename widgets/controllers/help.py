"""The Help menu: the keyboard shortcuts (listed from the window's own actions, so the list can
never drift from the menus) and About TractLens."""

from __future__ import annotations

import html

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout

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
    ("Click", "move the cursor (navigate tool)"),
    ("Wheel", "next or previous slice"),
    ("Ctrl+wheel", "zoom about the pointer"),
    ("Right-drag", "window/level of the map under it"),
    ("Space+drag, middle-drag", "pan (Shift+drag with the navigate tool)"),
    ("Drag", "paint with the brush, erase, draw a rectangle"),
    ("Double-click", "close a polygon"),
    ("3-D view: drag, wheel", "turn the camera, zoom"),
)


def _table(title: str, rows) -> str:
    cells = "".join(
        f"<tr><td>{html.escape(what)}</td><td><tt>{html.escape(keys)}</tt></td></tr>" for what, keys in rows
    )
    return f"<p><b>{html.escape(title)}</b></p><table cellspacing='0' cellpadding='2'>{cells}</table>"


def shortcuts_html(window) -> str:
    """The shortcut list in two columns (menus grouped; the mouse last): short enough for an
    800 px screen."""
    groups: dict[str, list] = {}
    for menu, command, keys in shortcut_rows(window):
        groups.setdefault(menu, []).append((command, keys))
    blocks = [(_table(menu, rows), len(rows) + 2) for menu, rows in groups.items()]
    blocks.append((_table("Mouse (slice views)", [(effect, gesture) for gesture, effect in MOUSE_ROWS]), 10))
    half, columns, count = sum(n for _, n in blocks) / 2, [[], []], 0
    for block, lines in blocks:  # in menu order, split where half the lines are
        columns[0 if count < half else 1].append(block)
        count += lines
    cells = "".join(f"<td valign='top' style='padding-right:18px'>{''.join(c)}</td>" for c in columns)
    return f"<table><tr>{cells}</tr></table>"


class ShortcutsDialog(QDialog):
    """Help ▸ Keyboard shortcuts: the two-column list, scrolling only on a screen under 800 px."""

    def __init__(self, window):
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts and mouse")
        self.browser = QTextBrowser()
        self.browser.setHtml(shortcuts_html(window))
        self.browser.setFrameShape(QTextBrowser.Shape.NoFrame)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser)
        layout.addWidget(buttons)
        document = self.browser.document()
        document.setTextWidth(document.idealWidth())
        width, height = int(document.idealWidth()) + 40, int(document.size().height()) + 80
        screen = window.screen().availableGeometry() if window.screen() is not None else None
        limit = min(MAX_HEIGHT_PX, int(0.9 * screen.height())) if screen is not None else MAX_HEIGHT_PX
        self.resize(width, min(height, limit))


MAX_HEIGHT_PX = 740  # an 800 px screen less its panel and title bar


def show_shortcuts(window):
    """Help ▸ Keyboard shortcuts: the dialog, not blocking (None when nobody can be asked)."""
    if not dialogs.interactive():
        return None
    dialog = ShortcutsDialog(window)
    dialog.open()
    return dialog


def about_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

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
