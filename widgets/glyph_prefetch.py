"""The glyphs of the cursor's neighbouring positions, built ahead (issue 41: whole-slice glyphs
within 100 ms a slice step).

A slice step moves the cursor by one voxel along one axis. Once a step's frame is on screen,
the glyph builds of the six neighbouring cursor positions (one voxel either way along each
axis) run on a worker of their own, one after the other, and their results are kept. A step to
one of them finds its glyphs made: they are shown in the same event-loop turn as the step,
the 3-D frame and the slice views' repaint come in one window update, and nothing waits for
a worker. A step elsewhere (a jump, or a step before the builds ahead are done) is built as
before (:class:`widgets.glyphs.LatestTask`). The next step's builds ahead stop the running
ones after the build in hand. Each slice view does the same for its own slice: the pictures of
the slices one voxel either way along its normal, for its place on the screen
(:func:`neighbour_planes`), drawn in the step's first paint.

Builds ahead are the same functions as the step's own (:func:`widgets.fod_glyphs.volume_glyph_job`
with another cursor), so a result made ahead is the one a step would build: NumPy arrays, plus
what makes VTK objects on the GUI thread (:class:`widgets.glyphs.OnGuiThread`), run when shown.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections import OrderedDict

from PySide6.QtCore import QRunnable, QThreadPool

log = logging.getLogger(__name__)

KEPT = 24  # results kept (a layer's six neighbours and the positions stepped through lately)
MISSING = object()


class GlyphPrefetch:
    """Glyph builds of the neighbouring cursor positions, made on a worker and kept by key."""

    def __init__(self, kept: int = KEPT):
        self.kept = kept
        # key -> (weak reference to the volume it was made from, result), guarded by _lock: a
        # volume gone or replaced (another one may get its id, which keys hold) is never answered for
        self._results: OrderedDict = OrderedDict()
        self._lock = threading.RLock()  # (reentrant: a volume may go while it is held)
        self._generation = 0  # a new call to ahead() stops the running builds after the one in hand
        self._pool = QThreadPool()
        self._pool.setMaxThreadCount(1)  # one at a time, beside (not instead of) the step's own builds
        self.hits = 0  # steps that found theirs made (tests, measurements)

    def take(self, key, data):
        """The result made ahead for ``key`` from the volume ``data``, or :data:`MISSING`."""
        with self._lock:
            held = self._results.get(key)
            if held is None or held[0]() is not data:
                return MISSING
            self._results.move_to_end(key)
            self.hits += 1
            return held[1]

    def holds(self, key) -> bool:
        with self._lock:
            return key in self._results

    def ahead(self, jobs) -> None:
        """Build ``jobs`` ((build, key, volume) triples, snapshots taken on the GUI thread; the
        volume: the array the build reads) on the worker, one after the other, keeping their
        results; those held already are skipped. Stops the builds asked for before (after the
        one in hand)."""
        self._generation += 1
        jobs = [job for job in jobs if not self.holds(job[1])]
        if jobs:
            self._pool.start(_Ahead(self, self._generation, jobs))

    def stop(self) -> None:
        """No more builds ahead (the layer hidden, the window closing); what is kept stays."""
        self._generation += 1

    def _forget(self, gone: weakref.ref) -> None:
        """A volume was freed (its layer removed): what was made from it goes too."""
        with self._lock:
            for key in [key for key, (ref, _result) in self._results.items() if ref is gone]:
                del self._results[key]

    def finish(self, timeout_ms: int = 10_000) -> bool:
        """Stop, and wait until no build ahead runs (the window closing)."""
        self.stop()
        return bool(self._pool.waitForDone(timeout_ms))

    def _run(self, generation: int, jobs) -> None:
        for build, key, data in jobs:
            if generation != self._generation:
                return
            if self.holds(key):
                continue
            try:
                result = build()
            except Exception:  # a build ahead that fails is built again, and reported, by the step
                log.debug("a glyph build ahead failed", exc_info=True)
                continue
            with self._lock:
                self._results[key] = (weakref.ref(data, self._forget), result)
                while len(self._results) > self.kept:
                    self._results.popitem(last=False)
            time.sleep(0)  # let the GUI thread have Python's lock between builds


class _Ahead(QRunnable):
    def __init__(self, owner: GlyphPrefetch, generation: int, jobs):
        super().__init__()
        self.owner, self.generation, self.jobs = owner, generation, jobs
        self.setAutoDelete(True)

    def run(self) -> None:
        owner, jobs, self.owner, self.jobs = self.owner, self.jobs, None, None
        owner._run(self.generation, jobs)


def neighbours(cursor, shape) -> list:
    """The cursor positions one voxel away along each axis, within the grid (z first: a slice
    step in the axial view is the most common)."""
    out = []
    for axis in (2, 1, 0):
        for delta in (1, -1):
            position = [int(v) for v in cursor]
            position[axis] += delta
            if 0 <= position[axis] < int(shape[axis]):
                out.append(position)
    return out


def neighbour_planes(geometry, shape) -> list:
    """A slice's geometry (:class:`widgets.render.PlaneGeometry`) one voxel either way along
    its normal, within the grid: the slices a step in that view shows next."""
    out = []
    normal = geometry.normal_axis
    for delta in (1, -1):
        position = int(geometry.voxels[0, 0, normal]) + delta
        if 0 <= position < int(shape[normal]):
            voxels = geometry.voxels.copy()
            voxels[..., normal] = position
            out.append(dataclasses.replace(geometry, voxels=voxels))
    return out
