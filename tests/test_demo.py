"""The demo phantom: reproducible, realistic enough to fit, with correct conventions."""

import json

import nibabel as nib
import numpy as np

from tractlens.app import demo
from tractlens.app.io import load_dwi
from tractlens.app.masking import brain_mask_from_b0
from tractlens.app.pipelines.dti import fit_dti_pipeline


def test_phantom_is_reproducible(demo_phantom):
    again = demo.make_phantom()
    np.testing.assert_array_equal(again.dwi, demo_phantom.dwi)
    assert not np.array_equal(demo.make_phantom(seed=1).dwi, demo_phantom.dwi)


def test_acquisition_and_noise_are_as_documented(demo_phantom):
    p = demo_phantom
    assert (p.bvals == 0).sum() >= 1 and (p.bvals > 0).sum() >= 30
    # Noise: in the grey matter the b=0 signal is S0, so std over the 4 b=0 volumes ~ sigma.
    gm = p.brain & (p.occupancy.sum(-1) == 0)
    b0 = p.dwi[gm][:, p.bvals == 0]
    snr = b0.mean() / b0.std(axis=1, ddof=1).mean()
    assert 20 <= snr <= 30


def test_files_are_written_with_rois_and_ground_truth(demo_dir):
    manifest = json.loads((demo_dir / "demo.json").read_text())
    assert {b["name"] for b in manifest["bundles"]} == {
        "crossing_lr",
        "crossing_ap",
        "arc",
        "kissing_lower",
        "kissing_upper",
    }
    brain = nib.load(demo_dir / "mask.nii.gz").get_fdata() > 0
    for name, info in manifest["rois"].items():
        roi = nib.load(demo_dir / name).get_fdata() > 0
        assert roi.sum() == info["voxels"] > 5 and not (roi & ~brain).any()
    from tractlens.app.io import load_tractogram

    truth = load_tractogram(demo_dir / "bundles.trk")
    assert set(np.unique(truth.streamline_scalars["bundle"])) == {1, 2, 3, 4, 5}


def test_demo_is_cached_after_first_use(demo_dir):
    stamp = (demo_dir / "dwi.nii.gz").stat().st_mtime_ns
    assert demo.demo_path() == demo_dir
    assert (demo_dir / "dwi.nii.gz").stat().st_mtime_ns == stamp


def test_computed_brain_mask_matches_the_true_brain(demo_dir):
    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    mask = brain_mask_from_b0(dwi.mean_b0())
    truth = nib.load(demo_dir / "mask.nii.gz").get_fdata() > 0
    dice = 2 * (mask & truth).sum() / (mask.sum() + truth.sum())
    assert dice > 0.97


def test_fit_recovers_bundle_directions_through_the_fsl_bvec_convention(demo_dir, demo_phantom):
    """bvecs on disk are in FSL's frame (x flipped, positive-determinant affine); after
    loading, the fitted e1 must follow the bundles' true voxel-axis tangents."""
    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    result = fit_dti_pipeline(dwi, device="cpu")
    p = demo_phantom
    single = (p.occupancy.max(-1) > 0.99) & ((p.occupancy > 0.01).sum(-1) == 1) & result.mask
    truth = p.directions[single, p.occupancy[single].argmax(-1)]
    e1 = result.map("v1")[single]
    cos = np.abs((e1 * truth).sum(-1))
    assert single.sum() > 500 and np.median(cos) > 0.99 and np.percentile(cos, 5) > 0.95
    fa = result.map("fa")
    assert np.median(fa[single]) > 0.5
    gm = p.brain & (p.occupancy.sum(-1) == 0)
    assert np.median(fa[gm]) < 0.15


def test_pipeline_reports_and_writes_flags_for_bad_voxels(demo_dir, tmp_path):
    from tractlens.app.pipelines.dti import write_dti_outputs

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    truth = nib.load(demo_dir / "mask.nii.gz").get_fdata() > 0
    dwi.data[28, 28, 12, 3] = np.nan
    dwi.data[28, 29, 12] = 0.0
    result = fit_dti_pipeline(dwi, mask=truth, device="cpu")
    assert any("no signal at b=0" in w for w in result.warnings)
    assert any("non-finite signal" in w for w in result.warnings)
    write_dti_outputs(result, tmp_path)
    flags = nib.load(tmp_path / "dti_flags.nii.gz").get_fdata()
    assert flags[28, 28, 12] == 1 and flags[28, 29, 12] == 2
    fa = nib.load(tmp_path / "dti_FA.nii.gz").get_fdata()
    assert fa[28, 28, 12] == 0 and np.isfinite(fa).all()
