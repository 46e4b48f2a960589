"""The way to a first result, shown: what the window does after ``--demo`` and after Track.

- After the demo opens, the Deterministic panel is in front (it tracks at once on the demo's
  tensors; the probabilistic one needs a ball & sticks fit first) and a visible map is selected.
- Until the first tracking result exists, a short hint on the axial view says what to do
  ("New ROI → paint a seed → Track"), as DSI Studio's step strip does; it goes once there is one.
- Track brings its panel forward; its result is selected, centred (the cursor goes to it) and
  counted in the status bar.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QBoxLayout, QDockWidget, QLabel, QPushButton

from tractlens.app.track_results import result_centre, result_count, result_text

HINT = "New ROI → paint a seed → Track (Ctrl+T)"
PANEL_DOCKS = {  # tracking method -> its dock
    "deterministic": "dock_deterministic_tracking",
    "geodesic": "dock_geodesic_tracking",
    "probabilistic": "dock_probabilistic_tracking",
}


class FirstSteps(QObject):
    """Wires the window's first screen and its tracking feedback (``window``: the main window)."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self._demo_pending = False
        self.tracked = False  # a tracking result exists: the hint is not needed any more
        view = window.views["axial"]
        self.hint = QLabel(HINT, view)
        self.hint.setObjectName("first_steps_hint")
        self.hint.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.hint.setStyleSheet(
            "QLabel { background: rgba(20, 20, 20, 200); color: white; padding: 4px 8px; border-radius: 4px; }"
        )
        self.hint.setWordWrap(True)  # a narrow view wraps it rather than cutting it
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.hide()
        view.installEventFilter(self)
        # The last run's count stays in the status bar (a permanent part: other messages pass over it).
        self.result_label = QLabel("")
        self.result_label.setObjectName("last_result")
        window.statusBar().addPermanentWidget(self.result_label)
        window.loaded.connect(self._loaded)
        window.document.connect(lambda _source, event, **_info: event == "layers" and self.update_hint())
        for method, panel in (
            ("deterministic", window.deterministic_panel),
            ("geodesic", window.geodesic_panel),
            ("probabilistic", window.probabilistic_panel),
        ):
            panel.finished.connect(lambda layer, m=method: self.show_result(m, layer))
        self._paint_seed_button(window.probabilistic_panel)

    def _paint_seed_button(self, panel) -> None:
        """The Probabilistic panel says "paint a seed ROI" too: the same button at its top (added
        here, so that the panel's own layout stays its own)."""
        layout = panel.layout()
        if not isinstance(layout, QBoxLayout):
            return
        button = QPushButton("Paint a seed ROI")
        button.setObjectName("probabilistic_paint_seed")
        button.setToolTip(
            "A new seed ROI with the brush ready (New ROI, Ctrl+N): drag on a slice view to paint it, then Track"
        )
        button.clicked.connect(lambda: self.window.roi_toolbar.new_roi(role="seed"))
        layout.insertWidget(0, button)

    # ------------------------------------------------------------ the demo
    def demo_requested(self) -> None:
        self._demo_pending = True

    def _loaded(self, path: str) -> None:
        if self._demo_pending and path.endswith("bundles.trk"):  # the demo's last file
            self._demo_pending = False
            self.first_screen()

    def first_screen(self) -> None:
        """The Deterministic panel in front, the topmost visible map selected, the hint shown."""
        self.raise_panel("deterministic")
        window = self.window
        layers = [layer for layer in reversed(window.document.layers) if layer.visible]
        maps = [layer for layer in layers if layer.kind not in ("tractogram", "roi")]
        chosen = (maps or layers or [None])[0]
        if chosen is not None:
            window.select_layer(chosen)
            window.layer_panel.list.scrollToItem(window.layer_panel.item_for(chosen))
        self.update_hint()
        window.statusBar().showMessage(HINT)  # what a newcomer reads first, until another message

    # ------------------------------------------------------------ the hint
    def update_hint(self) -> None:
        has_data = self.window.document.reference_affine is not None
        self.hint.setVisible(has_data and not self.tracked)
        status = self.window.statusBar()
        if self.tracked and status.currentMessage() == HINT:  # its work is done there too
            status.clearMessage()
        self._place_hint()

    def _place_hint(self) -> None:
        view = self.hint.parentWidget()
        self.hint.setMaximumWidth(max(80, view.width() - 16))
        self.hint.adjustSize()
        self.hint.move(max(0, (view.width() - self.hint.width()) // 2), 24)

    def eventFilter(self, watched, event) -> bool:
        if event.type() == event.Type.Resize:
            self._place_hint()
        return False

    # ------------------------------------------------------- track feedback
    def raise_panel(self, method: str) -> QDockWidget | None:
        dock = self.window.findChild(QDockWidget, PANEL_DOCKS[method])
        if dock is not None:
            dock.show()
            dock.raise_()
        return dock

    def track(self, method: str) -> int | None:
        """The Track menu: the method's panel in front, then Track there."""
        self.raise_panel(method)
        return self.panel(method).track()

    def panel(self, method: str):
        window = self.window
        return {
            "deterministic": window.deterministic_panel,
            "geodesic": window.geodesic_panel,
            "probabilistic": window.probabilistic_panel,
        }[method]

    def show_result(self, method: str, layer) -> None:
        """A tracking run ended: its panel in front, its layer selected and centred, its count said.
        A live re-track's result is not centred: the slices stay where the user is drawing."""
        window = self.window
        self.raise_panel(method)
        if layer is None or layer not in window.document.layers:
            return
        window.select_layer(layer)
        if result_count(layer):
            self.tracked = True
            self.update_hint()
            live = getattr(self.panel(method), "live", None)
            if live is None or not live.isChecked():
                self.centre_on(layer)
        self.result_label.setText(result_text(method, layer))

    def tracked_elsewhere(self) -> None:
        """A tracking result made another way (Track ▸ Named bundles…): the hint's work is done."""
        self.tracked = True
        self.update_hint()

    def centre_on(self, layer) -> None:
        """Put the cursor (and so the slices) at the middle of the result (a tractogram's points,
        a path distribution's voxels)."""
        doc = self.window.document
        centre = result_centre(layer, doc.reference_affine)
        if centre is not None:
            doc.set_cursor(centre)
