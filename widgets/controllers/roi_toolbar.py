"""The ROI tool bar and Edit menu: the role of new ROIs, New ROI, the drawing tools, the brush and
shape radius, the flood-fill threshold, and the 3-D handle that follows the active shape ROI.
About widgets: it holds the window's tool bar and 3-D view; the drawing itself is
:class:`~tractlens.widgets.roi_tools.RoiTools`'."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QActionGroup, QKeySequence
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QLabel, QSpinBox

from tractlens.app.model import ROI_ROLES, shape_half_sizes
from tractlens.resources import TOOLBAR_ICONS

from .menus import add_action

TOOL_TIPS = {  # what each tool does, for its tool tip (the key is added)
    "navigate": "Navigate: click to move the cursor, wheel for the next slice, right-drag for window/level, Shift+drag to pan",
    "brush": "Brush: drag on a slice to paint into the selected ROI",
    "eraser": "Eraser: erase from the selected ROI",
    "rectangle": "Rectangle: drag to fill a rectangle in the selected ROI",
    "polygon": "Polygon: click the corners, double-click to fill",
    "fill": "Fill: flood-fill the connected voxels above the fill threshold",
    "sphere": "Sphere: click to place a spherical ROI, Shift+drag to size it (move and resize it in 3-D too)",
    "box": "Box: click to place a box ROI, Shift+drag to size it (move and resize it in 3-D too)",
    "ruler": "Ruler: two clicks on a slice measure the distance between them in mm (Esc removes it)",
}
TOOLS = (
    ("navigate", "N"),
    ("brush", "B"),
    ("eraser", "E"),
    ("rectangle", "R"),
    ("polygon", "P"),
    ("fill", "F"),
    ("sphere", "S"),
    ("box", "X"),
    ("ruler", "M"),  # measure a distance in mm on a slice (not an ROI tool: it draws nothing into ROIs)
)
SHAPE_TOOLS = ("sphere", "box")


class RoiToolbar:
    """ROI tools of ``window`` (its ``document``, ``roi_tools``, ``view3d`` and layer panel)."""

    def __init__(self, window):
        self.window = window
        self.document = window.document
        self.roi_tools = window.roi_tools
        self.view3d = window.view3d
        self.tool_actions: dict = {}
        self._paint_hint: tuple | None = None  # (the new ROI, the status message that says to paint it)
        self.document.connect(self._on_document)

    def build(self, file_menu) -> None:
        window, tools = self.window, self.roi_tools
        edit_menu = window.menuBar().addMenu("&Edit")
        add_action(window, edit_menu, "&Undo", self.document.undo, QKeySequence.StandardKey.Undo, icon_name="undo")
        add_action(window, edit_menu, "&Redo", self.document.redo, "Ctrl+Shift+Z", icon_name="redo")
        file_menu.addSeparator()
        add_action(window, file_menu, "Open R&OI…", window.open_roi_dialog)
        add_action(window, file_menu, "Sa&ve ROI…", window.save_roi_dialog)
        bar = window.addToolBar("ROI")
        bar.setObjectName("toolbar_roi")
        self.role_box = QComboBox()
        self.role_box.setObjectName("new_roi_role")
        self.role_box.addItems(ROI_ROLES)
        self.role_box.setToolTip("The role of the next new ROI: seed, target, waypoint, exclusion, stop or lesion")
        self.role_box.currentTextChanged.connect(lambda role: setattr(tools, "role", role))
        role_label = QLabel(" New ROI as ")
        role_label.setBuddy(self.role_box)
        bar.addWidget(role_label)
        bar.addWidget(self.role_box)
        self.new_roi_action = add_action(window, edit_menu, "New ROI", self.new_roi, "Ctrl+N", icon_name="new-roi")
        self.new_roi_action.setToolTip("New ROI (Ctrl+N): an empty ROI of the role chosen, with the brush ready")
        bar.addAction(self.new_roi_action)
        bar.widgetForAction(self.new_roi_action).setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        group = QActionGroup(window)
        for tool, key in TOOLS:
            action = add_action(
                window,
                edit_menu,
                tool.capitalize(),
                lambda t=tool: self.set_tool(t),
                key,
                True,
                icon_name=tool if tool in TOOLBAR_ICONS else None,  # the ruler shows its name
            )
            action.setToolTip(f"{TOOL_TIPS[tool]} ({key})")
            group.addAction(action)
            bar.addAction(action)
            self.tool_actions[tool] = action
        self.tool_actions["navigate"].setChecked(True)
        self.radius_box = QSpinBox()
        self.radius_box.setRange(0, 20)
        self.radius_box.setValue(tools.radius)
        self.radius_box.setPrefix("radius ")
        self.radius_box.setSuffix(" voxels")
        self.radius_box.setToolTip("Brush and shape radius, in voxels")
        self.radius_box.valueChanged.connect(self._radius_changed)
        bar.addWidget(self.radius_box)
        self.threshold_box = QDoubleSpinBox()
        self.threshold_box.setRange(-1e6, 1e6)
        self.threshold_box.setDecimals(3)
        self.threshold_box.setSingleStep(0.05)
        self.threshold_box.setValue(tools.threshold)
        self.threshold_box.setPrefix("fill > ")
        self.threshold_box.setToolTip("Fill tool: the connected voxels above this value of the selected map")
        self.threshold_box.valueChanged.connect(lambda t: setattr(tools, "threshold", float(t)))
        bar.addWidget(self.threshold_box)

    def _radius_changed(self, radius: int) -> None:
        """The radius box sets the brush and shape size, and resizes the active shape ROI when
        its tool is chosen (with the box tool, a box; another tool's size leaves it alone)."""
        self.roi_tools.radius = int(radius)
        layer = self.roi_tools.active_roi()
        shape = layer.data.shape if layer is not None else None
        if shape is not None and shape["kind"] == self.roi_tools.tool and shape["radius"] != radius:
            self.document.set_roi_shape(layer, dict(shape, radius=int(radius)))

    def attach_shape_widget(self, layer) -> None:
        """Put the 3-D handle on a shape ROI: moving or resizing it there is one undoable edit
        per interaction (a sphere handle on a sphere, a box handle on a box)."""

        def changed(shape: dict) -> None:
            if layer in self.document.layers:
                self.document.set_roi_shape(layer, shape)

        self.view3d.show_shape_widget(layer, changed)

    def set_tool(self, tool: str) -> None:
        self.roi_tools.tool = tool
        self.tool_actions[tool].setChecked(True)
        self.view3d.pick_planes = tool in SHAPE_TOOLS  # a click on a 3-D plane places one

    def follow_shape(self, layer) -> None:
        """A shape ROI moved or resized (on a slice, in 3-D, by undo): the 3-D handle goes with it
        (onto it, if it was on another ROI) and the radius box shows its size."""
        if self.view3d.shape_layer is not layer or not self.view3d.handle_fits(layer):
            self.attach_shape_widget(layer)
        else:
            self.view3d.follow_shape(layer)
        if layer is self.roi_tools.active_roi():
            radius = round(float(np.max(shape_half_sizes(layer.data.shape))))
            self.roi_tools.radius = radius
            self.radius_box.blockSignals(True)  # showing the size is no edit
            self.radius_box.setValue(radius)
            self.radius_box.blockSignals(False)

    def shape_created(self, layer) -> None:
        self.window.select_layer(layer)
        self.attach_shape_widget(layer)

    def place_shape_3d(self, ijk) -> None:
        """A click on a cursor plane in the 3-D view with the sphere or box tool: a new shape ROI there."""
        tool = self.roi_tools.tool
        if tool not in SHAPE_TOOLS:
            return
        try:
            layer = self.roi_tools.new_roi(shape={"kind": tool, "centre": ijk, "radius": self.roi_tools.radius})
        except ValueError as exc:
            self.window.report_error(str(exc), "")
            return
        self.shape_created(layer)

    def new_roi(self, role: str | None = None):
        """An empty ROI of the chosen role (or ``role``, which becomes the chosen one), selected,
        with the brush ready (None: no image yet)."""
        if role is not None:
            self.role_box.setCurrentText(role)
        try:
            layer = self.roi_tools.new_roi()
        except ValueError as exc:
            self.window.report_error(str(exc), "")
            return None
        self.window.select_layer(layer)
        if self.roi_tools.tool == "navigate":
            self.set_tool("brush")
        message = f"{layer.name} ({layer.data.role}): paint it on a slice view with the brush (B), then Track (Ctrl+T)"
        self.window.statusBar().showMessage(message, 0)
        self._paint_hint = (layer, message)
        return layer

    def _on_document(self, _source, event, **info) -> None:
        """Once the new ROI has voxels, the message that says to paint it goes (its work is done)."""
        if event != "roi" or self._paint_hint is None or info.get("layer") is not self._paint_hint[0]:
            return
        layer, message = self._paint_hint
        if layer.data.mask.any():
            self._paint_hint = None
            status = self.window.statusBar()
            if status.currentMessage() == message:
                status.clearMessage()
