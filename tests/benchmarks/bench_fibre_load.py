"""Benchmark: what opening a whole-brain .trx costs, step by step (issue 41), without a window.

    python tests/benchmarks/bench_fibre_load.py [--counts 1000000 10000000] [--points 100]
        [--cache DIR] [--device auto] [--no-selection] [--dtype float32|float16] [--out FILE]

For each N the synthetic tractogram of ``bench_render.py`` (N streamlines of ``--points`` points,
float32 positions (``--dtype float16``: half the file), a per-streamline ``weight``; written once
into ``--cache``) is opened in a fresh process (so each size's memory is its own) through the
steps the window takes, each timed with its peak resident memory (VmHWM, reset between steps where the kernel allows it):

- ``read``: :func:`app.io.load_tractogram` as the window's loading job calls it, split into
  ``read.trx_load`` (trx-python maps the file: header, offsets, lengths), ``read.check_positions``
  (one chunked pass over the positions: finite, inside what the grid's voxel coordinates hold) and
  ``read.other`` (offsets, scalars, the tractogram);
- ``display_arrays``: the 3-D view's arrays (:meth:`FiberArrayCache.prepare`, as the loading job
  calls it for a view that draws from its own buffers: levels of detail as index ranges);
- ``check_after_first_frame``: where the reader can leave it for later (``load_tractogram(...,
  check_positions=False)``, as the window's loading job does), the positions check, run by the
  window's job after the first frame (then ``read.check_positions`` is 0; the slice views wait
  for it);
- ``slice_views``: what the 2-D views compute on their first paint (:meth:`FiberArrayCache.on_reference`
  on the tractogram's grid: the at-rest level of software OpenGL, gathered and coloured);
- ``selection_index``: the ROI selection's index on the compute device (first ROI edit), then
  ``select``: one selection (a 12 mm sphere in the middle) and ``select_ranges``: its index ranges;
- ``voxels_made``: every point in voxel coordinates (what a pipeline that reads ``tractogram.points``
  makes once: COMMIT, tractometry, a session save); not on the way to the first frame.

Per step: ``s`` (seconds), ``peak_mb`` (VmHWM during the step), ``rss_mb``/``anon_mb``/``file_mb``
after it (resident memory; anonymous; pages of mapped files, which the kernel can drop). Also the
file's size and ``open_s`` (read + display_arrays: the loading job), ``rss_added_over_file`` after
the loading job and ``peak_added_over_file`` over the open and the selection.

Results: one JSON line per N, and ``--out`` (default ``results/fibre_load_<host>.json``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_render import (  # noqa: E402
    AFFINE,
    GRID_SHAPE,
    VOXEL_MM,
    reset_peak_rss,
    rss_kb,
    synthetic_trx,
)


class Steps:
    """Times and memory of the steps, in the order they ran."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.resettable = reset_peak_rss()
        self.inner: dict[str, float] = {}

    def run(self, name: str, work):
        self.resettable and reset_peak_rss()
        start = time.perf_counter()
        out = work()
        seconds = time.perf_counter() - start
        self.rows[name] = {
            "s": round(seconds, 3),
            "peak_mb": round(rss_kb("VmHWM") / 1024),
            "rss_mb": round(rss_kb() / 1024),
            "anon_mb": round(rss_kb("RssAnon") / 1024),
            "file_mb": round(rss_kb("RssFile") / 1024),
        }
        return out

    def timed(self, owner, attribute: str, name: str) -> None:
        """Add ``owner.attribute``'s time to ``self.inner[name]`` whenever it runs (nothing where
        the code measured has no such function: an older version, for a before/after)."""
        function = getattr(owner, attribute, None)
        if function is None:
            return

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.inner[name] = self.inner.get(name, 0.0) + time.perf_counter() - start

        setattr(owner, attribute, wrapper)


def one_size(path: Path, device: str, selection: bool = True) -> dict:
    import trx.trx_file_memmap as trx_memmap

    from tractlens.app.io import load_tractogram
    from tractlens.app.io import tractogram as tractogram_io
    from tractlens.app.model import Document, Layer
    from tractlens.app.selection import RoiSelection, select_fibres, streamline_index

    steps = Steps()
    steps.timed(trx_memmap, "load", "trx_load")
    steps.timed(tractogram_io, "points_fit_grid", "check_positions")
    # the window's loading job leaves the positions check for after the first frame where it can
    deferred = "check_positions" in inspect.signature(load_tractogram).parameters
    rss_before = rss_kb()
    tract = steps.run("read", lambda: load_tractogram(path, **({"check_positions": False} if deferred else {})))
    read = steps.rows["read"]
    read["trx_load_s"] = round(steps.inner.get("trx_load", 0.0), 3)
    read["check_positions_s"] = round(steps.inner.pop("check_positions", 0.0), 3)
    read["other_s"] = round(read["s"] - read["trx_load_s"] - read["check_positions_s"], 3)
    mapped = getattr(tract, "mapped", None) is not None  # (None before the mapped open)
    layer = Layer("t", tract, "tractogram")
    doc = Document()
    cache = doc.fiber_arrays
    cache.shader_drawn_min_points = 2_000_000  # the window's own-buffer drawing (widgets.view3d_fibers)
    steps.run("display_arrays", lambda: cache.prepare(layer))
    rss_open = rss_kb()
    doc.add_layer(layer)
    if deferred and tract.mapped is not None and not tract.mapped.checked:  # the job after the first frame
        steps.run("check_after_first_frame", tract.mapped.positions_fit)
    steps.run("slice_views", lambda: cache.on_reference(layer, np.asarray(tract.affine)))

    index = selected = None
    if selection:
        ijk = np.indices(GRID_SHAPE, dtype=np.float32)
        centre = np.array(GRID_SHAPE) / 2
        mask = sum((ijk[a] - centre[a]) ** 2 for a in range(3)) <= (12.0 / VOXEL_MM) ** 2
        del ijk
        request = RoiSelection((layer,), (mask,), (), AFFINE, ("sphere",))
        index = steps.run("selection_index", lambda: streamline_index(doc, layer, AFFINE, device))
        ((_, selected),) = steps.run("select", lambda: select_fibres(doc, request, device=device))
        steps.run("select_ranges", lambda: cache.prepare_selection(layer, selected))
    made_before = bool(mapped and tract.mapped.made)
    steps.run("voxels_made", lambda: tract.points)

    file_mb = path.stat().st_size / 2**20
    before_mb = rss_before / 1024
    peak_open = max(steps.rows[k]["peak_mb"] for k in ("read", "display_arrays", "slice_views"))
    peak_select = max((steps.rows[k]["peak_mb"] for k in ("selection_index", "select", "select_ranges")
                       if k in steps.rows), default=0)  # fmt: skip
    return {
        "file": str(path),
        "file_mb": round(file_mb),
        "streamlines": len(tract),
        "points": int(tract.offsets[-1]),
        "mapped": mapped,
        "voxels_made_before_asked": made_before,
        "select_device": None if index is None else index.backend.name,
        "selected": None if selected is None else int(np.count_nonzero(selected)),
        "rss_before_mb": round(before_mb),
        "open_s": round(steps.rows["read"]["s"] + steps.rows["display_arrays"]["s"], 3),
        "check_deferred": "check_after_first_frame" in steps.rows,
        "rss_added_over_file": round((rss_open / 1024 - before_mb) / file_mb, 3),
        "peak_added_over_file_open": round((peak_open - before_mb) / file_mb, 3) if steps.resettable else None,
        "peak_added_over_file_selection": round((peak_select - before_mb) / file_mb, 3)
        if steps.resettable and selection
        else None,
        "steps": steps.rows,
        "peaks_reset_between_steps": steps.resettable,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("TRACTLENS_BENCH_CACHE", "/tmp/tractlens-bench"))
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-selection", action="store_true", help="skip the selection steps")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="the file's positions")
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # a child: one file
    args = parser.parse_args()
    if args.one is not None:
        print("RESULT " + json.dumps(one_size(args.one, args.device, not args.no_selection)), flush=True)
        return
    rows = []
    for n in args.counts:
        path = synthetic_trx(args.cache, n, args.points, dtype=args.dtype)
        command = [sys.executable, __file__, "--one", str(path), "--device", args.device]
        done = subprocess.run(command + ["--no-selection"] * args.no_selection, capture_output=True, text=True)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        row = json.loads(line[len("RESULT ") :]) if line else {"streamlines": n, "error": done.stderr[-3000:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        out = args.out or ROOT / "tests" / "benchmarks" / "results" / f"fibre_load_{socket.gethostname()}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        summary = {"command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
                   "cpu_count": os.cpu_count(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "rows": rows}  # fmt: skip
        out.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
