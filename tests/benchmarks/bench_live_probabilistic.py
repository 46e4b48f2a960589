"""Benchmark: live probabilistic tracking in the window, stroke → first redrawn map and
last stroke → converged map, on an HCP-sized bedpostX field (or a reduced one), printed as JSON.

    python tests/benchmarks/bench_live_probabilistic.py --device gpu [--scale 1.0] \\
        [--seed-voxels 300] [--samples 1000] [--strokes 8] [--out result.json]

Needs a display (Xvfb: see gui_on_gpu.sh for how the GUI runs on the GPU machine). The field
is :func:`bench_probabilistic.hcp_like_samples` (145×174×145 voxels of 1.25 mm, 50 samples of 3
sticks; ``--scale`` shrinks the grid, e.g. 0.5 for the CPU engine here). A real window is made
(``MainWindow``), the samples are opened as a dyads layer (their engine field handed to the
document's cache of derived data, as a bedpostX folder read twice would be), a spherical seed ROI
of ``--seed-voxels`` voxels is painted, and one Track warms the engine (kernel compiled, samples
on the GPU). Then live mode is switched on and, for each of ``--strokes`` strokes (a few voxels
added to the seed, as a brush does), the script measures:

- ``first_map_ms``: stroke (the paint call) → the first pass's map in the document (layer values
  and surface set); ``first_map_panel_ms`` the same from the panel's hearing of the stroke (what
  earlier results called ``first_map_ms``: the views' own redraw for the stroke could come first);
- ``first_map_stages_ms``: where that time went, per thread: each stage's total ms between the
  stroke and the first map (the window's methods wrapped by this script, :func:`instrument`: the
  stroke's events, the submit, the use case up to its first totals — prepare, track, totals to the
  host —, the worker's surface crop, the layer set and replaced, marching cubes, the 3-D planes
  recomposited or patched and ROI surfaces rebuilt, the slice views' paint events, and the 3-D
  frames (``3-D frame drawn``, from the view's own record of them)); ``first_map_marks_ms``: [start, end] ms
  after the stroke of the submit, the use case's first totals and the GUI's showing of them
  (end of the use case → start of the show: the hop of the totals to the GUI thread);
  ``to_drawn_stages_ms`` the stages between the first map and the end of the first frame drawn
  after it, ``frame_ms`` that frame's own render time;
- ``first_drawn_ms``: stroke → the end of the first 3-D frame rendered after that (on screen);
- ``first_pass_streamlines``: streamlines in that first map;
- ``converged_ms``: last stroke → the map of every sample in the document (``converged_s``).

A final burst of strokes 20 ms apart (a brush moving) gives ``burst_converged_ms``: last stroke of
the burst → converged map. Targets (issue 40): first map ≤ 100 ms with ≥ 20,000 streamlines in
the first pass, converged ≤ 1 s, on the H100.

``--no-window`` times the use case alone (no Qt, no display: the GPU machine as it is): per
stroke, the time to the first pass's totals on the host and to the converged totals.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))


def field_of_scale(scale: float):
    import bench_probabilistic as bp

    if scale != 1.0:
        bp.SHAPE = tuple(max(16, round(n * scale)) for n in (145, 174, 145))
    field_, brain, mean_sticks, mean_f = bp.hcp_like_samples()
    return field_, brain, mean_sticks, mean_f, bp.VOXEL_MM


def wait_until(app, condition, timeout_s: float, step_s: float = 0.001) -> bool:
    end = time.perf_counter() + timeout_s
    while time.perf_counter() < end:
        app.processEvents()
        if condition():
            return True
        time.sleep(step_s)
    return condition()


class Stages:
    """Where a stroke's time goes: the window's methods on the path from a stroke to a drawn map,
    wrapped to record (stage, thread, start, end); :meth:`summary` sums each stage's time between
    the stroke and a moment (ms), and gives the first start of the marks (ms after the stroke)."""

    def __init__(self):
        self.spans: list[tuple[str, str, float, float]] = []
        self.frames_of = ()  # the 3-D view's (start, end) of each frame drawn: spans "3-D frame drawn"
        self._frames_seen: set = set()

    def _add_frames(self) -> None:
        for start, end in list(self.frames_of):
            if (start, end) not in self._frames_seen:
                self._frames_seen.add((start, end))
                self.spans.append(("3-D frame drawn", "gui", start, end))

    def wrap(self, owner, name: str, stage: str) -> None:
        import threading

        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                gui = threading.current_thread() is threading.main_thread()
                self.spans.append((stage, "gui" if gui else "worker", start, time.perf_counter()))

        setattr(owner, name, timed)

    def wrap_iter(self, owner, name: str, stage: str) -> None:
        """A generator function: the time from its call to its first item (the use case's first pass)."""
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            first = True
            for item in original(*args, **kwargs):
                if first:
                    self.spans.append((stage, "worker", start, time.perf_counter()))
                    first = False
                yield item

        setattr(owner, name, timed)

    def summary(self, since: float, until: float) -> dict:
        self._add_frames()
        out: dict[str, float] = {}
        for stage, thread, start, end in self.spans:
            if start >= since and end <= until:
                key = f"{thread}: {stage}"
                out[key] = round(out.get(key, 0.0) + (end - start) * 1000, 1)
        return out

    def marks(self, since: float, until: float, stages) -> dict:
        """ms after ``since`` at which each of ``stages`` first started and ended."""
        out = {}
        for stage in stages:
            hits = [(s, e) for name, _t, s, e in self.spans if name == stage and since <= s <= until]
            if hits:
                out[stage] = [round((hits[0][0] - since) * 1000, 1), round((hits[0][1] - since) * 1000, 1)]
        return out


def instrument(win, panel) -> Stages:
    """Wrap the stages of a live stroke (the benchmark's own view of them; the app is unchanged)."""
    from tractlens.widgets import probabilistic_panel as module

    stages = Stages()
    stages.wrap(panel, "track", "submit (panel.track)")
    stages.wrap_iter(module, "track_probabilistic", "use case to first totals (prepare, track, to host)")
    stages.wrap(module, "_result_layer", "result layer made (worker)")
    stages.wrap(module, "isosurface_input", "surface crop (worker)")
    stages.wrap(panel, "_show", "show (GUI: layer set, replace, surface)")
    stages.wrap(module, "isosurface", "marching cubes")
    stages.wrap(win.view3d, "set_layer_surface", "3-D surface actor set")
    stages.wrap(win.view3d, "_update_planes", "3-D planes recomposited")
    if hasattr(win.view3d, "_patch_planes"):  # (a tree before it: the script compares trees)
        stages.wrap(win.view3d, "_patch_planes", "3-D planes patched (a stroke's pixels)")
    for view in win.views.values():  # Qt calls the instance's paintEvent: the wrapper sees each paint
        stages.wrap(view, "paintEvent", f"slice view painted ({view.view})")
    stages.frames_of = win.view3d.renders
    stages.wrap(win.view3d, "_update_roi_surfaces", "3-D ROI surfaces rebuilt")
    stages.wrap(win.view3d, "_update_glyphs", "3-D glyphs updated")
    stages.wrap(win.view3d, "_render_now", "3-D render request")
    timer = win.view3d._roi_timer  # connected at start to the unwrapped method
    timer.timeout.disconnect()
    timer.timeout.connect(win.view3d._update_roi_surfaces)
    stages.wrap(win.document, "replace_layer", "layer replaced (events)")
    stages.wrap(win.document, "paint", "stroke painted (events)")
    return stages


def sphere(centre, radius_vox: float, shape) -> np.ndarray:
    grid = np.indices(shape).reshape(3, -1).T
    inside = np.linalg.norm(grid - np.asarray(centre), axis=1) <= radius_vox
    return grid[inside]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--scale", type=float, default=1.0, help="grid scale (1: the HCP grid)")
    parser.add_argument("--seed-voxels", type=int, default=300)
    parser.add_argument("--samples", type=int, default=1000, help="samples per seed voxel (the panel's count)")
    parser.add_argument("--strokes", type=int, default=8)
    parser.add_argument(
        "--first-pass", type=int, default=None, help="streamlines in the first pass (default: the app's)"
    )
    parser.add_argument("--burst-timeout-s", type=float, default=120.0, help="give up on the burst's convergence after")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--no-window",
        action="store_true",
        help="time the use case alone (app.pipelines.track_probabilistic, no Qt): stroke -> first pass's "
        "totals on the host, and -> all samples; for a machine without the GUI stack",
    )
    args = parser.parse_args(argv)
    if args.no_window:
        return headless(args)
    import os
    import tempfile

    private = tempfile.mkdtemp(prefix="tractlens-bench-")  # settings and autosaves: never the user's
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        os.environ[name] = os.path.join(private, name.lower())

    from PySide6.QtWidgets import QApplication

    from tractlens.app.io import BedpostSamples
    from tractlens.app.model import Layer, Volume
    from tractlens.app.volumes import DyadsVolume
    from tractlens.widgets import dialogs
    from tractlens.widgets.main_window import MainWindow

    t0 = time.perf_counter()
    field_, brain, mean_sticks, mean_f, voxel_mm = field_of_scale(args.scale)
    shape = brain.shape
    affine = np.diag([voxel_mm, voxel_mm, voxel_mm, 1.0])
    made_s = time.perf_counter() - t0

    app = QApplication.instance() or QApplication([])
    dialogs.set_scripted(True)
    win = MainWindow(device=args.device)
    win.resize(1400, 900)
    win.show()
    doc = win.document
    f1 = np.zeros(shape, np.float32)
    f1[brain] = mean_f[:, 0]
    doc.add_layer(Layer("mean f1", Volume("mean f1", f1, affine), "scalar"))
    dyads = np.zeros((*shape, mean_sticks.shape[1], 3), np.float32)
    dyads[brain] = mean_sticks
    empty = np.broadcast_to(np.zeros((), np.float32), (*shape, field_.n_fibres, field_.n_samples))
    samples = BedpostSamples(empty, empty, empty, brain, affine, path="(synthetic HCP-sized field)")
    volume = DyadsVolume("dyads", dyads, samples)
    doc.derived.get(volume, "sample_field", None, lambda: field_)  # the engine's field, as a second read keeps it
    doc.add_layer(Layer("dyads", volume, "dyads", visible=False))
    assert wait_until(app, lambda: win.runner.active() == [], 120)

    panel = win.probabilistic_panel
    panel.form.set_values(n_samples=args.samples)
    panel.first_pass = args.first_pass
    centre = np.array(shape) // 2
    radius = (3 * args.seed_voxels / (4 * np.pi)) ** (1 / 3)
    seed_voxels = sphere(centre, radius, shape)
    win.role_box.setCurrentText("seed")
    seed = win.new_roi()
    doc.paint(seed, seed_voxels, True)

    firsts: list[int] = []
    win.runner.job_partial.connect(
        lambda job_id, shown: job_id == panel.job_id and not firsts and firsts.append(shown.result.streamlines)
    )

    t0 = time.perf_counter()
    panel.track()  # warm: kernel compiled, samples on the device, first surfaces made
    assert wait_until(app, lambda: panel.job_id is None, 600), "the warm-up run did not end"
    warm_s = time.perf_counter() - t0
    assert panel.result is not None, panel.status.text()

    panel.live.setChecked(True)
    stages = instrument(win, panel)
    rows = []
    ring = sphere(centre, radius + 1.5, shape)
    ring = ring[~(np.linalg.norm(ring - centre, axis=1) <= radius)]
    order = np.random.default_rng(0).permutation(len(ring))
    for stroke in range(args.strokes):
        firsts.clear()
        voxels = ring[order[stroke * 4 : stroke * 4 + 4]]
        edit = time.perf_counter()
        doc.paint(seed, voxels, True)
        assert wait_until(app, lambda: panel.first_map_s is not None, 60), panel.status.text()
        shown_at = panel.shown_at
        first_map_at = panel.edit_time + panel.first_map_s  # the panel times from its own edit event
        drawn = frame = None
        if wait_until(app, lambda at=shown_at: any(start >= at for start, _ in win.view3d.renders), 5):
            frame = next((start, end) for start, end in win.view3d.renders if start >= shown_at)
            drawn = frame[1] - edit
        assert wait_until(app, lambda: panel.job_id is None and panel.converged_s is not None, 120)
        rows.append(
            {
                "first_map_ms": round((first_map_at - edit) * 1000, 1),  # from the stroke (the paint call)
                "first_map_panel_ms": round(panel.first_map_s * 1000, 1),  # from the panel's hearing of it
                "first_drawn_ms": None if drawn is None else round(drawn * 1000, 1),
                "first_pass_streamlines": firsts[0] if firsts else panel.result.streamlines,
                "converged_ms": round(panel.converged_s * 1000, 1),
                "streamlines": panel.result.streamlines,
                "waytotal": panel.result.waytotal,
                "first_map_stages_ms": stages.summary(edit, first_map_at),
                # first map → the end of the first frame drawn after it: what the GUI thread did meanwhile
                "to_drawn_stages_ms": {} if frame is None else stages.summary(first_map_at, frame[1]),
                "frame_ms": None if frame is None else round((frame[1] - frame[0]) * 1000, 1),
                "first_map_marks_ms": stages.marks(
                    edit,
                    first_map_at,
                    (
                        "submit (panel.track)",
                        "use case to first totals (prepare, track, to host)",
                        "show (GUI: layer set, replace, surface)",
                    ),
                ),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)

    # A burst: strokes 20 ms apart, as a brush moves; converged after the last one.
    burst = ring[order[args.strokes * 4 : args.strokes * 4 + 40]]
    for part in np.array_split(burst, 10):
        doc.paint(seed, part, True)
        wait_until(app, lambda: False, 0.02)
    ended = wait_until(app, lambda: panel.job_id is None and panel._live_pending is None, args.burst_timeout_s)
    burst_converged = panel.converged_s if ended else None

    def median(key):
        values = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(values), 1) if values else None

    result = {
        "device": args.device,
        "backend": panel.result.provenance.get("backend"),
        "device_name": panel.result.provenance.get("device"),
        "grid": list(shape),
        "brain_voxels": int(brain.sum()),
        "posterior_samples": field_.n_samples,
        "seed_voxels": int(seed.data.mask.sum()),
        "samples_per_seed_voxel": args.samples,
        "field_made_s": round(made_s, 1),
        "warm_up_s": round(warm_s, 2),
        "median_first_map_ms": median("first_map_ms"),
        "median_first_drawn_ms": median("first_drawn_ms"),
        "median_converged_ms": median("converged_ms"),
        "min_first_pass_streamlines": min(r["first_pass_streamlines"] for r in rows),
        "burst_converged_ms": None if burst_converged is None else round(burst_converged * 1000, 1),
        "live_runs": panel.live_runs,
        "strokes": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    win.runner.shutdown(10)
    win.close()
    return 0


def headless(args) -> int:
    """The use case's share of the latency: per stroke (the seed grown by a few voxels), the time
    to the first pass's totals and to the last pass's, the field kept on the device as the
    window keeps it."""
    from tractlens.app.io import BedpostSamples
    from tractlens.app.pipelines.track_probabilistic import ProbInputs, track_probabilistic
    from tractlens.app.regions import RoiCopy
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.probabilistic_kernel import upload_field
    from tractlens.gpu.probabilistic_params import ProbParams

    field_, brain, _sticks, _f, voxel_mm = field_of_scale(args.scale)
    shape, affine = brain.shape, np.diag([voxel_mm, voxel_mm, voxel_mm, 1.0])
    empty = np.broadcast_to(np.zeros((), np.float32), (*shape, field_.n_fibres, field_.n_samples))
    samples = BedpostSamples(empty, empty, empty, brain, affine)
    on_device = {}

    def device_field(device):
        if device not in on_device:
            on_device[device] = upload_field(get_backend(device), field_)
        return on_device[device]

    centre = np.array(shape) // 2
    radius = (3 * args.seed_voxels / (4 * np.pi)) ** (1 / 3)
    mask = np.zeros(shape, bool)
    mask[tuple(sphere(centre, radius, shape).T)] = True
    ring = sphere(centre, radius + 1.5, shape)
    ring = ring[~mask[tuple(ring.T)]]
    params = ProbParams(n_samples=args.samples)
    rows = []
    for stroke in range(args.strokes + 1):  # the first one warms up (kernel compiled, samples copied)
        mask[tuple(ring[stroke * 4 : stroke * 4 + 4].T)] = True
        rois = [RoiCopy("seed", "seed", mask.copy(), affine)]
        t0 = time.perf_counter()
        first = last = None
        for update in track_probabilistic(
            ProbInputs(samples, rois, params, field_=field_, device_field=device_field),
            device=args.device,
            first_pass=args.first_pass,
        ):
            first = first or (time.perf_counter() - t0, update.result.streamlines)
            last = (time.perf_counter() - t0, update.result.streamlines, update.result.provenance.get("device"))
        if stroke:
            rows.append({"first_pass_ms": round(first[0] * 1000, 1), "first_pass_streamlines": first[1],
                         "converged_ms": round(last[0] * 1000, 1), "streamlines": last[1], "device": last[2]})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr)
    result = {
        "mode": "use case only (no window)",
        "device": args.device,
        "grid": list(shape),
        "brain_voxels": int(brain.sum()),
        "seed_voxels": int(mask.sum()),
        "samples_per_seed_voxel": args.samples,
        "median_first_pass_ms": round(statistics.median(r["first_pass_ms"] for r in rows), 1),
        "median_converged_ms": round(statistics.median(r["converged_ms"] for r in rows), 1),
        "strokes": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
