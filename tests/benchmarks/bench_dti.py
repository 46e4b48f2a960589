"""Benchmark: tensor fitting, ours (NumPy and CuPy) vs DIPY's WLS, in one run.

    python tests/benchmarks/bench_dti.py                 # CPU: ours vs DIPY, ratio
    python tests/benchmarks/bench_dti.py --gpu --hcp     # + GPU on an HCP-sized volume

Data: synthetic white-matter tensors (random orientations, λ 1.2-2.0 / 0.2-0.6 /
0.1-0.2 µm²/ms), S0 500-1500, Rician noise SNR 25, HCP-like acquisition: 18 b=0
+ 90 directions at each of b = 1000, 2000, 3000 (288 volumes). The HCP-sized
case is a 145 x 174 x 145 grid with an ellipsoidal mask of ~800 k voxels.

Reported:
* cpu: voxels/s of DIPY's TensorModel(WLS) and of our NumPy float64 path on the
  same voxels, and the ratio;
* gpu: WLS fit + eigen + scalar maps on data already on the device (CUDA events,
  median of repeats after warm-up), float32 and float64; host->device copy of the
  masked signal; end to end from an uncompressed NIfTI on disk (load, mask, fit,
  write the compressed maps), stage by stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tractlens.gpu.dti import DTIFitParams, _Design, fit_batch, fit_dti  # noqa: E402

HCP_SHAPE = (145, 174, 145)


def hcp_gradients(seed: int = 0):
    rng = np.random.default_rng(seed)
    bvals = [np.zeros(18)]
    bvecs = [np.zeros((18, 3))]
    for b in (1000.0, 2000.0, 3000.0):
        v = rng.normal(size=(90, 3))
        bvecs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
        bvals.append(np.full(90, b))
    return np.concatenate(bvals), np.concatenate(bvecs)


def synthetic_signal(xp, n: int, bvals, bvecs, seed: int = 0, dtype=np.float32):
    """(n, K) noisy signals of random WM-like tensors, generated on the array module's device."""
    rs = xp.random.RandomState(seed)
    l1 = rs.uniform(1.2e-3, 2.0e-3, n)
    l2 = rs.uniform(2e-4, 6e-4, n)
    l3 = rs.uniform(1e-4, 2e-4, n)
    e1 = rs.normal(size=(n, 3))
    e1 /= xp.linalg.norm(e1, axis=1, keepdims=True)
    g = xp.asarray(bvecs)
    b = xp.asarray(bvals)
    # Cylindrically symmetric enough for a benchmark: D = l3 I + (l1-l3) e1e1ᵀ + (l2-l3) e2e2ᵀ
    tmp = xp.cross(e1, xp.asarray([0.0, 0.0, 1.0]))
    e2 = tmp / xp.maximum(xp.linalg.norm(tmp, axis=1, keepdims=True), 1e-9)
    adc = l3[:, None] + (l1 - l3)[:, None] * (e1 @ g.T) ** 2 + (l2 - l3)[:, None] * (e2 @ g.T) ** 2
    s0 = rs.uniform(500, 1500, n)
    clean = s0[:, None] * xp.exp(-b[None, :] * adc)
    sigma = 1000.0 / 25.0
    noisy = xp.sqrt((clean + rs.normal(0, sigma, clean.shape)) ** 2 + rs.normal(0, sigma, clean.shape) ** 2)
    return noisy.astype(dtype)


def time_cpu(n_ours: int, n_dipy: int, bvals, bvecs) -> dict:
    from dipy.core.gradients import gradient_table
    from dipy.reconst.dti import TensorModel

    signal = synthetic_signal(np, n_ours, bvals, bvecs, dtype=np.float64)
    t0 = time.perf_counter()
    ours = fit_dti(signal, bvals, bvecs, DTIFitParams(precision="float64"), device="cpu")
    t_ours = time.perf_counter() - t0
    model = TensorModel(gradient_table(bvals, bvecs=bvecs), fit_method="WLS")
    sub = signal[:n_dipy]
    t0 = time.perf_counter()
    ref = model.fit(sub)
    t_dipy = time.perf_counter() - t0
    fa_err = float(np.abs(ours.fa[:n_dipy] - ref.fa).max())
    return {
        "ours_numpy_voxels": n_ours,
        "ours_numpy_s": t_ours,
        "ours_numpy_voxels_per_s": n_ours / t_ours,
        "dipy_voxels": n_dipy,
        "dipy_s": t_dipy,
        "dipy_voxels_per_s": n_dipy / t_dipy,
        "speedup_ours_numpy_vs_dipy": (n_ours / t_ours) / (n_dipy / t_dipy),
        "max_fa_difference": fa_err,
    }


def ellipsoid_mask(shape, target=800_000):
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, s) for s in shape], indexing="ij"), -1)
    lo, hi = 0.1, 2.0
    for _ in range(40):  # radius giving ~target voxels
        r = 0.5 * (lo + hi)
        count = int(((grid / r) ** 2).sum(-1).__le__(1).sum())
        lo, hi = (r, hi) if count < target else (lo, r)
    return ((grid / r) ** 2).sum(-1) <= 1


def time_gpu(n: int, bvals, bvecs, repeats: int) -> dict:
    import cupy as cp

    from tractlens.gpu.backend import get_backend

    backend = get_backend("gpu")
    design = _Design.build(bvals, bvecs, 50.0)
    out = {"device": backend.device_name, "voxels": n, "volumes": len(bvals)}
    signal = synthetic_signal(cp, n, bvals, bvecs, seed=1)
    cp.cuda.Device().synchronize()
    fas = {}
    runs = [
        ("float32", np.float32, "kernel"),
        ("float64", np.float64, "kernel"),
        ("float32", np.float32, "arrays"),
        ("float64", np.float64, "arrays"),
    ]
    for precision, dtype, engine in runs:
        params = DTIFitParams(precision=precision, engine=engine)
        precision = precision if engine == "kernel" else f"{precision}_arrays"
        data = signal.astype(dtype)
        pool = cp.get_default_memory_pool()
        pool.free_all_blocks()
        held_before = pool.total_bytes()
        t0 = time.perf_counter()
        fit_batch(backend, data, design, params, dtype)
        cp.cuda.Device().synchronize()
        out[f"first_call_s_{precision}"] = time.perf_counter() - t0  # includes NVRTC compile/cache load
        fit_batch(backend, data, design, params, dtype)
        # The pool keeps every block it needed: its growth is the fit's working memory.
        out[f"working_bytes_{precision}"] = int(pool.total_bytes() - held_before)
        out[f"working_bytes_per_voxel_{precision}"] = out[f"working_bytes_{precision}"] / n
        times = []
        for _ in range(repeats):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            result = fit_batch(backend, data, design, params, dtype)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        out[f"fit_ms_{precision}"] = statistics.median(times)
        out[f"fit_ms_{precision}_min"] = min(times)
        out[f"fit_ms_{precision}_max"] = max(times)
        fa = cp.asnumpy(result["fa"])
        fas[precision] = fa
        out[f"fa_mean_{precision}"] = float(fa.mean())
        del data, result
        pool.free_all_blocks()
    for name, fa in fas.items():
        out[f"fa_maxdiff_{name}_vs_float64_arrays"] = float(np.abs(fa - fas["float64_arrays"]).max())
    out.update(stage_breakdown(backend, n))
    host = cp.asnumpy(signal)
    del signal
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        dev = cp.asarray(host)
        cp.cuda.Device().synchronize()
        copies.append(time.perf_counter() - t0)
        del dev
    out["host_to_device_ms"] = 1e3 * statistics.median(copies)
    out["host_to_device_GBps"] = host.nbytes / statistics.median(copies) / 1e9
    # GPU vs our own NumPy path and DIPY on the same voxels (subsets, per-voxel throughput).
    from dipy.core.gradients import gradient_table
    from dipy.reconst.dti import TensorModel

    sub = host[:100_000].astype(np.float64)
    t0 = time.perf_counter()
    fit_dti(sub, bvals, bvecs, DTIFitParams(precision="float64"), device="cpu")
    out["numpy_voxels_per_s"] = len(sub) / (time.perf_counter() - t0)
    sub = sub[:20_000]
    t0 = time.perf_counter()
    TensorModel(gradient_table(bvals, bvecs=bvecs), fit_method="WLS").fit(sub)
    out["dipy_voxels_per_s"] = len(sub) / (time.perf_counter() - t0)
    out["gpu_voxels_per_s_float32"] = n / (out["fit_ms_float32"] / 1e3)
    out["speedup_gpu_float32_vs_numpy"] = out["gpu_voxels_per_s_float32"] / out["numpy_voxels_per_s"]
    out["speedup_gpu_float32_vs_dipy"] = out["gpu_voxels_per_s_float32"] / out["dipy_voxels_per_s"]
    return out


def _median_event_ms(cp, fn, repeats=10):
    fn()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def stage_breakdown(backend, n: int) -> dict:
    """Time the O(voxels) float64 stages alone: batched 7x7 Cholesky and 3x3 eigen + maps."""
    import cupy as cp

    from tractlens.gpu import dti, sym3

    rs = cp.random.RandomState(3)
    a = rs.normal(size=(n, 7, 7))
    spd = a @ a.transpose(0, 2, 1) + 7 * cp.eye(7)
    pairs = [(i, j) for i in range(7) for j in range(i, 7)]
    normal = {p: cp.ascontiguousarray(spd[:, p[0], p[1]]) for p in pairs}
    rhs = [cp.ascontiguousarray(rs.normal(size=n)) for _ in range(7)]
    tensor = rs.normal(size=(n, 6)) * 1e-3

    def eig_and_maps():
        evals, evecs = sym3.eigh(cp, tensor)
        dti.scalar_maps(cp, evals, evecs)

    return {
        "stage_cholesky_ms": _median_event_ms(cp, lambda: dti._cholesky_solve(cp, normal, rhs)),
        "stage_eigen_maps_ms": _median_event_ms(cp, eig_and_maps),
    }


def time_end_to_end(bvals, bvecs, workdir: Path) -> dict:
    """From an uncompressed int16 NIfTI on disk to compressed maps, stage by stage."""
    import cupy as cp
    import nibabel as nib

    from tractlens.app.io import load_dwi, save_gradients
    from tractlens.app.pipelines.dti import fit_dti_pipeline, write_dti_outputs

    mask = ellipsoid_mask(HCP_SHAPE)
    n = int(mask.sum())
    signal = cp.asnumpy(synthetic_signal(cp, n, bvals, bvecs, seed=2))
    volume = np.zeros((*HCP_SHAPE, len(bvals)), dtype=np.int16)
    volume[mask] = np.clip(np.round(signal), 0, 32767).astype(np.int16)
    del signal
    affine = np.diag([1.25, 1.25, 1.25, 1.0])
    nib.save(nib.Nifti1Image(volume, affine), workdir / "dwi.nii")
    save_gradients(bvals, bvecs, affine, workdir / "dwi.bval", workdir / "dwi.bvec")
    nib.save(nib.Nifti1Image(mask.astype(np.uint8), affine), workdir / "mask.nii.gz")
    del volume
    out = {"voxels": n, "nifti_bytes": (workdir / "dwi.nii").stat().st_size}
    t0 = time.perf_counter()
    dwi = load_dwi(workdir / "dwi.nii")
    t1 = time.perf_counter()
    result = fit_dti_pipeline(dwi, mask_path=workdir / "mask.nii.gz", device="gpu")
    t2 = time.perf_counter()
    write_dti_outputs(result, workdir / "out")
    t3 = time.perf_counter()
    out.update(
        load_s=t1 - t0,
        fit_pipeline_s=t2 - t1,
        fit_compute_s=result.fit.provenance["compute_s"],
        fit_transfer_s=result.fit.provenance["transfer_s"],
        write_s=t3 - t2,
        total_s=t3 - t0,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="also time the CuPy path")
    parser.add_argument("--hcp", action="store_true", help="GPU on the HCP-sized volume (else 200k voxels)")
    parser.add_argument("--end-to-end", action="store_true", help="also time NIfTI on disk -> maps on disk")
    parser.add_argument("--cpu-voxels", type=int, default=50_000)
    parser.add_argument("--dipy-voxels", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    bvals, bvecs = hcp_gradients()
    results = {"acquisition": "18 b=0 + 3 x 90 directions (b 1000/2000/3000), 288 volumes"}
    results["cpu"] = time_cpu(args.cpu_voxels, args.dipy_voxels, bvals, bvecs)
    print(json.dumps({"cpu": results["cpu"]}, indent=2), flush=True)
    if args.gpu:
        n = int(ellipsoid_mask(HCP_SHAPE).sum()) if args.hcp else 200_000
        results["gpu"] = time_gpu(n, bvals, bvecs, args.repeats)
        print(json.dumps({"gpu": results["gpu"]}, indent=2), flush=True)
        if args.end_to_end:
            with tempfile.TemporaryDirectory() as tmp:
                results["end_to_end"] = time_end_to_end(bvals, bvecs, Path(tmp))
            print(json.dumps({"end_to_end": results["end_to_end"]}, indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
