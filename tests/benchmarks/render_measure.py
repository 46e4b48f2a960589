"""What bench_render.py measures with: resident memory, frames drawn to the GPU's end, waits on
the event loop, the GUI thread's profile and allocations of a step, and where a step's GUI time
goes (:class:`StepClock`). Imported by bench_render.py (and bench_fibre_load.py through it)."""

from __future__ import annotations

import collections
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import time
from pathlib import Path


def bench_window(width: int, height: int, prefix: str = "bench-config-"):
    """(app, window): the main window as the app makes it (its own Xvfb when there is no
    display, a settings folder of its own, not the user's), ``width`` x ``height``, shown."""
    import tempfile

    os.environ.setdefault("TRACTLENS_CONFIG_DIR", tempfile.mkdtemp(prefix=prefix))
    from tests.conftest import _ensure_display

    _ensure_display()
    from PySide6.QtWidgets import QApplication

    from tractlens.widgets.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    window = MainWindow(device="cpu", autosave_s=0)
    window.resize(width, height)
    window.show()
    app.processEvents()
    return app, window


def reset_peak_rss() -> bool:
    """Start VmHWM afresh (Linux 4.0+: ``5`` into ``/proc/self/clear_refs``), so that the peak of
    one step can be read apart; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def anon_and_file_mb() -> list[int]:
    """Resident MB now: [anonymous, file-backed (a mapped file's pages)]."""
    return [round(rss_kb(field) / 1024) for field in ("RssAnon", "RssFile")]


#: Each frame's time ends when the GPU has drawn it (``WaitForCompletion``, a glFinish), unless
#: BENCH_FINISH=0. A render call returns once its GL calls are queued: with hardware OpenGL the
#: GPU may still be drawing for many times as long (the submission is recorded apart).
FINISH = os.environ.get("BENCH_FINISH", "1") != "0"


def frames(plotter, count: int, step_deg: float = 3.0, finish: bool | None = None) -> list[float]:
    """Each frame's seconds while the camera turns, to the GPU's end of it (see :data:`FINISH`)."""
    finish = FINISH if finish is None else finish
    times = []
    plotter.ren_win.WaitForCompletion()  # no earlier frame's work in the first one
    for _ in range(count):
        plotter.camera.azimuth += step_deg
        start = time.perf_counter()
        plotter.render()
        if finish:
            plotter.ren_win.WaitForCompletion()
        times.append(time.perf_counter() - start)
    return times


def submitted(view, count: int) -> list[float]:
    """Each frame's seconds until its render call returned (its GL calls queued): what earlier
    versions of this benchmark recorded as the frame time."""
    view.finish_frames = False
    try:
        return frames(view.plotter, count, finish=False)
    finally:
        view.finish_frames = FINISH


def ms(values) -> float:
    return round(1e3 * statistics.median(values), 1)


def wait(app, condition, timeout_s: float) -> bool:
    end = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > end:
            return False
        app.processEvents()
        time.sleep(0.001)
    return True


@contextlib.contextmanager
def profiled(step: str, n_streamlines: int, profile: cProfile.Profile | None = None):
    """With ``BENCH_PROFILE`` (a folder): the GUI thread's Python profile of a step, its 40 most
    costly calls by cumulative time written to ``profile_<N>_<step>.txt`` there (work in C++, such
    as VTK's render, shows as the Python call that made it). A ``profile`` given gathers several
    steps; the caller writes it (:func:`write_profile`)."""
    folder = os.environ.get("BENCH_PROFILE")
    if not folder:
        yield
        return
    own = profile is None
    profile = profile or cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        if own:
            write_profile(profile, step, n_streamlines)


def write_profile(profile: cProfile.Profile, step: str, n_streamlines: int) -> None:
    folder = Path(os.environ["BENCH_PROFILE"])
    folder.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
    (folder / f"profile_{n_streamlines}_{step}.txt").write_text(text.getvalue())


def traced_allocations(stop: bool = False, top: int = 12):
    """With ``BENCH_TRACEMALLOC=1``: start tracing Python's (and NumPy's) allocations (True), or
    stop and give the ``top`` sites that still hold the most memory ("file:line": MB). Off: False."""
    import tracemalloc

    if os.environ.get("BENCH_TRACEMALLOC") != "1":
        return False
    if not stop:
        tracemalloc.start()
        return True
    stats = tracemalloc.take_snapshot().statistics("lineno")
    tracemalloc.stop()
    return {f"{s.traceback[0].filename.split('tractlens/')[-1]}:{s.traceback[0].lineno}": round(s.size / 2**20, 1)
            for s in stats[:top]}  # fmt: skip


def settle(app) -> None:
    """Process the events a change posted, including the view's coalesced repaint (one frame)."""
    for _ in range(3):
        app.processEvents()


class StepClock:
    """Where a step's GUI-thread time goes: the slice views' paints (their ``paintEvent`` timed,
    patched before the window is made), the 3-D frames (the view's ``renders``) and the fibre
    layer's uploads (its ``timings``), so that "swap and frame" is attributed."""

    def __init__(self) -> None:
        from tractlens.widgets.slice_view import SliceView

        self.painting = 0.0
        self.window_updates = False
        self.spans: collections.deque = collections.deque(maxlen=4096)  # (what, start, end) of each
        original = SliceView.paintEvent

        def timed(view, event, clock=self):
            start = time.perf_counter()
            try:
                return original(view, event)
            finally:
                end = time.perf_counter()
                clock.painting += end - start
                clock.spans.append(("slice_paint", start, end))

        SliceView.paintEvent = timed
        self.updates, self.updating = 0, 0.0
        if os.environ.get("BENCH_WINDOW_UPDATES") != "1":
            return
        # With BENCH_WINDOW_UPDATES=1 only: the window's update requests (Qt paints its dirty
        # widgets, the slice views and the 3-D view's frame, and composes and flushes the
        # window, through OpenGL when an OpenGL widget is in it). Timing them puts a Python
        # override on the window's event(), and then every compose holds Python's lock: a worker
        # ran at a third of its speed through one (measured here), so the jobs an ROI edit or a
        # glyph step waits for are slower than for a user, whose window has no such override.
        self.window_updates = True
        from PySide6.QtCore import QEvent

        from tractlens.widgets.main_window import MainWindow

        window_event = MainWindow.event

        def timed_event(window, event, clock=self, kind=QEvent.Type.UpdateRequest):
            if event.type() != kind:
                return window_event(window, event)
            start = time.perf_counter()
            try:
                return window_event(window, event)
            finally:
                end = time.perf_counter()
                clock.updates += 1
                clock.updating += end - start
                clock.spans.append(("window_update", start, end))

        MainWindow.event = timed_event

    def start(self, view) -> None:
        self.t0, self.painted0 = time.perf_counter(), self.painting
        self.updates0, self.updating0 = self.updates, self.updating
        for entry in view._fibers.values():
            getattr(getattr(entry["scene"], "gl", None), "timings", {}).clear()

    def parts(self, view) -> dict:
        total = time.perf_counter() - self.t0
        frames = [(start, end) for start, end in list(view.renders) if start >= self.t0]
        out = {
            "slice_views_ms": round(1e3 * (self.painting - self.painted0), 1),
            "frames_3d": len(frames),
            "frames_3d_ms": round(1e3 * sum(end - start for start, end in frames), 1),
            # when the first 3-D frame of the change was done (the change on screen in 3-D), from
            # the start; the rest of the settle (three event-loop passes) comes after it
            "first_frame_done_ms": round(1e3 * (frames[0][1] - self.t0), 1) if frames else None,
        }
        for entry in view._fibers.values():
            for name, seconds in getattr(getattr(entry["scene"], "gl", None), "timings", {}).items():
                out[f"gl_{name[:-2]}_ms"] = round(1e3 * seconds, 1)
        out["other_ms"] = round(1e3 * total - out["slice_views_ms"] - out["frames_3d_ms"], 1)
        # the window's updates (paints of the dirty widgets, 3-D frames drawn there, composing and
        # flushing) and what they took besides the slice views' paints and the 3-D frames
        if self.window_updates:
            out["window_updates"] = self.updates - self.updates0
            updating = 1e3 * (self.updating - self.updating0)
            out["window_update_compose_ms"] = round(updating - out["slice_views_ms"] - out["frames_3d_ms"], 1)
        return out
