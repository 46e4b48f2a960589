"""In-process CPU and GPU times of the methods beyond the tensor fit and deterministic tracking,
for ``bench_crossover.py``: each function returns rows ``{method, units, cpu_s, gpu_s, ...}``
with ``units`` in the unit that the pipelines pass to
:func:`tractlens.gpu.engines.decide_device` for that method (see ``DEFAULT_COSTS``).

The inputs are the other benchmarks' synthetic data, scaled down where the CPU would take
minutes. Both engines run warm (one untimed call first), GPU times synchronised.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def median_time(fn, repeats: int, sync=None) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one untimed (warming) call."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _gpu():
    from tractlens.gpu.backend import get_backend

    return get_backend("gpu")


def _row(method, units, cpu, gpu_s, log, **extra) -> dict:
    log(f"  {method:<14} {units:>12.3g} units: cpu {cpu:.4f} s, gpu {gpu_s:.4f} s")
    return {"method": method, "units": float(units), "cpu_s": cpu, "gpu_s": gpu_s, **extra}


def ballstick(sizes, repeats, log) -> list[dict]:
    """Ball & sticks on 65 measurements, short chains (units: voxels × measurements × iterations)."""
    from tests.benchmarks.bench_ballstick import voxels
    from tractlens.gpu import ballstick as bs
    from tractlens.gpu import ballstick_fit

    rng = np.random.default_rng(5)
    g = rng.normal(size=(64, 3))
    bvecs = np.r_[[[0.0, 0.0, 0.0]], g / np.linalg.norm(g, axis=1, keepdims=True)]
    bvals = np.r_[0.0, np.full(64, 1000.0)]
    params = bs.BallStickParams(burnin=100, njumps=100, sample_every=10)
    iterations = params.burnin + params.njumps
    gpu = _gpu()
    rows = []
    for n in sizes:
        signal = voxels(n, bvals, bvecs)
        cpu = median_time(lambda s=signal: ballstick_fit.fit_ballstick(s, bvals, bvecs, params, device="cpu"), 1)
        gpu_s = median_time(
            lambda s=signal: ballstick_fit.fit_ballstick(s, bvals, bvecs, params, device=gpu), repeats, gpu.synchronize
        )
        rows.append(_row("fit-ballstick", n * len(bvals) * iterations, cpu, gpu_s, log, voxels=n))
    return rows


def geodesic(sizes, repeats, log) -> list[dict]:
    """Geodesic rays on the HCP-like tensor field (units: fibres × max steps)."""
    from tests.benchmarks.bench_deterministic import VOXEL_MM, hcp_like_field
    from tests.benchmarks.bench_geodesic import workloads
    from tractlens.gpu import geodesic as geo
    from tractlens.gpu import geodesic_field, geodesic_params

    tensor, _fa, brain = hcp_like_field()
    params = geodesic_params.GeodesicParams(max_steps=200)
    gpu = _gpu()
    fld_cpu = geodesic_field.prepare_metric(tensor, (VOXEL_MM,) * 3, mask=brain, device="cpu")
    fld_gpu = geodesic_field.prepare_metric(tensor, (VOXEL_MM,) * 3, mask=brain, device=gpu)
    rng = np.random.default_rng(3)
    rows = []
    for n in sizes:
        starts, dirs = workloads(brain, n, rng)["seeds×directions"]
        cpu = median_time(lambda s=starts, d=dirs: geo.track_all(fld_cpu, s, d, params, device="cpu"), 1)
        gpu_s = median_time(
            lambda s=starts, d=dirs: geo.track_all(fld_gpu, s, d, params, device=gpu), repeats, gpu.synchronize
        )
        rows.append(_row("geodesic", n * params.max_steps, cpu, gpu_s, log, fibres=n))
    return rows


def probabilistic(sizes, repeats, log) -> list[dict]:
    """probtrackx-style streamlines from random brain voxels (units: streamlines × max steps)."""
    from collections import deque

    from tests.benchmarks.bench_probabilistic import hcp_like_samples
    from tractlens.gpu.probabilistic import iter_track
    from tractlens.gpu.probabilistic_kernel import upload_field
    from tractlens.gpu.probabilistic_params import ProbParams, mask_bits

    field_, brain, _sticks, _f = hcp_like_samples()
    bits = mask_bits(brain)
    gpu = _gpu()
    resident = upload_field(gpu, field_)
    voxels = np.argwhere(brain)
    rows = []
    for n in sizes:  # streamlines: 10 samples per seed voxel
        params = ProbParams(n_samples=10)
        seeds = np.ascontiguousarray(voxels[np.random.default_rng(1).permutation(len(voxels))[: max(1, n // 10)]])

        def run(device, resident_field=None, seeds=seeds, params=params):
            return deque(iter_track(field_, bits, seeds, params, device=device, device_field=resident_field), maxlen=1)

        if n == sizes[0]:  # the CPU's compiled loop loaded (or compiled) before it is timed
            run("cpu")
        cpu = median_time(lambda: run("cpu"), 1)
        gpu_s = median_time(lambda: run(gpu, resident), repeats, gpu.synchronize)
        rows.append(_row("probabilistic", len(seeds) * params.n_samples * params.n_steps, cpu, gpu_s, log))
    return rows


def commit(sizes, repeats, log) -> list[dict]:
    """COMMIT in process from files (segments, operator, a fixed 100 iterations; units: points × iterations)."""
    from tests.benchmarks.bench_commit import synthetic_files, time_pipeline

    rows = []
    iterations = 100
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="crossover-commit-") as work:
            folder = synthetic_files(Path(work), n)
            time_pipeline(folder, 5, "gpu")  # compile, warm up
            cpu = time_pipeline(folder, iterations, "cpu")["total_s"]
            gpu_s = statistics.median(time_pipeline(folder, iterations, "gpu")["total_s"] for _ in range(repeats))
        rows.append(_row("commit", n * 90 * iterations, cpu, gpu_s, log, streamlines=n))
    return rows


def streamline_methods(sizes, repeats, log) -> list[dict]:
    """ROI selection, end-point assignment (connectome), profile and distance on the render
    benchmark's streamlines (50 points each) in a 100³ box (units as the pipelines count them)."""
    from tests.benchmarks.bench_connectivity import lesion, parcellation
    from tests.benchmarks.bench_render import synthetic_tractogram
    from tractlens.gpu.connectivity import assign_endpoints
    from tractlens.gpu.select import select_streamlines
    from tractlens.gpu.tractometry import profile, region_distance

    labels = parcellation()
    region = lesion()
    linear = np.eye(3)
    roi = np.zeros(labels.shape, bool)
    roi[40:60, 40:60, 40:60] = True
    scalar = np.random.default_rng(2).random(labels.shape).astype(np.float32)
    gpu = _gpu()
    rows = []
    for n in sizes:
        tract = synthetic_tractogram(n)
        pts, off = np.clip(tract.points, 0.0, labels.shape[0] - 0.6).astype(np.float32), tract.offsets
        cases = {
            "select": (len(pts), lambda d, p=pts, o=off: select_streamlines(p, o, [roi], device=d)),
            "connectome": (n, lambda d, p=pts, o=off: assign_endpoints(p, o, labels, linear, radius_mm=2.0, device=d)),
            "profile": (len(pts), lambda d, p=pts, o=off: profile(p, o, scalar, 20, linear=linear, device=d)),
            "distance": (len(pts), lambda d, p=pts, o=off: region_distance(p, o, region, linear, device=d)),
        }
        for method, (units, fn) in cases.items():
            try:
                cpu = median_time(lambda fn=fn: fn("cpu"), 1 if n > 100_000 else repeats)
                gpu_s = median_time(lambda fn=fn: fn(gpu), repeats, gpu.synchronize)
            except TypeError as exc:  # a signature this benchmark does not know: say so, go on
                log(f"  {method}: skipped ({exc})")
                continue
            rows.append(_row(method, units, cpu, gpu_s, log, streamlines=n))
    return rows


#: method group -> (function, sizes, quick sizes)
GROUPS = {
    "fit-ballstick": (ballstick, [200, 800, 2_000], [200, 800]),
    "geodesic": (geodesic, [500, 2_000, 8_000], [500, 2_000]),
    "probabilistic": (probabilistic, [100, 400, 1_600], [100, 400]),
    "commit": (commit, [500, 2_000, 5_000], [500, 2_000]),
    "streamlines": (streamline_methods, [1_000, 20_000, 200_000], [1_000, 20_000]),
}
