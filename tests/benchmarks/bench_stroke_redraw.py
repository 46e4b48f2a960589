"""Benchmark: the window's own share of a live probabilistic stroke on an HCP-sized grid, with a
stand-in engine, on any machine (the GUI-thread work is CPU work).

    python tests/benchmarks/bench_stroke_redraw.py [--engine-ms 35] [--strokes 8] [--scale 1.0] [--out FILE]

Needs a display (``xvfb-run -a``). It builds the window of :mod:`bench_live_probabilistic` (a
145×174×145 grid of 1.25 mm: a scalar map, a hidden dyads layer with posterior samples, a
spherical seed ROI at the cursor, live mode on) but replaces the use case
(``track_probabilistic``) by a **stand-in** that waits ``--engine-ms`` (the H100's use case took
~35 ms to its first totals) and yields a fixed visitation map (a Gaussian tube through the seed:
20,000 streamlines, then refined passes). Everything the window does with it is real: the
worker's surface crop, the GUI thread's layer update, marching cubes, the slice views and the
3-D view. So ``first_map_ms`` here is (engine wait) + (the time the GUI thread keeps the totals
waiting) + (showing them): what the window adds to the engine.

Per stroke (a few voxels added to the seed, on the axial slice at the cursor): ``first_map_ms``
(stroke → the map's values and surface set), ``first_drawn_ms`` (stroke → end of the first 3-D
frame after it), ``gui_busy_ms`` (the GUI thread's busy time between the stroke and the first
map: the union of the stages' spans and the 3-D frames), and the stages (:func:`bench_live_probabilistic.instrument`, plus the
slice views' paint events). ``--no-live``: the same strokes with live mode off (the cost of a
stroke's redraw alone, until the GUI is idle).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from bench_live_probabilistic import instrument, sphere, wait_until  # noqa: E402

VOXEL_MM = 1.25


def busy_ms(spans, since: float, until: float) -> float:
    """The GUI thread's busy time between two moments: the union of its recorded spans (nested
    stages counted once)."""
    inside = sorted((max(s, since), min(e, until)) for _n, t, s, e in spans if t == "gui" and e > since and s < until)
    total, reach = 0.0, since
    for start, end in inside:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return round(total * 1000, 1)


def hcp_like_grid(scale: float):
    """(brain mask, a smooth scalar map in it, a visitation map: a Gaussian tube through the centre)."""
    from scipy import ndimage

    shape = tuple(max(16, round(n * scale)) for n in (145, 174, 145))
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"), -1)
    brain = (grid**2 / np.array([0.9, 0.9, 0.85]) ** 2).sum(-1) < 1.0
    rng = np.random.default_rng(0)
    f1 = np.clip(0.35 + 0.1 * ndimage.gaussian_filter(rng.normal(size=shape), 3.0), 0.05, 0.6).astype(np.float32)
    f1[~brain] = 0
    # a bundle bending through the centre, ~10 voxels wide: the counts of 20,000 streamlines
    x, y, z = grid[..., 0], grid[..., 1], grid[..., 2]
    distance = np.hypot(y - 0.3 * x**2 + 0.15, z) * shape[1] / 2
    paths = np.floor(400 * np.exp(-(distance**2) / (2 * 8.0**2)) * (np.abs(x) < 0.8)).astype(np.int32)
    paths[~brain] = 0
    return brain, f1, paths


def stand_in_engine(paths: np.ndarray, seed_layer, engine_ms: float, later_ms: float, passes: int):
    """A replacement for ``track_probabilistic``: waits like the engine, yields ``paths`` scaled
    (20,000 streamlines first, then ``passes`` refinements up to the run's total)."""
    from tractlens.app.pipelines.track_probabilistic import ProbUpdate
    from tractlens.gpu.backend import Cancelled

    def track_probabilistic(inputs, *, cancelled=None, **_options):
        seeds = np.argwhere(seed_layer.data.mask)
        total = len(seeds) * inputs.params.n_samples
        run = SimpleNamespace(
            samples=inputs.samples, seeds=seeds, targets=[], n_waypoints=0, notes=[], params=inputs.params
        )
        sizes = [20_000] + [20_000 + (total - 20_000) * (k + 1) // passes for k in range(passes)]
        time.sleep(engine_ms / 1000)
        for number, streamlines in enumerate(sizes):
            if number:
                time.sleep(later_ms / 1000)
            if cancelled is not None and cancelled():
                raise Cancelled()
            result = SimpleNamespace(
                paths=paths * (streamlines // 20_000 + 1),
                streamlines=streamlines,
                waytotal=streamlines,
                seed_targets=np.zeros((len(seeds), 0), np.int64),
                provenance={"backend": "stand-in", "device": "stand-in", "tracking_s": 0.0},
            )
            yield ProbUpdate(run, result, total, number)

    return track_probabilistic


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="grid scale (1: the HCP grid)")
    parser.add_argument("--seed-voxels", type=int, default=300)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--strokes", type=int, default=8)
    parser.add_argument("--engine-ms", type=float, default=35.0, help="the stand-in's wait for its first totals")
    parser.add_argument("--later-ms", type=float, default=40.0, help="… and for each later pass")
    parser.add_argument("--passes", type=int, default=4, help="refined passes after the first")
    parser.add_argument("--no-live", action="store_true", help="strokes with live mode off: the redraw alone")
    parser.add_argument("--profile", default=None, help="write a cProfile of the strokes here")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import os
    import tempfile

    private = tempfile.mkdtemp(prefix="tractlens-bench-")
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        os.environ[name] = os.path.join(private, name.lower())

    from PySide6.QtWidgets import QApplication

    from tractlens.app.io import BedpostSamples
    from tractlens.app.model import Layer, Volume
    from tractlens.app.volumes import DyadsVolume
    from tractlens.widgets import dialogs
    from tractlens.widgets import probabilistic_panel as module
    from tractlens.widgets.main_window import MainWindow

    brain, f1, paths = hcp_like_grid(args.scale)
    shape = brain.shape
    affine = np.diag([VOXEL_MM, VOXEL_MM, VOXEL_MM, 1.0])
    app = QApplication.instance() or QApplication([])
    dialogs.set_scripted(True)
    win = MainWindow(device="cpu")
    win.resize(1400, 900)
    win.show()
    doc = win.document
    doc.add_layer(Layer("mean f1", Volume("mean f1", f1, affine), "scalar"))
    empty = np.broadcast_to(np.zeros((), np.float32), (*shape, 3, 50))
    samples = BedpostSamples(empty, empty, empty, brain, affine, path="(stand-in samples)")
    volume = DyadsVolume("dyads", np.zeros((*shape, 3, 3), np.float32), samples)
    doc.derived.get(volume, "sample_field", None, lambda: SimpleNamespace())  # never used by the stand-in
    doc.add_layer(Layer("dyads", volume, "dyads", visible=False))
    assert wait_until(app, lambda: win.runner.active() == [], 120)

    panel = win.probabilistic_panel
    panel.form.set_values(n_samples=args.samples)
    centre = np.array(shape) // 2
    radius = (3 * args.seed_voxels / (4 * np.pi)) ** (1 / 3)
    win.role_box.setCurrentText("seed")
    seed = win.new_roi()
    doc.paint(seed, sphere(centre, radius, shape), True)
    module.track_probabilistic = stand_in_engine(paths, seed, args.engine_ms, args.later_ms, args.passes)
    panel.track()
    assert wait_until(app, lambda: panel.job_id is None, 120), "the first run did not end"
    assert panel.result is not None, panel.status.text()
    wait_until(app, lambda: False, 1.0)  # the ROI surface's timer and the frames after it

    panel.live.setChecked(not args.no_live)
    stages = instrument(win, panel)
    ring = sphere(centre, radius + 1.5, shape)
    ring = ring[~(np.linalg.norm(ring - centre, axis=1) <= radius)]
    ring = ring[ring[:, 2] == centre[2]]  # on the axial slice at the cursor, as a brush paints
    order = np.random.default_rng(0).permutation(len(ring))
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    rows = []
    for stroke in range(args.strokes):
        voxels = ring[order[(stroke * 3) % len(ring) : (stroke * 3) % len(ring) + 3]]
        if profiler:
            profiler.enable()
        edit = time.perf_counter()
        doc.paint(seed, voxels, True)
        painted = time.perf_counter()
        panel_edit = panel.edit_time  # the panel times from its own hearing of the stroke (first)
        if args.no_live:
            wait_until(app, lambda: False, 0.6)
            until = edit + 0.6
            row = {"paint_call_ms": round((painted - edit) * 1000, 1)}
            frames = [end for start, end in win.view3d.renders if start >= edit]
            row["first_drawn_ms"] = round((frames[0] - edit) * 1000, 1) if frames else None
        else:
            assert wait_until(app, lambda: panel.first_map_s is not None, 30), panel.status.text()
            until = panel_edit + panel.first_map_s
            shown_at = panel.shown_at
            wait_until(app, lambda at=shown_at: any(s >= at for s, _ in win.view3d.renders), 5)
            frame = next(((s, e) for s, e in win.view3d.renders if s >= shown_at), None)
            assert wait_until(app, lambda: panel.job_id is None and panel.converged_s is not None, 30)
            wait_until(app, lambda: False, 0.3)
            row = {
                "paint_call_ms": round((painted - edit) * 1000, 1),
                "first_map_ms": round((until - edit) * 1000, 1),
                "first_drawn_ms": None if frame is None else round((frame[1] - edit) * 1000, 1),
                "converged_ms": round(panel.converged_s * 1000, 1),
            }
        if profiler:
            profiler.disable()
        spent = stages.summary(edit, until)
        row["gui_busy_ms"] = busy_ms(stages.spans, edit, until)  # before the first map (live) or in 0.6 s
        row["stages_ms"] = spent
        row["frames_after_stroke"] = sum(1 for s, _e in win.view3d.renders if s >= edit)
        if not args.no_live:
            row["marks_ms"] = stages.marks(
                edit,
                until,
                (
                    "submit (panel.track)",
                    "use case to first totals (prepare, track, to host)",
                    "show (GUI: layer set, replace, surface)",
                ),
            )
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    def median(key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(values), 1) if values else None

    result = {
        "engine": f"stand-in: {args.engine_ms} ms to the first totals, {args.passes} passes {args.later_ms} ms apart",
        "live": not args.no_live,
        "grid": list(shape),
        "seed_voxels": int(seed.data.mask.sum()),
        "median_paint_call_ms": median("paint_call_ms"),
        "median_first_map_ms": median("first_map_ms"),
        "median_first_drawn_ms": median("first_drawn_ms"),
        "median_converged_ms": median("converged_ms"),
        "strokes": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if profiler:
        profiler.dump_stats(args.profile)
    win.runner.shutdown(10)
    win.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
