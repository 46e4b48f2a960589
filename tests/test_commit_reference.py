"""Agreement with dmri-commit (COMMIT 2, the reference implementation; a test dependency).

Same DWI, tractogram, mask, peaks and Stick-Zeppelin-Ball model (tests/commit_reference.py
lists what has to be aligned for that). Both fits are run to convergence (relative change of
the objective below 1e-7): at the tool's default tolerance (1e-3) both stop early, at
different iterations, and the weights of redundant streamlines (which the data cannot tell
apart) are still on their way to 0.
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tests.commit_reference import run_dmri_commit
from tests.test_cli import run_cli


@pytest.fixture(scope="module")
def commit_inputs(demo_dir, tmp_path_factory):
    """Deterministic tracking from every third brain voxel (redundant streamlines, so that
    COMMIT sets many to 0) and peaks from our tensor fit: V1 as written (FSL's frame) for
    TractLens, in voxel axes for dmri-commit."""
    from tractlens.app.io.dwi import fsl_to_voxel_vectors

    work = tmp_path_factory.mktemp("commit_reference")
    mask = nib.load(demo_dir / "mask.nii.gz")
    brain = np.asarray(mask.dataobj) > 0
    i, j, k = np.indices(brain.shape)
    seeds = brain & ((i + j + k) % 3 == 0)
    nib.save(nib.Nifti1Image(seeds.astype(np.uint8), mask.affine), work / "seeds.nii.gz")
    dwi = str(demo_dir / "dwi.nii.gz")
    result = run_cli(
        "track", "deterministic", "--dwi", dwi, "--seed", str(work / "seeds.nii.gz"),
        "--mask", str(demo_dir / "mask.nii.gz"), "--seed-rng", "1", "--device", "cpu", "--quiet",
        "-o", str(work / "tracts.tck"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = run_cli("fit-dti", dwi, "--mask", str(demo_dir / "mask.nii.gz"), "--device", "cpu", "--quiet",
                     "-o", str(work / "dti"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    v1 = nib.load(work / "dti" / "dti_V1.nii.gz")
    voxel_axes = fsl_to_voxel_vectors(np.asarray(v1.dataobj), v1.affine).astype(np.float32)
    nib.save(nib.Nifti1Image(voxel_axes, v1.affine), work / "peaks_voxel.nii.gz")
    return work


def _voxel_lengths_from_dictionary(folder, shape):
    """Total streamline length per voxel in dmri-commit's segment dictionary."""
    voxel = np.fromfile(folder / "dictionary_IC_v.dict", dtype=np.uint32)
    length = np.fromfile(folder / "dictionary_IC_len.dict", dtype=np.float32)
    total = np.bincount(voxel, weights=length, minlength=int(np.prod(shape)))
    return total.reshape(shape[::-1]).transpose(2, 1, 0)  # index x + X (y + Y z)


def _our_voxel_lengths(tractogram, demo_dir):
    from tractlens.app.io import load_dwi, load_tractogram
    from tractlens.gpu.commit_segments import segments

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    tract = load_tractogram(tractogram, reference=(dwi.affine, dwi.shape3))
    rows = np.arange(np.prod(dwi.shape3)).reshape(dwi.shape3)
    seg = segments(tract.points_on(dwi.affine), tract.offsets, rows, np.abs(np.diag(dwi.affine)[:3]))
    return np.bincount(seg.row, weights=seg.length, minlength=rows.size).reshape(dwi.shape3)


def test_weights_agree_with_dmri_commit(demo_dir, commit_inputs, tmp_path):
    work = commit_inputs
    out = tmp_path / "ours"
    result = run_cli(
        "commit", "--dwi", str(demo_dir / "dwi.nii.gz"), "--tractogram", str(work / "tracts.tck"),
        "--mask", str(demo_dir / "mask.nii.gz"), "--peaks", str(work / "dti" / "dti_V1.nii.gz"),
        "--peaks-frame", "fsl", "--tol", "1e-7", "--max-iter", "5000", "--device", "cpu", "--json", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)
    reference = run_dmri_commit(
        demo_dir / "dwi.nii.gz",
        demo_dir / "dwi.bval",
        demo_dir / "dwi.bvec",
        work / "tracts.tck",
        tmp_path / "reference",
        mask=demo_dir / "mask.nii.gz",
        peaks=work / "peaks_voxel.nii.gz",
        tol=1e-7,
        max_iter=5000,
        threads=2,
    )
    # The same segments: length per voxel equal to float32 precision.
    shape = nib.load(demo_dir / "mask.nii.gz").shape
    ref_lengths = _voxel_lengths_from_dictionary(tmp_path / "reference" / "dictionary", shape)
    assert int((ref_lengths > 0).sum()) == ours["voxels"]  # both fit the voxels the streamlines cross
    np.testing.assert_allclose(_our_voxel_lengths(work / "tracts.tck", demo_dir), ref_lengths, rtol=1e-4, atol=1e-4)

    ours_w = np.loadtxt(out / "streamline_weights.txt")
    ref_w = reference["weights"]
    assert len(ours_w) == len(ref_w) == ours["streamlines"]
    corr = float(np.corrcoef(ours_w, ref_w)[0, 1])
    zero_ours, zero_ref = ours_w == 0, ref_w == 0
    both, either = int((zero_ours & zero_ref).sum()), int((zero_ours | zero_ref).sum())
    print(
        f"\nTractLens vs dmri-commit on {len(ours_w)} streamlines: weights correlate {corr:.5f}; "
        f"objective {ours['objective']:.3f} vs {reference['objective']:.3f} "
        f"({ours['iterations']} vs {reference['iterations']} iterations); weight 0: ours {int(zero_ours.sum())}, "
        f"dmri-commit {int(zero_ref.sum())}, both {both} (overlap {both / max(either, 1):.3f})"
    )
    assert corr >= 0.95
    assert zero_ref.sum() > 0.2 * len(ref_w)  # the test is about which ones: there must be many
    assert both / either >= 0.95
    assert abs(ours["objective"] - reference["objective"]) <= 1e-3 * reference["objective"]
