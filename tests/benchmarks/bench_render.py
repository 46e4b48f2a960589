"""Benchmark: frame time while rotating large tractograms, our fiber layer vs plain pyvista.

    python tests/benchmarks/bench_render.py [--counts 10000 100000 1000000] [--frames 10]

Synthetic streamlines (50 points each, smooth random curves in a 100 mm box)
are shown (a) by TractLens's 3-D view (one actor per tractogram, a 20 k
streamline level of detail while the camera moves, full detail when it stops)
and (b) by a plain ``plotter.add_mesh`` of the same polylines, in the same
window and run. For each size it reports the first-display time (arrays to the
first rendered frame), the median frame time while rotating, and for ours the
full-detail frame drawn when rotation stops. One JSON line per size, then a
summary line. Starts its own Xvfb when there is no display; with Mesa's
llvmpipe that is software rendering.
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


def synthetic_tractogram(n_streamlines: int, n_points: int = 50, seed: int = 0):
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(seed)
    start = rng.uniform(0, 100, (n_streamlines, 1, 3)).astype(np.float32)
    direction = rng.normal(size=(n_streamlines, 1, 3)).astype(np.float32)
    direction /= np.linalg.norm(direction, axis=2, keepdims=True)
    bend = rng.normal(scale=0.02, size=(n_streamlines, 1, 3)).astype(np.float32)
    t = np.arange(n_points, dtype=np.float32)[None, :, None]
    points = start + direction * t + bend * t**2
    offsets = np.arange(0, n_streamlines * n_points + 1, n_points, dtype=np.int64)
    return Tractogram(points.reshape(-1, 3), offsets, np.eye(4), (100, 100, 100), name=f"{n_streamlines}")


def line_connectivity(offsets: np.ndarray) -> np.ndarray:
    """VTK's legacy [n, ids..., n, ids...] polyline array: what a plain pyvista user builds."""
    counts = np.diff(offsets).astype(np.int64)
    heads = np.cumsum(counts + 1) - (counts + 1)
    out = np.empty(int(counts.sum()) + len(counts), dtype=np.int64)
    out[heads] = counts
    body = np.ones(len(out), dtype=bool)
    body[heads] = False
    out[body] = np.arange(int(counts.sum()), dtype=np.int64)
    return out


def rotate_frames(plotter, frames: int) -> list[float]:
    times = []
    for _ in range(frames):
        plotter.camera.azimuth += 3.0
        t0 = time.perf_counter()
        plotter.render()
        times.append(time.perf_counter() - t0)
    return times


def bench_size(window, n: int, frames: int) -> dict:
    import pyvista as pv
    from PySide6.QtWidgets import QApplication

    from tractlens.app.model import Layer

    view = window.view3d
    plotter = view.plotter
    tract = synthetic_tractogram(n)
    app = QApplication.instance()

    # Ours: layer -> actor -> first frame.
    t0 = time.perf_counter()
    layer = Layer(f"bench {n}", tract, "tractogram")
    window.document.fiber_arrays.prepare(layer)  # what the loading job does on its worker thread
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    window.document.add_layer(layer)
    view._render_now()  # the first frame shows the light level; the settled one follows when idle
    ours_first = time.perf_counter() - t0
    app.processEvents()
    plotter.reset_camera()
    view._coarse_detail()  # what a mouse press on the view does
    ours_frames = rotate_frames(plotter, frames)
    view._full_detail()  # what the end of the interaction does (after a 250 ms pause)
    t0 = time.perf_counter()
    plotter.render()
    ours_settled = time.perf_counter() - t0
    layer.set(visible=False)
    app.processEvents()

    # Plain pyvista: the same polylines as one mesh, rendered at full detail every frame.
    t0 = time.perf_counter()
    mesh = pv.PolyData(tract.points, lines=line_connectivity(tract.offsets))
    actor = plotter.add_mesh(mesh, color="white", name="plain", line_width=1)
    plotter.render()
    plain_first = time.perf_counter() - t0
    plain_frames = rotate_frames(plotter, max(2, frames if n <= 100_000 else 3))
    plotter.remove_actor(actor)
    window.document.remove_layer(layer)
    app.processEvents()
    ours_ms = 1e3 * statistics.median(ours_frames)
    plain_ms = 1e3 * statistics.median(plain_frames)
    return {
        "streamlines": n,
        "points": len(tract.points),
        "ours_prepare_s_worker": round(prepare_s, 3),
        "ours_first_display_s_gui": round(ours_first, 3),
        "ours_frame_ms_rotating": round(ours_ms, 1),
        "ours_frame_ms_full_detail": round(1e3 * ours_settled, 1),
        "plain_first_display_s": round(plain_first, 3),
        "plain_frame_ms_rotating": round(plain_ms, 1),
        "speedup_rotating": round(plain_ms / ours_ms, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--frames", type=int, default=10)
    parser.add_argument("--size", default="1200x800")
    args = parser.parse_args()
    from tests.conftest import _ensure_display

    _ensure_display()
    from PySide6.QtWidgets import QApplication

    from tractlens.widgets.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    window = MainWindow(device="cpu")
    width, height = (int(v) for v in args.size.split("x"))
    window.resize(width, height)
    window.show()
    app.processEvents()
    renderer = window.view3d.plotter.ren_win.ReportCapabilities().splitlines()
    gl = next((line.split(":", 1)[1].strip() for line in renderer if "renderer string" in line), "unknown")
    rows = []
    for n in args.counts:
        row = bench_size(window, n, args.frames)
        row["renderer"] = gl
        row["view_px"] = [window.view3d.width(), window.view3d.height()]
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"summary": rows}), flush=True)
    window.close()


if __name__ == "__main__":
    main()
