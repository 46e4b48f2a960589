"""fit-dti's host steps around the fit (issue 30): the same bytes as the whole-grid way."""

from __future__ import annotations

import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.io import DWI, save_tensor, save_volume
from tractlens.app.io.dwi import count_nonfinite_voxels
from tractlens.app.pipelines.dti import _v1_fsl_frame, fit_dti_pipeline, masked_signal, write_dti_outputs


def _series(rng, shape=(9, 8, 7), k=14, nans=True):
    bvals = np.r_[0.0, 0.0, np.full(k - 2, 1000.0)]
    g = rng.normal(size=(k, 3))
    g /= np.linalg.norm(g, axis=1)[:, None]
    g[:2] = 0
    d = rng.uniform(2e-4, 2e-3, size=(*shape, 3))
    adc = np.einsum("kc,xyzc->xyzk", g**2, d)
    data = np.asfortranarray((1000 * np.exp(-bvals * adc) + rng.normal(0, 5, (*shape, k))).astype(np.float32))
    if nans:
        data[1, 2, 3, 5] = np.nan
        data[4, 4, 4, :] = np.inf
        data[0, 0, 0, 0] = -np.inf
    return data, bvals, g


def test_masked_signal_is_data_mask_in_order():
    rng = np.random.default_rng(1)
    data, _, _ = _series(rng)
    mask = rng.random(data.shape[:3]) < 0.6
    got = masked_signal(data, mask)
    want = data[mask]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.ascontiguousarray(got).tobytes() == want.tobytes()
    assert got.flags.f_contiguous  # one copy: the engine sends it as it is


def test_nonfinite_count_is_the_whole_grid_count():
    rng = np.random.default_rng(2)
    data, _, _ = _series(rng)
    data[8, 7, 6, 13] = np.nan  # last voxel, last volume
    want = int(np.count_nonzero(~np.isfinite(data).all(axis=-1)))
    assert count_nonfinite_voxels(data) == want == 4


def _reference_write(result, out):
    """The writer as it was: whole-grid maps, the tensor through save_tensor (under dtifit's names)."""
    out.mkdir()
    aff = result.affine
    for name in ("fa", "md", "ad", "rd", "rgb", "l1", "l2", "l3", "s0"):
        save_volume(result.map(name), aff, out / f"dti_{name.upper()}.nii.gz", dtype=np.float32)
    save_volume(_v1_fsl_frame(result.map("v1"), aff), aff, out / "dti_V1.nii.gz", dtype=np.float32)
    save_volume(result.mask, aff, out / "dti_mask.nii.gz", dtype=np.uint8)
    save_volume(result.map("flags"), aff, out / "dti_flags.nii.gz", dtype=np.uint8)
    save_tensor(result.map("tensor"), aff, out / "dti_tensor.nii.gz", order="fsl")


@pytest.mark.parametrize("flip", [True, False])
@pytest.mark.parametrize("given_mask", [True, False])
def test_written_maps_are_byte_identical_to_the_whole_grid_writer(tmp_path, flip, given_mask):
    rng = np.random.default_rng(3)
    data, bvals, bvecs = _series(rng, shape=(16, 15, 14))
    affine = np.diag([2.0 if flip else -2.0, 2.0, 2.0, 1.0])
    mask = None
    if given_mask:
        mask = np.zeros(data.shape[:3], bool)
        mask[2:14, 3:12, 1:13] = True
    else:  # a computed mask needs a head: dark outside
        data[:2] = 0
    dwi = DWI(data=data, affine=affine, bvals=bvals, bvecs=bvecs)
    result = fit_dti_pipeline(dwi, mask=mask, device="cpu")
    assert result.fit.flags.any()  # the NaN/Inf voxels are in it
    write_dti_outputs(result, tmp_path / "new")
    _reference_write(result, tmp_path / "ref")
    names = sorted(p.name for p in (tmp_path / "ref").glob("*.nii.gz"))
    new = {p.name for p in (tmp_path / "new").glob("*.nii.gz")}  # and V2, V3, MO, new in issue 27
    assert set(names) <= new and len(names) == 13 and len(new) == 16
    for name in names:
        a, b = nib.load(tmp_path / "ref" / name), nib.load(tmp_path / "new" / name)
        assert a.header.binaryblock == b.header.binaryblock, name
        da, db = np.asarray(a.dataobj), np.asarray(b.dataobj)
        assert da.dtype == db.dtype and da.tobytes() == db.tobytes(), name
    if flip:  # the frame change reaches outside the mask too (-0.0), as it always did
        t = np.asarray(nib.load(tmp_path / "new" / "dti_tensor.nii.gz").dataobj)
        assert np.signbit(t[~result.mask][:, 1]).all()


def test_fit_dti_start_does_not_import_scipy_ndimage():
    code = "import sys, tractlens.app.pipelines.dti; print('scipy.ndimage' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
