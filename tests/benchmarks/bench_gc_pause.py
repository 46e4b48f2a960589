"""Benchmark: how long a full cyclic garbage collection holds the GUI thread with the window up
(bench_render.py's scene: a reference image and a tensor layer), with what existed once the
window was up frozen out of the collector (``widgets/gui_gc.py``, the window's own state) and, in
the same process, unfrozen again (as before): the pause a slice step or a rotation can meet.

    python tests/benchmarks/bench_gc_pause.py [--repeat 5] [--out FILE]

Writes one JSON object (medians in ms, and the objects each walk covers) to ``--out``
(default: results/gc_pause_<host>.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def full_collections(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        gc.collect(2)
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from tests.benchmarks.bench_render import scene_layers
    from tests.benchmarks.render_measure import bench_window

    app, window = bench_window(1600, 1000, "bench-gc-config-")
    for _ in range(5):
        app.processEvents()
    scene_layers(window.document)
    assert window.wait_for_jobs(600)
    for _ in range(20):
        app.processEvents()
    row = {
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    row["command"] = " ".join(["python", *sys.argv])
    row["frozen_objects"] = gc.get_freeze_count()
    row["walked_objects_frozen"] = len(gc.get_objects())
    row["full_collection_ms_frozen"] = full_collections(args.repeat)
    gc.unfreeze()  # as before: every object walked
    row["walked_objects_unfrozen"] = len(gc.get_objects())
    row["full_collection_ms_unfrozen"] = full_collections(args.repeat)
    row["ratio_frozen_over_unfrozen"] = round(row["full_collection_ms_frozen"] / row["full_collection_ms_unfrozen"], 4)
    window.close()
    out = (
        args.out
        or ROOT / "tests" / "benchmarks" / "results" / f"gc_pause_{'vm' if 'vm' in row['host'] else row['host']}.json"
    )
    out.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
