"""Python's cyclic garbage collection on the GUI thread only, while a window is open.

Python collects reference cycles in whichever thread happens to allocate when a generation's
threshold is crossed: a glyph build or a job on a pool thread can then destroy the Python wrappers
of Qt objects (a view's :class:`widgets.glyphs.LatestTask`, a panel's timers) whose C++ objects the
GUI thread is drawing or deleting. Shiboken keeps one map of wrappers for all threads; a CI run
crashed in ``Shiboken::BindingManager::releaseWrapper`` while the GUI thread deleted a closed
window's children. This is the usual remedy of Qt applications written in Python: automatic
collection is turned off while a window lives, and a GUI-thread timer collects each generation when
its threshold is reached (the same thresholds as Python's own collector), so the same garbage
goes at about the same pace, only on the GUI thread. The last window closing turns automatic
collection back on.

Once the first window is up, what exists then (the modules of Qt, VTK, NumPy and the rest, the
window's own widgets: some 270 k objects) is frozen out of the collector (``gc.freeze``): a full
collection walked them all, 60-150 ms on the GUI thread at unforeseeable moments (a slice step of
80 ms took 224 ms once in five on an H200). They live as long as the application; the last window
closing unfreezes them, so nothing frozen escapes collection for good."""

from __future__ import annotations

import gc

import shiboken6
from PySide6.QtCore import QObject, QTimer

#: Milliseconds between checks of the collector's counts (a check is a few microseconds).
CHECK_MS = 100

_holders: set[int] = set()
_timer: QTimer | None = None
_was_enabled = True


def _collect() -> None:
    thresholds, counts = gc.get_threshold(), gc.get_count()
    for generation in (2, 1, 0):
        if thresholds[generation] and counts[generation] > thresholds[generation]:
            gc.collect(generation)
            return


def hold(owner: QObject) -> None:
    """Collect on the GUI thread while ``owner`` (a window) lives; let go when it is destroyed."""
    global _timer, _was_enabled
    key = id(owner)
    if key in _holders:
        return
    if not _holders:
        _was_enabled = gc.isenabled()
        gc.disable()
        _timer = QTimer()
        _timer.setInterval(CHECK_MS)
        _timer.timeout.connect(_collect)
        _timer.start()
        QTimer.singleShot(0, _freeze)  # once the window is built (the event loop's first turn)
    _holders.add(key)
    owner.destroyed.connect(lambda *_: release(key))


def release(key: int) -> None:
    """``owner``'s part of :func:`hold` ends; the last one turns automatic collection back on."""
    global _timer
    if key not in _holders:
        return
    _holders.discard(key)
    if not _holders:
        if _timer is not None and shiboken6.isValid(_timer):  # (at exit Qt may have deleted it first)
            _timer.stop()
        _timer = None
        gc.unfreeze()
        if _was_enabled:
            gc.enable()


def _freeze() -> None:
    """Move everything alive now out of the collector's way (while a window still holds it)."""
    if _holders:
        gc.freeze()  # (garbage among them waits for the unfreeze: a full collection first would cost as much)


def holding() -> bool:
    """Whether automatic collection is handed to the GUI thread now."""
    return bool(_holders)
