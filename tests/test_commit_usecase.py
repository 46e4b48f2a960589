"""The COMMIT use case (app/usecases/commit.py): the window and ``tractlens commit`` check their
inputs in one place, with one grid rule and one set of messages."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.grid import Grid
from tractlens.app.io import load_dwi, load_tractogram, save_tractogram
from tractlens.app.model import RoiMask, Tractogram
from tractlens.app.pipelines.commit import CommitParams, commit_pipeline
from tractlens.app.usecases.commit import check_commit_inputs, commit_from_files, filter_with_commit

PARAMS = CommitParams(max_iter=15)


@pytest.fixture(scope="module")
def inputs(demo_dir):
    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    return dwi, load_tractogram(demo_dir / "bundles.trk", reference=(dwi.affine, dwi.shape3))


def coarse_left_half(dwi) -> RoiMask:
    """An ROI on a grid twice as coarse as the DWI's, over its left half."""
    shape = tuple(-(-n // 2) for n in dwi.shape3)
    mask = np.zeros(shape, bool)
    mask[: shape[0] // 2] = True
    return RoiMask("coarse half", mask, dwi.affine @ np.diag([2.0, 2.0, 2.0, 1.0]))


def test_a_mask_on_another_grid_is_resampled_alike_from_a_layer_and_from_a_file(inputs, demo_dir, tmp_path):
    dwi, tract = inputs
    roi = coarse_left_half(dwi)
    from_layer = filter_with_commit(dwi, tract, mask=roi, params=PARAMS, device="cpu")
    path = tmp_path / "coarse half.nii.gz"
    nib.save(nib.Nifti1Image(roi.mask.astype(np.uint8), roi.affine), str(path))
    from_file, _ = commit_from_files(demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk", mask=path, params=PARAMS,
                                     device="cpu")  # fmt: skip
    on_grid = Grid.of(dwi).resample_nearest(roi.mask, Grid.of(roi))
    assert 0 < on_grid.sum() < on_grid.size
    expected = commit_pipeline(dwi, tract, mask=on_grid, params=PARAMS, device="cpu")
    np.testing.assert_allclose(from_layer.weights, expected.weights, rtol=0, atol=1e-10)
    np.testing.assert_allclose(from_file.weights, expected.weights, rtol=0, atol=1e-10)
    for result, name in ((from_layer, "coarse half"), (from_file, str(path))):
        assert f"{name}: on another grid than the DWI series; resampled (nearest neighbour)" in result.notes


def test_a_mask_on_the_dwi_grid_is_used_as_it_is(inputs):
    dwi, tract = inputs
    mask = np.zeros(dwi.shape3, bool)
    mask[dwi.shape3[0] // 2 :] = True
    result = filter_with_commit(dwi, tract, mask=RoiMask("right", mask, dwi.affine), params=PARAMS, device="cpu")
    expected = commit_pipeline(dwi, tract, mask=mask, params=PARAMS, device="cpu")
    np.testing.assert_array_equal(result.weights, expected.weights)
    assert not any("resampled" in note for note in result.notes)


def test_refusals_say_what_is_missing(inputs, tmp_path):
    dwi, tract = inputs
    with pytest.raises(InputError, match="Open a DWI series first"):
        check_commit_inputs(None, tract)
    with pytest.raises(InputError, match="Open or track a tractogram first"):
        check_commit_inputs(dwi, None)
    empty = RoiMask("nothing painted", np.zeros(dwi.shape3, bool), dwi.affine)
    with pytest.raises(InputError, match="nothing painted: the white-matter mask is empty"):
        check_commit_inputs(dwi, tract, mask=empty)
    far = np.eye(4)
    far[:3, 3] = 10_000.0  # mm: nowhere near the DWI
    outside = RoiMask("far away", np.ones((4, 4, 4), bool), far)
    with pytest.raises(InputError, match="far away: the white-matter mask lies outside the DWI series's volume"):
        filter_with_commit(dwi, tract, mask=outside, params=PARAMS, device="cpu")


def message_of(capsys, argv) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip().split("error: ", 1)[1]


def test_the_window_and_the_command_say_the_same(inputs, demo_dir, tmp_path, capsys):
    """The messages of the use case are the command's, word for word."""
    dwi, tract = inputs
    empty_path = tmp_path / "empty.trk"
    nothing = Tractogram(np.zeros((0, 3), np.float32), np.zeros(1, np.int64), dwi.affine, dwi.shape3)
    save_tractogram(nothing, empty_path)
    common = ["commit", "--dwi", str(demo_dir / "dwi.nii.gz"), "--device", "cpu", "-o", str(tmp_path / "out")]
    cli = message_of(capsys, [*common, "--tractogram", str(empty_path)])
    with pytest.raises(InputError) as caught:
        check_commit_inputs(dwi, load_tractogram(empty_path, reference=(dwi.affine, dwi.shape3)),
                            tractogram_name=str(empty_path))  # fmt: skip
    assert str(caught.value) == cli and "0 streamlines" in cli

    missing = tmp_path / "no peaks.nii.gz"
    cli = message_of(capsys, [*common, "--tractogram", str(demo_dir / "bundles.trk"), "--peaks", str(missing)])
    with pytest.raises(InputError) as caught:
        check_commit_inputs(dwi, tract, peaks=missing)
    assert str(caught.value) == cli and "peaks file not found" in cli
