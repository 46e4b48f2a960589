"""Benchmark: TractLens's CPU engine against its CPU peer, same inputs, same process, same run.

    python tests/benchmarks/bench_cpu_peers.py [--work /tmp/bench_cpu_peers] [--repeats 3]
        [--out tests/benchmarks/results/cpu_peers.json]

Four methods, each timed for ours (``device="cpu"``) and for the peer on the same arrays or
files, under the same environment (thread settings and BLAS variables are recorded in the
output; nothing is changed between the two), best of ``--repeats`` wall times:

- COMMIT: ``commit_from_files`` (load, segments, operator, FISTA to tol 1e-3) vs dmri-commit
  (trk2dictionary, kernels, operator, fit; all cores) on the demo phantom with a whole-brain
  deterministic tractogram and dtifit-style V1 peaks (tests/commit_reference.py aligns them);
- tensor fit (WLS): ``gpu.dti.fit_dti`` vs DIPY ``TensorModel(fit_method="WLS")`` on the demo
  DWI tiled to 8× its voxels;
- deterministic tracking: ``gpu.deterministic.track_all`` (trilinear tensor, main
  eigenvector, Euler, 0.5 mm, FA 0.15, 45°) vs DIPY ``LocalTracking`` with the same tensor
  field's V1 as EuDX peaks (``PeaksAndMetrics``), FA threshold stopping, same step, seeds and
  angle;
- ROI selection: ``gpu.select.select_streamlines`` vs DIPY ``tracking.utils.target`` on 100 000
  synthetic streamlines of 50 points and a 10³-voxel cube.

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

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENV_KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MKL_NUM_THREADS")


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
    args = dict(mask=demo / "mask.nii.gz", peaks=work / "peaks_voxel.nii.gz", peaks_frame="world")
    # (voxel axes = world axes here: the demo's affine is diagonal and positive)
    ours_s, (ours, _) = best_of(repeats, lambda: commit_from_files(demo / "dwi.nii.gz", work / "wb.tck", **args))
    files = (demo / "dwi.nii.gz", demo / "dwi.bval", demo / "dwi.bvec", work / "wb.tck", work / "dmri_commit")
    peer_s, peer = best_of(
        repeats, lambda: run_dmri_commit(*files, mask=demo / "mask.nii.gz", peaks=work / "peaks_voxel.nii.gz")
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
    from dipy.data import default_sphere
    from dipy.direction.peaks import PeaksAndMetrics
    from dipy.tracking.local_tracking import LocalTracking
    from dipy.tracking.stopping_criterion import ThresholdStoppingCriterion
    from dipy.tracking.streamline import Streamlines

    from tractlens.gpu.deterministic import DeterministicParams, track_all

    params = DeterministicParams(keep_truncated=True, min_length_mm=0.0)
    tensor, mask, seeds, vs = inputs["tensor"], inputs["mask"], inputs["seeds"], inputs["voxel_size"]
    ours_s, ours = best_of(
        repeats, lambda: track_all(tensor, seeds, params, voxel_size=vs, mask=mask, device="cpu", engine="arrays")
    )
    pam = PeaksAndMetrics()
    pam.peak_dirs = inputs["v1"][..., None, :].astype(np.float64)
    pam.peak_values = inputs["fa"][..., None]
    pam.peak_indices = np.zeros((*mask.shape, 1), dtype=np.int32)
    pam.sphere, pam.ang_thr, pam.qa_thr, pam.total_weight = default_sphere, params.max_angle_deg, 0.0, 0.5
    stopping = ThresholdStoppingCriterion(np.where(mask, inputs["fa"], 0.0), params.fa_threshold)
    affine = np.diag([*vs, 1.0])
    max_steps = int(params.max_length_mm / params.step_mm)

    def peer():
        tracker = LocalTracking(
            pam, stopping, seeds * vs, affine, step_size=params.step_mm, max_cross=1, maxlen=max_steps, minlen=2
        )
        return Streamlines(tracker)

    peer_s, peer_lines = best_of(repeats, peer)
    return row(
        "Deterministic tracking (tensor, Euler 0.5 mm)",
        ours_s,
        "DIPY LocalTracking, EuDX peaks of the same tensors",
        peer_s,
        seeds=len(seeds),
        points={"ours": len(ours.points), "peer": int(peer_lines.get_data().shape[0])},
        us_per_point={
            "ours": round(ours_s / len(ours.points) * 1e6, 2),
            "peer": round(peer_s / peer_lines.get_data().shape[0] * 1e6, 2),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/bench_cpu_peers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=("commit", "tensor", "tracking", "selection"))
    parser.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "cpu_peers.json"))
    args = parser.parse_args()
    work = Path(args.work)
    only = set(args.only or ("commit", "tensor", "tracking", "selection"))
    from importlib.metadata import version

    import dipy
    import scipy

    results = {
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "environment": {key: os.environ.get(key) for key in ENV_KEYS},
        "versions": {
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "dipy": dipy.__version__,
            "dmri-commit": version("dmri-commit"),
        },
        "repeats": args.repeats,
        "rows": [],
    }
    inputs = demo_inputs(work) if only & {"commit", "tensor", "tracking"} else {}
    if "commit" in only:
        results["rows"].append(bench_commit(inputs, work, args.repeats))
    if "tensor" in only:
        results["rows"].append(bench_tensor_fit(inputs, args.repeats))
    if "tracking" in only:
        results["rows"].append(bench_tracking(inputs, args.repeats))
    if "selection" in only:
        results["rows"].append(bench_selection(args.repeats))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
