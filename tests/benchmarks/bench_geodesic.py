"""Benchmark: geodesic ray tracing steps per second on an HCP-sized tensor field.

    python tests/benchmarks/bench_geodesic.py [--gpu] [--fibers 10000 100000 1000000]
        [--cpu-fibers 2000] [--steps 500] [--out results.json]

The field of bench_deterministic.py (145×174×145, 1.25 mm, brain-like synthetic
tensors); fibres start at random brain voxels in Fibonacci directions; 0.1-voxel
steps, no optional stopping rule, so almost every fibre runs ``--steps`` steps or
leaves the brain mask. Rows: the CUDA kernel (CUDA events, the kernel alone, and
end to end with packing and copying the kept fibres, every 5th point) for RK2 and
RK4, and our NumPy reference on ``--cpu-fibers`` fibres. The published figure to
compare with is 52 M RK2 steps/s (GTX 260, seed 004).
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

from gpu import geodesic  # noqa: E402
from tests.benchmarks.bench_deterministic import VOXEL_MM, hcp_like_field  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--fibers", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--cpu-fibers", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--out")
    args = parser.parse_args()
    tensor, _fa, brain = hcp_like_field()
    t0 = time.perf_counter()
    fld = geodesic.prepare_metric(tensor, (VOXEL_MM,) * 3, mask=brain, device="gpu" if args.gpu else "cpu")
    prep_s = time.perf_counter() - t0
    rng = np.random.default_rng(3)
    voxels = np.argwhere(brain)
    results = {"shape": list(brain.shape), "prepare_s": round(prep_s, 3), "rows": []}
    print(f"metric prepared in {prep_s:.2f} s", flush=True)
    for integrator in ("rk2", "rk4"):
        params = geodesic.GeodesicParams(integrator=integrator, max_steps=args.steps)
        sizes = [(n, "gpu") for n in args.fibers] * bool(args.gpu) + [(args.cpu_fibers, "numpy")] * bool(
            args.cpu_fibers
        )
        for n, engine in sizes:
            starts = voxels[rng.integers(0, len(voxels), n)] + rng.uniform(-0.5, 0.5, (n, 3))
            dirs = geodesic.fibonacci_directions(n)[rng.permutation(n)]
            row = {"engine": engine, "integrator": integrator, "fibers": n}
            if engine == "gpu":
                import cupy as cp

                from gpu.backend import get_backend

                backend = get_backend("gpu")
                field_dev, region = backend.asarray(fld.data), backend.asarray(fld.region)
                s, d = cp.asarray(starts), cp.asarray(dirs)
                geodesic._track_kernel(backend, fld, field_dev, region, s[:256], d[:256], params)  # compile
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                out = geodesic._track_kernel(backend, fld, field_dev, region, s, d, params)
                stop.record()
                stop.synchronize()
                kernel_s = cp.cuda.get_elapsed_time(start, stop) / 1000
                steps = int(out[5].sum())
                del out
                t0 = time.perf_counter()
                result = geodesic.track_all(fld, starts, dirs, params, device=backend)
                total_s = time.perf_counter() - t0
                row.update(
                    steps=steps,
                    kernel_s=round(kernel_s, 4),
                    kernel_steps_per_s=round(steps / kernel_s),
                    end_to_end_s=round(total_s, 3),
                    end_to_end_steps_per_s=round(result.provenance["steps"] / total_s),
                    kept=len(result),
                )
            else:
                t0 = time.perf_counter()
                result = geodesic.track_all(fld, starts, dirs, params, device="cpu")
                total_s = time.perf_counter() - t0
                row.update(steps=result.provenance["steps"], s=round(total_s, 3),
                           steps_per_s=round(result.provenance["steps"] / total_s))  # fmt: skip
            print(json.dumps(row), flush=True)
            results["rows"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
