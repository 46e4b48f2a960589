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


def build_file_menu(window, menu, toolbar):
    """The File menu in the usual order: opening (files, folders, the demo, ROIs, recent files),
    sessions, exporting, Quit last. ``window`` gives the slots; the ROI items are added by the ROI
    tool bar later and moved up with :func:`move_before`. Returns the "Open recent" menu."""
    sessions, reports = window.sessions, window.reports
    toolbar.addAction(
        add_action(window, menu, "&Open…", window.open_dialog, QKeySequence.StandardKey.Open, icon_name="open")
    )
    add_action(
        window, menu, "Open &folder (dtifit, bedpostX, fit-csd)…", window.open_folder_dialog, icon_name="open-folder"
    )
    toolbar.addAction(add_action(window, menu, "Open &demo", window.open_demo, "Ctrl+D", icon_name="demo"))
    recent = menu.addMenu("Open &recent")
    menu.addSeparator()
    add_action(
        window, menu, "Open s&ession…", lambda: sessions.open_session_dialog(window), "Ctrl+Shift+O",
        icon_name="open-session",
    )  # fmt: skip
    add_action(
        window, menu, "Save sess&ion", lambda: sessions.save_session_dialog(window), QKeySequence.StandardKey.Save,
        icon_name="save-session",
    )  # fmt: skip
    add_action(
        window, menu, "Save session &as…", lambda: sessions.save_session_as_dialog(window),
        QKeySequence.StandardKey.SaveAs,
    )  # fmt: skip
    add_action(window, menu, "&Autosave interval…", window._autosave_dialog)
    menu.addSeparator()
    toolbar.addAction(
        add_action(window, menu, "Save &screenshot…", reports.screenshot_dialog, "Ctrl+Alt+S", icon_name="screenshot")
    )
    add_action(window, menu, "Export &report…", reports.report_dialog, "Ctrl+Shift+E", icon_name="report")
    menu.addSeparator()
    add_action(window, menu, "&Quit", window.close, QKeySequence.StandardKey.Quit)
    return recent


def move_before(menu, actions, before: QAction) -> None:
    """Move ``actions`` (already in ``menu``) to just before ``before``, in their order."""
    for action in actions:
        menu.insertAction(before, action)  # Qt moves an action that is already there


def window_actions(window) -> list[tuple[str, QAction]]:
    """Every action of the window's menus as (menu path, action), in menu order: what the
    keyboard-shortcut list shows and what the shortcut test checks."""
    found: list[tuple[str, QAction]] = []

    def walk(menu, path: str) -> None:
        for action in menu.actions():
            if action.menu() is not None:
                walk(action.menu(), f"{path} ▸ {plain(action.text())}")
            elif not action.isSeparator() and isinstance(action, QAction):
                found.append((path, action))

    for top in window.menuBar().actions():
        if top.menu() is not None:
            walk(top.menu(), plain(top.text()))
    return found


def plain(text: str) -> str:
    """A menu text without its mnemonic marks (``&Open…`` → ``Open…``)."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&")


def shortcut_text(action: QAction) -> str:
    """An action's shortcuts as the user types them (``Ctrl+S``), several joined by ``, ``."""
    return ", ".join(
        seq.toString(QKeySequence.SequenceFormat.NativeText) for seq in action.shortcuts() if not seq.isEmpty()
    )
