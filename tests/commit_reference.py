"""Run dmri-commit (COMMIT 2, the reference implementation) the way TractLens fits COMMIT,
for agreement tests and benchmarks.

What has to match for the two to fit the same model:
- gradients: dmri-commit reads FSL bvecs as they are (voxel axes); FSL negates x for images
  with a positive-determinant affine, which TractLens undoes on reading, so the scheme is
  written with x flipped for such images;
- streamlines: dmri-commit maps .tck points through the inverse affine and takes voxel i as
  [i, i + 1); NIfTI voxel centres are at integers, so ``fiber_shift=0.5``;
- orientations: 32 761 (181 × 181), as TractLens's look-up tables;
- peaks in voxel axes (``peaks_use_affine=False``), the voxels traversed by the streamlines;
- Stick-Zeppelin-Ball with one zeppelin (d⊥ 0.51e-3) and balls (1.7e-3, 3e-3).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import numpy as np

N_DIRS = 32761


def run_dmri_commit(
    dwi: Path,
    bval: Path,
    bvec: Path,
    tractogram: Path,
    workdir: Path,
    *,
    mask: Path | None = None,
    peaks: Path | None = None,
    tol: float = 1e-3,
    max_iter: int = 1000,
    d_par: float = 1.7e-3,
    d_perp: float = 0.51e-3,
    d_iso: tuple[float, ...] = (1.7e-3, 3.0e-3),
    threads: int | None = None,
) -> dict:
    """Weights (per input streamline), iterations, objective and timings from dmri-commit."""
    import amico
    import commit
    import nibabel as nib
    from commit import trk2dictionary

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    affine = nib.load(str(dwi)).affine
    flip_x = float(np.linalg.det(affine[:3, :3])) > 0
    scheme = workdir / "dwi.scheme"
    quiet = io.StringIO()
    here = os.getcwd()
    timings = {}
    try:
        os.chdir(workdir)
        with contextlib.redirect_stdout(quiet):
            amico.util.fsl2scheme(str(bval), str(bvec), str(scheme), flipAxes=[flip_x, False, False])
            t0 = time.perf_counter()
            trk2dictionary.run(
                filename_tractogram=str(tractogram),
                path_out=str(workdir / "dictionary"),
                filename_mask=None if mask is None else str(mask),
                filename_peaks=None if peaks is None else str(peaks),
                TCK_ref_image=str(dwi),
                fiber_shift=0.5,
                min_seg_len=1e-3,
                ndirs=N_DIRS,
                n_threads=threads or -1,
                verbose=0,
            )
            timings["dictionary_s"] = time.perf_counter() - t0
            commit.core.setup()
            mit = commit.Evaluation(str(workdir), ".", dictionary_path=str(workdir / "dictionary"))
            mit.set_verbose(0)
            mit.load_data(str(dwi), str(scheme))
            mit.set_model("StickZeppelinBall")
            mit.model.set(d_par=d_par, d_perps_zep=[d_perp], d_isos=list(d_iso))
            t0 = time.perf_counter()
            mit.generate_kernels(regenerate=True, ndirs=N_DIRS)
            mit.load_kernels()
            timings["kernels_s"] = time.perf_counter() - t0
            mit.load_dictionary()
            mit.set_threads(n=threads or os.cpu_count())
            t0 = time.perf_counter()
            mit.build_operator()
            timings["operator_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            mit.fit(tol_fun=tol, max_iter=max_iter)
            timings["fit_s"] = time.perf_counter() - t0
            mit.save_results()
    finally:
        os.chdir(here)
    details = mit.get_config("optimization")["fit_details"]
    weights_file = next((workdir / "dictionary").glob("Results_*/streamline_weights.txt"))
    return {
        "weights": np.loadtxt(weights_file),
        "iterations": int(details["iterations"]),
        "objective": float(details["cost_function"]),
        "stopped": details["stopping_criterion"],
        **timings,
    }
