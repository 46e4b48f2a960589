"""``tractlens fit-csd``: files written and read back, bad input refused with exit status 2."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tests.csd_synth import add_rician_noise, crossing, gradient_table, voxel_signal
from tractlens.app.cli import main
from tractlens.app.io.fod import load_fod, read_response


def _series(tmp_path, shells, directions=45, nan_voxel=False):
    bvals, bvecs = gradient_table(shells, directions, 3)
    rng = np.random.default_rng(0)
    data = np.zeros((8, 8, 3, len(bvals)), np.float32)
    for index in np.ndindex(8, 8, 3):
        angle = rng.uniform(0, 180)
        fibres = (
            crossing(60) if index[0] < 2 else np.array([[np.cos(np.radians(angle)), np.sin(np.radians(angle)), 0.1]])
        )
        gm = 1.0 if index[0] == 7 else 0.0  # pure grey matter
        csf = 1.0 if index[0] == 6 else 0.0  # pure CSF
        data[index] = voxel_signal(bvals, bvecs, fibres, gm=gm, csf=csf)
    data = add_rician_noise(data, 500).astype(np.float32)  # files, not accuracy, are tested here
    if nan_voxel:
        data[0, 0, 0, 3] = np.nan
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "dwi.nii.gz")
    np.savetxt(tmp_path / "dwi.bval", bvals[None], fmt="%g")
    fsl = bvecs.copy()
    fsl[:, 0] *= -1  # FSL's frame for a positive-determinant affine
    np.savetxt(tmp_path / "dwi.bvec", fsl.T, fmt="%.6f")
    nib.save(nib.Nifti1Image(np.ones((8, 8, 3), np.uint8), affine), tmp_path / "mask.nii.gz")
    return tmp_path / "dwi.nii.gz"


@pytest.mark.parametrize("msmt", [False, True])
def test_fit_csd_writes_mrtrix_files_that_read_back(tmp_path, capsys, msmt):
    dwi = _series(tmp_path, (1000.0, 2500.0) if msmt else (2500.0,), nan_voxel=True)
    out = tmp_path / "out"
    args = [
        "fit-csd",
        str(dwi),
        "--mask",
        str(tmp_path / "mask.nii.gz"),
        "--response-fa",
        "0.5",
        "-o",
        str(out),
        "--json",
        "--quiet",
    ]
    assert main(args + (["--msmt"] if msmt else [])) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["voxels_fitted"] == 192 and summary["flags"]["non-finite signal"] == 1
    sh, affine, lmax, basis = load_fod(out / "fod.nii.gz")
    assert sh.shape == (8, 8, 3, 45) and lmax == 8 and basis == "mrtrix"
    np.testing.assert_allclose(affine, np.diag([2.0, 2.0, 2.0, 1.0]))
    peaks = nib.load(out / "peaks.nii.gz").get_fdata()
    assert peaks.shape == (8, 8, 3, 9)
    # a 58.7° crossing voxel (crossing(60) tilts both fibres by 0.2 in z): two peaks that far
    # apart in world space. Single shell only: the multi-tissue program's exact optimum puts them
    # 44.6° apart here, with the responses estimated from this small phantom (with reference
    # responses on the same acquisition each fibre is within 4°: test_csd_qp.py).
    first, second = peaks[1, 1, 1, :3], peaks[1, 1, 1, 3:6]
    assert np.linalg.norm(first) > 0 and np.linalg.norm(second) > 0
    if not msmt:
        cos = abs(first @ second) / np.linalg.norm(first) / np.linalg.norm(second)
        assert abs(np.degrees(np.arccos(cos)) - 58.7) < 3
    assert not sh[0, 0, 0].any()
    response = read_response(out / "response.txt")
    assert response.zonal.shape[1] == 5 and response.zonal[-1, 0] > 0
    if msmt:
        assert (out / "gm.nii.gz").exists() and (out / "csf.nii.gz").exists()
        assert list(response.bvalues) == [0.0, 1000.0, 2500.0]


def test_msmt_on_one_shell_and_too_few_directions_are_refused(tmp_path, capsys):
    dwi = _series(tmp_path, (1000.0,))
    assert main(["fit-csd", str(dwi), "--msmt", "-o", str(tmp_path / "o"), "--quiet"]) == 2
    assert "two diffusion-weighted shells" in capsys.readouterr().err
    few = tmp_path / "few"
    few.mkdir()
    dwi = _series(few, (1000.0,), directions=12)
    assert (
        main(
            [
                "fit-csd",
                str(dwi),
                "--mask",
                str(few / "mask.nii.gz"),
                "--response-fa",
                "0.5",
                "-o",
                str(few / "o"),
                "--quiet",
            ]
        )
        == 2
    )
    assert "too few" in capsys.readouterr().err


def test_unlabelled_fod_needs_a_basis(tmp_path):
    from tractlens.app.errors import InputError

    nib.save(nib.Nifti1Image(np.zeros((2, 2, 2, 45), np.float32), np.eye(4)), tmp_path / "f.nii.gz")
    with pytest.raises(InputError, match="basis"):
        load_fod(tmp_path / "f.nii.gz")
    assert load_fod(tmp_path / "f.nii.gz", basis="dipy-descoteaux")[3] == "dipy-descoteaux"
