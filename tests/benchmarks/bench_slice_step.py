"""Benchmark: the GUI thread's own work when the cursor steps one slice (issue 41's glyph step,
without the 3-D frames, so that it measures the same on software and hardware OpenGL).

    python tests/benchmarks/bench_slice_step.py [--steps 12] [--out FILE]

In a 1600×1000 main window with bench_render.py's scene (a reference image and a tensor layer on
the 1.25 mm HCP-sized grid, 145×174×145, the tensors' glyphs shown), the cursor steps one voxel
along z, y and x in turn, ``--steps`` times. Per step, on the GUI thread:

- ``cursor_event_ms``: ``document.set_cursor`` (the views' handlers: the 3-D view's cursor planes
  composited again, the glyph builds asked for);
- ``slice_paints_ms``: the three slice views painted (``repaint``: their images composited where
  needed, the tensors' ellipses, the crosshair);
- ``composites``: how many plane images were composited (three slice views and three 3-D planes
  could each make one);
- ``glyph_build_ms``: the 3-D glyphs' build (``widgets.glyphs.tensor_glyph_job``) timed on this
  thread (a worker runs it in the window).

Medians over the steps. To compare two trees side by side, run the script of one tree against
the other's package (``PYTHONPATH`` holding a ``tractlens`` link to that tree) in alternation;
``--label`` names each run in the results. Writes one JSON line per run to ``--out``
(default ``results/slice_step_<host>.jsonl``, appended).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    os.environ.setdefault("TRACTLENS_CONFIG_DIR", tempfile.mkdtemp(prefix="bench-slice-config-"))
    from tests.conftest import _ensure_display

    _ensure_display()
    from PySide6.QtWidgets import QApplication

    import tractlens.app
    import tractlens.widgets.render as render
    from tests.benchmarks.bench_render import scene_layers
    from tractlens.widgets.glyphs import tensor_glyph_job, wait_for_builds
    from tractlens.widgets.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    composites = [0]
    original = render.composite

    def counted(*a, **k):
        composites[0] += 1
        return original(*a, **k)

    render.composite = counted  # the modules import it by name: patched where they look it up
    for name in ("tractlens.widgets.slice_view", "tractlens.widgets.view3d"):
        module = sys.modules.get(name) or __import__(name, fromlist=["composite"])
        module.composite = counted
    window = MainWindow(device="cpu", autosave_s=0)
    window.resize(1600, 1000)
    window.show()
    app.processEvents()
    doc = window.document
    tensors = scene_layers(doc)
    tensors.set(visible=True)
    assert window.wait_for_jobs(600)
    for _ in range(5):
        app.processEvents()
    wait_for_builds(60_000)

    rows = {"cursor_event_ms": [], "slice_paints_ms": [], "composites": [], "glyph_build_ms": []}
    for step in range(args.steps):
        axis = (2, 1, 0)[step % 3]
        composites[0] = 0
        start = time.perf_counter()
        doc.set_cursor(doc.cursor + np.eye(3, dtype=int)[axis])
        rows["cursor_event_ms"].append(1e3 * (time.perf_counter() - start))
        start = time.perf_counter()
        for view in window.views.values():
            view.repaint()
        rows["slice_paints_ms"].append(1e3 * (time.perf_counter() - start))
        rows["composites"].append(composites[0])
        build, _key = tensor_glyph_job(tensors, doc, software=False)
        start = time.perf_counter()
        build()
        rows["glyph_build_ms"].append(1e3 * (time.perf_counter() - start))
        wait_for_builds(60_000)
        for _ in range(3):
            app.processEvents()
    out = {
        "label": args.label,
        "package": str(Path(tractlens.app.__file__).resolve().parent.parent),  # the tree measured
        "steps": args.steps,
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{k: round(statistics.median(v), 2) for k, v in rows.items()},
        "per_step": {k: [round(x, 2) for x in v] for k, v in rows.items()},
    }
    print(json.dumps(out))
    path = args.out or ROOT / "tests" / "benchmarks" / "results" / f"slice_step_{socket.gethostname()}.jsonl"
    with open(path, "a") as handle:
        handle.write(json.dumps(out) + "\n")
    window.close()


if __name__ == "__main__":
    main()
