"""What an ROI stroke's patch of the 3-D cursor planes costs a frame: frames of the window's 3-D
view drawn with nothing changed, against frames after the three planes' colours were changed (as
``View3D._patch_planes`` does for a stroke), in the same run, as a ratio. Drawn as grids, VTK
extracted each plane's surface again after such a change; drawn as surfaces that hold the grids'
arrays, only the colours are sent again.

    xvfb-run -a python tests/benchmarks/bench_plane_patch.py [--frames 8] [--out FILE]

A 1600×1000 window with bench_render.py's image and (hidden) tensor layers on the 1.25 mm grid,
no tractogram. Each frame is rendered and waited for (``WaitForCompletion``). Writes one JSON
object (medians in ms) to ``--out`` (default: results/plane_patch_<renderer>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("TRACTLENS_CONFIG_DIR", tempfile.mkdtemp(prefix="bench-plane-config-"))  # not the user's
    from PySide6.QtWidgets import QApplication

    from tests.benchmarks.bench_render import renderer_kind, scene_layers
    from tractlens.widgets.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    window = MainWindow(autosave_s=0)
    window.resize(1600, 1000)
    window.show()
    app.processEvents()
    view = window.view3d
    scene_layers(window.document).set(visible=False)
    assert window.wait_for_jobs(600)
    for _ in range(50):
        app.processEvents()
        time.sleep(0.01)
    ren_win = view.plotter.ren_win

    def frames(before) -> list[float]:
        out = []
        for _ in range(args.frames):
            before()
            start = time.perf_counter()
            ren_win.Render()
            ren_win.WaitForCompletion()
            out.append(1e3 * (time.perf_counter() - start))
        return out

    def change_colours() -> None:
        for grid, _actor in view._planes.values():
            grid.GetPointData().GetArray("rgb").Modified()

    plain, patched = [], []
    for _ in range(2):  # interleaved
        plain += frames(lambda: None)
        patched += frames(change_colours)
    result = {
        "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
        "gl_renderer": view.gl_renderer if hasattr(view, "gl_renderer") else None,
        "planes": [list(grid.dimensions) for grid, _actor in view._planes.values()],
        "frame_unchanged_ms": round(statistics.median(plain), 1),
        "frame_after_colours_changed_ms": round(statistics.median(patched), 1),
        "ratio": round(statistics.median(patched) / statistics.median(plain), 2),
        "all_unchanged_ms": [round(t, 1) for t in plain],
        "all_after_colours_changed_ms": [round(t, 1) for t in patched],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    view._software()
    result["gl_renderer"] = view.gl_renderer
    out = args.out or ROOT / "tests" / "benchmarks" / "results" / f"plane_patch_{renderer_kind(view.gl_renderer)}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("all_")}))
    window.close()


if __name__ == "__main__":
    main()
