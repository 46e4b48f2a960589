"""Data derived from a layer (a geodesic metric, a streamline index, a field of samples), kept
while the layer's data is unchanged so that a re-run or an ROI edit does not recompute it.

The document owns one :class:`DerivedCache` (``document.derived``); panels and controllers ask it
for what they need instead of keeping caches of their own, so that every user of a metric shares
one copy and removing a layer frees what was derived from it.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class DerivedCache:
    """``get(source, kind, key, compute)``: ``compute()`` once per (source object, kind, key).

    ``source`` is the object the result is derived from (a volume, a tractogram); entries are
    dropped when it is garbage collected, and the least recently used beyond ``max_entries``.
    ``key`` holds everything else the result depends on (parameters, a grid, a data version).
    Thread-safe: workers may ask concurrently; two asking for the same missing entry at once
    compute it once (the second waits for the first).
    """

    def __init__(self, max_entries: int = 16):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self._pending: dict[tuple, threading.Lock] = {}
        self._finalizers: dict[int, weakref.finalize] = {}

    def get(self, source: object, kind: str, key: Hashable, compute: Callable[[], T]) -> T:
        entry_key = (id(source), kind, key)
        with self._lock:
            if entry_key in self._entries:
                self._entries.move_to_end(entry_key)
                return self._entries[entry_key]  # type: ignore[return-value]
            gate = self._pending.setdefault(entry_key, threading.Lock())
        with gate:
            with self._lock:
                if entry_key in self._entries:
                    return self._entries[entry_key]  # type: ignore[return-value]
            value = compute()
            with self._lock:
                self._entries[entry_key] = value
                self._watch(source)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
                self._pending.pop(entry_key, None)
        return value

    def peek(self, source: object, kind: str, key: Hashable):
        """The cached value, or None (computes nothing)."""
        with self._lock:
            return self._entries.get((id(source), kind, key))

    def discard(self, source: object, kind: str | None = None) -> None:
        """Forget what was derived from ``source`` (of one ``kind``, or all)."""
        self._drop(id(source), kind)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _watch(self, source: object) -> None:
        ident = id(source)
        if ident in self._finalizers:
            return
        try:
            self._finalizers[ident] = weakref.finalize(source, self._drop, ident, None)
        except TypeError:  # not weak-referenceable: kept until evicted
            pass

    def _drop(self, ident: int, kind: str | None) -> None:
        with self._lock:
            for entry_key in [k for k in self._entries if k[0] == ident and (kind is None or k[1] == kind)]:
                del self._entries[entry_key]
            if kind is None:
                finalizer = self._finalizers.pop(ident, None)
                if finalizer is not None:
                    finalizer.detach()
