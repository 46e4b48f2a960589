"""Benchmark: probabilistic tracking (probtrackx style) on an HCP-sized bedpostX field.

    python tests/benchmarks/bench_probabilistic.py [--gpu] [--numpy-streamlines 2000]
        [--dipy-seeds 2000] [--out results.json]

The field is synthetic but brain-like: 145×174×145 voxels of 1.25 mm (the HCP grid),
an ellipsoidal brain, 50 posterior samples of 3 sticks per voxel. Stick 1 follows a
smooth random orientation field (correlation length ≈ 8 mm) with f1 from 0.05 to 0.6 in
patches, stick 2 another smooth field with f2 ≈ 0.15, stick 3 random with f3 = 0.02
(below nothing: followed only when best aligned); the samples spread by ~8°. Tracking
uses probtrackx's defaults (0.5 mm steps, 2000 steps, cthr 0.2, fibthresh 0.01), so
streamlines end at the brain's edge, on sharp turns, or after 2000 steps.

Rows (streamlines per second, both halves counted as one, the path distribution
accumulated; the mean steps per streamline, both halves, and the distinct voxels per
kept streamline reported as the length measures):
- ``gpu``: :func:`gpu.probabilistic.iter_track` end to end (the batches, the device →
  host copies of the running totals and the final result included) with the samples
  already on the GPU (as when tracking again from the same folder) for whole-brain seeding (2 % of the brain's voxels × 50 samples, and
  10 % × 50), a small seed region (100 voxels × 5000 samples), and with a waypoint
  mask (visits then counted at the end of each streamline); and once with the copy of
  the samples to the GPU (3.3 GB) included;
- ``numpy``: our NumPy reference engine on ``--numpy-streamlines`` streamlines (the compiled CPU
  loop against it: bench_probabilistic_cpu.py);
- ``dipy``: DIPY's probabilistic tracking (``ProbabilisticDirectionGetter`` on
  spherical-harmonic ODFs of the mean sticks, order 8, ``LocalTracking``, 0.5 mm
  steps, max angle 78°, one thread) from ``--dipy-seeds`` seeds, one streamline each.
The algorithms differ (DIPY samples an ODF, probtrackx samples posterior sticks); the
DIPY row is a speed reference on the same grid, seeds and step length.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tractlens.gpu.probabilistic import iter_track  # noqa: E402
from tractlens.gpu.probabilistic_kernel import upload_field  # noqa: E402
from tractlens.gpu.probabilistic_params import ProbParams, SampleField, mask_bits  # noqa: E402

SHAPE = (145, 174, 145)
VOXEL_MM = 1.25
N_SAMPLES, N_FIBRES = 50, 3


def _smooth_directions(rng, sigma):
    from scipy import ndimage

    d = np.stack([ndimage.gaussian_filter(rng.normal(size=SHAPE), sigma) for _ in range(3)], -1)
    return d / (np.linalg.norm(d, axis=-1, keepdims=True) + 1e-12)


def hcp_like_samples(seed: int = 0):
    """(SampleField, brain mask, mean sticks (n, L, 3), mean f (n, L))."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in SHAPE], indexing="ij"), -1)
    brain = (grid**2 / np.array([0.9, 0.9, 0.85]) ** 2).sum(-1) < 1.0
    sigma = 8.0 / VOXEL_MM
    main = _smooth_directions(rng, sigma)[brain]
    second = _smooth_directions(rng, sigma)[brain]
    n = int(brain.sum())
    third = rng.normal(size=(n, 3))
    third /= np.linalg.norm(third, axis=1, keepdims=True)
    patches = ndimage.gaussian_filter(rng.normal(size=SHAPE), 4.0 / VOXEL_MM)[brain]
    f1 = np.clip(0.35 + 0.25 * (patches - patches.mean()) / patches.std(), 0.05, 0.6)
    mean_sticks = np.stack([main, second, third], 1).astype(np.float32)  # (n, L, 3)
    mean_f = np.stack([f1, np.full(n, 0.15), np.full(n, 0.02)], 1).astype(np.float32)
    dirs = np.empty((n, N_SAMPLES, N_FIBRES, 3), np.float32)
    for start in range(0, n, 100_000):  # ~8° spread around each mean stick
        part = slice(start, min(n, start + 100_000))
        d = mean_sticks[part, None] + rng.normal(0, 0.14, (part.stop - part.start, N_SAMPLES, N_FIBRES, 3))
        dirs[part] = d / np.linalg.norm(d, axis=-1, keepdims=True)
    f = np.repeat(mean_f[:, None, :], N_SAMPLES, axis=1)
    index = np.full(SHAPE, -1, np.int32)
    index[brain] = np.arange(n, dtype=np.int32)
    return SampleField(dirs, f, index, np.full(3, VOXEL_MM)), brain, mean_sticks, mean_f


def time_engine(
    field_, bits, seeds, params, device, n_waypoints=0, repeats=1, device_field=None, engine="auto"
) -> dict:
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        runs = iter_track(
            field_, bits, seeds, params, device=device, n_waypoints=n_waypoints, device_field=device_field,
            engine=engine,
        )  # fmt: skip
        result = deque(runs, maxlen=1)[0]
        elapsed = time.perf_counter() - t0
        best = elapsed if best is None else min(best, elapsed)
    return {
        "seed_voxels": len(seeds),
        "samples_per_voxel": params.n_samples,
        "streamlines": result.streamlines,
        "kept": result.waytotal,
        "s": round(best, 3),
        "streamlines_per_s": round(result.streamlines / best, 1),
        "mean_steps": round(result.steps / result.streamlines, 1),
        "mean_voxels_per_kept_streamline": round(float(result.paths.sum() / max(result.waytotal, 1)), 1),
        **{k: result.provenance[k] for k in ("rerun_large_sets", "counting", "threads") if k in result.provenance},
    }


def time_dipy(brain, mean_sticks, mean_f, seeds, step_mm) -> dict:
    from dipy.data import small_sphere
    from dipy.direction import ProbabilisticDirectionGetter
    from dipy.reconst.shm import sf_to_sh
    from dipy.tracking.local_tracking import LocalTracking
    from dipy.tracking.stopping_criterion import BinaryStoppingCriterion
    from dipy.tracking.streamline import Streamlines

    t0 = time.perf_counter()
    vertices = small_sphere.vertices
    sh = np.zeros((*SHAPE, 45), dtype=np.float64)
    rows = np.argwhere(brain)
    for start in range(0, len(rows), 200_000):  # ODF: sharp lobes along the sticks, weighted by f
        part = slice(start, start + 200_000)
        cos = np.abs(np.einsum("nlk,vk->nvl", mean_sticks[part], vertices))
        odf = (mean_f[part, None, :] * cos**40).sum(-1)
        sh[tuple(rows[part].T)] = sf_to_sh(odf, small_sphere, sh_order_max=8)
    prepared = time.perf_counter() - t0
    getter = ProbabilisticDirectionGetter.from_shcoeff(sh, max_angle=78.5, sphere=small_sphere)
    criterion = BinaryStoppingCriterion(brain)
    affine = np.diag([VOXEL_MM, VOXEL_MM, VOXEL_MM, 1.0])
    rng = np.random.default_rng(3)
    world = (seeds + rng.uniform(-0.5, 0.5, seeds.shape)) * VOXEL_MM
    t0 = time.perf_counter()
    tracks = Streamlines(
        LocalTracking(
            getter,
            criterion,
            world,
            affine,
            step_size=step_mm,
            maxlen=2000,
            random_seed=1,
            return_all=True,
            max_cross=1,
        )
    )
    elapsed = time.perf_counter() - t0
    points = np.array([len(s) for s in tracks])
    return {
        "seed_voxels": len(seeds),
        "streamlines": len(tracks),
        "s": round(elapsed, 3),
        "streamlines_per_s": round(len(tracks) / elapsed, 1),
        "mean_steps": round(float(points.mean()) - 1, 1),  # both halves joined at the seed
        "odf_preparation_s": round(prepared, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--numpy-streamlines", type=int, default=2000)
    parser.add_argument("--dipy-seeds", type=int, default=2000)
    parser.add_argument("--out")
    args = parser.parse_args()
    t0 = time.perf_counter()
    field_, brain, mean_sticks, mean_f = hcp_like_samples()
    rng = np.random.default_rng(1)
    voxels = np.argwhere(brain)
    voxels = np.ascontiguousarray(voxels[rng.permutation(len(voxels))])
    print(f"field {SHAPE}, {len(voxels)} brain voxels, built in {time.perf_counter() - t0:.1f} s", flush=True)
    bits = mask_bits(brain)
    results = {"shape": SHAPE, "voxel_mm": VOXEL_MM, "samples": N_SAMPLES, "fibres": N_FIBRES, "rows": []}

    def record(row):
        print(json.dumps(row), flush=True)
        results["rows"].append(row)

    two, ten = voxels[: len(voxels) // 50], voxels[: len(voxels) // 10]
    if args.gpu:
        from tractlens.gpu.backend import get_backend

        backend = get_backend("gpu")
        results["device"] = backend.device_name
        time_engine(field_, bits, two[:1000], ProbParams(n_samples=10), "gpu")  # compile, warm up
        record(
            {
                "engine": "gpu",
                "case": "whole brain, 10 % of voxels, samples copied to the GPU first",
                **time_engine(field_, bits, ten, ProbParams(n_samples=50), "gpu"),
            }
        )
        resident = upload_field(backend, field_)
        cases = [
            ("whole brain, 2 % of voxels", two, ProbParams(n_samples=50), bits, 0),
            ("whole brain, 10 % of voxels", ten, ProbParams(n_samples=50), bits, 0),
            ("seed region of 100 voxels", voxels[:100], ProbParams(n_samples=5000), bits, 0),
        ]
        slab = np.zeros(SHAPE, bool)
        slab[70:73] = True
        cases.append(("2 %, waypoint slab", two, ProbParams(n_samples=50), mask_bits(brain, waypoints=[slab]), 1))
        for label, seeds, params, b, n_way in cases:
            timing = time_engine(field_, b, seeds, params, "gpu", n_way, repeats=2, device_field=resident)
            record({"engine": "gpu", "case": label, **timing})
    if args.numpy_streamlines:
        params = ProbParams(n_samples=10)
        seeds = voxels[: max(1, args.numpy_streamlines // 10)]
        timing = time_engine(field_, bits, seeds, params, "cpu", engine="numpy")
        record({"engine": "numpy", "case": "whole brain seeds", **timing})
    if args.dipy_seeds:
        try:
            row = {"engine": "dipy", "case": "whole brain seeds"}
            row.update(time_dipy(brain, mean_sticks, mean_f, voxels[: args.dipy_seeds], 0.5))
        except ImportError as exc:
            row = {"engine": "dipy", "error": f"DIPY not available: {exc}"}
        record(row)
    rates = {r["engine"] + ":" + r["case"]: r.get("streamlines_per_s") for r in results["rows"] if "case" in r}
    gpu = rates.get("gpu:whole brain, 10 % of voxels")
    if gpu:
        for ref in ("numpy:whole brain seeds", "dipy:whole brain seeds"):
            if rates.get(ref):
                results[f"speedup_vs_{ref.split(':')[0]}"] = round(gpu / rates[ref], 1)
                print(f"GPU (10 % of voxels) vs {ref}: {gpu / rates[ref]:.0f}x", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
