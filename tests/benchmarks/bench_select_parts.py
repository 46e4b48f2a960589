"""Benchmark: where the time of one ROI selection over a whole-brain tractogram goes, on the GPU.

    python tests/benchmarks/bench_select_parts.py --trx /tmp/tractlens-bench/synthetic_10000000x100.trx [--repeat 10]

The render benchmark's synthetic ``.trx`` (``bench_render.py`` writes it) is opened memory-mapped,
indexed on its grid on the GPU (:func:`app.pipelines.select.index_on_grid`, as the window does),
and selected against the ROI sphere of the render benchmark's edits (``render_roi.RADIUS_MM`` at
the grid's centre), ``--repeat`` times. Each part of :meth:`StreamlineIndex.select` is timed with
the device synchronised before and after it (the parts run one after another anyway): the host's
mask work, the bits' upload, the kernel, the verdict's ids, the downloads. The whole select is
timed on its own too, without the synchronisations. Prints one JSON line (medians in ms, and
every repeat), written to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_render import AFFINE, GRID_SHAPE, VOXEL_MM  # noqa: E402
from tests.benchmarks.render_roi import RADIUS_MM, sphere  # noqa: E402


def timed_parts(select_module, backend, spent: dict) -> None:
    """Wrap the select module's parts and the backend's transfers: each call's ms into ``spent``."""
    sync = backend.synchronize if hasattr(backend, "synchronize") else (lambda: backend.xp.cuda.Device().synchronize())

    def wrap(owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            sync()
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            sync()
            spent[label].append(1e3 * (time.perf_counter() - start))
            return out

        object.__setattr__(owner, name, timed)  # (the backend is a frozen dataclass)

    from tractlens.gpu import select_host

    wrap(select_module, "checked_masks", "host: masks checked")
    wrap(select_host, "region_bounds", "host: the regions' box")
    wrap(select_module, "region_bits", "host: region bits")
    wrap(backend, "asarray", "upload: region bits")
    wrap(select_module, "hits_kernel", "device: kernel")
    wrap(select_module, "flatnonzero", "device: verdict's ids")
    wrap(backend, "to_host", "download (each)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trx", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from tractlens.app.io.tractogram import load_tractogram
    from tractlens.app.pipelines.select import index_on_grid
    from tractlens.gpu import select as select_module

    t0 = time.perf_counter()
    tract = load_tractogram(args.trx)
    index = index_on_grid(tract, AFFINE, "gpu")
    row = {"streamlines": len(tract), "points": int(tract.n_points), "index_s": round(time.perf_counter() - t0, 2)}
    mask = sphere(GRID_SHAPE, np.array(GRID_SHAPE) / 2, RADIUS_MM / VOXEL_MM)
    index.select([mask])  # the kernel compiled and the index uploaded: not timed
    whole = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = index.select([mask])
        whole.append(1e3 * (time.perf_counter() - start))
    row["selected"] = len(result.ids)
    row["select_ms"] = round(statistics.median(whole), 2)
    row["select_all_ms"] = [round(t, 2) for t in whole]
    spent: dict[str, list[float]] = defaultdict(list)
    timed_parts(select_module, index.backend, spent)
    synced = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        index.select([mask])
        synced.append(1e3 * (time.perf_counter() - start))
    row["select_synchronised_ms"] = round(statistics.median(synced), 2)
    row["parts_ms"] = {label: round(statistics.median(times), 2) for label, times in spent.items()}
    row["parts_calls_per_select"] = {label: len(times) // args.repeat for label, times in spent.items()}
    row["parts_each_ms"] = {label: [round(t, 2) for t in times] for label, times in spent.items()}
    text = json.dumps(row)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
