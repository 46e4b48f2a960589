"""Benchmark: whole-brain deterministic tracking on an HCP-sized tensor field.

    python tests/benchmarks/bench_deterministic.py [--gpu] [--seeds 1000000 2000000]
        [--cpu-seeds 20000] [--dipy-seeds 5000] [--out results.json]

The field is synthetic but brain-like: 145×174×145 voxels of 1.25 mm (the HCP
grid), an ellipsoidal brain, a smooth random fibre orientation field (correlation
length ≈ 8 mm) and an FA map that falls below the 0.15 threshold in patches (grey
matter / CSF), so streamlines end for all the usual reasons and have realistic
lengths (reported). Whole-brain seeds: two random seeds per voxel with FA ≥ 0.15
(2.3 M), shuffled, the first N of them.

Rows (same field, same parameters: 0.5 mm steps, FA 0.15, 45°, 20–250 mm):
- ``gpu``: the CUDA kernel through :func:`gpu.deterministic.track`, end to end
  (seeds on the host in, kept streamlines on the host out), and the kernel alone;
- ``numpy``: our NumPy reference engine on ``--cpu-seeds`` seeds;
- ``dipy``: DIPY's ``LocalTracking`` on the same seeds with the tensor's main
  eigenvector as a one-peak ``PeaksAndMetrics`` direction getter and an FA
  threshold stopping criterion (DIPY's deterministic tracking of a DTI peak field),
  on ``--dipy-seeds`` seeds.
Rates are seeds (= streamlines attempted) per second and kept streamlines per second.
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

from tractlens.gpu import sym3  # noqa: E402
from tractlens.gpu.deterministic import DeterministicParams, prepare_field, track, track_all  # noqa: E402
from tractlens.gpu.seeding import seeds_in_mask  # noqa: E402

SHAPE = (145, 174, 145)
VOXEL_MM = 1.25


def hcp_like_field(seed: int = 0):
    """(tensor (X, Y, Z, 6) float32, FA, brain mask)."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in SHAPE], indexing="ij"), -1)
    brain = (grid**2 / np.array([0.9, 0.9, 0.85]) ** 2).sum(-1) < 1.0
    sigma = 8.0 / VOXEL_MM
    direction = np.stack([ndimage.gaussian_filter(rng.normal(size=SHAPE), sigma) for _ in range(3)], -1)
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True) + 1e-12
    fa_field = ndimage.gaussian_filter(rng.normal(size=SHAPE), 4.0 / VOXEL_MM)
    fa_field = (fa_field - fa_field.mean()) / fa_field.std()
    fa_target = np.clip(0.45 + 0.25 * fa_field, 0.0, 0.9)  # ~15 % of the brain below 0.15
    # Prolate tensors with trace 2.1e-3 and the target FA: λ1 = md(1 + 2a), λ2 = λ3 = md(1 - a).
    md = 7e-4
    a = fa_target / np.sqrt(3 - 2 * fa_target**2) * np.sqrt(1.0)  # FA of (1+2a, 1-a, 1-a)
    l1, l2 = md * (1 + 2 * a), md * (1 - a)
    matrix = l2[..., None, None] * np.eye(3) + (l1 - l2)[..., None, None] * (
        direction[..., :, None] * direction[..., None, :]
    )
    tensor = sym3.from_matrix(np, matrix).astype(np.float32)
    tensor[~brain] = 0
    fa = sym3.fractional_anisotropy_from_invariants(np, tensor.astype(np.float64))
    return tensor, fa, brain


def time_gpu(field, seeds, params, repeats: int = 2) -> dict:
    import cupy as cp

    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.deterministic import _track_kernel

    backend = get_backend("gpu")
    list(track(field, seeds[:1000], params, device=backend))  # compile and warm up
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        kept = points = 0
        for batch in track(field, seeds, params, device=backend):
            kept += len(batch)
            points += len(batch.points)
        elapsed = time.perf_counter() - t0
        best = elapsed if best is None else min(best, elapsed)
    # The kernel alone on one batch of all seeds (CUDA events).
    dev_field = backend.asarray(field.tensor8)
    region = backend.asarray(field.region)
    chunk = backend.asarray(seeds)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    buf, count, stops, valid = _track_kernel(backend, dev_field, region, 1.0 / field.voxel_size, chunk, params)
    stop.record()
    stop.synchronize()
    kernel_s = cp.cuda.get_elapsed_time(start, stop) / 1000
    steps = int(count.sum())
    from tractlens.gpu.tracking import compact

    t0 = time.perf_counter()
    compact(cp, buf, count, stops, valid, 0, params)  # filter, pack on the device, copy to the host
    compact_s = time.perf_counter() - t0
    del buf
    return {
        "seeds": len(seeds),
        "kept": kept,
        "points": points,
        "end_to_end_s": round(best, 4),
        "seeds_per_s": round(len(seeds) / best),
        "kept_per_s": round(kept / best),
        "kernel_s": round(kernel_s, 4),
        "kernel_seeds_per_s": round(len(seeds) / kernel_s),
        "kernel_steps_per_s": round(steps / kernel_s),
        "pack_and_copy_s": round(compact_s, 4),
        "mean_points_per_kept": round(points / max(kept, 1), 1),
    }


def time_numpy(field, seeds, params) -> dict:
    t0 = time.perf_counter()
    out = track_all(field, seeds, params, device="cpu")
    elapsed = time.perf_counter() - t0
    return {
        "seeds": len(seeds),
        "kept": len(out),
        "points": len(out.points),
        "s": round(elapsed, 3),
        "seeds_per_s": round(len(seeds) / elapsed, 1),
        "kept_per_s": round(len(out) / elapsed, 1),
    }


def time_dipy(tensor, fa, seeds, params) -> dict:
    from dipy.direction.peaks import PeaksAndMetrics
    from dipy.tracking.local_tracking import LocalTracking
    from dipy.tracking.stopping_criterion import ThresholdStoppingCriterion
    from dipy.tracking.streamline import Streamlines

    evals, evecs = sym3.eigh(np, tensor.astype(np.float64))
    peaks = PeaksAndMetrics()
    peaks.peak_dirs = evecs[..., :, 0][..., None, :].astype(np.float64)
    peaks.peak_values = evals[..., :1].astype(np.float64)
    peaks.peak_indices = np.zeros((*fa.shape, 1), dtype=np.int32)
    from dipy.data import default_sphere

    peaks.sphere = default_sphere
    peaks.ang_thr = params.max_angle_deg
    peaks.qa_thr = 0.0
    affine = np.diag([VOXEL_MM, VOXEL_MM, VOXEL_MM, 1.0])
    criterion = ThresholdStoppingCriterion(fa.astype(np.float64), params.fa_threshold)
    world_seeds = seeds * VOXEL_MM
    t0 = time.perf_counter()
    generator = LocalTracking(
        peaks,
        criterion,
        world_seeds,
        affine,
        step_size=params.step_mm,
        maxlen=int(params.max_length_mm / params.step_mm),
        max_cross=1,
        return_all=True,
    )
    streamlines = Streamlines(generator)
    elapsed = time.perf_counter() - t0
    lengths = np.array([len(s) for s in streamlines])
    kept = int((lengths - 1 >= params.min_length_mm / params.step_mm).sum())
    return {
        "seeds": len(seeds),
        "kept": kept,
        "s": round(elapsed, 3),
        "seeds_per_s": round(len(seeds) / elapsed, 1),
        "kept_per_s": round(kept / elapsed, 1),
        "mean_points": round(float(lengths.mean()), 1) if len(lengths) else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1_000_000, 2_000_000])
    parser.add_argument("--cpu-seeds", type=int, default=20_000)
    parser.add_argument("--dipy-seeds", type=int, default=5_000)
    parser.add_argument("--integrators", nargs="+", default=["euler", "rk4"])
    parser.add_argument("--out")
    args = parser.parse_args()
    t0 = time.perf_counter()
    tensor, fa, brain = hcp_like_field()
    seeds_all = seeds_in_mask(brain & (fa >= 0.15), 2, rng_seed=1)
    rng = np.random.default_rng(2)
    seeds_all = seeds_all[rng.permutation(len(seeds_all))]
    print(f"field {SHAPE} built in {time.perf_counter() - t0:.1f} s; {len(seeds_all)} seed voxels", flush=True)
    field = prepare_field(tensor, (VOXEL_MM,) * 3, brain)
    results = {"shape": SHAPE, "voxel_mm": VOXEL_MM, "seed_voxels": len(seeds_all), "rows": []}
    for integrator in args.integrators:
        params = DeterministicParams(integrator=integrator)
        if args.gpu:
            for n in args.seeds:
                seeds = seeds_all[np.arange(n) % len(seeds_all)]
                row = {"engine": "gpu", "integrator": integrator, **time_gpu(field, seeds, params)}
                print(json.dumps(row), flush=True)
                results["rows"].append(row)
        if args.cpu_seeds:
            row = {
                "engine": "numpy",
                "integrator": integrator,
                **time_numpy(field, seeds_all[: args.cpu_seeds], params),
            }
            print(json.dumps(row), flush=True)
            results["rows"].append(row)
    if args.dipy_seeds:
        try:
            row = {
                "engine": "dipy",
                "integrator": "euler",
                **time_dipy(tensor, fa, seeds_all[: args.dipy_seeds], params),
            }
        except ImportError as exc:
            row = {"engine": "dipy", "error": f"DIPY not available: {exc}"}
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
