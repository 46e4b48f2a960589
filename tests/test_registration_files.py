"""The registration folder's files read without nitransforms (the fast path of every atlas and
apply-transform) give what nitransforms reads, and anything else still goes to nitransforms; the
affine written without nitransforms (every registration) is the file nitransforms writes."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
from nitransforms import linear
from nitransforms.io import itk

from tests.anatomy_synth import rigid
from tractlens.app.grid import Grid
from tractlens.app.io.transforms import _read_field, _write_field, read_itk_affine, write_itk_affine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_itk_affine_reads_as_nitransforms_reads_it(tmp_path, seed):
    rng = np.random.default_rng(seed)
    affine = rigid(*rng.uniform(-20, 20, 3), tuple(rng.uniform(-15, 15, 3)))
    affine[:3, :3] = affine[:3, :3] @ (np.eye(3) + rng.uniform(-0.1, 0.1, (3, 3)))
    path = tmp_path / "0GenericAffine.mat"
    linear.Affine(affine).to_filename(str(path), fmt="itk")
    ours = read_itk_affine(path)
    np.testing.assert_allclose(ours, linear.load(str(path), fmt="itk").matrix, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours, affine, rtol=0, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_itk_affine_is_written_byte_for_byte_as_nitransforms_writes_it(tmp_path, seed):
    rng = np.random.default_rng(seed + 10)
    affine = rigid(*rng.uniform(-20, 20, 3), tuple(rng.uniform(-15, 15, 3)))
    affine[:3, :3] = affine[:3, :3] @ (np.eye(3) + rng.uniform(-0.1, 0.1, (3, 3)))
    theirs, ours = tmp_path / "theirs.mat", tmp_path / "ours.mat"
    linear.Affine(affine).to_filename(str(theirs), fmt="itk")
    write_itk_affine(affine, ours)
    assert ours.read_bytes() == theirs.read_bytes()
    np.testing.assert_allclose(linear.load(str(ours), fmt="itk").matrix, affine, rtol=0, atol=1e-12)


def test_a_file_that_is_not_an_itk_affine_is_left_to_nitransforms(tmp_path):
    text = tmp_path / "affine.txt"
    text.write_text("#Insight Transform File V1.0\n")
    assert read_itk_affine(text) is None
    short = tmp_path / "short.mat"
    short.write_bytes(b"\x00\x00\x00\x00\x03")
    assert read_itk_affine(short) is None


def test_a_displacement_field_reads_as_nitransforms_reads_it(tmp_path):
    rng = np.random.default_rng(3)
    grid = Grid(np.diag([2.0, 2.0, 2.0, 1.0]), (6, 7, 5))
    field = rng.normal(size=(*grid.shape, 3)).astype(np.float32)
    path = tmp_path / "1Warp.nii.gz"
    _write_field(field, grid, path)
    ours = _read_field(path, grid)
    theirs = np.asarray(itk.ITKDisplacementsField.from_image(nib.load(path)).dataobj, np.float32)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_allclose(ours, field, rtol=0, atol=1e-6)
