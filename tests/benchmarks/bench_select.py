"""Benchmark: ROI selection of 100 k and 1 M streamlines against a 1 000-voxel ROI, CPU vs GPU.

    python tests/benchmarks/bench_select.py [--counts 100000 1000000] [--gpu]

Synthetic streamlines of 50 points, one voxel apart, in a 100³ grid; the ROI is a
10×10×10 cube in the middle. CPU = the CPU engine ``auto`` picks (``cpu_engine``: NumPy, or
the compiled loop when numba has started; the key keeps its old name); GPU = the CUDA
kernel, timed (a) with the streamlines already on the device, as while an ROI
is dragged (CUDA events, median of 20), and (b) end to end from host arrays.
Prints one JSON line per size.
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

from tractlens.gpu.select import StreamlineIndex, hits_kernel, region_bits, select_streamlines  # noqa: E402


def synthetic(n: int):
    """The render benchmark's streamlines (50 points, 1 voxel apart, in a 100³ box) as arrays."""
    from tests.benchmarks.bench_render import synthetic_tractogram

    tract = synthetic_tractogram(n)
    return tract.points, tract.offsets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--cpu-max", type=int, default=1_000_000, help="skip the CPU run above this size")
    args = parser.parse_args()
    roi = np.zeros((100, 100, 100), dtype=bool)
    roi[45:55, 45:55, 45:55] = True
    for n in args.counts:
        points, offsets = synthetic(n)
        row = {"streamlines": n, "points": len(points), "roi_voxels": int(roi.sum())}
        if n <= args.cpu_max:
            t0 = time.perf_counter()
            cpu = select_streamlines(points, offsets, [roi], device="cpu")
            row["cpu_numpy_s"] = round(time.perf_counter() - t0, 3)
            row["cpu_engine"] = cpu.provenance["engine"]
            row["selected"] = int(cpu.selected.sum())
        if args.gpu:
            import cupy as cp

            from tractlens.gpu.backend import get_backend

            backend = get_backend("gpu")
            select_streamlines(points[:5000], offsets[:101], [roi], device="gpu")  # compile, warm up
            t0 = time.perf_counter()
            gpu = select_streamlines(points, offsets, [roi], device="gpu")
            row["gpu_end_to_end_s"] = round(time.perf_counter() - t0, 3)
            if "selected" in row:
                row["gpu_equals_cpu"] = bool(np.array_equal(gpu.bits, cpu.bits))
            row["selected"] = int(gpu.selected.sum())
            index = StreamlineIndex(points, offsets, device="gpu")
            bits = cp.asarray(region_bits([roi]))
            times = []
            for _ in range(20):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                hits_kernel(backend, index.points, index.stream_of_point, index.is_last, bits, n)
                stop.record()
                stop.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, stop))
            row["gpu_resident_ms"] = round(statistics.median(times), 2)
            # What one ROI edit costs in the window: mask in, selection out, streamlines resident.
            walls = []
            for _ in range(10):
                t0 = time.perf_counter()
                index.select([roi])
                walls.append(time.perf_counter() - t0)
            row["gpu_resident_select_ms_host_to_host"] = round(1e3 * statistics.median(walls), 2)
            row["device"] = backend.device_name
            if "cpu_numpy_s" in row:
                row["speedup_resident_vs_cpu"] = round(row["cpu_numpy_s"] * 1e3 / row["gpu_resident_ms"], 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
