"""One helper for the window's menus and tool bars: an action with its text, shortcut and slot."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction, QKeySequence


def add_action(parent, menu, text: str, slot: Callable[[], object], shortcut=None, checkable: bool = False) -> QAction:
    """An action owned by ``parent`` (the window, so its shortcut works there) added to ``menu``;
    ``slot`` is called without the ``checked`` argument."""
    action = QAction(text, parent)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    action.setCheckable(checkable)
    action.triggered.connect(lambda *_: slot())
    menu.addAction(action)
    return action
