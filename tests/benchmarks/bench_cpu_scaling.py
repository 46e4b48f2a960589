"""Benchmark: how the CPU engine's NODDI-Watson and single-shell CSD fits scale with threads.

    python tests/benchmarks/bench_cpu_scaling.py [--threads 1 2] [--noddi-voxels 500]
        [--csd-voxels 4000] [--repeats 3] [--out tests/benchmarks/results/cpu_scaling.json]

For each fit and thread count (``TRACTLENS_THREADS``; BLAS held to one thread, as the fits do
on several), best of ``--repeats`` wall times, the thread counts taking turns within a repeat.
On one thread (the fit runs on the calling thread) it also measures, in CPU time and so
independently of other load on the machine:

- ``serial_fraction``: the share of the fit's CPU time outside its compiled loops (the loops
  run without the GIL; outside them Python and NumPy run, partly under it): an upper bound of
  Amdahl's serial fraction s, and ``amdahl_speedup_16`` = 1 / (s + (1 − s) / 16) what it
  allows on 16 cores (None for the array programs, ``TRACTLENS_DISABLE_NUMBA=1``);
- ``cpu_ms_per_voxel`` (user + system), ``system_share`` (the kernel's share: page faults of
  large temporaries) and ``minor_faults_per_voxel``.

From the wall times: ``speedup`` = T(1) / T(N) and the parallel fraction it implies,
p = (1 − T(N)/T(1)) / (1 − 1/N). Wall times mean something only on a machine with its cores
free (``load_average`` is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def noddi_case(voxels: int):
    from tests.benchmarks.bench_models import acquisition, signals, truth
    from tractlens.gpu.models import fit_model, noddi_watson

    model = noddi_watson()
    bvals, bvecs = acquisition()
    signal = signals(model, truth("noddi-watson", voxels, seed=3), bvals, bvecs, seed=3)
    fit_model(model, signal[:64], bvals, bvecs, device="cpu")  # start-up: numba's cache
    return lambda: fit_model(model, signal, bvals, bvecs, device="cpu")


def csd_case(voxels: int):
    from tests.benchmarks.bench_csd import phantom, responses
    from tests.csd_synth import gradient_table
    from tractlens.gpu.csd import CSDParams, build_model, fit_csd

    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 90, 18)
    keep = (bvals < 50) | (np.abs(bvals - 3000) < 80)
    signal = phantom(voxels, bvals, bvecs)[:, keep]
    params = CSDParams(msmt=False, lmax=8)
    model = build_model(bvals[keep], bvecs[keep], responses(bvals[keep], bvecs[keep]), params)
    fit_csd(signal[:256], model, params, device="cpu")
    return lambda: fit_csd(signal, model, params, device="cpu")


def one_thread_costs(fit, voxels: int) -> dict:
    os.environ["TRACTLENS_THREADS"] = "1"
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    result = fit()
    thread_cpu = time.thread_time() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    serial = 1.0 - result.provenance["compiled_cpu_s"] / thread_cpu
    compiled = result.provenance["engine"] == "compiled"  # the array programs: not measured this way
    return {
        "engine": result.provenance["engine"],
        "serial_fraction": round(serial, 4) if compiled else None,
        "amdahl_speedup_16": round(1.0 / (serial + (1.0 - serial) / 16), 2) if compiled else None,
        "cpu_ms_per_voxel": round(1e3 * (user + system) / voxels, 3),
        "system_share": round(system / max(user + system, 1e-9), 3),
        "minor_faults_per_voxel": round((r1.ru_minflt - r0.ru_minflt) / voxels, 2),
    }


def scaling(fit, threads: list[int], repeats: int) -> dict:
    from threadpoolctl import threadpool_limits

    best = {n: float("inf") for n in threads}
    with threadpool_limits(limits=1):
        for _ in range(repeats):
            for n in threads:
                os.environ["TRACTLENS_THREADS"] = str(n)
                t = time.perf_counter()
                fit()
                best[n] = min(best[n], time.perf_counter() - t)
    out = {"wall_s": {str(n): round(best[n], 3) for n in threads}}
    base = best[threads[0]]
    if threads[0] == 1:
        for n in threads[1:]:
            speedup = base / best[n]
            out[f"speedup_{n}"] = round(speedup, 2)
            out[f"parallel_fraction_from_{n}"] = round((1 - best[n] / base) / (1 - 1 / n), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--noddi-voxels", type=int, default=500)
    parser.add_argument("--csd-voxels", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for name, case, voxels in (
        ("NODDI-Watson", noddi_case, args.noddi_voxels),
        ("CSD (single shell b=3000, lmax 8)", csd_case, args.csd_voxels),
    ):
        fit = case(voxels)
        row = {
            "method": name,
            "voxels": voxels,
            **one_thread_costs(fit, voxels),
            **scaling(fit, args.threads, args.repeats),
        }
        rows.append(row)
        print(json.dumps(row))
    result = {
        "command": "python " + " ".join(sys.argv),
        "cores": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
