"""Benchmark: connectome endpoint assignment and distance to a lesion, NumPy vs GPU, with CPU references.

    python tests/benchmarks/bench_connectivity.py [--counts 100000 1000000] [--gpu] [--out FILE]

Streamlines: the render benchmark's (50 points, 1 voxel apart, 1 mm voxels, in a 100³ box),
clipped to the box.
Parcellation: 90 regions (Voronoi cells of random seeds) in the outer 10 voxels of the box, the
inside unlabelled, so many ends need the radial search.

* connectome, radius 0 (end voxels): ours (NumPy, GPU) vs DIPY's
  ``dipy.tracking.utils.connectivity_matrix`` (end voxels); the counts must be equal;
* connectome, radius 4 mm (MRtrix's default radial search): ours, NumPy vs GPU;
* distance to a spherical lesion (radius 8 voxels, 2 109 voxels): ours (every segment sampled
  every 0.25 mm) vs a scipy ``cKDTree`` over the lesion voxel centres queried at the points only
  (less work: no sampling between points), NumPy vs GPU.

GPU times are end to end from host arrays (the transfer included), after a warm-up run.
Prints one JSON object per size and writes them all to --out.
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

from tests.benchmarks.bench_render import synthetic_tractogram  # noqa: E402
from tractlens.gpu.connectivity import assign_endpoints, connectome, node_indices  # noqa: E402
from tractlens.gpu.tractometry import region_distance  # noqa: E402

SHAPE = (100, 100, 100)


def parcellation(regions: int = 90, shell: int = 10, seed: int = 0) -> np.ndarray:
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(seed)
    grid = np.indices(SHAPE).reshape(3, -1).T
    inner = np.all((grid >= shell) & (grid < np.array(SHAPE) - shell), axis=1)
    centres = grid[~inner][rng.choice(int((~inner).sum()), regions, replace=False)]
    _, nearest = cKDTree(centres).query(grid)
    labels = (nearest + 1).astype(np.int32)
    labels[inner] = 0
    return labels.reshape(SHAPE)


def lesion() -> np.ndarray:
    grid = np.indices(SHAPE, dtype=np.float64)
    return ((grid - np.array([50.0, 50.0, 50.0])[:, None, None, None]) ** 2).sum(axis=0) <= 8.0**2


def timed(fn, repeat: int = 1):
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def dipy_counts(points, offsets, labels):
    from dipy.tracking.utils import connectivity_matrix

    streamlines = [points[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    return connectivity_matrix(streamlines, np.eye(4), labels, symmetric=True)


def measure(n: int, args, labels, nodes, region, linear) -> dict:
    tract = synthetic_tractogram(n)
    # kept inside the box (DIPY refuses points outside the label volume)
    points, offsets = np.clip(tract.points, 0.0, SHAPE[0] - 0.6).astype(np.float32), tract.offsets
    row = {"streamlines": n, "points": len(points), "regions": len(nodes), "lesion_voxels": int(region.sum())}
    devices = (["cpu"] if n <= args.cpu_max else []) + (["gpu"] if args.gpu else [])
    results = {}
    for device in devices:
        t, end0 = timed(lambda d=device: assign_endpoints(points, offsets, labels, linear, radius_mm=0.0, device=d))
        row[f"endvoxel_{device}_s"] = round(t, 4)
        t, end4 = timed(lambda d=device: assign_endpoints(points, offsets, labels, linear, radius_mm=4.0, device=d))
        row[f"radial4mm_{device}_s"] = round(t, 4)
        t, dist = timed(lambda d=device: region_distance(points, offsets, region, linear, device=d))
        row[f"distance_{device}_s"] = round(t, 4)
        results[device] = (end0, end4, dist)
    if n <= args.cpu_max:
        t, reference = timed(lambda: dipy_counts(points, offsets, labels))
        row["dipy_connectivity_matrix_s"] = round(t, 4)
        ours = connectome(results[devices[0]][0], nodes).counts
        row["counts_equal_dipy"] = bool(np.array_equal(ours, reference[1:, 1:]))
        from scipy.spatial import cKDTree

        centres = np.argwhere(region).astype(np.float64)

        def kdtree():
            distance, _ = cKDTree(centres).query(points.astype(np.float64))
            return distance

        t, _ = timed(kdtree)
        row["ckdtree_points_only_s"] = round(t, 4)
    end4 = results[devices[-1]][1]
    row["assigned_radius0"] = int(np.all(node_indices(results[devices[-1]][0].labels, nodes) >= 0, axis=1).sum())
    row["assigned_radius4"] = int(np.all(node_indices(end4.labels, nodes) >= 0, axis=1).sum())
    row["within_5mm"] = int((results[devices[-1]][2].per_streamline <= 5.0).sum())
    if "cpu" in results and "gpu" in results:
        row["gpu_equals_numpy_labels"] = bool(np.array_equal(results["cpu"][1].labels, results["gpu"][1].labels))
        row["gpu_numpy_distance_maxdiff_mm"] = float(
            np.abs(results["cpu"][2].per_streamline - results["gpu"][2].per_streamline).max()
        )
        for key in ("endvoxel", "radial4mm", "distance"):
            row[f"{key}_speedup_gpu_vs_numpy"] = round(row[f"{key}_cpu_s"] / row[f"{key}_gpu_s"], 1)
        row["endvoxel_speedup_gpu_vs_dipy"] = round(row["dipy_connectivity_matrix_s"] / row["endvoxel_gpu_s"], 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--cpu-max", type=int, default=1_000_000, help="no NumPy/reference run above this size")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    labels = parcellation()
    nodes = np.unique(labels[labels > 0])
    region = lesion()
    linear = np.eye(3)
    rows = []
    if args.gpu:  # compile and warm up
        small = synthetic_tractogram(1000)
        assign_endpoints(small.points, small.offsets, labels, linear, radius_mm=4.0, device="gpu")
        region_distance(small.points, small.offsets, region, linear, device="gpu")
    for n in args.counts:
        row = measure(n, args, labels, nodes, region, linear)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
