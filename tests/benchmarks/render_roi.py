"""bench_render.py's ROI edits through the window (issue 41: ROI edit -> selection re-drawn within
100 ms at 10 M): an ROI sphere in the document, the tractogram filtered by ROIs (the layer menu's
"Filter by ROIs"), and the sphere moved by a brush's two strokes (the old voxels erased, the new
ones painted), a reader's pause apart. Each edit is timed from the strokes until the 3-D frame
with the new selection is drawn (``roi_edit_ms``: the window's throttle, the selection job on the
job runner, the selection, the index ranges, the swap and the frame; to the GPU's end where
frames are; the frame of an edit draws the moving level, as the camera's do, stated in
``roi_edit_lod_text``, and everything once the edits pause: ``roi_edit_rest_frame_ms``) and until the window has settled (``roi_edit_settled_ms``: the window's update with
that frame composed and flushed). bench_render.py's ``select`` times the same parts called one
after the other, without the window's path. ``roi_edit_timeline``: where each edit's time went
(:class:`Timeline`). The edits are then made back with the 3-D view's depth peeling off
(``roi_edit_no_depth_peeling_ms``): what the ROI's translucent surface costs the frame."""

from __future__ import annotations

import cProfile
import os
import threading
import time

import numpy as np

from tests.benchmarks.render_glyphs import idle
from tests.benchmarks.render_measure import ms, profiled, settle, wait, write_profile

EDITS = 6  # (the selection frame varies by 10-20 ms from edit to edit on the GPU machine)
RADIUS_MM = 12.0  # the ROI sphere's (bench_render.py's parts and edits alike)


def sphere(shape, centre, radius_voxels: float) -> np.ndarray:
    """A ball of ``radius_voxels`` around ``centre`` (voxels) on a grid of ``shape``."""
    ijk = np.indices(shape, dtype=np.float32)
    return sum((ijk[a] - centre[a]) ** 2 for a in range(3)) <= radius_voxels**2


class Timeline:
    """Where an edit's time goes: the perf_counter times at which wrapped calls began and ended
    (``name>`` and ``name<``, first of each after :meth:`start`) and on which thread, so that a
    run on the GPU machine says which part of the path is long, not only how long it is."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, bool]] = []
        self._restore: list = []
        self._gui = threading.main_thread()
        self._cpu: dict = {}

    def start(self) -> float:
        self.marks.clear()
        self._cpu = thread_cpu()
        return time.perf_counter()

    def wrap(self, owner, attr: str, name: str) -> None:
        original = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            begin = time.perf_counter()
            gui = threading.current_thread() is self._gui
            self.marks.append((name + ">", begin, gui))
            try:
                return original(*args, **kwargs)
            finally:
                self.marks.append((name + "<", time.perf_counter(), gui))

        own = attr in vars(owner)  # a module's function, or an attribute the instance holds itself
        setattr(owner, attr, wrapped)
        self._restore.append((owner, attr, original if own else None))

    def restore(self) -> None:
        for owner, attr, original in reversed(self._restore):
            if original is None:
                delattr(owner, attr)  # the instance's class's method again
            else:
                setattr(owner, attr, original)
        self._restore.clear()

    def read(self, start: float, frames, spans) -> dict:
        """ms from ``start``: each mark's first time (``@worker`` when not on the GUI thread), and
        the 3-D frames (begin, end) drawn after it; ``spans`` (what, begin, end): the GUI thread's
        calls timed elsewhere (:class:`render_measure.StepClock`'s)."""
        out: dict = {}
        for name, t, gui in self.marks:
            out.setdefault(name if gui else name + "@worker", round(1e3 * (t - start), 1))
        out["frames"] = [(round(1e3 * (b - start), 1), round(1e3 * (e - start), 1)) for b, e in frames if b >= start]
        # the GUI thread's longer calls (slice views' paints, the window's updates), outermost only
        busy, until = [], -1.0
        for name, b, e in sorted(spans, key=lambda span: span[1]):
            if e - b >= 5e-4 and b >= max(until, start):
                busy.append((name, round(1e3 * (b - start), 1), round(1e3 * (e - start), 1)))
                until = e
        out["gui_busy"] = busy
        # CPU ms of each thread that used more than 2 ms during the edit (which workers compete)
        after = thread_cpu()
        used = {tid: (after[tid][0], (after[tid][1] - self._cpu.get(tid, ("", 0))[1]) / 1e6) for tid in after}
        out["threads_cpu_ms"] = sorted(
            [(f"{name}{' (GUI)' if tid == threading.main_thread().native_id else ''}", round(cpu, 1))
             for tid, (name, cpu) in used.items() if cpu > 2.0],
            key=lambda row: -row[1],
        )  # fmt: skip
        return out


def thread_cpu() -> dict:
    """{thread id: (name, ns on a CPU so far)} of this process's threads (Linux; {} elsewhere)."""
    out = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = (f.read().strip(), ns)
        except (OSError, ValueError):  # ended meanwhile
            continue
    return out


def roi_edits(app, window, layer, clock, shape, affine, voxel_mm: float, edits: int = EDITS) -> dict:
    from tractlens.app.model import Layer
    from tractlens.app.volumes import RoiMask

    doc, view = window.document, window.view3d
    radius = RADIUS_MM / voxel_mm
    centres = [np.array(shape) / 2 + shift for shift in range(0, 3 * EDITS + 1, 3)][: edits + 1]
    mask = sphere(shape, centres[0], radius)
    roi = doc.add_layer(Layer("sphere", RoiMask("sphere", mask.copy(), affine, role="target"), "roi"))
    layer.set(filter_by_rois=True)
    assert wait(app, lambda: layer.selection is not None and not window.runner.active(), 600)
    settle(app)
    changed_at = []

    def listen(_source, event, **info) -> None:
        if info.get("layer") is layer and event == "display" and "selection" in info.get("changed", ()):
            changed_at.append(time.perf_counter())

    doc.connect(listen)
    import tractlens.widgets.controllers.selection as selection_module

    timeline = Timeline()
    timeline.wrap(window.selection, "_leading", "leading")
    timeline.wrap(window.selection, "update", "update")
    timeline.wrap(window.runner, "submit", "submit")
    timeline.wrap(selection_module, "select_fibres", "select")
    timeline.wrap(doc.fiber_arrays, "prepare_selection", "ranges")
    timeline.wrap(layer, "set_selection", "swap")
    timeline.wrap(view, "_render_now", "render_now")
    timeline.wrap(view, "release_frames", "release")
    profile = cProfile.Profile() if os.environ.get("BENCH_PROFILE") else None
    state = {"mask": mask}

    def series(targets) -> tuple[list, ...]:
        """(drawn, settled, selected, timelines, said, rest, changes): one list each, an item per edit."""
        drawn, settled, selected, timelines = [], [], [], []
        said, rest, changes = [], [], []
        for centre in targets:
            idle(app, 0.3)
            new = sphere(shape, centre, radius)
            changed_at.clear()
            old = state["mask"]
            erase, paint = np.argwhere(old & ~new), np.argwhere(new & ~old)  # a brush's strokes' voxels
            with profiled("roi_edit", len(layer.data), profile):
                start = timeline.start()
                doc.paint(roi, erase, False)  # erased, then painted
                doc.paint(roi, paint, True, merge_with_last=True)
                painted = time.perf_counter()
                state["mask"] = new

                def shown() -> bool:
                    return bool(changed_at) and not view._render_pending and view.renders[-1][0] >= changed_at[0]

                assert wait(app, shown, 120)
            settled.append(time.perf_counter() - start)
            said.append(view.lod_text())  # the level of detail of the edit's frame, as the view states it
            idle(app, 0.3)  # the edit's later frames (its ROI surface's, everything once edits pause) too
            assert wait(app, lambda: not view._moving and not view._render_pending, 30)
            # The edit's whole selection drawn: the frame after the edit's last selection (one,
            # unless the edit was selected in parts, the first of them half-made: then counted to
            # the last, and ``roi_edit_selection_changes`` says so)
            changes.append(len(changed_at))
            drawn.append(next(end for begin, end in view.renders if begin >= changed_at[-1]) - start)
            selected.append(int(layer.selection.sum()))  # the whole edit's selection
            rest.append(1e3 * (view.renders[-1][1] - view.renders[-1][0]))  # the frame of everything
            timelines.append(
                {"painted": round(1e3 * (painted - start), 1), **timeline.read(start, view.renders, clock.spans)}
            )
        return drawn, settled, selected, timelines, said, rest, changes

    drawn, settled, selected, timelines, said, rest, changes = series(centres[1:])
    # The same edits back, the 3-D view without depth peeling (the ROI's translucent surface then
    # blends in one pass): what the peeling passes cost an edit's frame at this size.
    renderer = view.plotter.renderer
    renderer.disable_depth_peeling()
    try:
        unpeeled = series(centres[-2::-1])[0]
    finally:
        renderer.enable_depth_peeling()
    timeline.restore()
    if profile is not None:
        write_profile(profile, "roi_edit", len(layer.data))
    doc.disconnect(listen)
    layer.set(filter_by_rois=False)
    doc.remove_layer(roi)
    layer.set_selection(None)
    settle(app)
    return {
        "roi_edit_ms": ms(drawn),
        "roi_edit_all_ms": [round(1e3 * t, 1) for t in drawn],
        "roi_edit_settled_ms": ms(settled),
        "roi_edit_settled_all_ms": [round(1e3 * t, 1) for t in settled],
        "roi_edit_selected": selected,
        "roi_edit_selection_changes": changes,  # selections shown per edit: 1 (more: shown in parts)
        # while edits go on the view draws the moving level (the camera's), and says so; once they
        # pause, everything: that frame's time
        "roi_edit_lod_text": said,
        "roi_edit_rest_frame_ms": [round(t, 1) for t in rest],
        "roi_edit_timeline": timelines,  # ms from the edit: each step's begin (>) and end (<), the 3-D frames
        "roi_edit_no_depth_peeling_ms": ms(unpeeled),
        "roi_edit_no_depth_peeling_all_ms": [round(1e3 * t, 1) for t in unpeeled],
    }
