"""Benchmark: geodesic ray tracing steps per second on an HCP-sized tensor field, and the
live re-tracking latency of the pipeline.

    python tests/benchmarks/bench_geodesic.py [--gpu] [--fibers 10000 100000 1000000]
        [--kernel-only 10000000] [--cpu-fibers 2000] [--steps 500] [--out results.json]

The field of bench_deterministic.py (145×174×145, 1.25 mm, brain-like synthetic
tensors); 0.1-voxel steps, no optional stopping rule, so almost every fibre runs
``--steps`` steps or leaves the brain mask. Two orders of work:

- ``seeds×directions``: seed points at random brain voxels, 100 Fibonacci directions
  from each, one after the other — what ``tractlens track geodesic`` and the panel run;
- ``random``: every fibre from its own random point in a random direction (the worst
  case for the caches: neighbouring threads share nothing).

Rows: the CUDA kernel alone (CUDA events, best of 3) for RK2 and RK4; end to end
(``track_all``: packing and copying the kept fibres, every 5th point) up to 10⁶ fibres;
our NumPy reference on ``--cpu-fibers`` fibres; and the live latency: a seed ROI of 100
points × 100 directions × 500 steps (10⁴ fibres), from calling the pipeline with the
cached metric to the first batch's display arrays ready (``FiberArrayCache.prepare``), as
the Geodesic panel does on its worker (first batch of ``INTERACTIVE_FIRST_BATCH`` fibres,
the rest streaming after it). The GUI's share (wrapping the arrays in VTK and
drawing) is measured in tests/gui/test_geodesic_panel.py. The published figure to
compare with is 52 M RK2 steps/s (GTX 260, seed 004).
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

from tests.benchmarks.bench_deterministic import VOXEL_MM, hcp_like_field  # noqa: E402
from tractlens.gpu import geodesic, geodesic_field, geodesic_params  # noqa: E402

DIRECTIONS = 100


def workloads(brain: np.ndarray, n: int, rng) -> dict:
    voxels = np.argwhere(brain)

    def points(count):
        return voxels[rng.integers(0, len(voxels), count)] + rng.uniform(-0.5, 0.5, (count, 3))

    seeds = points(max(1, n // DIRECTIONS))
    return {
        "seeds×directions": (
            np.repeat(seeds, DIRECTIONS, 0)[:n], np.tile(geodesic.fibonacci_directions(DIRECTIONS), (len(seeds), 1))[:n]
        ),
        "random": (points(n), geodesic.fibonacci_directions(n)[rng.permutation(n)]),
    }  # fmt: skip


def kernel_row(fld, starts, dirs, params) -> dict:
    import cupy as cp

    from tractlens.gpu.backend import get_backend

    backend = get_backend("gpu")
    packed, region = geodesic_field.packed_field(backend, fld), backend.asarray(fld.region)
    s, d = cp.asarray(starts), cp.asarray(dirs)
    geodesic._track_kernel(backend, fld, packed, region, s[:256], d[:256], params)  # compile
    times = []
    for _ in range(3):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        out = geodesic._track_kernel(backend, fld, packed, region, s, d, params)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1000)
        steps = int(out[5].sum())
        del out
    kernel_s = min(times)
    return {"steps": steps, "kernel_s": round(kernel_s, 5), "kernel_steps_per_s": round(steps / kernel_s)}


def live_latency(field_, fld, brain, device: str, repeats: int = 7) -> dict:
    """Seed ROI → first batch of fibres with display arrays, as GeodesicPanel's job does it."""
    from tractlens.app.fiber_cache import FiberArrayCache
    from tractlens.app.pipelines.track import INTERACTIVE_FIRST_BATCH, geodesic_pipeline

    rng = np.random.default_rng(5)
    voxels = np.argwhere(brain)
    params = geodesic_params.GeodesicParams(max_steps=500)
    samples, first_fibres, fiber_arrays = [], 0, FiberArrayCache()
    for r in range(repeats + 1):  # the first run compiles
        seed = np.zeros(brain.shape, bool)
        seed[tuple(voxels[rng.integers(0, len(voxels), 100)].T)] = True
        count = int(seed.sum())
        first = {}
        t0 = time.perf_counter()

        def on_batch(tract, first=first, t0=t0):
            if "s" not in first:
                first["tracked_s"] = time.perf_counter() - t0
                fiber_arrays.cm_layer("geodesic", tract)  # what GeodesicPanel's worker does
                first["s"] = time.perf_counter() - t0
                first["fibres"] = len(tract)

        geodesic_pipeline(
            field_, seed_mask=seed, directions=DIRECTIONS * 100 // count, params=params, device=device,
            on_batch=on_batch, max_batch=20_000, first_batch=INTERACTIVE_FIRST_BATCH, metric_field=fld,
        )  # fmt: skip
        if r:
            samples.append((first["s"], first["tracked_s"]))
            first_fibres = first["fibres"]
    return {
        "fibres": DIRECTIONS * 100,
        "steps": 500,
        "first_batch_fibres": first_fibres,
        "median_s": round(statistics.median(s for s, _ in samples), 4),
        "max_s": round(max(s for s, _ in samples), 4),
        "median_tracked_s": round(statistics.median(t for _, t in samples), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--fibers", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--kernel-only", type=int, nargs="*", default=[10_000_000], help="kernel rows only")
    parser.add_argument("--cpu-fibers", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--out")
    args = parser.parse_args()
    from tractlens.app.pipelines.track import TensorField

    tensor, _fa, brain = hcp_like_field()
    device = "gpu" if args.gpu else "cpu"
    t0 = time.perf_counter()
    fld = geodesic_field.prepare_metric(tensor, (VOXEL_MM,) * 3, mask=brain, device=device)
    prep_s = time.perf_counter() - t0
    results = {"shape": list(brain.shape), "prepare_s": round(prep_s, 3), "rows": []}
    print(f"metric prepared in {prep_s:.2f} s", flush=True)

    def emit(row):
        print(json.dumps(row, ensure_ascii=False), flush=True)
        results["rows"].append(row)

    rng = np.random.default_rng(3)
    for integrator in ("rk2", "rk4"):
        params = geodesic_params.GeodesicParams(integrator=integrator, max_steps=args.steps)
        sizes = list(args.fibers) + list(args.kernel_only)
        for n in sizes * bool(args.gpu):
            for order, (starts, dirs) in workloads(brain, n, rng).items():
                row = {"engine": "gpu", "integrator": integrator, "order": order, "fibers": n}
                row.update(kernel_row(fld, starts, dirs, params))
                if n in args.fibers:
                    t0 = time.perf_counter()
                    result = geodesic.track_all(fld, starts, dirs, params, device="gpu")
                    total_s = time.perf_counter() - t0
                    row.update(end_to_end_s=round(total_s, 3), kept=len(result),
                               end_to_end_steps_per_s=round(result.provenance["steps"] / total_s))  # fmt: skip
                emit(row)
        if args.cpu_fibers:
            starts, dirs = workloads(brain, args.cpu_fibers, rng)["seeds×directions"]
            t0 = time.perf_counter()
            result = geodesic.track_all(fld, starts, dirs, params, device="cpu")
            total_s = time.perf_counter() - t0
            emit({"engine": "numpy", "integrator": integrator, "order": "seeds×directions",
                  "fibers": args.cpu_fibers, "steps": result.provenance["steps"], "s": round(total_s, 3),
                  "steps_per_s": round(result.provenance["steps"] / total_s)})  # fmt: skip
    field_ = TensorField.from_tensor(tensor, np.diag([VOXEL_MM] * 3 + [1.0]))
    latency = live_latency(field_, fld, brain, device, repeats=7 if args.gpu else 1)
    latency["engine"] = device
    results["live_latency"] = latency
    print("live latency:", json.dumps(latency), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
