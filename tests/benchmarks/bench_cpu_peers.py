"""Benchmark: TractLens's CPU engine against its CPU peer, same inputs, same process, same run.

    python tests/benchmarks/bench_cpu_peers.py [--threads N] [--device cpu] [--repeats 3]
        [--only commit tensor tracking selection csd noddi] [--csd-voxels 20000] [--csd-msmt]
        [--noddi-voxels 2000] [--tensor-tiles 8] [--work /tmp/bench_cpu_peers]
        [--out tests/benchmarks/results/cpu_peers.json]
    python tests/benchmarks/bench_cpu_peers.py --cores 16 2 [--machine h100] [--budget-s 540]

``--cores N1 N2 …`` runs the whole comparison once per core count, each in its own process
pinned to the first N cores (``taskset -c`` and ``--threads N``), with smaller sizes below 8
cores (:data:`SIZES`) so that a 16-core and a 2-core run fit in one call of ten minutes, and
writes the ratios side by side, the runs and their exact commands in
results/cpu_peers_<machine>.json.

Ours always runs on the CPU engine (``--device cpu``, the default and only choice: on a GPU
machine this measures its CPUs). ``--threads N`` runs everything on N cores (the process's CPU
affinity, set before NumPy is imported) and sizes every thread pool to N: ours
(TRACTLENS_THREADS, numba, BLAS) and the peers' (dmri-commit's ``set_threads``/``n_threads``,
DIPY's ``nbr_threads`` and joblib ``n_jobs``, AMICO's ``nthreads``, BLAS/OpenMP).

Each method is timed for ours and for the peer on the same arrays or files, under the same
environment (thread settings and BLAS variables are recorded in the output), best of
``--repeats`` wall times:

- COMMIT: ``commit_from_files`` (load, segments, operator, FISTA to tol 1e-3) vs dmri-commit
  (trk2dictionary, kernels, operator, fit) on the demo phantom with a whole-brain
  deterministic tractogram and dtifit-style V1 peaks (tests/commit_reference.py aligns them);
- tensor fit (WLS): ``gpu.dti.fit_dti`` vs DIPY ``TensorModel(fit_method="WLS")`` on the demo
  DWI tiled to 8× its voxels (DIPY's threads: its BLAS);
- deterministic tracking: ``gpu.deterministic.track_all`` (trilinear tensor, main
  eigenvector, Euler, 0.5 mm, FA 0.15, 45°; the compiled engine with numba) vs DIPY's threaded
  ``eudx_tracking`` and its ``LocalTracking`` (one thread) with the same tensor field's V1 as
  EuDX peaks (``PeaksAndMetrics``), FA threshold stopping, same step, seeds and angle;
- ROI selection: ``gpu.select.select_streamlines`` vs DIPY ``tracking.utils.target`` on 100 000
  synthetic streamlines of 50 points and a 10³-voxel cube (DIPY: one thread);
- CSD: single-shell CSD (b=3000, lmax 8) for both, DIPY with joblib on all the cores
  (``--csd-msmt``: ours MSMT on three shells, not the same problem);
- NODDI-Watson: the model toolbox vs AMICO (its fit only).

Ratio = ours / peer (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

THREAD_KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "TRACTLENS_THREADS")


def pin_threads(argv: list[str]) -> int | None:
    """``--threads N``: this process on N cores (its affinity) and every thread pool sized N (BLAS,
    OpenMP, numba, TractLens's CPU engines), set before NumPy is imported; the peers get N too."""
    if "--threads" not in argv:
        return None
    n = int(argv[argv.index("--threads") + 1])
    for key in THREAD_KEYS:
        os.environ[key] = str(n)
    cores = sorted(os.sched_getaffinity(0))
    if n < len(cores):
        os.sched_setaffinity(0, cores[:n])
    return n


THREADS = pin_threads(sys.argv)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENV_KEYS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", *THREAD_KEYS)
METHODS = ("commit", "tensor", "tracking", "selection", "csd", "noddi")


def cores() -> int:
    """Cores this process may run on (and the peers' thread count)."""
    return len(os.sched_getaffinity(0))


def _version_or_none(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def best_of(repeats: int, run) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls of ``run()`` and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - t0)
    return best, result


def row(name: str, ours_s: float, peer: str, peer_s: float, **extra) -> dict:
    out = {"method": name, "ours_s": round(ours_s, 3), "peer": peer, "peer_s": round(peer_s, 3)}
    out["ratio"] = round(ours_s / peer_s, 2)
    out.update(extra)
    print(json.dumps(out), flush=True)
    return out


def demo_inputs(work: Path) -> dict:
    """The demo phantom, our WLS tensor fit of it and a whole-brain deterministic tractogram."""
    import nibabel as nib

    from tractlens.app.demo import demo_path
    from tractlens.app.io import load_dwi, save_tractogram
    from tractlens.app.model import Tractogram
    from tractlens.gpu.deterministic import DeterministicParams, track_all
    from tractlens.gpu.dti import fit_dti
    from tractlens.gpu.seeding import seeds_in_mask

    work.mkdir(parents=True, exist_ok=True)
    demo = demo_path()
    dwi = load_dwi(demo / "dwi.nii.gz")
    mask = np.asarray(nib.load(demo / "mask.nii.gz").dataobj) > 0
    fit = fit_dti(dwi.data[mask], dwi.bvals, dwi.bvecs, device="cpu")
    tensor = np.zeros((*dwi.shape3, 6))
    tensor[mask] = fit.tensor
    fa = np.zeros(dwi.shape3)
    fa[mask] = fit.fa
    v1 = np.zeros((*dwi.shape3, 3), np.float32)
    v1[mask] = fit.evecs[:, :, 0]
    voxel_size = np.sqrt((dwi.affine[:3, :3] ** 2).sum(0))
    seeds = seeds_in_mask(mask & (fa >= 0.15), 1, rng_seed=1)
    batch = track_all(tensor, seeds, DeterministicParams(), voxel_size=voxel_size, mask=mask, device="cpu")
    tract = Tractogram(batch.points, batch.offsets, dwi.affine, dwi.shape3, {}, {}, name="whole brain")
    save_tractogram(tract, work / "wb.tck")
    nib.save(nib.Nifti1Image(v1, dwi.affine), work / "peaks_voxel.nii.gz")  # voxel axes (dmri-commit)
    return dict(
        demo=demo,
        dwi=dwi,
        mask=mask,
        tensor=tensor,
        fa=fa,
        v1=v1,
        voxel_size=voxel_size,
        seeds=seeds,
    )


def bench_commit(inputs: dict, work: Path, repeats: int) -> dict:
    from tests.commit_reference import run_dmri_commit
    from tractlens.app.usecases.commit import commit_from_files

    demo = inputs["demo"]
    args = dict(mask=demo / "mask.nii.gz", peaks=work / "peaks_voxel.nii.gz", peaks_frame="world", device="cpu")
    # (voxel axes = world axes here: the demo's affine is diagonal and positive)
    ours_s, (ours, _) = best_of(repeats, lambda: commit_from_files(demo / "dwi.nii.gz", work / "wb.tck", **args))
    files = (demo / "dwi.nii.gz", demo / "dwi.bval", demo / "dwi.bvec", work / "wb.tck", work / "dmri_commit")
    peer_s, peer = best_of(
        repeats,
        lambda: run_dmri_commit(*files, mask=demo / "mask.nii.gz", peaks=work / "peaks_voxel.nii.gz", threads=cores()),
    )
    ours_fit = ours.fit.seconds / (ours.fit.iterations + 50)  # + the power iteration's 50 products
    return row(
        "COMMIT (Stick-Zeppelin-Ball, tol 1e-3)",
        ours_s,
        "dmri-commit",
        peer_s,
        segments=len(ours.problem.segments),
        streamlines=ours.problem.n_fibers,
        voxels=ours.problem.n_rows,
        iterations={"ours": ours.fit.iterations, "peer": peer["iterations"]},
        ms_per_product_pair={"ours": round(ours_fit * 1e3, 2)},
        peer_parts_s={k: round(v, 3) for k, v in peer.items() if k.endswith("_s")},
        weights_correlation=round(float(np.corrcoef(ours.weights, peer["weights"])[0, 1]), 4),
    )


def bench_tensor_fit(inputs: dict, repeats: int, tiles: int = 8) -> dict:
    """``tiles``: the demo's masked voxels repeated that many times."""
    from dipy.core.gradients import gradient_table
    from dipy.reconst.dti import TensorModel

    from tractlens.gpu.dti import fit_dti

    dwi, mask = inputs["dwi"], inputs["mask"]
    signal = np.tile(dwi.data[mask].astype(np.float64), (tiles, 1))
    ours_s, ours = best_of(repeats, lambda: fit_dti(signal, dwi.bvals, dwi.bvecs, device="cpu"))
    model = TensorModel(gradient_table(dwi.bvals, bvecs=dwi.bvecs, b0_threshold=50), fit_method="WLS")
    peer_s, peer = best_of(repeats, lambda: model.fit(signal))
    return row(
        "Tensor fit (WLS)",
        ours_s,
        "DIPY TensorModel WLS",
        peer_s,
        voxels=len(signal),
        volumes=signal.shape[1],
        fa_max_difference=round(float(np.abs(ours.fa - np.nan_to_num(peer.fa)).max()), 6),
    )


def bench_tracking(inputs: dict, repeats: int) -> dict:
    """Ours (``engine="auto"``: the compiled loop with numba, else the arrays engine) against
    DIPY's threaded EuDX tracker (``dipy.tracking.tracker.eudx_tracking``, ``nbr_threads`` = the
    cores) and its ``LocalTracking`` (one thread), on the same seeds."""
    from dipy.data import default_sphere
    from dipy.direction.peaks import PeaksAndMetrics
    from dipy.tracking.local_tracking import LocalTracking
    from dipy.tracking.stopping_criterion import ThresholdStoppingCriterion
    from dipy.tracking.streamline import Streamlines
    from dipy.tracking.tracker import eudx_tracking

    from tractlens.gpu import deterministic_host
    from tractlens.gpu.deterministic import DeterministicParams, track_all

    params = DeterministicParams(keep_truncated=True, min_length_mm=0.0)
    tensor, mask, seeds, vs = inputs["tensor"], inputs["mask"], inputs["seeds"], inputs["voxel_size"]
    engine = "compiled" if deterministic_host.available() else "arrays"
    track_all(tensor, seeds[:64], params, voxel_size=vs, mask=mask, device="cpu")  # numba's compilation (cached)
    ours_s, ours = best_of(repeats, lambda: track_all(tensor, seeds, params, voxel_size=vs, mask=mask, device="cpu"))
    pam = PeaksAndMetrics()
    pam.peak_dirs = inputs["v1"][..., None, :].astype(np.float64)
    pam.peak_values = inputs["fa"][..., None]
    pam.peak_indices = np.zeros((*mask.shape, 1), dtype=np.int32)
    pam.sphere, pam.ang_thr, pam.qa_thr, pam.total_weight = default_sphere, params.max_angle_deg, 0.0, 0.5
    stopping = ThresholdStoppingCriterion(np.where(mask, inputs["fa"], 0.0), params.fa_threshold)
    affine = np.diag([*vs, 1.0])
    max_steps = int(params.max_length_mm / params.step_mm)

    def local():
        tracker = LocalTracking(
            pam, stopping, seeds * vs, affine, step_size=params.step_mm, max_cross=1, maxlen=max_steps, minlen=2
        )
        return Streamlines(tracker)

    def threaded():
        lines = eudx_tracking(seeds * vs, stopping, affine, pam=pam, max_cross=1, min_len=2, max_len=max_steps,
                              step_size=params.step_mm, voxel_size=vs, max_angle=params.max_angle_deg,
                              nbr_threads=cores())  # fmt: skip
        return Streamlines(lines)

    local_s, local_lines = best_of(repeats, local)
    threaded()  # its first call sets up
    peer_s, peer_lines = best_of(repeats, threaded)
    n_local, n_peer = int(local_lines.get_data().shape[0]), int(peer_lines.get_data().shape[0])
    return row(
        "Deterministic tracking (tensor, Euler 0.5 mm)",
        ours_s,
        f"DIPY eudx_tracking, nbr_threads={cores()}, EuDX peaks of the same tensors",
        peer_s,
        engine=engine,
        seeds=len(seeds),
        streamlines={"ours": len(ours), "peer": len(peer_lines), "local_tracking": len(local_lines)},
        points={"ours": len(ours.points), "peer": n_peer, "local_tracking": n_local},
        local_tracking_s=round(local_s, 3),
        ratio_to_local_tracking=round(ours_s / local_s, 2),
        us_per_seed={
            "ours": round(ours_s / len(seeds) * 1e6, 2),
            "peer": round(peer_s / len(seeds) * 1e6, 2),
            "local_tracking": round(local_s / len(seeds) * 1e6, 2),
        },
        us_per_point={
            "ours": round(ours_s / len(ours.points) * 1e6, 2),
            "peer": round(peer_s / n_peer * 1e6, 2),
            "local_tracking": round(local_s / n_local * 1e6, 2),
        },
    )


def bench_selection(repeats: int, n: int = 100_000) -> dict:
    from dipy.tracking.streamline import Streamlines
    from dipy.tracking.utils import target

    from tests.benchmarks.bench_render import synthetic_tractogram
    from tractlens.gpu.select import select_streamlines

    tract = synthetic_tractogram(n)
    # Shifted so that every point lies in the grid (DIPY's target requires it; ours does not).
    margin = int(np.ceil(max(0.0, -float(tract.points.min())))) + 1
    points, offsets = tract.points + np.float32(margin), tract.offsets
    size = int(np.ceil(float(points.max()))) + 2
    roi = np.zeros((size, size, size), dtype=bool)
    roi[45 + margin : 55 + margin, 45 + margin : 55 + margin, 45 + margin : 55 + margin] = True
    ours_s, ours = best_of(repeats, lambda: select_streamlines(points, offsets, [roi], device="cpu"))
    lines = Streamlines()
    lines._data, lines._offsets, lines._lengths = points.astype(np.float64), offsets[:-1], np.diff(offsets)
    # DIPY's voxels are [i - 0.5, i + 0.5) around centres at integers, as ours
    peer_s, peer = best_of(repeats, lambda: list(target(lines, np.eye(4), roi, include=True)))
    return row(
        "ROI selection (one include region)",
        ours_s,
        "DIPY tracking.utils.target",
        peer_s,
        streamlines=n,
        points=len(points),
        selected={"ours": int(ours.selected.sum()), "peer": len(peer)},
    )


def bench_csd(repeats: int, voxels: int, msmt: bool = False) -> dict:
    """Single-shell CSD (Tournier 2007, lmax 8) on the same problem for both: the b=0 and
    b=3000 volumes of synthetic HCP-like voxels (tests/benchmarks/bench_csd.py); ours
    ``device="cpu"``, DIPY's ``ConstrainedSphericalDeconvModel`` with ``engine="joblib"`` on all
    the cores. ``msmt``: ours is MSMT-CSD on all three shells instead (DIPY's MSMT needs cvxpy,
    so the peer stays single-shell: not the same problem, the ratio is per voxel of each tool's
    own CSD)."""
    import warnings

    from dipy.core.gradients import gradient_table as dipy_table
    from dipy.reconst.csdeconv import ConstrainedSphericalDeconvModel

    from tests.benchmarks.bench_csd import phantom, responses
    from tests.csd_synth import gradient_table
    from tractlens.gpu.csd import CSDParams, build_model, fit_csd

    bvals, bvecs = gradient_table((1000.0, 2000.0, 3000.0), 90, 18)
    signal = phantom(voxels, bvals, bvecs)
    keep = (bvals < 50) | (np.abs(bvals - 3000) < 80)
    params = CSDParams(msmt=msmt, lmax=8)
    ours_b, ours_g, ours_signal = (bvals, bvecs, signal) if msmt else (bvals[keep], bvecs[keep], signal[:, keep])
    model = build_model(ours_b, ours_g, responses(ours_b, ours_g), params)
    fit_csd(ours_signal[:256], model, params, device="cpu")  # start-up outside the timing
    ours_s, ours = best_of(repeats, lambda: fit_csd(ours_signal, model, params, device="cpu"))
    gtab = dipy_table(bvals[keep], bvecs=np.where(bvals[keep, None] > 0, bvecs[keep], 0))
    data = signal[:, keep].reshape(voxels, 1, 1, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer_model = ConstrainedSphericalDeconvModel(gtab, (np.array([1.7e-3, 0.3e-3, 0.3e-3]), 100.0), sh_order_max=8)
        peer_s, _ = best_of(repeats, lambda: peer_model.fit(data, engine="joblib", n_jobs=cores()))
    return row(
        "CSD (ours MSMT 3 shells; DIPY SSST b=3000)" if msmt else "CSD (single shell b=3000, lmax 8)",
        ours_s,
        f"DIPY ConstrainedSphericalDeconvModel, joblib n_jobs={cores()}",
        peer_s,
        voxels=voxels,
        volumes={"ours": len(ours_b), "peer": int(keep.sum())},
        engine=ours.provenance["engine"],
    )


def bench_noddi(repeats: int, voxels: int) -> dict:
    """Ours (NODDI-Watson of the model toolbox, ``device="cpu"``, the whole fit after a start-up
    fit of 64 voxels, as the CSD row's, that loads the compiled loops) against AMICO's
    NODDI (``nthreads`` = the cores; its fit only, kernels generated beforehand) on the same
    synthetic voxels at SNR 30 (tests/benchmarks/bench_models.py)."""
    from tests.benchmarks.bench_models import acquisition, amico_fit, correlations, signals, truth
    from tractlens.gpu.models import fit_model, noddi_watson

    model = noddi_watson()
    bvals, bvecs = acquisition()
    signal = signals(model, truth("noddi-watson", voxels, seed=3), bvals, bvecs, seed=3)
    fit_model(model, signal[:64], bvals, bvecs, device="cpu")  # start-up (numba's cache) outside the timing
    ours_s, ours = best_of(repeats, lambda: fit_model(model, signal, bvals, bvecs, device="cpu"))
    best, maps = float("inf"), None
    for _ in range(repeats):
        peer, maps = amico_fit(signal, bvals, bvecs, threads=cores())
        best = min(best, peer["seconds"])
    return row(
        "NODDI-Watson",
        ours_s,
        f"AMICO NODDI, nthreads={cores()} (fit only)",
        best,
        voxels=voxels,
        volumes=len(bvals),
        engine=ours.provenance["engine"],
        r_ours_amico=correlations(ours.derived, maps),
    )


#: Sizes of a run on few cores (``--cores``: below :data:`FEW_CORES`), so that the 2-core run
#: fits beside the 16-core one in one call of ten minutes; each row records its sizes.
FEW_CORES = 8
SIZES = {
    "many": {"repeats": 2, "tensor_tiles": 8, "csd_voxels": 20_000, "noddi_voxels": 2_000},
    "few": {"repeats": 1, "tensor_tiles": 2, "csd_voxels": 4_000, "noddi_voxels": 1_000},
}


def machine_name() -> str:
    """A default name for the results file: the CPU count (``--machine`` names it better)."""
    return f"{os.cpu_count()}cpu"


def child_command(n: int, out: Path, args) -> list[str]:
    """The command of one core count's run: pinned by ``taskset`` to the first ``n`` cores this
    process may use (where taskset exists; ``--threads`` pins it anyway), every pool sized ``n``."""
    import shutil

    sizes = SIZES["few" if n < FEW_CORES else "many"]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--threads", str(n), "--device", "cpu"]
    cmd += ["--repeats", str(sizes["repeats"]), "--tensor-tiles", str(sizes["tensor_tiles"])]
    cmd += ["--csd-voxels", str(sizes["csd_voxels"]), "--noddi-voxels", str(sizes["noddi_voxels"])]
    cmd += ["--work", str(Path(args.work) / f"{n}cores"), "--out", str(out)]
    cmd += ["--only", *args.only] if args.only else []
    cmd += ["--csd-msmt"] if args.csd_msmt else []
    allowed = sorted(os.sched_getaffinity(0))
    if shutil.which("taskset") and n <= len(allowed):
        cmd = ["taskset", "-c", ",".join(str(c) for c in allowed[:n]), *cmd]
    return cmd


def side_by_side(args) -> None:
    """``--cores N1 N2 …``: one run per core count, each in its own pinned process, in the order
    given, within ``--budget-s`` in all (a run cut by it keeps the rows it finished), and the
    ratios side by side in ``--out`` (default results/cpu_peers_<machine>.json) with the
    commands."""
    import shlex
    import subprocess

    machine = args.machine or machine_name()
    out = Path(args.out or ROOT / "tests" / "benchmarks" / "results" / f"cpu_peers_{machine}.json")
    deadline = time.monotonic() + args.budget_s
    runs, commands = {}, {}
    for n in args.cores:
        part = Path(args.work) / f"cpu_peers_{n}cores.json"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.unlink(missing_ok=True)
        cmd = child_command(n, part, args)
        commands[str(n)] = shlex.join(cmd)
        left = deadline - time.monotonic()
        print(f"== {n} cores ({left:.0f} s left): {commands[str(n)]}", flush=True)
        status = "done"
        if left < 30:
            status = "not run: the budget was spent"
        else:
            try:
                done = subprocess.run(cmd, timeout=left, check=False)
                status = "done" if done.returncode == 0 else f"failed (exit {done.returncode})"
            except subprocess.TimeoutExpired:
                status = f"cut by the budget ({args.budget_s:.0f} s in all)"
        try:
            run = json.loads(part.read_text()) if part.exists() else {"rows": []}
        except json.JSONDecodeError:  # killed while writing a row
            run = {"rows": []}
        run["status"] = status
        runs[str(n)] = run
    table = []
    for method in dict.fromkeys(r["method"] for run in runs.values() for r in run["rows"]):
        entry = {"method": method}
        for n, run in runs.items():
            match = next((r for r in run["rows"] if r["method"] == method), None)
            if match is not None:
                entry[f"ratio_{n}_cores"] = match["ratio"]
                entry[f"ours_s_{n}_cores"], entry[f"peer_s_{n}_cores"] = match["ours_s"], match["peer_s"]
                entry["peer"] = match["peer"].replace(f"={n}", "=N")
        table.append(entry)
    results = {
        "machine": {
            "name": machine,
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "command": shlex.join([sys.executable, *sys.argv]),
        "commands": commands,
        "sizes": {f"few_cores (below {FEW_CORES})": SIZES["few"], "many_cores": SIZES["many"]},
        "side_by_side": table,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"== ratio = ours / peer (below 1: ours is faster); written {out}")
    header = "method".ljust(48) + "".join(f"{n + ' cores':>12}" for n in runs)
    print(header)
    for entry in table:
        cells = "".join(f"{entry.get(f'ratio_{n}_cores', '-'):>12}" for n in runs)
        print(entry["method"][:47].ljust(48) + cells)
    for n, run in runs.items():
        print(f"{n} cores: {run['status']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, help="cores for ours and the peers (default: all this process may use)")
    parser.add_argument(
        "--cores",
        type=int,
        nargs="+",
        help="one pinned run per core count (e.g. 16 2), the ratios side by side in one file",
    )
    parser.add_argument("--budget-s", type=float, default=540.0, help="--cores: seconds for all the runs together")
    parser.add_argument("--machine", help="--cores: the name in results/cpu_peers_<machine>.json (default: Ncpu)")
    parser.add_argument(
        "--device", choices=("cpu",), default="cpu", help="ours runs on the CPU engine, also where a GPU is"
    )
    parser.add_argument("--work", default="/tmp/bench_cpu_peers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=METHODS)
    parser.add_argument("--tensor-tiles", type=int, default=8, help="the demo's voxels repeated for the tensor row")
    parser.add_argument("--csd-voxels", type=int, default=20_000, help="voxels of the CSD row")
    parser.add_argument("--csd-msmt", action="store_true", help="ours MSMT-CSD on three shells (default: single shell)")
    parser.add_argument("--noddi-voxels", type=int, default=2_000, help="voxels of the NODDI row")
    parser.add_argument(
        "--out", help="results file (default: results/cpu_peers.json, with --cores cpu_peers_<machine>.json)"
    )
    args = parser.parse_args()
    if args.cores:
        side_by_side(args)
        return
    out = Path(args.out or ROOT / "tests" / "benchmarks" / "results" / "cpu_peers.json")
    work = Path(args.work)
    only = set(args.only or METHODS)

    import dipy
    import scipy

    results = {
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "threads": {"requested": args.threads, "cores_used": cores()},
        "command": " ".join([sys.executable, *sys.argv]),
        "environment": {key: os.environ.get(key) for key in ENV_KEYS},
        "versions": {
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "dipy": dipy.__version__,
            "dmri-commit": _version_or_none("dmri-commit"),
            "dmri-amico": _version_or_none("dmri-amico"),
            "numba": _version_or_none("numba"),
        },
        "repeats": args.repeats,
        "rows": [],
    }

    def add(result: dict) -> None:  # written after each row: a run cut short keeps what it did
        results["rows"].append(result)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))

    inputs = demo_inputs(work) if only & {"commit", "tensor", "tracking"} else {}
    if "tracking" in only:  # first: the target on every core count, and quick
        add(bench_tracking(inputs, max(3, args.repeats)))  # a fraction of a second: best of 3 at least
    if "commit" in only:
        add(bench_commit(inputs, work, args.repeats))
    if "tensor" in only:
        add(bench_tensor_fit(inputs, args.repeats, args.tensor_tiles))
    if "selection" in only:
        add(bench_selection(args.repeats))
    if "csd" in only:
        add(bench_csd(args.repeats, args.csd_voxels, args.csd_msmt))
    if "noddi" in only:
        add(bench_noddi(args.repeats, args.noddi_voxels))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
