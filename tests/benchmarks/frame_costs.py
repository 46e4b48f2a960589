"""What one 3-D frame of the window costs without streamlines, and what it is made of (issue 41).

    python tests/benchmarks/frame_costs.py [--out FILE]

The glyph steps of ``bench_render.py`` spend 25-36 ms of the GUI thread on one 3-D frame of a
scene of three textured planes and glyphs, on an H200: more than such a scene should take. This
opens the window as the benchmark does (1600 x 1000, its scene layers on the 1.25 mm grid, the
fODF layer shown, no tractogram) and times frames drawn as the view draws them (its repaint,
drawn to the end), the median of ``--frames``, for: the scene as the window shows it; with the
view's multisampling off; without the glyphs; without glyphs and planes; and the window's
update alone (a slice view's repaint: Qt composes the window, which holds an OpenGL widget).
Prints and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def measure(n_frames: int) -> dict:
    from tests.benchmarks.bench_render import AFFINE, GRID_SHAPE, scene_layers
    from tests.benchmarks.render_glyphs import fod_scene_layer
    from tests.benchmarks.render_measure import bench_window, wait
    from tractlens.widgets.glyphs import wait_for_builds

    app, window = bench_window(1600, 1000, "frame-costs-config-")
    view, doc = window.view3d, window.document
    view.finish_frames = True  # a frame's end is when the GPU has drawn it
    tensors = scene_layers(doc)
    tensors.set(visible=False)
    fods = fod_scene_layer(doc, GRID_SHAPE, AFFINE)
    app.processEvents()
    wait_for_builds(120_000)
    assert wait(app, view.glyphs_ready, 120)
    ren_win = view.plotter.ren_win

    def frames() -> dict:
        """The view's own frames (its repaint), each waited for: the frame (render to the GPU's
        end) and the whole turn (the frame, Qt's compose of the window and its flush)."""
        drawn, turns = [], []
        for _ in range(n_frames):
            count = view.frames_drawn
            start = time.perf_counter()
            view.request_render()
            assert wait(app, lambda c=count: view.frames_drawn > c, 30)
            app.processEvents()
            turns.append(time.perf_counter() - start)
            drawn.append(view.renders[-1][1] - view.renders[-1][0])
        return {"frame_ms": round(1e3 * float(np.median(drawn)), 1), "turn_ms": round(1e3 * float(np.median(turns)), 1)}

    out = {"gl_renderer": view.gl_renderer, "view_px": [view.width(), view.height()],
           "multisamples": int(ren_win.GetMultiSamples())}  # fmt: skip
    out["scene"] = frames()
    samples = ren_win.GetMultiSamples()
    ren_win.SetMultiSamples(0)
    out["no_multisampling"] = frames()
    ren_win.SetMultiSamples(samples)
    fods.set(visible=False)
    app.processEvents()
    out["no_glyphs"] = frames()
    doc.layer("image").set(visible=False)
    app.processEvents()
    out["no_glyphs_no_planes"] = frames()
    # the window's update for one slice view's repaint: its paint, Qt's compose and flush
    slice_view = next(iter(window.views.values()))
    turns = []
    for _ in range(n_frames):
        start = time.perf_counter()
        slice_view.repaint()
        app.processEvents()
        turns.append(time.perf_counter() - start)
    out["slice_repaint_turn_ms"] = round(1e3 * float(np.median(turns)), 1)
    window.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = {"command": " ".join(["python", *sys.argv]), **measure(args.frames)}
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
