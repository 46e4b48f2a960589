"""The Help menu: the keyboard shortcuts (listed from the window's own actions, so the list can
never drift from the menus) and About TractLens."""

from __future__ import annotations

import html
from importlib.metadata import PackageNotFoundError, version

from PySide6.QtGui import QKeySequence

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


def shortcuts_html(window) -> str:
    """The shortcut list as an HTML table (one row per action, grouped by menu)."""
    lines = ["<table cellspacing='0' cellpadding='3'>"]
    last = None
    for menu, command, keys in shortcut_rows(window):
        if menu != last:
            lines.append(f"<tr><td colspan='2'><b>{html.escape(menu)}</b></td></tr>")
            last = menu
        lines.append(f"<tr><td>{html.escape(command)}</td><td><tt>{html.escape(keys)}</tt></td></tr>")
    lines.append("</table>")
    return "\n".join(lines)


def show_shortcuts(window):
    """Help ▸ Keyboard shortcuts: the table in a box that does not block (nothing when scripted)."""
    return dialogs.information(window, "Keyboard shortcuts", shortcuts_html(window), rich=True)


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
