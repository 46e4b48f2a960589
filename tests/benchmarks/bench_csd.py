"""MSMT-CSD on HCP-sized multi-shell synthetic data: TractLens (GPU and CPU) and DIPY's CSD.

HCP's acquisition: 18 b=0 and 90 directions at each of b = 1000, 2000, 3000 s/mm²; its brain
mask holds ~900 k voxels at 1.25 mm. Voxels are random 1-3 fibre crossings with GM and CSF
fractions (tests/csd_synth.py). TractLens fits every voxel; DIPY's single-shell
``ConstrainedSphericalDeconvModel`` (its MSMT needs cvxpy, not installed) fits a sample on
all CPU cores (``engine="ray"`` is not used: ``parallel=True`` with its default engine) and
is reported as a per-voxel rate and the ratio to TractLens on the whole brain. The MSMT
solver's exactness is checked on a sample (the largest KKT residual, gpu/csd_qp.py), and its
work is counted there for the default solver (interior-point start) and for the plain
Lawson-Hanson active set (``interior_iterations=0``, the former solver): batched steps (rounds
of kernel launches), batched factorisations and solves per voxel, their floating-point work
(Cholesky P³/3 and LU 2k³/3 on the k × k systems the batch is padded to) and the GEMM work
around them, with the CPU time of each on that sample — the counts from which the GPU's
speed-up can be predicted.

    python tests/benchmarks/bench_csd.py [--quick] [--voxels N] [--sample N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.csd_synth import add_rician_noise, fibre_signal, gradient_table, unit, voxel_signal
from tractlens.gpu.csd import CSDParams, build_model, constraint_matrix, fit_csd, shared_program
from tractlens.gpu.csd_qp import kkt_residuals, solve_batch
from tractlens.gpu.csd_response import anisotropic_response, find_shells, isotropic_response


def phantom(n: int, bvals, bvecs, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, len(bvals)), np.float32)
    for start in range(0, n, 4096):  # a few distinct crossings, tiled with independent noise
        block = min(4096, n - start)
        base = []
        for _ in range(64):
            k = rng.integers(1, 4)
            gm, csf = rng.uniform(0, 0.3), rng.uniform(0, 0.2)
            base.append(voxel_signal(bvals, bvecs, unit(rng.normal(size=(k, 3))), gm=gm, csf=csf))
        tiled = np.array(base)[rng.integers(0, 64, block)]
        out[start : start + block] = add_rician_noise(tiled, 30, seed=start)
    return out


def responses(bvals, bvecs):
    shells = find_shells(bvals, 50)
    fibres = unit(np.random.default_rng(1).normal(size=(200, 3)))
    wm = anisotropic_response(np.array([fibre_signal(bvals, bvecs, d) for d in fibres]), bvecs, fibres, shells, 8)
    gm = isotropic_response(voxel_signal(bvals, bvecs, fibres[:1], gm=1.0)[None], shells, 8, "gm")
    csf = isotropic_response(voxel_signal(bvals, bvecs, fibres[:1], csf=1.0)[None], shells, 8, "csf")
    return {"wm": wm, "gm": gm, "csf": csf}


def work_counts(work, voxels: int, m: int, p: int) -> dict:
    """Per stage of gpu.csd_qp.solve_batch: batched steps, and per voxel its batched solves,
    their factorisation flops and the GEMM flops around them (kernels that scale with voxels)."""
    factorisation = {
        "unconstrained": lambda k: 0.0,  # one GEMM with the shared H⁻¹
        "interior": lambda k: k**3 / 3 + 4 * k * k,  # Cholesky, two pairs of substitutions
        "active set": lambda k: 2 * k**3 / 3 + 2 * k * k,  # LU and one solve of the padded system
    }
    gemm = {
        "unconstrained": lambda k: 2.0 * p * p + 2 * m * p,
        "interior": lambda k: m * p * (p + 1.0) + 7 * 2 * m * p,  # Gᵀ diag(λ/s) G (upper half); x Gᵀ, λ G, ...
        "active set": lambda k: 2.0 * 2 * m * p + k * k,  # λ H⁻¹Gᵀ, x Gᵀ; gather of Q_PP
    }
    stages = {}
    for stage, count, size in work:
        entry = stages.setdefault(
            stage, {"batched_steps": 0, "solves": 0.0, "factorisation_flops": 0.0, "gemm_flops": 0.0}
        )
        entry["batched_steps"] += 1
        entry["solves"] += count / voxels
        entry["factorisation_flops"] += count * factorisation[stage](size) / voxels
        entry["gemm_flops"] += count * gemm[stage](size) / voxels
    total = {
        key: sum(entry[key] for entry in stages.values())
        for key in ("batched_steps", "solves", "factorisation_flops", "gemm_flops")
    }
    return {"per_voxel_by_stage": stages, "total": total}


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 k voxels, 2 k for DIPY")
    parser.add_argument("--voxels", type=int, default=None, help="voxels for TractLens (default 900 k)")
    parser.add_argument("--dipy-voxels", type=int, default=None, help="voxels for DIPY (default 20 k)")
    parser.add_argument("--sample", type=int, default=1000, help="voxels for exactness and work counts")
    parser.add_argument("--skip-fit", action="store_true", help="only the solver's sample (no fit, no DIPY)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    n = args.voxels or (20_000 if args.quick else 900_000)
    n_dipy = args.dipy_voxels or (2_000 if args.quick else 20_000)
    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 90, 18)
    signal = phantom(n, bvals, bvecs)
    params = CSDParams(msmt=True)
    model = build_model(bvals, bvecs, responses(bvals, bvecs), params)
    results = {"voxels": n, "volumes": len(bvals), "cpu_cores": os.cpu_count()}
    for device in () if args.skip_fit else ("gpu", "cpu"):
        size = n if device == "gpu" else min(n, n_dipy)
        try:
            fit_csd(signal[:256], model, params, device=device)  # start-up (CuPy, cuBLAS) outside the timing
            fit, first = timed(lambda d=device, s=size: fit_csd(signal[:s], model, params, device=d))
            if device == "gpu":  # the first whole run compiles CuPy's kernels for its sizes (cached on disk)
                fit, seconds = timed(lambda d=device, s=size: fit_csd(signal[:s], model, params, device=d))
            else:
                seconds = first
        except Exception as exc:  # no GPU here
            results[device] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        results[device] = {
            "voxels": size,
            "seconds": seconds,
            "voxels_per_s": size / seconds,
            "first_run_seconds": first,
            "stages_s": {k: fit.provenance[k] for k in ("transfer_s", "compute_s", "peaks_s")},
            "whole_brain_s": n / (size / seconds),
            "device": fit.provenance["device"],
            "solver": fit.provenance["solver"],
            "max_iterations_used": fit.provenance["max_iterations_used"],
            "not_converged": fit.flag_counts().get("not converged", 0),
        }
    sample = signal[: min(n, args.sample), model.volumes].astype(np.float64) @ model.design
    shared = shared_program(model)
    for name, interior in (("exactness", None), ("exactness_plain_active_set", 0)):
        work = []
        options = {} if interior is None else {"interior_iterations": interior}
        (x, lam, _, converged), seconds = timed(
            lambda o=options, w=work: solve_batch(np, sample, shared, params.msmt_max_iterations, work=w, **o)
        )
        residuals = kkt_residuals(x, lam, sample, model.design.T @ model.design, constraint_matrix(model))
        results[name] = {
            "voxels": len(sample),
            "cpu_seconds": seconds,
            "cpu_voxels_per_s": len(sample) / seconds,
            "not_converged": int((~converged).sum()),
            "active_constraints_mean": float((lam > 0).sum(axis=1).mean()),
            **{f"kkt_{key}_max": float(values.max()) for key, values in residuals.items()},
            "work": work_counts(work, len(sample), *shared.constraint.shape),
        }
    results["work_ratio_plain_over_default"] = {
        key: results["exactness_plain_active_set"]["work"]["total"][key] / results["exactness"]["work"]["total"][key]
        for key in results["exactness"]["work"]["total"]
    }
    if args.skip_fit:
        print(json.dumps(results, indent=2))
        return
    try:
        from dipy.core.gradients import gradient_table as dipy_table
        from dipy.reconst.csdeconv import ConstrainedSphericalDeconvModel

        gtab = dipy_table(bvals, bvecs=np.where(bvals[:, None] > 0, bvecs, 0))
        keep = (bvals < 50) | (np.abs(bvals - 3000) < 80)
        gtab = dipy_table(bvals[keep], bvecs=gtab.bvecs[keep])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_d = ConstrainedSphericalDeconvModel(gtab, (np.array([1.7e-3, 0.3e-3, 0.3e-3]), 100.0), sh_order_max=8)
            _, seconds = timed(lambda: model_d.fit(signal[:n_dipy, keep].reshape(n_dipy, 1, 1, -1)))
        results["dipy_ssst_serial"] = {
            "voxels": n_dipy,
            "seconds": seconds,
            "voxels_per_s": n_dipy / seconds,
            "whole_brain_s": n / (n_dipy / seconds),
        }
        # the same on every core of the machine (DIPY's joblib engine), a chunk per worker
        cores = os.cpu_count() or 1
        n_par = min(n, n_dipy * cores)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = signal[:n_par, keep].reshape(n_par, 1, 1, -1)
            _, seconds = timed(lambda: model_d.fit(data, engine="joblib", n_jobs=cores))
        results["dipy_ssst_all_cores"] = {
            "voxels": n_par,
            "cores": cores,
            "seconds": seconds,
            "voxels_per_s": n_par / seconds,
            "whole_brain_s": n / (n_par / seconds),
        }
    except Exception as exc:
        results.setdefault("dipy_ssst_serial", {"error": f"{type(exc).__name__}: {exc}"})
        results.setdefault("dipy_ssst_all_cores", {"error": f"{type(exc).__name__}: {exc}"})
    for key in ("gpu", "cpu"):
        for dipy in ("dipy_ssst_serial", "dipy_ssst_all_cores"):
            if "whole_brain_s" in results.get(key, {}) and "whole_brain_s" in results.get(dipy, {}):
                results[f"{dipy}_over_{key}"] = results[dipy]["whole_brain_s"] / results[key]["whole_brain_s"]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
