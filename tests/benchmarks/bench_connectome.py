"""Benchmark: a dense connectome, probtrackx2 ``--omatrix3``, on an HCP-sized field.

    python tests/benchmarks/bench_connectome.py [--streamlines 5e8] [--json] [--out F]
    python tests/benchmarks/bench_connectome.py --quick      # NumPy, a small grid, seconds

The published reference (Hernández-Fernández 2019, ch. 6.4.2; document 003): probtrackx2_gpu
made the dense connectome of an HCP subject, 91,282 seed points × 10,000 samples = 913 M
streamlines, in 2.95 h on one K80 (8 CUDA streams).

Here: the synthetic bedpostX field of ``bench_probabilistic.py`` (145×174×145 voxels of
1.25 mm, 1.29 M brain voxels in an ellipsoid, 50 posterior samples of 3 sticks, smooth
orientation fields), and as the grey/white boundary its outermost layer of voxels (brain
voxels with a brain-outside neighbour among their 26: 84,946 voxels). That layer is both the
seed mask and ``--target3``, as in an HCP dense connectome; probtrackx's defaults (0.5 mm
steps, 2000 steps, cthr 0.2, fibthresh 0.01, no loop check), ``--nsamples`` chosen so that at
least ``--streamlines`` streamlines run (5,887 per voxel: 500.1 M). Streamlines end where they
leave the brain, so each joins the layer near its seed and where it leaves: matrix3 counts
every pair of layer voxels a streamline visits (FSL's definition, upper triangle).

Reported: wall time of :func:`gpu.connectome.track_connectome` end to end (samples copied to
the GPU, tracking with the kernel's visit lists — the first chunk checked against its step
traces —, pair emission, reductions, the matrix brought to the host), streamlines/s, the matrix's non-zeros and total count, peak
device memory (CuPy's pool) and peak host memory (the process's maximum resident set, the
field's construction included), and the ratio to the published 2.95 h, scaled to 913 M
streamlines. ``--budget-s`` stops a run that would not finish in time and reports the rate so
far (``"completed": false``): the default keeps the whole run (field, warm-up, tracking)
within 8.5 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tractlens.gpu.backend import Cancelled, get_backend  # noqa: E402
from tractlens.gpu.connectome import ConnectomeSpec, track_connectome  # noqa: E402
from tractlens.gpu.probabilistic_params import ProbParams, SampleField, mask_bits  # noqa: E402

PUBLISHED_S, PUBLISHED_STREAMLINES = 2.95 * 3600, 912.82e6  # K80, probtrackx2_gpu
HCP_SHAPE, QUICK_SHAPE, VOXEL_MM = (145, 174, 145), (26, 30, 26), 1.25


def synthetic_field(shape, n_samples: int = 50, seed: int = 0) -> tuple[SampleField, np.ndarray]:
    """bench_probabilistic's field on any grid: (SampleField, brain mask)."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"), -1)
    brain = (grid**2 / np.array([0.9, 0.9, 0.85]) ** 2).sum(-1) < 1.0
    sigma = 8.0 / VOXEL_MM

    def smooth():
        d = np.stack([ndimage.gaussian_filter(rng.normal(size=shape), sigma) for _ in range(3)], -1)[brain]
        return d / (np.linalg.norm(d, axis=-1, keepdims=True) + 1e-12)

    n = int(brain.sum())
    third = rng.normal(size=(n, 3))
    mean = np.stack([smooth(), smooth(), third / np.linalg.norm(third, axis=1, keepdims=True)], 1)
    patches = ndimage.gaussian_filter(rng.normal(size=shape), 4.0 / VOXEL_MM)[brain]
    f1 = np.clip(0.35 + 0.25 * (patches - patches.mean()) / patches.std(), 0.05, 0.6)
    mean_f = np.stack([f1, np.full(n, 0.15), np.full(n, 0.02)], 1).astype(np.float32)
    dirs = np.empty((n, n_samples, 3, 3), np.float32)
    for start in range(0, n, 100_000):  # ~8° spread around each mean stick
        part = slice(start, min(n, start + 100_000))
        d = mean[part, None] + rng.normal(0, 0.14, (part.stop - part.start, n_samples, 3, 3))
        dirs[part] = d / np.linalg.norm(d, axis=-1, keepdims=True)
    f = np.repeat(mean_f[:, None, :], n_samples, axis=1)
    index = np.full(shape, -1, np.int32)
    index[brain] = np.arange(n, dtype=np.int32)
    return SampleField(dirs, f, index, np.full(3, VOXEL_MM)), brain


def boundary_layer(brain: np.ndarray) -> np.ndarray:
    """The brain's outermost voxels: those with an outside voxel among their 26 neighbours."""
    from scipy import ndimage

    return brain & ~ndimage.binary_erosion(brain, np.ones((3, 3, 3), bool))


def run(shape, streamlines: float, device: str, n_samples_field: int, budget_s: float, quiet: bool) -> dict:
    t_build = started = time.perf_counter()
    field_, brain = synthetic_field(shape, n_samples_field)
    layer = boundary_layer(brain)
    seeds = np.ascontiguousarray(np.argwhere(layer))
    nodes = np.full(shape, -1, np.int64)
    nodes[tuple(seeds.T)] = np.arange(len(seeds))  # node order = seed order (any order counts the same)
    spec = ConnectomeSpec(matrix3_nodes=nodes, n_matrix3_nodes=len(seeds))
    per_voxel = math.ceil(streamlines / len(seeds))
    params = ProbParams(n_samples=per_voxel)
    bits = mask_bits(brain)
    built = time.perf_counter() - t_build
    backend = get_backend(device)
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False, device=device)
    if backend.is_gpu:  # compile and warm up on a small run
        track_connectome(field_, bits, seeds[:2000], ProbParams(n_samples=5), spec, **kw)
        backend.xp.get_default_memory_pool().free_all_blocks()
    done = [0, 0.0]
    t0 = time.perf_counter()

    def progress(count, total):
        done[:] = [count, time.perf_counter() - t0]
        if not quiet:
            eta = done[1] / count * (total - count)
            print(f"\r{count / 1e6:.1f} / {total / 1e6:.1f} M streamlines, ETA {eta:.0f} s", end="", file=sys.stderr)

    def over_time():
        return time.perf_counter() - started > budget_s

    row = {
        "device": backend.device_name,
        "shape": list(shape),
        "brain_voxels": int(brain.sum()),
        "boundary_voxels": len(seeds),
        "samples_per_voxel": per_voxel,
        "streamlines_planned": len(seeds) * per_voxel,
        "field_build_s": round(built, 1),
        "warm_up_s": round(t0 - started - built, 1),
        "params": "probtrackx defaults (0.5 mm, 2000 steps, cthr 0.2, fibthresh 0.01)",
    }
    try:
        result = track_connectome(field_, bits, seeds, params, spec, progress=progress, cancelled=over_time, **kw)
    except Cancelled:
        count, elapsed = done
        row |= {"completed": False, "streamlines": count, "s": round(elapsed, 2)}
        row["streamlines_per_s"] = round(count / elapsed) if elapsed else None
        return _compare(row)
    elapsed = time.perf_counter() - t0
    if not quiet:
        print(file=sys.stderr)
    m = result.matrix3
    row |= {
        "completed": True,
        "streamlines": result.streamlines,
        "kept": int(result.waytotal.sum()),
        "s": round(elapsed, 2),
        "streamlines_per_s": round(result.streamlines / elapsed),
        "matrix3_nonzeros": m.nnz,
        "matrix3_total_count": int(m.counts.sum()),
        "matrix3_density": m.nnz / (m.shape[0] * (m.shape[0] - 1) / 2),
        "peak_device_bytes": result.provenance["peak_device_pool_bytes"],
        "reductions": result.provenance["reductions"],
        "spills_to_host": result.provenance["spills"],
        "chunk_streamlines": result.provenance["chunk_streamlines"],
        "engine": result.provenance["engine"],
        "notes": result.provenance["notes"],
    }
    return _compare(row)


def _compare(row: dict) -> dict:
    row["peak_host_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rate = row["streamlines_per_s"]
    if rate:
        projected = PUBLISHED_STREAMLINES / rate
        row["projected_913M_s"] = round(projected, 1)
        row["speedup_vs_published_k80"] = round(PUBLISHED_S / projected, 1)
    row["published"] = "913 M streamlines in 2.95 h on one K80 (probtrackx2_gpu, document 003 §6.4.2)"
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small grid with NumPy: finishes in seconds")
    parser.add_argument("--streamlines", type=float, default=5e8, help="at least this many (default 5e8)")
    parser.add_argument("--device", default=None, help="gpu (default) or cpu (--quick: cpu)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=510.0,
        help="stop tracking when the run has taken this long (s), report the rate",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        shape, streamlines, device, n_field = QUICK_SHAPE, min(args.streamlines, 3000), args.device or "cpu", 10
    else:
        shape, streamlines, device, n_field = HCP_SHAPE, args.streamlines, args.device or "gpu", 50
    row = run(shape, streamlines, device, n_field, args.budget_s, quiet=args.json)
    text = json.dumps(row, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        for key, value in row.items():
            print(f"{key:28s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
