"""The View menu: the 3-D camera (reset, along an axis), slice stepping, the radiological
convention, one view maximised, the slab of fibres drawn on the slices, and the 3-D slice planes
(opaque, translucent or hidden). About widgets: it
holds the window's views."""

from __future__ import annotations

from PySide6.QtGui import QAction, QActionGroup

from .menus import add_action
from .settings import settings

SLAB_CHOICES_MM = (1.0, 2.0, 4.0, 10.0, 20.0)  # View > Fiber slab on slices
DEFAULT_SLAB_MM = 4.0
SLAB_KEY = "view/slab_mm"


class ViewControls:
    """The View menu of ``window`` over its ``view3d`` and slice ``views``."""

    def __init__(self, window, view3d, views: dict):
        self.window = window
        self.view3d = view3d
        self.views = views
        self.slab_actions: dict[float | None, QAction] = {}
        self.plane_actions: dict[str, QAction] = {}

    def build(self, view_menu, toolbar) -> None:
        window = self.window
        toolbar.addAction(
            add_action(window, view_menu, "&Reset 3-D camera", self.reset_camera, "Ctrl+R", icon_name="reset-camera")
        )
        add_action(window, view_menu, "Next slice", lambda: self.focused_view().step(1), "Ctrl+Up")
        add_action(window, view_menu, "Previous slice", lambda: self.focused_view().step(-1), "Ctrl+Down")
        add_action(window, view_menu, "Radiological convention", self.toggle_radiological, checkable=True)
        # Ctrl+0, as in other viewers; 0 alone resets the focused slice view (see widgets.slice_navigation)
        add_action(window, view_menu, "Reset slice &zoom", self.reset_slice_zoom, "Ctrl+0")
        self._build_view_controls(view_menu)

    def _build_view_controls(self, view_menu) -> None:
        """The 3-D camera along an axis (Ctrl+1..4), one view maximised (Alt+1..4, Alt+0 or the
        same key again: all four), and the slab of fibers drawn on the slices."""
        window = self.window
        view_menu.addSeparator()
        camera = view_menu.addMenu("3-D &camera")
        views = (
            ("axial", "&Axial (from above)"),
            ("coronal", "&Coronal (from behind)"),
            ("sagittal", "&Sagittal (from the left)"),
            ("isometric", "&Isometric"),
        )
        for key, (name, text) in enumerate(views, start=1):
            add_action(window, camera, text, lambda n=name: self.set_camera_view(n), f"Ctrl+{key}")
        layout = view_menu.addMenu("&Maximise view")
        for key, (name, text) in enumerate(
            (("3d", "&3-D view"), ("axial", "&Axial"), ("coronal", "&Coronal"), ("sagittal", "&Sagittal")), start=1
        ):
            add_action(window, layout, text, lambda n=name: self.maximise_view(n), f"Alt+{key}")
        add_action(window, layout, "All &four views", lambda: self.maximise_view(None), "Alt+0")
        slab_menu = view_menu.addMenu("Streamline s&lab on slices")
        group = QActionGroup(window)
        for mm in (*SLAB_CHOICES_MM, None):
            text = "&All streamlines (no slab)" if mm is None else f"{mm:g} mm"
            action = add_action(window, slab_menu, text, lambda m=mm: self.set_fiber_slab(m), checkable=True)
            group.addAction(action)
            self.slab_actions[mm] = action
        saved = settings().value(SLAB_KEY, DEFAULT_SLAB_MM)
        self.set_fiber_slab(None if saved in ("all", None) else float(saved))
        planes_menu = view_menu.addMenu("Slice &planes in 3-D")
        group = QActionGroup(window)
        for mode, text in (("opaque", "&Opaque"), ("translucent", "&Translucent"), ("hidden", "&Hidden")):
            action = add_action(window, planes_menu, text, lambda m=mode: self.set_plane_mode(m), checkable=True)
            group.addAction(action)
            self.plane_actions[mode] = action
        self.plane_actions[self.view3d.plane_mode].setChecked(True)

    def set_plane_mode(self, mode: str) -> None:
        """The 3-D view's cursor planes opaque, translucent or hidden, its menu item checked."""
        self.view3d.set_plane_mode(mode)
        self.plane_actions[mode].setChecked(True)

    def reset_slice_zoom(self) -> None:
        """Every slice view back to the whole slice, centred (zoom 1, no pan)."""
        for view in self.views.values():
            view.navigation.reset()

    def reset_camera(self) -> None:
        self.view3d.reset_camera()
        self.view3d.request_render()

    def set_fiber_slab(self, mm: float | None) -> None:
        """Draw on the slice views the fibers within ``mm`` around the slice (None: all of them,
        projected); remembered for the next start."""
        for view in self.views.values():
            view.slab_mm = None if mm is None else float(mm)
            view.update()
        if mm in self.slab_actions:
            self.slab_actions[mm].setChecked(True)
        else:
            for action in self.slab_actions.values():
                action.setChecked(False)
        settings().setValue(SLAB_KEY, "all" if mm is None else float(mm))

    def set_camera_view(self, name: str) -> None:
        """Turn the 3-D camera to look along an axis (``axial``, ``coronal``, ``sagittal``) as the
        slice views show it, mirrored with the radiological convention, or ``isometric``."""
        self.view3d.view_from(name, radiological=self.views["axial"].radiological)

    def maximise_view(self, name: str | None) -> None:
        """Show one view (``3d``, ``axial``, ``coronal``, ``sagittal``) over the whole central area,
        or all four (None, or the name of the view already maximised)."""
        widgets = {"3d": self.view3d, **self.views}
        if name is not None and name not in widgets:
            raise ValueError(f"no view {name!r}: one of {', '.join(widgets)}")
        alone = [key for key, widget in widgets.items() if not widget.isHidden()]
        if name is None or alone == [name]:
            for widget in widgets.values():
                widget.show()
            return
        for key, widget in widgets.items():
            widget.setVisible(key == name)
        if name != "3d":
            widgets[name].setFocus()  # its keys (slice stepping) work at once

    def focused_view(self):
        for view in self.views.values():
            if view.hasFocus():
                return view
        return self.views["axial"]

    def toggle_radiological(self) -> None:
        for view in self.views.values():
            view.radiological = not view.radiological
            view.update()
