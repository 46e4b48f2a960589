"""One helper for the window's menus and tool bars: an action with its text, shortcut, icon and slot."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction, QIcon, QKeySequence

from tractlens import resources


def icon(name: str) -> QIcon:
    """The shipped tool-bar icon ``name`` (see :data:`tractlens.resources.TOOLBAR_ICONS`)."""
    return QIcon(str(resources.icon_path(name)))


def app_icon() -> QIcon:
    """The application icon (window title bars, task bars)."""
    return QIcon(str(resources.path(resources.APP_ICON)))


def add_action(
    parent,
    menu,
    text: str,
    slot: Callable[[], object],
    shortcut=None,
    checkable: bool = False,
    icon_name: str | None = None,
) -> QAction:
    """An action owned by ``parent`` (the window, so its shortcut works there) added to ``menu``;
    ``slot`` is called without the ``checked`` argument; ``icon_name`` a shipped tool-bar icon."""
    action = QAction(text, parent)
    if icon_name is not None:
        action.setIcon(icon(icon_name))
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    action.setCheckable(checkable)
    action.triggered.connect(lambda *_: slot())
    menu.addAction(action)
    return action
