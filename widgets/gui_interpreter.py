"""How Python runs while a window is open: cyclic garbage collected on the GUI thread only, what
exists once the window is up frozen out of the collector, and threads switched every 0.5 ms.

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
closing unfreezes them, so nothing frozen escapes collection for good.

Python hands its lock from a thread that holds it to one that waits for it after a *switch
interval*, 5 ms by default. The GUI thread gives the lock up at every call into Qt or VTK that
releases it and asks for it back at every call from Qt into Python (a paint, an event, a signal):
while workers build glyphs or fibre pictures in Python, each such return could wait up to 5 ms,
and a slice step makes dozens of them (an H200 profile of fODF glyph steps: 40 % of the slice
views' paint time spent entering Python). While a window is open the interval is
:data:`SWITCH_INTERVAL_S`; workers lose a little throughput to the extra switches."""

from __future__ import annotations

import gc
import sys

import shiboken6
from PySide6.QtCore import QObject, QTimer

#: Milliseconds between checks of the collector's counts (a check is a few microseconds).
CHECK_MS = 100
#: Seconds a thread may hold Python's lock while another waits, while a window is open.
SWITCH_INTERVAL_S = 0.0005

_holders: set[int] = set()
_timer: QTimer | None = None
_was_enabled = True
_was_interval = sys.getswitchinterval()


def _collect() -> None:
    thresholds, counts = gc.get_threshold(), gc.get_count()
    for generation in (2, 1, 0):
        if thresholds[generation] and counts[generation] > thresholds[generation]:
            gc.collect(generation)
            return


def hold(owner: QObject) -> None:
    """Collect on the GUI thread and switch threads often while ``owner`` (a window) lives; let go
    when it is destroyed."""
    global _timer, _was_enabled, _was_interval
    key = id(owner)
    if key in _holders:
        return
    if not _holders:
        _was_enabled, _was_interval = gc.isenabled(), sys.getswitchinterval()
        gc.disable()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        _timer = QTimer()
        _timer.setInterval(CHECK_MS)
        _timer.timeout.connect(_collect)
        _timer.start()
        QTimer.singleShot(0, _freeze)  # once the window is built (the event loop's first turn)
    _holders.add(key)
    owner.destroyed.connect(lambda *_: release(key))


def release(key: int) -> None:
    """``owner``'s part of :func:`hold` ends; the last one turns automatic collection and the
    switch interval back to what they were."""
    global _timer
    if key not in _holders:
        return
    _holders.discard(key)
    if not _holders:
        if _timer is not None and shiboken6.isValid(_timer):  # (at exit Qt may have deleted it first)
            _timer.stop()
        _timer = None
        gc.unfreeze()
        sys.setswitchinterval(_was_interval)
        if _was_enabled:
            gc.enable()


def _freeze() -> None:
    """Move everything alive now out of the collector's way (while a window still holds it)."""
    if _holders:
        gc.freeze()  # (garbage among them waits for the unfreeze: a full collection first would cost as much)


def holding() -> bool:
    """Whether automatic collection is handed to the GUI thread now."""
    return bool(_holders)
