"""A selection's moving level: its random subset of streamlines, drawn by ``random_subset``
(``app.fiber_arrays``) against NumPy's ``choice`` without replacement and a sort (what it was),
in the same run, as a ratio; and the whole preparation of a selection's levels
(``level_cells`` "full" and "moving", as the ROI edit's job does on its worker).

    python tests/benchmarks/bench_selection_levels.py [--streamlines 10000000] [--share 0.12] [--repeat 5] [--out FILE]

Synthetic offsets (100 points a streamline), a random selection of ``--share`` of them, and the
8 pieces the 3-D view draws 10 M streamlines in. Writes one JSON object (medians in ms) to
``--out`` (default: results/selection_levels_<host>.json).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 1)


def main() -> None:
    from tractlens.app.fiber_arrays import HARDWARE_MOVING_POINTS, level_cells, piece_bounds, random_subset

    parser = argparse.ArgumentParser()
    parser.add_argument("--streamlines", type=int, default=10_000_000)
    parser.add_argument("--share", type=float, default=0.12)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    n = args.streamlines
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.full(n, 100, np.int64), out=offsets[1:])
    ids = np.flatnonzero(np.random.default_rng(1).random(n) < args.share)
    lengths = offsets[ids + 1] - offsets[ids]
    bounds = piece_bounds(offsets)
    keep = int(min(len(ids), HARDWARE_MOVING_POINTS / 100))
    row = {
        "streamlines": n,
        "selected": len(ids),
        "moving_kept": keep,
        "pieces": len(bounds),
        "subset_choice_sort_ms": median_ms(
            lambda: np.sort(np.random.default_rng(0).choice(len(ids), keep, replace=False, shuffle=False)), args.repeat
        ),
        "subset_random_subset_ms": median_ms(lambda: random_subset(len(ids), keep), args.repeat),
        "levels_full_ms": median_ms(
            lambda: level_cells(offsets, "full", ids, bounds, True, lengths=lengths), args.repeat
        ),
        "levels_moving_ms": median_ms(
            lambda: level_cells(offsets, "moving", ids, bounds, True, lengths=lengths), args.repeat
        ),
        "host": socket.gethostname(),
        "command": " ".join(["python", *sys.argv]),
    }
    row["subset_speedup"] = round(row["subset_choice_sort_ms"] / row["subset_random_subset_ms"], 2)
    out = args.out or ROOT / "tests" / "benchmarks" / "results" / f"selection_levels_{socket.gethostname()}.json"
    out.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
