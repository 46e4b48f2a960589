"""Benchmark: COMMIT's operator A·x and Aᵀ·y (and FISTA iterations) vs problem size.

    python tests/benchmarks/bench_commit.py [--gpu] [--segments 1e5 1e6 1e7 4.7e7]
        [--numpy-segments 1e6] [--measurements 60] [--cylinders] [--end-to-end N]
        [--dmri-commit N] [--memory N1 N2 [--gpu]] [--out results.json]

``--end-to-end N`` times the whole pipeline (files read, segments, operator, 2000 FISTA
iterations, outputs written) on N random-walk streamlines of 90 points in a 40³ grid;
``--dmri-commit N`` runs dmri-commit (all CPU cores) and ours (GPU) on the same files for
200 iterations. ``--memory N1 N2`` measures the host memory of the pipeline (tracemalloc peak
and peak RSS, each size in a fresh process) on N bundle-like streamlines (straight lines and
arcs in a 32³ grid, ``--memory-shape X Y Z`` another) and the bytes per segment between the
sizes, with the peak that line gives at 400 M segments (1 M HCP streamlines).

Synthetic problems shaped like seed 000's (64 309 voxels, 399 758 streamlines and
47 M segments at full size: ~730 segments per voxel): segment rows sorted, streamlines
and orientations random, Stick-Zeppelin-Ball tables, EC compartments from the segments.
GPU timings are CUDA events, best of 5, on the device-resident problem; the NumPy
reference runs on ``--numpy-segments``. Bytes each product must read at least (the
segment arrays once, x or y, the EC arrays, the output written) give the achieved
fraction of the device's memory bandwidth (the LUT reads hit the L2 cache and are not
counted).
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

from tractlens.gpu.commit import N_ORIENTATIONS, CommitParams, lookup_tables  # noqa: E402
from tractlens.gpu.commit_operator import Problem, apply_a_numpy, apply_at_numpy, ec_from_segments  # noqa: E402
from tractlens.gpu.commit_segments import Segments  # noqa: E402

SEED_VOXELS, SEED_FIBERS, SEED_SEGMENTS = 64_309, 399_758, 47_082_501


def synthetic_problem(n_segments: int, n_meas: int, seed: int = 0, params: CommitParams | None = None) -> Problem:
    rng = np.random.default_rng(seed)
    scale = n_segments / SEED_SEGMENTS
    n_rows = max(100, int(SEED_VOXELS * min(1.0, scale**0.5)))
    n_fibers = max(100, int(SEED_FIBERS * min(1.0, scale**0.5)))
    row = np.sort(rng.integers(0, n_rows, n_segments)).astype(np.int32)
    seg = Segments(
        row,
        rng.integers(0, n_fibers, n_segments).astype(np.int32),
        rng.uniform(0.1, 2.0, n_segments),
        rng.integers(0, N_ORIENTATIONS, n_segments).astype(np.int32),
        n_fibers,
    )
    g = rng.normal(size=(n_meas, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    bvals = np.where(np.arange(n_meas) < max(1, n_meas // 15), 0.0, 1000.0 + 1000.0 * (np.arange(n_meas) % 2))
    tables = lookup_tables(bvals, g, params or CommitParams())
    ec_row, ec_orient = ec_from_segments(Segments(row[::50], seg.fiber[::50], seg.length[::50], seg.orient[::50], 0))
    return Problem(n_rows, seg, ec_row, ec_orient, tables["ic"], tables["ec"], tables["iso"])


def bytes_touched(problem: Problem) -> dict:
    s, m, k = len(problem.segments), problem.n_meas, problem.n_ic
    segments_a = s * (4 + 8 + 4) + (problem.n_rows + 1) * 8  # fiber, length, orientation + row starts
    segments_at = s * (8 + 4) + s * 8 * k * 2 + s * 8 + (problem.n_fibers + 1) * 8  # + values written/read, order
    x, y = problem.n_cols * 8, problem.n_rows * m * 8
    return {"a": segments_a + x + y, "at": segments_at + x + y}


def time_gpu(problem: Problem, repeats: int = 5) -> dict:
    import cupy as cp

    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.commit_device import DeviceOperator

    backend = get_backend("gpu")
    op = DeviceOperator(backend, problem)
    rng = np.random.default_rng(1)
    x = cp.asarray(rng.random(problem.n_cols))
    y = cp.asarray(rng.random(problem.n_rows * problem.n_meas))
    out = {}
    for name, fn, arg in (("a", op.a, x), ("at", op.at, y)):
        fn(arg)
        best = None
        for _ in range(repeats):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn(arg)
            stop.record()
            stop.synchronize()
            ms = cp.cuda.get_elapsed_time(start, stop)
            best = ms if best is None else min(best, ms)
        out[f"{name}_ms"] = round(best, 3)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    peak = 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8  # bytes/s
    touched = bytes_touched(problem)
    out["a_bandwidth_fraction"] = round(touched["a"] / (out["a_ms"] / 1e3) / peak, 3)
    out["at_bandwidth_fraction"] = round(touched["at"] / (out["at_ms"] / 1e3) / peak, 3)
    out["peak_GBps"] = round(peak / 1e9)
    out["device"] = backend.device_name
    return out


def time_fit(problem: Problem, iterations: int) -> dict:
    """FISTA on the GPU for a fixed number of iterations (tol 0), the power iteration included."""
    import cupy as cp

    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.commit_device import DeviceOperator
    from tractlens.gpu.commit_solver import fista

    backend = get_backend("gpu")
    t0 = time.perf_counter()
    op = DeviceOperator(backend, problem)
    cp.cuda.Device().synchronize()
    t1 = time.perf_counter()
    scale = op.column_norms()
    t2 = time.perf_counter()
    rng = np.random.default_rng(2)
    y = op.a(cp.asarray(rng.random(problem.n_cols)))
    fit = fista(op.a, op.at, y, problem.n_cols, scale=scale, max_iter=iterations, tol=0.0, xp=cp)
    per_iteration = fit.seconds / (iterations + 50)  # + the 50 power iterations
    return {
        "iterations": iterations,
        "fit_s": round(fit.seconds, 2),
        "ms_per_iteration": round(per_iteration * 1e3, 2),
        "projected_2000_iterations_s": round(2050 * per_iteration, 1),
        "prepare_operator_s": round(t1 - t0, 2),
        "column_norms_s": round(t2 - t1, 3),
    }


def time_segments(n_streamlines: int, points: int = 100, backend=None) -> dict:
    """Building segments (NumPy, one core) from random-walk streamlines of ``points`` points,
    0.5-voxel steps, on the HCP grid (145×174×145, all voxels in the mask)."""
    from tractlens.gpu.commit_segments import segments

    rng = np.random.default_rng(3)
    shape = np.array([145, 174, 145])
    start = rng.uniform(20, shape - 20, (n_streamlines, 3))
    direction = rng.normal(size=(n_streamlines, 3))
    steps = direction[:, None, :] + rng.normal(0, 0.3, (n_streamlines, points, 3)).cumsum(1) * 0.1
    steps *= 0.5 / np.linalg.norm(steps, axis=-1, keepdims=True)
    pts = np.clip(start[:, None, :] + steps.cumsum(1), 0, shape - 1).reshape(-1, 3)
    offsets = np.arange(n_streamlines + 1, dtype=np.int64) * points
    rows = np.arange(int(np.prod(shape))).reshape(tuple(shape))
    if backend is not None:  # compile the element-wise kernels first
        segments(pts[: 100 * points], offsets[:101], rows, (1.25, 1.25, 1.25), backend=backend)
    t0 = time.perf_counter()
    seg = segments(pts, offsets, rows, (1.25, 1.25, 1.25), backend=backend)
    elapsed = time.perf_counter() - t0
    return {
        "streamlines": n_streamlines,
        "points": len(pts),
        "segments": len(seg),
        "s": round(elapsed, 1),
        "segments_per_s": round(len(seg) / elapsed),
    }


def time_numpy(problem: Problem) -> dict:
    rng = np.random.default_rng(1)
    x = rng.random(problem.n_cols)
    y = rng.random((problem.n_rows, problem.n_meas))
    t0 = time.perf_counter()
    apply_a_numpy(problem, x)
    t1 = time.perf_counter()
    apply_at_numpy(problem, y)
    t2 = time.perf_counter()
    return {"a_ms": round((t1 - t0) * 1e3, 1), "at_ms": round((t2 - t1) * 1e3, 1)}


def synthetic_files(folder: Path, n_streamlines: int, shape=(40, 40, 40), n_meas: int = 60, points: int = 90):
    """A random-signal DWI (voxel 1.25 mm), random-walk streamlines (0.5-voxel steps) as .tck,
    a mask (every voxel) and random peaks (voxel axes = world here): files for both tools."""
    import nibabel as nib

    from tractlens.app.io import save_tractogram
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(4)
    folder.mkdir(parents=True, exist_ok=True)
    affine = np.diag([1.25, 1.25, 1.25, 1.0])
    n_b0 = max(1, n_meas // 15)
    bvals = np.r_[np.zeros(n_b0), np.where(np.arange(n_meas - n_b0) % 2, 2000.0, 1000.0)]
    g = rng.normal(size=(n_meas, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    g[:n_b0] = 0
    data = rng.uniform(0.2, 0.9, (*shape, n_meas)).astype(np.float32)
    data[..., :n_b0] = 1.0
    nib.save(nib.Nifti1Image(data * 1000, affine), folder / "dwi.nii")
    np.savetxt(folder / "dwi.bval", bvals[None], fmt="%g")
    fsl = g.copy()
    fsl[:, 0] *= -1  # FSL's bvec frame for a positive-determinant affine
    np.savetxt(folder / "dwi.bvec", fsl.T, fmt="%.6f")
    nib.save(nib.Nifti1Image(np.ones(shape, np.uint8), affine), folder / "mask.nii.gz")
    peaks = rng.normal(size=(*shape, 3)).astype(np.float32)
    peaks /= np.linalg.norm(peaks, axis=-1, keepdims=True)
    nib.save(nib.Nifti1Image(peaks, affine), folder / "peaks.nii.gz")
    lim = np.array(shape) - 1
    start = rng.uniform(2, lim - 2, (n_streamlines, 3))
    direction = rng.normal(size=(n_streamlines, 3))
    steps = direction[:, None, :] + rng.normal(0, 0.3, (n_streamlines, points, 3)).cumsum(1) * 0.1
    steps *= 0.5 / np.linalg.norm(steps, axis=-1, keepdims=True)
    pts = np.clip(start[:, None, :] + steps.cumsum(1), 0, lim).reshape(-1, 3).astype(np.float32)
    tract = Tractogram(pts, np.arange(n_streamlines + 1, dtype=np.int64) * points, affine, shape, {}, {}, name="random")
    save_tractogram(tract, folder / "tracts.tck")
    return folder


def time_pipeline(folder: Path, iterations: int, device: str) -> dict:
    """``tractlens commit``'s work on the files: load, segments, operator, FISTA (a fixed number
    of iterations, tol 0), outputs written; wall times of the parts."""
    from tractlens.app.pipelines.commit import write_commit_outputs
    from tractlens.app.usecases.commit import commit_from_files

    t0 = time.perf_counter()
    params = CommitParams(max_iter=iterations, tol=0.0)
    result, suffix = commit_from_files(
        folder / "dwi.nii", folder / "tracts.tck", mask=folder / "mask.nii.gz", peaks=folder / "peaks.nii.gz",
        params=params, device=device,
    )  # fmt: skip
    t1 = time.perf_counter()
    write_commit_outputs(result, folder / f"out_{device}", suffix)
    t2 = time.perf_counter()
    return {
        "device": device,
        "segments": len(result.problem.segments),
        "voxels": result.problem.n_rows,
        "streamlines": result.problem.n_fibers,
        "iterations": result.fit.iterations,
        "fit_s": round(result.fit.seconds, 2),
        "ms_per_iteration": round(result.fit.seconds / (result.fit.iterations + 50) * 1e3, 2),
        "load_segments_operator_fit_s": round(t1 - t0, 2),
        "write_outputs_s": round(t2 - t1, 2),
        "total_s": round(t2 - t0, 2),
        "weights": result.weights,
    }


def bundle_inputs(n_streamlines: int, shape=(32, 32, 32), n_meas: int = 60, seed: int = 0, mapped: Path | None = None):
    """A random-signal DWI (2 mm voxels) and ``n_streamlines`` bundle-like streamlines in voxel
    coordinates, 0.5-voxel steps: half straight lines along one direction from random starts,
    half circular arcs in axial planes (few orientations per voxel, as in bundles). In memory:
    (DWI, Tractogram), points float32 as a loaded file has them; ``mapped`` (a folder): the DWI
    written there and mapped read-only in a NIfTI's (column-major) order, as a command maps an
    uncompressed series (its pages leave the resident set once read)."""
    from tractlens.app.io.dwi import DWI
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(seed)
    lim = np.array(shape, dtype=np.float64) - 1.0
    step = 0.5
    n_points = int(0.8 * min(shape) / step)
    arc = np.arange(n_points) * step
    n_straight = n_streamlines // 2
    n_arcs = n_streamlines - n_straight
    direction = np.array([1.0, 0.2, 0.1]) / np.linalg.norm([1.0, 0.2, 0.1])
    start = np.c_[rng.uniform(0.5, 0.15 * lim[0], n_straight), rng.uniform(0.5, 0.6 * lim[1], n_straight)]
    start = np.c_[start, rng.uniform(0.5, 0.8 * lim[2], n_straight)]
    radius = rng.uniform(0.3, 0.45, n_arcs) * min(shape[:2])
    angle0 = rng.uniform(0, 2 * np.pi, n_arcs)
    height = rng.uniform(0.5, lim[2] - 0.5, n_arcs)
    centre = lim[:2] / 2
    # Filled in blocks of streamlines: the peak RSS of a large run is the pipeline's, not the
    # float64 temporaries of making its input (the same numbers as made at once).
    points = np.empty((n_streamlines, n_points, 3), dtype=np.float32)
    top = lim.astype(np.float32)
    block = 20_000
    for a in range(0, n_straight, block):
        b = min(n_straight, a + block)
        points[a:b] = np.clip((start[a:b, None, :] + arc[None, :, None] * direction).astype(np.float32), 0, top)
    for a in range(0, n_arcs, block):
        b = min(n_arcs, a + block)
        angle = angle0[a:b, None] + arc[None, :] / radius[a:b, None]
        part = points[n_straight + a : n_straight + b]
        part[..., 0] = centre[0] + radius[a:b, None] * np.cos(angle)
        part[..., 1] = centre[1] + radius[a:b, None] * np.sin(angle)
        part[..., 2] = height[a:b, None]
        np.clip(part, 0, top, out=part)
    points = points.reshape(-1, 3)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    n_b0 = max(1, n_meas // 15)
    bvals = np.r_[np.zeros(n_b0), np.where(np.arange(n_meas - n_b0) % 2, 2000.0, 1000.0)]
    g = rng.normal(size=(n_meas, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    g[:n_b0] = 0
    if mapped is not None:  # a volume at a time, in the file's order (other draws than in memory)
        Path(mapped).mkdir(parents=True, exist_ok=True)
        file = Path(mapped) / f"dwi_{'x'.join(map(str, shape))}x{n_meas}.f32"
        data = np.memmap(file, dtype=np.float32, mode="w+", shape=(*shape, n_meas), order="F")
        for k in range(n_meas):
            data[..., k] = 1.0 if k < n_b0 else rng.uniform(0.3, 1.0, shape)
    else:
        data = np.empty((*shape, n_meas), dtype=np.float32)
        for x in range(shape[0]):  # a slab at a time: the same draws as all at once, in C order
            data[x] = rng.uniform(0.3, 1.0, (*shape[1:], n_meas))
        data[..., :n_b0] = 1.0
    offsets = np.arange(n_streamlines + 1, dtype=np.int64) * n_points
    tract = Tractogram(points, offsets, affine, shape, {}, {}, name="bundles")
    if mapped is not None:
        data.flush()
        del data
        data = np.memmap(file, dtype=np.float32, mode="r", shape=(*shape, n_meas), order="F")
        return DWI(data, affine, bvals, g, nonfinite_voxels=0), tract  # counted when written, as a loader does
    return DWI(data, affine, bvals, g), tract


def brain_mask(shape, voxels: int) -> np.ndarray:
    """An ellipsoid centred in the grid, its axes in the grid's proportions, of about ``voxels``
    voxels (a brain's white and grey matter on the HCP grid: ~700 k)."""
    scale = (voxels / (np.pi / 6 * float(np.prod(shape)))) ** (1 / 3)
    axes = [np.linspace(-1, 1, n) for n in shape]
    x, y, z = np.meshgrid(*axes, indexing="ij", sparse=True)
    return (x / scale) ** 2 + (y / scale) ** 2 + (z / scale) ** 2 <= 1.0


def _status_bytes(key: str) -> int | None:
    """A /proc/self/status value in bytes (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration):
        return None


def pipeline_memory(
    n_streamlines: int,
    iterations: int = 3,
    device: str = "cpu",
    shape=(32, 32, 32),
    n_meas: int = 60,
    mask_voxels: int | None = None,
    mapped: Path | None = None,
    traced: bool = True,
) -> dict:
    """Host memory of :func:`commit_pipeline` on :func:`bundle_inputs` (``n_meas`` measurements;
    ``mask_voxels``: within a :func:`brain_mask` of about that many voxels; ``mapped``: the DWI
    mapped from a file there): the tracemalloc peak above what existed before the streamlines
    were made (the tractogram's points included, as a command holds them; ``traced`` False: not
    traced), the process's peak RSS, its peak RSS above what it held once the inputs were made
    (VmHWM reset then: the job's own peak, as tests/test_memory_guard.py measures it), the
    segments and the wall time."""
    import resource
    import tracemalloc

    from tractlens.app.pipelines.commit import commit_pipeline
    from tractlens.gpu import commit_solver

    if traced:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    dwi, tract = bundle_inputs(n_streamlines, shape, n_meas=n_meas, mapped=mapped)
    mask = None if mask_voxels is None else brain_mask(shape, mask_voxels)
    dwi_bytes = 0 if mapped is not None else dwi.data.nbytes
    tracemalloc.reset_peak()
    try:
        with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) from here on
            f.write("5")
        rss_before = _status_bytes("VmRSS")
    except OSError:
        rss_before = None
    t0 = time.perf_counter()
    before_fit = []  # the peak until FISTA starts (cutting, operator, norms), then FISTA's and after
    rss_before_fit = []
    real = commit_solver.fista

    def fista(*args, **kwargs):
        before_fit.append(tracemalloc.get_traced_memory()[1] - base)
        rss_before_fit.append(_status_bytes("VmHWM"))
        tracemalloc.reset_peak()
        return real(*args, **kwargs)

    commit_solver.fista = fista
    from tractlens.app import memory_guard

    needs, check = [], memory_guard.check_host_memory  # what the memory guard announced
    memory_guard.check_host_memory = lambda need, fix, **k: needs.append(need) or check(need, fix, **k)
    try:
        result = commit_pipeline(
            dwi, tract, mask=mask, params=CommitParams(max_iter=iterations, tol=0.0), device=device
        )
    finally:
        commit_solver.fista = real
        memory_guard.check_host_memory = check
    seconds = time.perf_counter() - t0
    rss_peak = _status_bytes("VmHWM")
    fit_peak = tracemalloc.get_traced_memory()[1] - base
    peak = max([*before_fit, fit_peak])
    tracemalloc.stop()
    return {
        "peak_rss_above_inputs_bytes": None if rss_before is None else rss_peak - rss_before,
        "announced_bytes": needs[0].total if needs else None,  # the memory guard's estimate (CPU)
        "cut_passes": result.provenance.get("cut_passes"),
        "ec_compartments": result.problem.n_ec,
        "streamlines": n_streamlines,
        "points": len(tract.points),
        "segments": len(result.problem.segments),
        "voxels": result.problem.n_rows,  # per voxel: the signal and FISTA's measurement vectors
        "traced_peak_bytes": peak - dwi_bytes if traced else None,
        "traced_peak_before_fit_bytes": before_fit[0] - dwi_bytes if before_fit and traced else None,
        "peak_rss_above_inputs_before_fit_bytes": (
            None if rss_before is None or not rss_before_fit else rss_before_fit[0] - rss_before
        ),
        "traced_peak_fit_bytes": fit_peak - dwi_bytes if traced else None,  # FISTA and the model after it
        "measurements": int(dwi.data.shape[-1]),
        "dwi_bytes": dwi_bytes,  # in memory here (subtracted from the traced peaks); a command maps the file
        "points_bytes": tract.points.nbytes,  # held by this benchmark; a command reads them in chunks
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "shape": list(shape),
        "seconds": round(seconds, 2),
        "notes": result.notes,
    }


#: Segments of a whole-brain HCP tractogram of 1 M streamlines (issue 42's target: ≤ 8 GB peak)
HCP_SEGMENTS = 400e6


def memory_slope(
    sizes: list[int], iterations: int = 3, device: str = "cpu", shape=(32, 32, 32), options: list[str] | None = None
) -> dict:
    """:func:`pipeline_memory` at each size in a fresh process (so that the peak RSS is its own;
    ``options``: more ``--memory-*`` arguments for it), the bytes per segment between the
    smallest and the largest (traced and RSS, with and without the points this benchmark holds: a
    command reads them in chunks from the file; and of the job's own peak RSS, above its inputs),
    and the peak RSS without the points that line gives at :data:`HCP_SEGMENTS`."""
    import subprocess

    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--memory-one", str(n), "--memory-iterations", str(iterations)]
        cmd += ["--memory-shape", *map(str, shape), *(options or [])]
        cmd += ["--gpu"] if device == "gpu" else []
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    lo, hi = rows[0], rows[-1]
    d_seg = hi["segments"] - lo["segments"]
    out = {"device": device, "rows": rows}
    if lo["traced_peak_bytes"] is not None:
        out["traced_bytes_per_segment"] = round((hi["traced_peak_bytes"] - lo["traced_peak_bytes"]) / d_seg, 1)
        out["traced_bytes_per_segment_without_points"] = round(
            (hi["traced_peak_bytes"] - hi["points_bytes"] - lo["traced_peak_bytes"] + lo["points_bytes"]) / d_seg, 1
        )
    out["rss_bytes_per_segment"] = round((hi["max_rss_bytes"] - lo["max_rss_bytes"]) / d_seg, 1)
    if lo.get("peak_rss_above_inputs_bytes") is not None:
        own = (hi["peak_rss_above_inputs_bytes"] - lo["peak_rss_above_inputs_bytes"]) / d_seg
        out["own_peak_rss_bytes_per_segment"] = round(own, 1)
    rss = [r["max_rss_bytes"] - r["points_bytes"] for r in (lo, hi)]
    slope = (rss[1] - rss[0]) / d_seg
    out["rss_bytes_per_segment_without_points"] = round(slope, 1)
    out["rss_without_points_at_400M_segments_gb"] = round((rss[1] + slope * (HCP_SEGMENTS - hi["segments"])) / 1e9, 2)
    return out


def compare_with_dmri_commit(n_streamlines: int, iterations: int, folder: Path, device: str = "gpu") -> dict:
    """dmri-commit (CPU, all cores) and TractLens (GPU) on the same files, same iterations."""
    import os

    from tests.commit_reference import run_dmri_commit

    synthetic_files(folder, n_streamlines)
    ref = run_dmri_commit(
        folder / "dwi.nii", folder / "dwi.bval", folder / "dwi.bvec", folder / "tracts.tck", folder / "reference",
        mask=folder / "mask.nii.gz", peaks=folder / "peaks.nii.gz", tol=1e-12, max_iter=iterations,
    )  # fmt: skip
    ours = time_pipeline(folder, iterations, device)
    weights = ours.pop("weights")
    out = {
        "streamlines": n_streamlines,
        "cpu_threads": os.cpu_count(),
        "dmri_commit": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ref.items() if k != "weights"},
        f"tractlens_{device}": ours,
        "weights_correlation": round(float(np.corrcoef(weights, ref["weights"])[0, 1]), 6),
    }
    out["dmri_commit"]["ms_per_iteration"] = round(ref["fit_s"] / max(1, ref["iterations"]) * 1e3, 1)
    out["fit_speedup"] = round(out["dmri_commit"]["ms_per_iteration"] / ours["ms_per_iteration"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--segments", type=float, nargs="+", default=[1e5, 1e6, 1e7, 4.7e7])
    parser.add_argument("--numpy-segments", type=float, default=1e6)
    parser.add_argument("--measurements", type=int, default=60)
    parser.add_argument("--fit-iterations", type=int, default=200, help="FISTA iterations timed on the largest size")
    parser.add_argument(
        "--segment-streamlines", type=int, default=0, help="also time building segments from N streamlines"
    )
    parser.add_argument("--cylinders", action="store_true", help="also time Cylinder-Zeppelin-Ball (4 radii)")
    parser.add_argument(
        "--end-to-end", type=int, default=0, metavar="N", help="time the whole pipeline on N random streamlines"
    )
    parser.add_argument("--end-to-end-iterations", type=int, default=2000)
    parser.add_argument(
        "--dmri-commit", type=int, default=0, metavar="N", help="dmri-commit (CPU) vs ours (GPU) on N streamlines"
    )
    parser.add_argument(
        "--memory", type=int, nargs="+", metavar="N", help="host memory of the pipeline on N bundle streamlines (each)"
    )
    parser.add_argument("--memory-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-shape", type=int, nargs=3, default=[32, 32, 32], help="--memory: the grid (HCP: 145 174 145)"
    )
    parser.add_argument("--memory-iterations", type=int, default=3)
    parser.add_argument("--memory-measurements", type=int, default=60, help="--memory: measurements (HCP: 288)")
    parser.add_argument(
        "--memory-mask-voxels", type=int, help="--memory: fit within an ellipsoid of about N voxels (HCP brain: 700000)"
    )
    parser.add_argument(
        "--memory-mapped-dwi",
        action="store_true",
        help="--memory: map the DWI from a file in --work, as a command does",
    )
    parser.add_argument("--memory-untraced", action="store_true", help="--memory: no tracemalloc (faster; RSS only)")
    parser.add_argument("--work", default="/tmp/bench_commit", help="folder for the synthetic files")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.memory_one:
        device = "gpu" if args.gpu else "cpu"
        row = pipeline_memory(
            args.memory_one, args.memory_iterations, device, tuple(args.memory_shape), args.memory_measurements,
            args.memory_mask_voxels, Path(args.work) if args.memory_mapped_dwi else None, not args.memory_untraced,
        )  # fmt: skip
        print(json.dumps(row))
        return
    results = {"measurements": args.measurements, "rows": []}
    if args.memory:
        device = "gpu" if args.gpu else "cpu"
        options = ["--memory-measurements", str(args.memory_measurements), "--work", args.work]
        options += ["--memory-mask-voxels", str(args.memory_mask_voxels)] if args.memory_mask_voxels else []
        options += ["--memory-mapped-dwi"] * args.memory_mapped_dwi + ["--memory-untraced"] * args.memory_untraced
        results["memory"] = memory_slope(args.memory, args.memory_iterations, device, tuple(args.memory_shape), options)
        print(json.dumps({k: v for k, v in results["memory"].items() if k != "rows"}), flush=True)
        args.segments = []
    if args.dmri_commit:
        results["dmri_commit"] = compare_with_dmri_commit(
            args.dmri_commit, 200, Path(args.work) / "reference", "gpu" if args.gpu else "cpu"
        )
        print(json.dumps(results["dmri_commit"]), flush=True)
    if args.end_to_end:
        folder = synthetic_files(Path(args.work) / "end_to_end", args.end_to_end)
        row = time_pipeline(folder, args.end_to_end_iterations, "gpu" if args.gpu else "cpu")
        row.pop("weights")
        results["end_to_end"] = row
        print(json.dumps(row), flush=True)
    if args.segment_streamlines:
        results["segments_numpy"] = time_segments(args.segment_streamlines)
        print(json.dumps(results["segments_numpy"]), flush=True)
        if args.gpu:
            from tractlens.gpu.backend import get_backend

            for n in (args.segment_streamlines, 4 * args.segment_streamlines):
                results[f"segments_gpu_{n}"] = time_segments(n, backend=get_backend("gpu"))
                print(json.dumps(results[f"segments_gpu_{n}"]), flush=True)
    for n in [int(v) for v in args.segments]:
        problem = synthetic_problem(n, args.measurements)
        row = {"segments": n, "voxels": problem.n_rows, "streamlines": problem.n_fibers, "ec": problem.n_ec}
        if args.gpu:
            row["gpu"] = time_gpu(problem)
            if n == max(int(v) for v in args.segments) and args.fit_iterations:
                row["fit"] = time_fit(problem, args.fit_iterations)
            if n == max(int(v) for v in args.segments) and args.cylinders:
                cylinders = CommitParams(model="cylinder-zeppelin-ball", small_delta_ms=10.6, big_delta_ms=43.1)
                row["cylinders_gpu"] = time_gpu(synthetic_problem(n, args.measurements, params=cylinders))
        if n <= args.numpy_segments:
            row["numpy"] = time_numpy(problem)
            if args.gpu:
                row["speedup_a"] = round(row["numpy"]["a_ms"] / row["gpu"]["a_ms"], 1)
                row["speedup_at"] = round(row["numpy"]["at_ms"] / row["gpu"]["at_ms"], 1)
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
