"""Benchmark: probabilistic tracking on the CPU, the NumPy reference against the compiled loop
(numba), on the same streamlines of an HCP-sized bedpostX field, in one run.

    python tests/benchmarks/bench_probabilistic_cpu.py [--seed-voxels 40] [--samples 10]
        [--threads 1 2] [--compiled-seed-voxels 1000] [--scale 1.0] [--out result.json]

The field is :func:`bench_probabilistic.hcp_like_samples` (145×174×145 voxels of 1.25 mm, 50
posterior samples of 3 sticks, probtrackx's defaults: 0.5 mm steps, 2000 steps, cthr 0.2);
``--scale`` shrinks the grid. Seed voxels are drawn at random in the brain. Rows:

- ``numpy``: :func:`gpu.probabilistic.iter_track` with ``engine="numpy"`` (its own batches) on
  ``--seed-voxels`` × ``--samples`` streamlines;
- ``compiled, N threads``: the same call with ``engine="compiled"`` and ``TRACTLENS_THREADS=N``
  on the same streamlines (the first call of the process compiles or loads the loop: a warm-up
  run on other seeds comes first), its totals checked equal to the reference's (path
  distribution, waytotal, steps), and the ratio of the rates;
- ``compiled, N threads, larger``: on ``--compiled-seed-voxels`` × ``--samples`` streamlines (a
  steadier rate; the NumPy reference would take hours).

Rates are streamlines a second (both halves one streamline), whole calls (batches, running
totals), and per second of this process's CPU time (all its threads). Timings on a shared machine
vary with its load: the load average is recorded, and the CPU-time rate is the steadier measure
there (two threads only help when two cores are free).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from tractlens.gpu.probabilistic import iter_track  # noqa: E402
from tractlens.gpu.probabilistic_params import ProbParams, mask_bits  # noqa: E402


def timed(field_, bits, seeds, params, engine: str, threads: int | None = None) -> tuple[dict, object]:
    if threads is not None:
        os.environ["TRACTLENS_THREADS"] = str(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    result = deque(iter_track(field_, bits, seeds, params, device="cpu", engine=engine), maxlen=1)[0]
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    row = {
        "engine": engine,
        "threads": threads,
        "streamlines": result.streamlines,
        "s": round(seconds, 3),
        "streamlines_per_s": round(result.streamlines / seconds, 1),
        "cpu_s": round(cpu_s, 3),  # this process's CPU time (all threads): what the others' load left it
        "streamlines_per_cpu_s": round(result.streamlines / cpu_s, 1) if cpu_s > 0 else None,
        "mean_steps": round(result.steps / max(1, result.streamlines), 1),
        "waytotal": result.waytotal,
        "load_1min": round(os.getloadavg()[0], 2),
    }
    return row, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed-voxels", type=int, default=40)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--compiled-seed-voxels", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import bench_probabilistic as bp

    if args.scale != 1.0:
        bp.SHAPE = tuple(max(16, round(n * args.scale)) for n in (145, 174, 145))
    t0 = time.perf_counter()
    field_, brain, _, _ = bp.hcp_like_samples()
    print(f"field {bp.SHAPE} made in {time.perf_counter() - t0:.1f} s", flush=True)
    bits = mask_bits(brain)
    rng = np.random.default_rng(1)
    voxels = np.argwhere(brain)
    voxels = np.ascontiguousarray(voxels[rng.permutation(len(voxels))])
    params = ProbParams(n_samples=args.samples)
    same = voxels[: args.seed_voxels]
    larger = voxels[args.seed_voxels : args.seed_voxels + args.compiled_seed_voxels]
    out = {
        "what": __doc__.split("\n\n")[0],
        "command": "python tests/benchmarks/bench_probabilistic_cpu.py " + " ".join(argv or sys.argv[1:]),
        "grid": list(bp.SHAPE),
        "voxel_mm": bp.VOXEL_MM,
        "cores": os.cpu_count(),
        "params": vars(params),
        "rows": [],
    }

    def record(row):
        print(json.dumps(row), flush=True)
        out["rows"].append(row)

    t0 = time.perf_counter()
    timed(field_, bits, voxels[-50:], ProbParams(n_samples=2), "compiled", 1)  # compile or load the loop
    out["compiled_warm_up_s"] = round(time.perf_counter() - t0, 2)
    reference_row, reference = timed(field_, bits, same, params, "numpy")
    reference_row["case"] = "same streamlines"
    record(reference_row)
    for threads in args.threads:
        row, result = timed(field_, bits, same, params, "compiled", threads)
        row["case"] = "same streamlines"
        row["equal_to_numpy"] = bool(
            np.array_equal(result.paths, reference.paths)
            and result.waytotal == reference.waytotal
            and result.steps == reference.steps
        )
        row["speedup_vs_numpy"] = round(row["streamlines_per_s"] / reference_row["streamlines_per_s"], 1)
        if row["streamlines_per_cpu_s"] and reference_row["streamlines_per_cpu_s"]:
            row["speedup_vs_numpy_per_cpu_s"] = round(
                row["streamlines_per_cpu_s"] / reference_row["streamlines_per_cpu_s"], 1
            )
        record(row)
    if args.compiled_seed_voxels:
        for threads in args.threads:
            row, _ = timed(field_, bits, larger, params, "compiled", threads)
            row["case"] = "larger"
            record(row)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
