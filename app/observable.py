"""The change events of the document's objects (napari's model/view split): views subscribe with
:meth:`Observable.connect` and are called on every change; nothing polls and nothing here knows
about Qt or VTK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Observable:
    """Minimal event source: ``connect(callback)``, ``emit(event, **info)``."""

    def __init__(self) -> None:
        self._listeners: list[Callable[..., None]] = []

    def connect(self, callback: Callable[..., None], *, first: bool = False) -> None:
        """Call ``callback(source, event, **info)`` on every change; ``first``: before the
        listeners already connected (one that starts work on a worker, so that it starts before
        the views redraw)."""
        if first:
            self._listeners.insert(0, callback)
        else:
            self._listeners.append(callback)

    def disconnect(self, callback: Callable[..., None]) -> None:
        self._listeners.remove(callback)

    def emit(self, event: str, **info: Any) -> None:
        for callback in list(self._listeners):
            callback(self, event, **info)
