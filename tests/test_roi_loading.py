"""ROI files (File > Open ROI) read onto the document's grid by app.loaders.load_roi_file, without a screen."""

import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.grid import Grid
from tractlens.app.io import save_volume
from tractlens.app.loaders import load_roi_file, unique_name

SHAPE = (10, 12, 8)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])  # 2 mm voxels, origin at voxel 0


def write_mask(path, mask, affine=AFFINE):
    return save_volume(np.asarray(mask, dtype=np.uint8), affine, path)


def test_a_mask_on_the_reference_grid_is_taken_as_it_is(tmp_path):
    mask = np.zeros(SHAPE, dtype=bool)
    mask[2:4, 3:6, 1] = True
    path = write_mask(tmp_path / "cst_seed.nii.gz", mask)
    roi, notices = load_roi_file(path, Grid(AFFINE, SHAPE), role="target")
    np.testing.assert_array_equal(roi.mask, mask)
    np.testing.assert_array_equal(roi.affine, AFFINE)
    assert (roi.name, roi.role, notices) == ("cst_seed", "target", [])


def test_a_mask_on_a_finer_grid_is_resampled_by_nearest_neighbour_with_a_notice(tmp_path):
    fine = np.diag([1.0, 1.0, 1.0, 1.0])
    mask = np.zeros((20, 24, 16), dtype=bool)
    mask[4, 6, 2] = True  # 1 mm voxel (4, 6, 2) = 2 mm voxel (2, 3, 1)
    path = write_mask(tmp_path / "roi.nii", mask, fine)
    roi, notices = load_roi_file(path, Grid(AFFINE, SHAPE))
    assert roi.mask.shape == SHAPE
    assert {tuple(v) for v in np.argwhere(roi.mask)} == {(2, 3, 1)}
    assert len(notices) == 1 and "another grid" in notices[0] and "roi.nii" in notices[0]


def test_a_mask_outside_the_image_is_refused_and_names_the_file(tmp_path):
    shifted = AFFINE.copy()
    shifted[:3, 3] = 500.0  # half a metre away
    mask = np.ones(SHAPE, dtype=bool)
    path = write_mask(tmp_path / "elsewhere.nii.gz", mask, shifted)
    with pytest.raises(InputError, match="outside the image") as error:
        load_roi_file(path, Grid(AFFINE, SHAPE))
    assert "elsewhere.nii.gz" in str(error.value)


def test_an_empty_mask_is_kept_as_a_blank_with_a_warning(tmp_path):
    path = write_mask(tmp_path / "blank.nii.gz", np.zeros(SHAPE, dtype=bool))
    roi, notices = load_roi_file(path, Grid(AFFINE, SHAPE))
    assert not roi.mask.any() and roi.mask.shape == SHAPE
    assert any("empty" in notice for notice in notices)


def test_without_a_reference_the_mask_keeps_its_own_grid(tmp_path):
    mask = np.zeros((5, 6, 7), dtype=bool)
    mask[1, 2, 3] = True
    affine = np.diag([1.5, 1.5, 3.0, 1.0])
    roi, notices = load_roi_file(write_mask(tmp_path / "own.nii.gz", mask, affine), None)
    np.testing.assert_array_equal(roi.mask, mask)
    np.testing.assert_allclose(roi.affine, affine)
    assert notices == []


def test_the_roi_name_is_the_file_name_made_unique(tmp_path):
    path = write_mask(tmp_path / "seed.nii.gz", np.ones(SHAPE, dtype=bool))
    roi, _ = load_roi_file(path, Grid(AFFINE, SHAPE), taken=["seed", "seed (2)", "FA"])
    assert roi.name == "seed (3)"
    assert unique_name("FA", []) == "FA"


def test_a_file_that_is_no_image_is_an_input_error(tmp_path):
    path = tmp_path / "notes.nii.gz"
    path.write_bytes(b"not a nifti")
    with pytest.raises(InputError):
        load_roi_file(path, Grid(AFFINE, SHAPE))
    with pytest.raises(ValueError, match="unknown ROI role"):
        load_roi_file(path, None, role="cortex")
