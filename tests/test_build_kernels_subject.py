"""packaging/build_kernels.py's subjects run every command it builds kernels for: the CSD subject
has enough directions for CSD at its default lmax 8 and the grey matter and CSF that multi-tissue
CSD estimates its responses from (the first build's subject had 10 directions: CSD and fODF
tracking failed their input checks and none of their kernels were built). Here on the CPU, on a
few voxels of each tissue (the same input checks as on the GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def planned(build_kernels, tmp_path_factory):
    work = tmp_path_factory.mktemp("kernels")
    _subject, commands = build_kernels._subject(work)
    return work, dict(commands)


def test_the_build_runs_csd_multi_tissue_csd_and_fod_tracking_and_the_benchmarks_commands(planned):
    _work, commands = planned
    assert list(commands) == [
        "fit-dti", "fit-ballstick", "track-prob", "track-prob-wb", "track-det", "track-det-roi", "commit",
        "track-geodesic", "fit-csd", "fit-csd-msmt", "track-fod",
        "fit-dti-mid", "fit-ballstick-mid", "track-det-mid", "commit-mid",
    ]  # fmt: skip
    # the "-mid" runs are on the CSD subject's 182 volumes (kernels compiled per 32 measurements)
    assert "--seed" in commands["track-det-roi"] and "--whole-brain" not in commands["track-det-roi"]
    assert all("subject-csd" in " ".join(commands[f"{n}-mid"]) for n in ("fit-dti", "fit-ballstick", "commit"))
    assert "--msmt" in commands["fit-csd-msmt"]
    assert commands["track-fod"][commands["track-fod"].index("--fod") + 1] == commands["fit-csd"][-3]  # its -o


def test_the_large_subject_adds_dti_tracking_and_commit_on_it(build_kernels, tmp_path, planned):
    work, _ = planned
    _subject, commands = build_kernels._subject(work, large=work / "subject")  # any bench_e2e subject folder
    large = {label: argv for label, argv in commands if label.endswith("-large")}
    assert list(large) == ["fit-dti-large", "track-det-large", "commit-large"]
    assert all(str(work / "runs-large") in " ".join(argv) for argv in large.values())


@pytest.mark.slow
def test_the_csd_subject_passes_csd_and_multi_tissue_csd_and_tracks(build_kernels, planned, tmp_path):
    work, commands = planned
    subject = work / "subject-csd"
    bvals = np.loadtxt(subject / "dwi.bval")
    assert (np.abs(bvals - 3000) < 50).sum() == build_kernels.CSD_DIRECTIONS >= 45  # lmax 8 without super-resolution
    # a few voxels of each tissue, so the CPU solvers take seconds
    mask = nib.load(subject / "mask.nii.gz")
    inside = np.flatnonzero(np.asarray(mask.dataobj).ravel() > 0)
    n = build_kernels.TISSUE_VOXELS
    few = np.zeros(np.prod(mask.shape), np.uint8)
    few[np.r_[inside[:12], inside[n : n + 12], inside[-24:]]] = 1
    small = tmp_path / "few.nii.gz"
    nib.save(nib.Nifti1Image(few.reshape(mask.shape), mask.affine), small)
    out = tmp_path / "out"
    for label in ("fit-csd", "fit-csd-msmt", "track-fod"):
        argv = list(commands[label])
        argv = [str(small) if a == str(subject / "mask.nii.gz") else a for a in argv]
        argv = [a.replace(str(work / "runs"), str(out)) for a in argv]
        argv = ["cpu" if a == "gpu" else a for a in argv]
        done = subprocess.run(
            [sys.executable, "-m", "tractlens.app.cli", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{label}: {done.stderr[-2000:]}"
    assert (out / "fit-csd-msmt" / "csf.nii.gz").exists() and (out / "fod.trk").exists()


def test_the_log_names_the_kernels_a_command_compiled(build_kernels):
    calls = [
        {"source": 'extern "C" __global__ void cupy_add__float32(CArray<float, 1, 1, 1> _raw_x) {}'},
        {"source": "#include <cub/block/block_reduce.cuh>\n__global__ void __launch_bounds__(512) cupy_sum(int n) {}"},
        {"source": 'typedef float real;\n__device__ int f();\nextern "C" __global__ void commit_a(const float* x) {}'},
        {"source": "no kernel here"},
    ]
    assert build_kernels.kernel_names(calls) == ["cupy_add__float32", "cupy_sum", "commit_a", "?"]
