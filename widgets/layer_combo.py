"""A combo box of the document's layers of some kinds, kept in step with the document (the
connectivity and presurgical panels choose their inputs with it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import (
    QComboBox,
)

from tractlens.app.model import Document, Layer

COMBO_CHARS = 12

#: A layer's kind in the window's words (the layer list, the layer choices of the panels).
KIND_WORDS = {"dwi": "diffusion series", "rgb": "RGB", "fod": "fODF", "roi": "ROI"}  # else the kind itself


def kind_words(kind: str) -> str:
    return KIND_WORDS.get(kind, kind)


def named_with_kind(layer: Layer) -> str:
    """``lesion  (ROI)``: a layer's name and its kind, in one style everywhere; the kind is left
    out when the name says it already (``tensors``, not ``tensors (tensor)``)."""
    words = kind_words(layer.kind)
    name = layer.name.strip().lower()
    if name in (words.lower(), f"{words.lower()}s") or name.rstrip("s") == words.lower():
        return layer.name
    return f"{layer.name}  ({words})"


class LayerCombo(QComboBox):
    """A combo box of the document's layers of some kinds that keeps the user's choice (by
    identity, following a layer replaced by another) across ``layers`` events."""

    def __init__(
        self,
        document: Document,
        kinds: Sequence[str],
        *,
        prefer: Callable[[Layer], bool] | None = None,
        accept: Callable[[Layer], bool] | None = None,
        show_kind: bool = False,
        parent=None,
    ):
        super().__init__(parent)
        self.document, self.kinds, self.prefer, self.accept = document, tuple(kinds), prefer, accept
        self.show_kind = show_kind
        self.layers: list[Layer] = []
        self._chosen: Layer | None = None
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(COMBO_CHARS)
        self.activated.connect(self._picked)
        self.refresh()

    def _picked(self, index: int) -> None:
        if 0 <= index < len(self.layers):
            self._chosen = self.layers[index]

    def follow(self, old: Layer, new: Layer) -> None:
        if self._chosen is old:
            self._chosen = new

    def refresh(self) -> None:
        layers = [
            layer
            for layer in self.document.layers
            if layer.kind in self.kinds and (self.accept is None or self.accept(layer))
        ]
        current = self._chosen if self._chosen in layers else None
        if current is None and layers:
            preferred = [layer for layer in layers if self.prefer is not None and self.prefer(layer)]
            current = (preferred or layers)[-1]
        self.layers = layers
        self.blockSignals(True)
        self.clear()
        for layer in layers:
            self.addItem(named_with_kind(layer) if self.show_kind else layer.name)
        if current is not None:
            self.setCurrentIndex(layers.index(current))
        self.blockSignals(False)

    def layer(self) -> Layer | None:
        index = self.currentIndex()
        return self.layers[index] if 0 <= index < len(self.layers) else None

    def choose(self, layer: Layer) -> None:
        if layer not in self.document.layers or layer.kind not in self.kinds:
            raise ValueError(f"{layer.name} cannot be chosen here")
        self._chosen = layer
        self.refresh()


# --------------------------------------------------------------------------- heat map
