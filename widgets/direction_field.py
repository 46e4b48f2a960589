"""The tracking panels' choice of direction field: a tensor layer or an fODF layer.

Lists the document's ``tensor`` and ``fod`` layers, newest last, and follows the document: a
layer the user picked stays chosen while others come and go; otherwise (or once it is removed)
the newest tensor layer is, what the panel tracked before fODFs existed.
"""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox

from tractlens.app.model import Document, Layer

from .layer_combo import named_with_kind

FIELD_KINDS = ("tensor", "fod")


class DirectionFieldChoice(QComboBox):
    """A combo box of the direction fields open in ``document``; :meth:`layer` is the chosen one."""

    def __init__(self, document: Document, parent=None):
        super().__init__(parent)
        self.document = document
        self.setObjectName("direction_field")
        self.setToolTip("What tracking follows: a tensor layer's main direction, or an fODF layer's peaks")
        self._layers: list[Layer] = []
        self._chosen: Layer | None = None  # picked by the user; None: the newest tensor layer
        self.activated.connect(lambda index: setattr(self, "_chosen", self._layers[index]))
        document.connect(self._on_document)
        self.refresh()

    def _on_document(self, _source, event, **info) -> None:
        if event == "layers" or (event == "display" and "name" in info.get("changed", ())):
            self.refresh()

    def refresh(self) -> None:
        layers = [layer for layer in self.document.layers if layer.kind in FIELD_KINDS]
        chosen = self._chosen
        if chosen not in layers:  # the newest tensor layer, as before fODFs
            tensors = [layer for layer in layers if layer.kind == "tensor"]
            chosen = tensors[-1] if tensors else None
        self.blockSignals(True)
        self.clear()
        self._layers = layers
        for layer in layers:
            self.addItem(named_with_kind(layer))
        self.setCurrentIndex(layers.index(chosen) if chosen in layers else -1)
        self.blockSignals(False)

    def layer(self) -> Layer | None:
        index = self.currentIndex()
        return self._layers[index] if 0 <= index < len(self._layers) else None

    def choose(self, layer: Layer) -> bool:
        """Choose ``layer`` (scripts and tests); False when it is not listed."""
        if layer not in self._layers:
            return False
        self._chosen = layer
        self.setCurrentIndex(self._layers.index(layer))
        return True
