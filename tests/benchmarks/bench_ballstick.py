"""Benchmark: ball & sticks (bedpostX) fitting, CUDA kernels vs our NumPy engine on one core.

    python tests/benchmarks/bench_ballstick.py                # NumPy only (small)
    python tests/benchmarks/bench_ballstick.py --gpu --out r.json

Data: synthetic voxels, half single fibres (f 0.6), half 60-90° crossings (f 0.35 each),
S0 1000, d 1.5e-3 mm²/s, Rician noise SNR 30, two acquisitions:
* 60 measurements: 6 b=0 + 54 directions at b = 1000 s/mm²;
* 288 measurements (HCP-like): 18 b=0 + 90 directions at each of b = 1000, 2000, 3000.
FSL's defaults: 3 sticks, burn-in 1000, 1250 jumps, sample every 25, ARD weight 1.

Reported per acquisition: voxels/s of the whole fit (tensor initialisation, LM, MCMC,
transfers) on the GPU for a large batch, and of the NumPy engine run pinned to one CPU
core (``taskset``, one BLAS thread) on a few hundred voxels; their ratio; the time the
GPU would take for an HCP-sized mask (900 k voxels) at the measured rate; the GPU's
split between LM and MCMC; and the MCMC for the block sizes tried.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tractlens.gpu.ballstick as bs  # noqa: E402

HCP_VOXELS = 900_000


def acquisition(m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shells = {60: (6, [(1000.0, 54)]), 288: (18, [(1000.0, 90), (2000.0, 90), (3000.0, 90)])}[m]
    bvals, bvecs = [np.zeros(shells[0])], [np.zeros((shells[0], 3))]
    for b, k in shells[1]:
        v = rng.normal(size=(k, 3))
        bvecs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
        bvals.append(np.full(k, b))
    return np.concatenate(bvals), np.concatenate(bvecs)


def voxels(n: int, bvals, bvecs, seed: int = 1):
    rng = np.random.default_rng(seed)
    v1 = rng.normal(size=(n, 3))
    v1 /= np.linalg.norm(v1, axis=1, keepdims=True)
    perp = np.cross(v1, rng.normal(size=(n, 3)))
    perp /= np.linalg.norm(perp, axis=1, keepdims=True)
    angle = np.deg2rad(rng.uniform(60, 90, n))
    v2 = np.cos(angle)[:, None] * v1 + np.sin(angle)[:, None] * perp
    dirs = np.stack([v1, v2], 1)
    f = np.where(np.arange(n)[:, None] % 2 == 0, [0.6, 0.0], [0.35, 0.35])
    th, ph = bs.vectors_to_angles(np, dirs)
    clean = bs.ball_stick_signal(bvals, bvecs, np.full(n, 1000.0), np.full(n, 1.5e-3), th, ph, f)
    return np.hypot(clean + rng.normal(0, 1000 / 30, clean.shape), rng.normal(0, 1000 / 30, clean.shape))


def numpy_one_core(m: int, n: int) -> dict:
    """Run the NumPy engine in a child pinned to CPU 0 with one BLAS thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child-numpy", str(m), str(n)]
    if sys.platform.startswith("linux"):
        cmd = ["taskset", "-c", "0", *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_numpy(m: int, n: int) -> None:
    bvals, bvecs = acquisition(m)
    signal = voxels(n, bvals, bvecs)
    t = time.perf_counter()
    fit = bs.fit_ballstick(signal, bvals, bvecs, bs.BallStickParams(), device="cpu", batch_voxels=n)
    dt = time.perf_counter() - t
    print(json.dumps({"voxels": n, "seconds": dt, "voxels_per_s": n / dt, "lm_s": fit.provenance["lm_s"]}))


def gpu_run(m: int, n: int, blocks: list[int]) -> dict:
    import cupy as cp

    bvals, bvecs = acquisition(m)
    signal = voxels(n, bvals, bvecs)
    params = bs.BallStickParams()
    bs.fit_ballstick(signal[:2048], bvals, bvecs, params, device="gpu")  # compile + warm up
    result = {"voxels": n}
    for block in blocks:  # the MCMC alone, on the same start, per block size
        bs.MCMC_BLOCK = block
        y = cp.asarray((signal[:n] / 1000.0).astype(np.float32))
        start = cp.asarray(np.tile([1.0, 1.5e-3 * bvals.max(), 1.0, 1.0, 0.4, 2.0, 2.0, 0.3, 0.5, 0.5, 0.05], (n, 1)))
        backend = bs.get_backend("gpu")
        bs.mcmc_kernel(backend, y[:1024], bvals / bvals.max(), bvecs, start[:1024], 0, params)
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        bs.mcmc_kernel(backend, y, bvals / bvals.max(), bvecs, start, 0, params)
        cp.cuda.Device().synchronize()
        result[f"mcmc_block{block}_voxels_per_s"] = n / (time.perf_counter() - t)
    best = max(blocks, key=lambda b: result[f"mcmc_block{b}_voxels_per_s"])
    bs.MCMC_BLOCK = best
    result["mcmc_block"] = best
    t = time.perf_counter()
    fit = bs.fit_ballstick(signal, bvals, bvecs, params, device="gpu")
    dt = time.perf_counter() - t
    result.update(
        seconds=dt,
        voxels_per_s=n / dt,
        stages={k: fit.provenance[k] for k in ("dti_s", "lm_s", "mcmc_s", "transfer_s")},
        hcp_projected_s=HCP_VOXELS / (n / dt),
        device=fit.provenance["device"],
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--gpu-voxels", type=int, default=200_000)
    parser.add_argument("--cpu-voxels", type=int, default=96)
    parser.add_argument("--blocks", default="64,128,256")
    parser.add_argument("--out")
    parser.add_argument("--child-numpy", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_numpy:
        child_numpy(*args.child_numpy)
        return
    results = {}
    for m in (60, 288):
        row = {"numpy_one_core": numpy_one_core(m, args.cpu_voxels)}
        if args.gpu:
            row["gpu"] = gpu_run(m, args.gpu_voxels, [int(b) for b in args.blocks.split(",")])
            row["gpu_over_numpy_one_core"] = row["gpu"]["voxels_per_s"] / row["numpy_one_core"]["voxels_per_s"]
        results[f"M{m}"] = row
        print(json.dumps({f"M{m}": row}, indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
