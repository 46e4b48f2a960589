"""What a user does in the window, as functions the GUI tests share."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QContextMenuEvent
from PySide6.QtWidgets import QApplication

from tractlens.widgets.controllers.menus import plain, window_actions


def trigger(window, path: str, text: str) -> None:
    """Choose ``path ▸ text`` from the window's menus (as the menu bar would); the item must be enabled."""
    for menu_path, action in window_actions(window):
        if menu_path == path and plain(action.text()) == text:
            assert action.isEnabled()
            action.trigger()
            return
    raise AssertionError(f"no menu item {path} ▸ {text}")


def choose_from_layer_menu(win, qtbot, layer, text: str) -> None:
    """Right-click a layer in the layer list and pick ``text`` (the context-menu event is sent
    by hand: QTest's mouse events do not pass through the window system)."""
    panel = win.layer_panel
    viewport = panel.list.viewport()
    pos = panel.list.visualItemRect(panel.item_for(layer)).center()
    qtbot.mouseClick(viewport, Qt.MouseButton.RightButton, pos=pos)
    QApplication.sendEvent(viewport, QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, viewport.mapToGlobal(pos)))
    qtbot.waitUntil(lambda: panel.menu is not None and panel.menu.isVisible(), timeout=3000)
    menu = panel.menu
    action = next(action for action in menu.actions() if action.text() == text)
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(action).center())


def press_drag_release(qtbot, view, voxels) -> None:
    """Press the left button on a slice view at the first voxel, move through the others and release
    at the last (a paint or erase stroke with the brush)."""
    points = [view.widget_point_of_voxel(v) for v in voxels]
    qpoints = [QPoint(int(p.x()), int(p.y())) for p in points]
    qtbot.mousePress(view, Qt.MouseButton.LeftButton, pos=qpoints[0])
    for point in qpoints[1:]:
        qtbot.mouseMove(view, pos=point)
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=qpoints[-1])
