"""Registrations chained through the image they share (app.registration.compose_registrations):
T1 → DWI and T1 → MNI give DWI ↔ MNI through the T1, warps included. Points through the chain
equal composing the two by hand; atlases, MNI coordinates and apply-transform take the chain."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tests.anatomy_synth import rigid
from tractlens.app.anatomy_layers import mni_coordinate, template_registration
from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.grid import Grid
from tractlens.app.io.transforms import save_registration
from tractlens.app.registration import (
    FIXED_TO_MOVING,
    MOVING_TO_FIXED,
    ChainedRegistration,
    Registration,
    compose_registrations,
)


def _grid(shape, voxel_mm, centre=(0.0, 0.0, 0.0)) -> Grid:
    affine = np.diag([voxel_mm, voxel_mm, voxel_mm, 1.0])
    affine[:3, 3] = np.asarray(centre) - voxel_mm * (np.array(shape) - 1) / 2
    return Grid(affine, shape)


def _field(grid: Grid, amplitude_mm: float = 2.0, scale_mm: float = 25.0) -> tuple[np.ndarray, np.ndarray]:
    """A smooth displacement field on ``grid`` and its inverse (fixed-point iteration, sampled on the
    same grid), both (X, Y, Z, 3) RAS mm."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in grid.shape], indexing="ij"), -1).reshape(-1, 3)
    points = grid.to_mm(ijk)

    def w(p):
        x, y, z = (p / scale_mm).T
        return amplitude_mm * np.stack([np.sin(y) * np.cos(z), np.sin(z) * np.cos(x), np.sin(x) * np.cos(y)], 1)

    inverse = np.zeros_like(points)
    for _ in range(40):  # v(y) = -w(y + v(y))
        inverse = -w(points + inverse)
    return w(points).reshape(*grid.shape, 3), inverse.reshape(*grid.shape, 3)


@pytest.fixture(scope="module")
def case():
    """DWI (2 mm), T1 (1 mm, its own scanner placement) and MNI (2 mm): T1 → DWI rigid, T1 → MNI
    affine + warp (the template the fixed side, as ``tractlens register T1 mni`` makes it)."""
    dwi = _grid((30, 32, 28), 2.0)
    t1 = _grid((56, 60, 52), 1.0, centre=(3.0, -2.0, 1.5))
    mni = _grid((48, 56, 48), 2.0, centre=(0.0, -18.0, 8.0))
    t1_to_dwi = Registration(dwi, t1, rigid(4, -3, 6, (3.0, -2.0, 1.5)), kind="rigid", fixed_name="dwi_b0",
                             moving_name="T1w")  # fmt: skip
    warp, inverse = _field(mni)
    affine = rigid(-5, 2, 3, (1.0, 16.0, -6.0)) @ np.diag([0.95, 1.05, 0.9, 1.0])
    t1_to_mni = Registration(mni, t1, affine, warp, inverse, kind="syn", fixed_name="mni", moving_name="T1w",
                             template="mni", template_side="fixed")  # fmt: skip
    return dwi, t1, mni, t1_to_dwi, t1_to_mni


def _points(grid: Grid, n: int = 500, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return grid.to_mm(rng.uniform(0.2, 0.8, (n, 3)) * (np.array(grid.shape) - 1))


def test_points_through_a_chain_equal_the_two_registrations_composed_by_hand(case):
    dwi, _t1, mni, t1_to_dwi, t1_to_mni = case
    chain = compose_registrations([t1_to_mni, t1_to_dwi])  # data flows MNI → T1 → DWI
    assert isinstance(chain, ChainedRegistration)
    assert chain.legs == ((t1_to_mni, FIXED_TO_MOVING), (t1_to_dwi, MOVING_TO_FIXED))
    assert chain.moving is t1_to_mni.fixed and chain.fixed is t1_to_dwi.fixed
    assert (chain.moving_name, chain.fixed_name) == ("mni", "dwi_b0")
    assert chain.template == "mni" and chain.template_side == "moving" and chain.nonlinear
    p_dwi, p_mni = _points(dwi), _points(mni)
    by_hand = t1_to_mni.moving_to_fixed(t1_to_dwi.fixed_to_moving(p_dwi))  # DWI → T1 → MNI
    np.testing.assert_array_equal(chain.fixed_to_moving(p_dwi), by_hand)
    np.testing.assert_array_equal(chain.to_template(p_dwi), by_hand)
    np.testing.assert_array_equal(
        chain.moving_to_fixed(p_mni), t1_to_dwi.moving_to_fixed(t1_to_mni.fixed_to_moving(p_mni))
    )
    # there and back: within what the sampled inverse field allows (0.05 mm)
    back = chain.moving_to_fixed(chain.fixed_to_moving(p_dwi))
    assert np.abs(back - p_dwi).max() < 0.05
    assert mni_coordinate(chain, p_dwi[0]) == pytest.approx(by_hand[0])


def test_the_other_order_is_the_same_chain_walked_back(case):
    dwi, *_rest, t1_to_dwi, t1_to_mni = case
    forward = compose_registrations([t1_to_mni, t1_to_dwi])
    backward = compose_registrations([t1_to_dwi, t1_to_mni])  # DWI → T1 → MNI
    assert backward.template_side == "fixed" and backward.moving is t1_to_dwi.fixed
    p = _points(dwi)
    np.testing.assert_array_equal(backward.moving_to_fixed(p), forward.fixed_to_moving(p))
    np.testing.assert_array_equal(forward.inverted().moving_to_fixed(p), forward.fixed_to_moving(p))
    assert "mni → T1w → dwi_b0" in forward.describe() and "dwi_b0 → T1w → mni" in backward.describe()
    assert compose_registrations([t1_to_dwi]) is t1_to_dwi  # a chain of one is the registration


def test_an_atlas_through_the_chain_is_the_nearest_label_of_each_voxel_mapped_by_hand(case):
    dwi, _t1, mni, t1_to_dwi, t1_to_mni = case
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 40, mni.shape).astype(np.int32)
    chain = compose_registrations([t1_to_mni, t1_to_dwi])
    on_dwi = chain.template_to_subject(labels, mni, dwi, "nearest")
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in dwi.shape], indexing="ij"), -1).reshape(-1, 3)
    at = mni.to_voxels(t1_to_mni.moving_to_fixed(t1_to_dwi.fixed_to_moving(dwi.to_mm(ijk))))
    at = np.rint(at).astype(int)
    inside = np.all((at >= 0) & (at < mni.shape), axis=1)
    expected = np.zeros(len(ijk), np.int32)
    expected[inside] = labels[tuple(at[inside].T)]
    same = np.mean(on_dwi.ravel() == expected)
    assert same > 0.999, same  # a voxel centre on a rounding tie may go either way
    assert inside.mean() > 0.5  # the test means something: most of the DWI lies in the template grid


def test_registrations_that_share_no_image_are_refused(case):
    *_grids, t1_to_dwi, _t1_to_mni = case
    elsewhere = _grid((20, 20, 20), 3.0, centre=(200.0, 0.0, 0.0))
    other = Registration(elsewhere, _grid((10, 10, 10), 5.0, centre=(-300.0, 0, 0)), np.eye(4), fixed_name="a",
                         moving_name="b")  # fmt: skip
    with pytest.raises(InputError, match="share no image"):
        compose_registrations([t1_to_dwi, other])
    with pytest.raises(InputError, match="same two images"):
        compose_registrations([t1_to_dwi, t1_to_dwi])


def test_the_window_chains_a_t1_template_registration_with_the_t1_to_dwi_one(case):
    dwi, _t1, _mni, t1_to_dwi, t1_to_mni = case
    assert template_registration([t1_to_mni], dwi) is None  # the T1's own: not of the DWI, and nothing joins them
    chain = template_registration([t1_to_mni, t1_to_dwi], dwi)
    assert isinstance(chain, ChainedRegistration) and chain.template == "mni"
    p = _points(dwi, 20)
    np.testing.assert_array_equal(chain.to_template(p), t1_to_mni.moving_to_fixed(t1_to_dwi.fixed_to_moving(p)))


def test_apply_transform_and_atlas_take_several_registration_folders_in_order(case, tmp_path, capsys):
    dwi, _t1, mni, t1_to_dwi, t1_to_mni = case
    save_registration(t1_to_dwi, tmp_path / "t1_to_dwi", {})
    save_registration(t1_to_mni, tmp_path / "t1_to_mni", {})
    rng = np.random.default_rng(2)
    mni_image = rng.normal(100, 10, mni.shape).astype(np.float32)
    nib.save(nib.Nifti1Image(mni_image, mni.affine), tmp_path / "in_mni.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros(dwi.shape, np.float32), dwi.affine), tmp_path / "dwi.nii.gz")
    out = tmp_path / "on_dwi.nii.gz"
    code = main(["apply-transform", str(tmp_path / "in_mni.nii.gz"), "--registration", str(tmp_path / "t1_to_mni"),
                 "--registration", str(tmp_path / "t1_to_dwi"), "--reference", str(tmp_path / "dwi.nii.gz"),
                 "-o", str(out), "--interp", "nearest", "--json"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert "mni → T1w → dwi_b0" in summary["registration"]
    chain = compose_registrations([t1_to_mni, t1_to_dwi])
    written = np.asarray(nib.load(out).dataobj)
    np.testing.assert_array_equal(written, chain.pull(mni_image, mni, dwi, "fixed", "nearest"))
    # the wrong order (the images do not meet) is refused and writes nothing
    code = main(["apply-transform", str(tmp_path / "in_mni.nii.gz"), "--registration", str(tmp_path / "t1_to_dwi"),
                 "--registration", str(tmp_path / "t1_to_dwi"), "--reference", str(tmp_path / "dwi.nii.gz"),
                 "-o", str(tmp_path / "no.nii.gz")])  # fmt: skip
    assert code == 2 and "cannot be chained" in capsys.readouterr().err and not (tmp_path / "no.nii.gz").exists()

    # an atlas on the DWI through the T1: the labels the chain brings (checked by hand above)
    from tractlens.app.atlases import load_atlas

    labels, affine, _table = load_atlas("aal")
    atlas = tmp_path / "aal_on_dwi.nii.gz"
    code = main(["atlas", "aal", "--registration", str(tmp_path / "t1_to_mni"), "--registration",
                 str(tmp_path / "t1_to_dwi"), "--reference", str(tmp_path / "dwi.nii.gz"), "-o", str(atlas)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    expected = chain.template_to_subject(labels, Grid(affine, labels.shape), dwi, "nearest")
    np.testing.assert_array_equal(np.asarray(nib.load(atlas).dataobj), expected)
    assert len(np.unique(expected)) > 5  # regions of the atlas reach the DWI
