"""Benchmark: microstructure models (NODDI-Watson LM, NODDI-Bingham LM) on an HCP-sized volume,
our GPU path vs our NumPy path vs AMICO on all CPU cores, in one run.

    python tests/benchmarks/bench_models.py --json                      # CPU only (small)
    python tests/benchmarks/bench_models.py --gpu --json --out tests/benchmarks/results/models_h100.json

Data: synthetic NODDI-Watson voxels (v_ic 0.3–0.8, ODI 0.05–0.6, v_iso 0–0.3, random
orientations; NODDI-Bingham: ODI_primary 0.15–0.5, ratio 0.3–0.8, ψ random), S0 100, Rician
noise at SNR 30; HCP-like acquisition: 18 b=0 + 90 directions at each of b = 1000, 2000,
3000 s/mm² (288 measurements). The GPU fits ``--gpu-voxels`` (default 900 k, a whole HCP
brain) with NODDI-Watson and ``--bingham-voxels`` with NODDI-Bingham; the NumPy path and
AMICO (``nthreads`` = all cores) fit subsets. Reported: seconds and voxels/s of each, the GPU's
split (grid / LM / transfers), the GPU's whole-brain time (900 k voxels, measured or at the
measured rate), the ratios, and the agreement (correlation of NDI and ODI) of each with the
truth and with each other on the common subset.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tractlens.gpu.models import Acquisition, fit_model, noddi_bingham, noddi_watson  # noqa: E402
from tractlens.gpu.models.optimize import predict  # noqa: E402

HCP_VOXELS = 900_000


def acquisition(seed: int = 0):
    rng = np.random.default_rng(seed)
    bvals, bvecs = [np.zeros(18)], [np.zeros((18, 3))]
    for b in (1000.0, 2000.0, 3000.0):
        v = rng.normal(size=(90, 3))
        bvecs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
        bvals.append(np.full(90, b))
    return np.concatenate(bvals), np.concatenate(bvecs)


def truth(model_name: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta, phi = np.arccos(rng.uniform(-1, 1, n)), rng.uniform(-np.pi, np.pi, n)
    s0 = np.full(n, 100.0)
    if model_name == "noddi-watson":
        return np.column_stack(
            [s0, rng.uniform(0.3, 0.8, n), rng.uniform(0.05, 0.6, n), rng.uniform(0, 0.3, n), theta, phi]
        )
    cols = [s0, rng.uniform(0.3, 0.8, n), rng.uniform(0.15, 0.5, n), rng.uniform(0.3, 0.8, n), rng.uniform(0, 0.3, n)]
    return np.column_stack([*cols, theta, phi, rng.uniform(0, np.pi, n)])


def signals(model, values: np.ndarray, bvals, bvecs, seed: int, chunk: int = 20_000, xp=np) -> np.ndarray:
    """Rician signals at SNR 30, float32, made in chunks (the forward model is float64; on the
    GPU with ``xp`` = CuPy, where a whole brain's would take minutes on the host)."""
    rng = np.random.default_rng(seed + 1)
    acq = Acquisition(bvals, bvecs, xp)
    out = np.empty((len(values), len(bvals)), dtype=np.float32)
    for start in range(0, len(values), chunk):
        v = values[start : start + chunk]
        clean = predict(xp, model, acq, xp.asarray(v))
        clean = clean.get() if hasattr(clean, "get") else clean
        sigma = v[:, :1] / 30.0
        real = clean + rng.normal(size=clean.shape) * sigma
        out[start : start + chunk] = np.sqrt(real * real + (rng.normal(size=clean.shape) * sigma) ** 2)
    return out


def timed_fit(model, signal, bvals, bvecs, device: str) -> tuple[dict, dict]:
    t0 = time.perf_counter()
    fit = fit_model(model, signal, bvals, bvecs, device=device)
    seconds = time.perf_counter() - t0
    row = {
        "voxels": len(signal),
        "seconds": seconds,
        "voxels_per_s": len(signal) / seconds,
        "ms_per_voxel": 1e3 * seconds / len(signal),
        **{k: fit.provenance[k] for k in ("grid_s", "lm_s", "transfer_s", "backend", "device")},
    }
    return row, fit.derived


def amico_fit(signal, bvals, bvecs, threads: int | None = None) -> tuple[dict, dict]:
    """AMICO's NODDI on ``threads`` threads (default: all cores; kernels generated beforehand,
    not timed)."""
    threads = threads or os.cpu_count() or 1
    import amico
    import nibabel as nib

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        folder = Path(tmp)
        nib.save(nib.Nifti1Image(signal.reshape(len(signal), 1, 1, -1), np.eye(4)), folder / "dwi.nii.gz")
        np.savetxt(folder / "dwi.scheme", np.column_stack([bvecs, bvals]), header="VERSION: BVECTOR", comments="")
        amico.setup()
        ae = amico.Evaluation(str(folder), ".", output_path=str(folder / "out"))
        ae.set_config("doSaveModulatedMaps", False)
        ae.set_config("nthreads", threads)
        ae.load_data(str(folder / "dwi.nii.gz"), str(folder / "dwi.scheme"), b0_thr=10)
        ae.set_model("NODDI")
        ae.generate_kernels(regenerate=True)
        ae.load_kernels()
        t0 = time.perf_counter()
        ae.fit()
        seconds = time.perf_counter() - t0
        ae.save_results()
        maps = {k: nib.load(folder / "out" / f"fit_{k}.nii.gz").get_fdata().reshape(-1) for k in ("NDI", "ODI")}
    row = {"voxels": len(signal), "seconds": seconds, "voxels_per_s": len(signal) / seconds, "threads": threads}
    return row, maps


def correlations(maps: dict, reference: dict, keys=("NDI", "ODI")) -> dict:
    n = min(len(next(iter(maps.values()))), len(next(iter(reference.values()))))
    return {k: float(np.corrcoef(maps[k][:n], reference[k][:n])[0, 1]) for k in keys}


def bench_model(name: str, args) -> dict:
    model = noddi_watson() if name == "noddi-watson" else noddi_bingham()
    bvals, bvecs = acquisition()
    gpu_n = (args.gpu_voxels if name == "noddi-watson" else args.bingham_voxels) if args.gpu else 0
    cpu_n = args.cpu_voxels if name == "noddi-watson" else args.bingham_cpu_voxels
    n = max(gpu_n, cpu_n, args.amico_voxels if name == "noddi-watson" else 0)
    values = truth(name, n, seed=3)
    xp = __import__("cupy") if args.gpu else np
    signal = signals(model, values, bvals, bvecs, seed=3, chunk=100_000 if args.gpu else 20_000, xp=xp)
    print(f"{name}: {n} voxels of signal made", file=sys.stderr, flush=True)
    names = ("s0", *model.names)
    true_maps = model.derived({k: values[:, i] for i, k in enumerate(names)}, np)
    result: dict = {"measurements": len(bvals)}
    row, cpu_maps = timed_fit(model, signal[:cpu_n], bvals, bvecs, "cpu")
    row["r_truth"] = correlations(cpu_maps, true_maps)
    result["numpy"] = row
    if args.gpu:
        timed_fit(model, signal[: min(2000, gpu_n)], bvals, bvecs, "gpu")  # CuPy's first-use compilation
        row, gpu_maps = timed_fit(model, signal[:gpu_n], bvals, bvecs, "gpu")
        row["r_truth"] = correlations(gpu_maps, true_maps)
        row["r_numpy"] = correlations(gpu_maps, cpu_maps)
        row["max_abs_diff_numpy"] = {
            k: float(np.abs(gpu_maps[k][:cpu_n] - cpu_maps[k]).max()) for k in ("NDI", "ODI", "FWF")
        }
        row["whole_brain_s"] = HCP_VOXELS / row["voxels_per_s"]
        result["gpu"] = row
        result["gpu_vs_numpy"] = row["voxels_per_s"] / result["numpy"]["voxels_per_s"]
    if name == "noddi-watson" and not args.no_amico:
        row, amico_maps = amico_fit(signal[: args.amico_voxels], bvals, bvecs)
        row["r_truth"] = correlations(amico_maps, true_maps)
        row["r_numpy"] = correlations(amico_maps, cpu_maps)
        result["amico"] = row
        if args.gpu:
            result["gpu_vs_amico"] = result["gpu"]["voxels_per_s"] / row["voxels_per_s"]
        result["numpy_vs_amico"] = result["numpy"]["voxels_per_s"] / row["voxels_per_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="fit on the GPU too")
    parser.add_argument("--gpu-voxels", type=int, default=HCP_VOXELS)
    parser.add_argument("--bingham-voxels", type=int, default=100_000)
    parser.add_argument("--cpu-voxels", type=int, default=2000)
    parser.add_argument("--bingham-cpu-voxels", type=int, default=100)
    parser.add_argument("--amico-voxels", type=int, default=20_000)
    parser.add_argument("--no-amico", action="store_true")
    parser.add_argument("--models", default="noddi-watson,noddi-bingham")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", help="write the results JSON here")
    args = parser.parse_args()
    results = {"cpu_cores": os.cpu_count()}
    for name in args.models.split(","):
        results[name] = bench_model(name, args)
        if not args.json:
            print(name, json.dumps(results[name], indent=1), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
