"""File formats: every bad input gives an InputError that names the file, the problem and the fix."""

import gzip
import shutil

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import (
    fsl_to_voxel_vectors,
    load_bedpostx,
    load_dwi,
    load_mask,
    load_tensor,
    load_tractogram,
    save_tensor,
    save_tractogram,
    save_volume,
)
from tractlens.app.io._atomic import atomic_path
from tractlens.app.model import Tractogram, Volume
from tractlens.gpu import sym3


@pytest.fixture
def dwi_copy(demo_dir, tmp_path):
    for name in ("dwi.nii.gz", "dwi.bval", "dwi.bvec"):
        shutil.copy(demo_dir / name, tmp_path / name)
    return tmp_path


def test_dwi_loads_with_gradient_files_found_beside_it(dwi_copy):
    dwi = load_dwi(dwi_copy / "dwi.nii.gz")
    assert dwi.data.shape == (56, 56, 24, 68) and dwi.data.dtype == np.float32
    assert dwi.b0_mask.sum() == 4 and dwi.warnings == []
    np.testing.assert_allclose(np.linalg.norm(dwi.bvecs[~dwi.b0_mask], axis=1), 1, atol=1e-6)


def test_fsl_bvals_bvecs_names_are_found(dwi_copy):
    (dwi_copy / "dwi.bval").rename(dwi_copy / "bvals")
    (dwi_copy / "dwi.bvec").rename(dwi_copy / "bvecs")
    assert load_dwi(dwi_copy / "dwi.nii.gz").bvals.shape == (68,)


def test_bvecs_are_flipped_to_voxel_axes_for_positive_determinant(dwi_copy):
    file_bvecs = np.loadtxt(dwi_copy / "dwi.bvec").T
    dwi = load_dwi(dwi_copy / "dwi.nii.gz")
    assert np.linalg.det(dwi.affine[:3, :3]) > 0
    np.testing.assert_allclose(dwi.bvecs[:, 0], -file_bvecs[:, 0], atol=1e-7)
    np.testing.assert_allclose(dwi.bvecs[:, 1:], file_bvecs[:, 1:], atol=1e-7)
    radiological = np.diag([-2.0, 2, 2, 1])
    np.testing.assert_array_equal(fsl_to_voxel_vectors(file_bvecs, radiological), file_bvecs)


def _expect_error(match, *args, **kwargs):
    with pytest.raises(InputError, match=match) as info:
        load_dwi(*args, **kwargs)
    message = str(info.value)
    assert "Traceback" not in message and message.endswith(".")
    return info.value


def test_mismatched_bval_count(dwi_copy):
    np.savetxt(dwi_copy / "short.bval", np.loadtxt(dwi_copy / "dwi.bval")[None, :-1], fmt="%g")
    err = _expect_error(r"67 b-values for 68 volumes", dwi_copy / "dwi.nii.gz", bval=dwi_copy / "short.bval")
    assert err.path.endswith("short.bval") and "belongs to this series" in str(err)


def test_mismatched_bvec_count(dwi_copy):
    np.savetxt(dwi_copy / "short.bvec", np.loadtxt(dwi_copy / "dwi.bvec")[:, :-2])
    _expect_error(r"shape \(3, 66\).*68 volumes", dwi_copy / "dwi.nii.gz", bvec=dwi_copy / "short.bvec")


def test_no_b0_volume(dwi_copy):
    bvals = np.loadtxt(dwi_copy / "dwi.bval")
    bvals[bvals == 0] = 700
    np.savetxt(dwi_copy / "dwi.bval", bvals[None], fmt="%g")
    _expect_error(r"no b=0 volume", dwi_copy / "dwi.nii.gz")


def test_nearly_unit_bvecs_are_normalised_with_a_warning(dwi_copy):
    bvecs = np.loadtxt(dwi_copy / "dwi.bvec")
    bvecs[:, 10] *= 1.02
    np.savetxt(dwi_copy / "dwi.bvec", bvecs)
    dwi = load_dwi(dwi_copy / "dwi.nii.gz")
    assert any("normalised" in w for w in dwi.warnings)
    assert abs(np.linalg.norm(dwi.bvecs[10]) - 1) < 1e-12


def test_far_from_unit_bvecs_are_refused(dwi_copy):
    bvecs = np.loadtxt(dwi_copy / "dwi.bvec") * 1000
    np.savetxt(dwi_copy / "dwi.bvec", bvecs)
    _expect_error(r"not unit length", dwi_copy / "dwi.nii.gz")


def test_zero_bvec_for_weighted_volume_is_refused(dwi_copy):
    bvecs = np.loadtxt(dwi_copy / "dwi.bvec")
    bvecs[:, 20] = 0
    np.savetxt(dwi_copy / "dwi.bvec", bvecs)
    _expect_error(r"zero b-vector", dwi_copy / "dwi.nii.gz")


def test_three_d_file_given_as_dwi(tmp_path, dwi_copy):
    save_volume(np.ones((4, 4, 4)), np.eye(4), tmp_path / "fa.nii.gz")
    _expect_error(r"single 3-D volume", tmp_path / "fa.nii.gz", bval=dwi_copy / "dwi.bval", bvec=dwi_copy / "dwi.bvec")


def test_wrong_file_type_and_missing_files(tmp_path, dwi_copy):
    (tmp_path / "scan.mif").write_bytes(b"mrtrix image\n")
    _expect_error(r"not a NIfTI file.*mrconvert", tmp_path / "scan.mif")
    _expect_error(r"not found", tmp_path / "nothing.nii.gz")
    (tmp_path / "broken.nii.gz").write_bytes(gzip.compress(b"not an image at all" * 10))
    _expect_error(r"could not be read as NIfTI", tmp_path / "broken.nii.gz", bval=dwi_copy / "dwi.bval")


def test_missing_gradient_files(tmp_path, dwi_copy):
    (dwi_copy / "dwi.bvec").unlink()
    _expect_error(r"no b-values/b-vectors given.*--bval and --bvec", dwi_copy / "dwi.nii.gz")


def test_nan_voxels_load_with_a_warning(tmp_path, dwi_copy):
    img = nib.load(dwi_copy / "dwi.nii.gz")
    data = img.get_fdata(dtype=np.float32)
    data[10, 10, 10, 5] = np.nan
    data[11, 10, 10, :] = np.inf
    save_volume(data, img.affine, tmp_path / "nan.nii.gz")
    dwi = load_dwi(tmp_path / "nan.nii.gz", dwi_copy / "dwi.bval", dwi_copy / "dwi.bvec")
    assert any("2 voxel(s) contain NaN or Inf" in w for w in dwi.warnings)
    assert dwi.nonfinite_voxels == 2
    # the mean b=0 treats them as 0, whether the reading counted them or not
    b0 = np.where(np.isfinite(data), data, 0)[..., dwi.b0_mask]
    np.testing.assert_array_equal(dwi.mean_b0(), b0.mean(axis=-1))
    dwi.nonfinite_voxels = None
    np.testing.assert_array_equal(dwi.mean_b0(), b0.mean(axis=-1))
    # counted clean: the same mean without the cleaning passes
    clean = load_dwi(dwi_copy / "dwi.nii.gz", dwi_copy / "dwi.bval", dwi_copy / "dwi.bvec")
    assert clean.nonfinite_voxels == 0
    np.testing.assert_array_equal(clean.mean_b0(), np.nan_to_num(clean.data[..., clean.b0_mask]).mean(axis=-1))


def test_masks_are_checked_against_the_grid(tmp_path, demo_dir):
    ref = Volume("ref", np.zeros((56, 56, 24)), nib.load(demo_dir / "mask.nii.gz").affine)
    assert load_mask(demo_dir / "roi_arc_seed.nii.gz", ref).sum() > 0
    save_volume(np.ones((20, 20, 20), np.uint8), ref.affine, tmp_path / "small.nii.gz")
    with pytest.raises(InputError, match=r"outside the volume.*Resample"):
        load_mask(tmp_path / "small.nii.gz", ref)
    save_volume(np.zeros((56, 56, 24), np.uint8), ref.affine, tmp_path / "empty.nii.gz")
    with pytest.raises(InputError, match="empty"):
        load_mask(tmp_path / "empty.nii.gz", ref)
    shifted = ref.affine.copy()
    shifted[0, 3] += 10
    save_volume(np.ones((56, 56, 24), np.uint8), shifted, tmp_path / "shifted.nii.gz")
    with pytest.raises(InputError, match="affines differ"):
        load_mask(tmp_path / "shifted.nii.gz", ref)


AFFINES = {
    "ras": np.diag([2.0, 2.0, 2.0, 1.0]),
    "las": np.diag([-2.0, 2.0, 2.0, 1.0]),
    "oblique": np.array([[1.8, -0.5, 0.2, 3], [0.5, 1.9, 0.1, -4], [-0.1, -0.2, 2.2, 5], [0, 0, 0, 1]]),
}


@pytest.mark.parametrize("affine", AFFINES.keys())
@pytest.mark.parametrize("order", ["fsl", "dipy", "mrtrix"])
def test_tensor_round_trip_in_each_order_and_frame(tmp_path, rng, order, affine):
    aff = AFFINES[affine]
    tensor = rng.normal(size=(4, 5, 3, 6)) * 1e-3
    save_tensor(tensor, aff, tmp_path / "t.nii.gz", order=order)
    back = load_tensor(tmp_path / "t.nii.gz", order)
    np.testing.assert_allclose(back.data, tensor, atol=1e-9)  # float32 on disk
    assert back.kind == "tensor"


def test_tensor_orders_are_what_the_tools_write(tmp_path):
    internal = np.array([1, 2, 3, 4, 5, 6], float)[None, None, None] * np.ones((2, 2, 2, 1))  # xx xy xz yy yz zz
    las = AFFINES["las"]  # no frame change for fsl/dipy; world == voxel axes up to x for mrtrix
    expected = {"fsl": [1, 2, 3, 4, 5, 6], "dipy": [1, 2, 4, 3, 5, 6]}
    for order, values in expected.items():
        save_tensor(internal, las, tmp_path / f"{order}.nii.gz", order=order)
        np.testing.assert_allclose(nib.load(tmp_path / f"{order}.nii.gz").get_fdata()[0, 0, 0], values)
    save_tensor(internal, np.eye(4), tmp_path / "mrtrix.nii.gz", order="mrtrix")
    np.testing.assert_allclose(nib.load(tmp_path / "mrtrix.nii.gz").get_fdata()[0, 0, 0], [1, 4, 6, 2, 3, 5])


def test_bare_six_volume_tensor_needs_an_order(tmp_path):
    save_volume(np.zeros((3, 3, 3, 6)), np.eye(4), tmp_path / "t.nii.gz")
    with pytest.raises(InputError, match=r"--tensor-order fsl.*dipy or mrtrix"):
        load_tensor(tmp_path / "t.nii.gz")
    save_volume(np.zeros((3, 3, 3, 4)), np.eye(4), tmp_path / "four.nii.gz")
    with pytest.raises(InputError, match="must have 6 volumes"):
        load_tensor(tmp_path / "four.nii.gz", "fsl")


def test_symmatrix_intent_is_read_as_lower_triangular(tmp_path):
    data = np.zeros((2, 2, 2, 1, 6))
    data[..., :] = [1, 2, 4, 3, 5, 6]  # lower triangle row-wise: xx, yx, yy, zx, zy, zz
    img = nib.Nifti1Image(data, AFFINES["las"])
    img.header.set_intent("symmetric matrix", (3,))
    nib.save(img, tmp_path / "sym.nii.gz")
    np.testing.assert_allclose(load_tensor(tmp_path / "sym.nii.gz").data[0, 0, 0], [1, 2, 3, 4, 5, 6])


def test_dtifit_folder_from_eigenvectors(tmp_path, rng):
    aff = AFFINES["ras"]
    tensor = sym3.from_matrix(np, (lambda a: a @ np.swapaxes(a, -1, -2))(rng.normal(size=(3, 3, 2, 3, 3)) * 0.03))
    evals, evecs = np.linalg.eigh(sym3.to_matrix(np, sym3.flip_x_frame(tensor)))  # FSL frame on disk
    for i in range(3):
        save_volume(evecs[..., :, 2 - i], aff, tmp_path / f"dti_V{i + 1}.nii.gz")
        save_volume(evals[..., 2 - i], aff, tmp_path / f"dti_L{i + 1}.nii.gz")
    loaded = load_tensor(tmp_path)
    np.testing.assert_allclose(loaded.data, tensor, atol=1e-6)
    with pytest.raises(InputError, match="no dtifit output"):
        load_tensor(tmp_path / "..")


@pytest.mark.parametrize("suffix", [".trk", ".trx", ".tck"])
def test_tractogram_round_trip_keeps_points_and_scalars(tmp_path, rng, suffix):
    aff = AFFINES["oblique"]
    lines = [rng.uniform(0, 20, size=(n, 3)) for n in (5, 1, 17, 3)]
    tract = Tractogram.from_list(
        lines,
        affine=aff,
        dimensions=(20, 20, 20),
        point_scalars={"fa": rng.uniform(size=26)},
        streamline_scalars={"cm": np.array([0.1, 0.2, 0.3, 0.4])},
    )
    path = save_tractogram(tract, tmp_path / f"t{suffix}")
    back = load_tractogram(path, reference=(aff, (20, 20, 20)))
    assert len(back) == 4 and back.source == str(path) and tract.source == ""
    np.testing.assert_array_equal(back.lengths, [5, 1, 17, 3])
    np.testing.assert_allclose(back.points, tract.points, atol=2e-4)
    np.testing.assert_allclose(back.affine, aff, atol=1e-5)
    # .tck: the scalars come back from their MRtrix side files (.tsf, .txt; issue 27), no longer dropped
    np.testing.assert_allclose(back.point_scalars["fa"], tract.point_scalars["fa"], atol=1e-6)
    np.testing.assert_allclose(back.streamline_scalars["cm"], [0.1, 0.2, 0.3, 0.4], atol=1e-6)
    assert back.dimensions == (20, 20, 20)


def test_tractogram_errors(tmp_path):
    with pytest.raises(InputError, match=r"unknown tractogram format \.vtk"):
        load_tractogram(tmp_path / "a.vtk")
    (tmp_path / "bad.trk").write_bytes(b"garbage" * 100)
    with pytest.raises(InputError, match=r"could not be read as a \.trk"):
        load_tractogram(tmp_path / "bad.trk")


def _write_bedpostx(folder, shape=(4, 4, 3), fibres=2, samples=5, rng=None):
    folder.mkdir()
    aff = AFFINES["las"]
    save_volume(np.ones(shape, np.uint8), aff, folder / "nodif_brain_mask.nii.gz")
    for i in range(1, fibres + 1):
        for name in ("th", "ph", "f"):
            save_volume(rng.uniform(0, 1, (*shape, samples)), aff, folder / f"merged_{name}{i}samples.nii.gz")
    return folder


def test_bedpostx_folder_is_read(tmp_path, rng):
    folder = _write_bedpostx(tmp_path / "s.bedpostX", rng=rng)
    samples = load_bedpostx(folder)
    assert samples.theta.shape == (4, 4, 3, 2, 5) and samples.n_fibres == 2 and samples.n_samples == 5
    (folder / "merged_ph2samples.nii.gz").unlink()
    with pytest.raises(InputError, match="merged_ph2samples is missing"):
        load_bedpostx(folder)
    with pytest.raises(InputError, match="not a bedpostX output"):
        load_bedpostx(tmp_path)


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.nii.gz"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []
    save_volume(np.ones((2, 2, 2)), np.eye(4), target)
    assert [p.name for p in tmp_path.iterdir()] == ["out.nii.gz"]


def test_nifti2_and_uncompressed_dwi_load_the_same(tmp_path, dwi_copy):
    img = nib.load(dwi_copy / "dwi.nii.gz")
    nib.save(nib.Nifti2Image(np.asanyarray(img.dataobj), img.affine), tmp_path / "n2.nii")
    a = load_dwi(dwi_copy / "dwi.nii.gz")
    b = load_dwi(tmp_path / "n2.nii", dwi_copy / "dwi.bval", dwi_copy / "dwi.bvec")
    np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(a.bvecs, b.bvecs)


def test_label_volumes(tmp_path, demo_dir):
    from tractlens.app.io import load_labels

    labels = load_labels(demo_dir / "labels.nii.gz")
    assert labels.dtype == np.int32 and set(np.unique(labels)) == {0, 1, 2, 3, 4, 5}
    save_volume(np.full((3, 3, 3), 0.5), np.eye(4), tmp_path / "prob.nii.gz")
    with pytest.raises(InputError, match="whole numbers"):
        load_labels(tmp_path / "prob.nii.gz")


def test_unreadable_gradient_tables(dwi_copy):
    (dwi_copy / "dwi.bval").write_text("0 1000 b=2000\n")
    _expect_error(r"could not be read as b-values", dwi_copy / "dwi.nii.gz")


# ---------------------------------------------------------------------------------------------
# corrupted inputs, one by one (tests/test_fuzz_loaders.py mutates them at random)


def _nifti_file(path, array, *, affine=None, fields=None, compress=None):
    """Write ``array`` as NIfTI-1, then overwrite raw header ``fields`` (name -> value or {index: value})."""
    from nibabel.nifti1 import header_dtype

    affine = np.diag([2.0, 2.0, 2.0, 1.0]) if affine is None else affine
    img = nib.Nifti1Image(array, affine, dtype=array.dtype)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    blob = bytearray(img.to_bytes())
    for name, value in (fields or {}).items():
        dtype, offset = header_dtype.fields[name][:2]
        element = dtype.base if dtype.subdtype else dtype
        for index, item in value.items() if isinstance(value, dict) else [(0, value)]:
            start = offset + index * element.itemsize
            blob[start : start + element.itemsize] = np.array(item, dtype=element).tobytes()
    compress = str(path).endswith(".gz") if compress is None else compress
    path.write_bytes(gzip.compress(bytes(blob)) if compress else bytes(blob))
    return path


def test_truncated_and_foreign_nifti_files(tmp_path):
    from tractlens.app.io import load_volume

    noise = np.random.default_rng(0).random((8, 8, 6)).astype(np.float32)  # does not compress
    whole = _nifti_file(tmp_path / "whole.nii", noise)
    (tmp_path / "cut.nii").write_bytes(whole.read_bytes()[:1000])
    with pytest.raises(InputError, match=r"cut\.nii: the file is truncated.*1536 bytes"):
        load_volume(tmp_path / "cut.nii")
    compressed = gzip.compress(whole.read_bytes())
    (tmp_path / "cut.nii.gz").write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(InputError, match=r"cut\.nii\.gz: the image data could not be read"):
        load_volume(tmp_path / "cut.nii.gz")
    _nifti_file(tmp_path / "magic.nii", np.ones((8, 8, 6), np.float32), fields={"magic": b"abc\x00"})
    with pytest.raises(InputError, match=r"magic\.nii: could not be read as NIfTI"):
        load_volume(tmp_path / "magic.nii")


def test_absurd_dimensions_are_refused_before_reading(tmp_path):
    """A damaged header announcing 32767^3 voxels must not make the loader allocate 140 TB."""
    from tractlens.app.io import load_volume

    _nifti_file(
        tmp_path / "huge.nii.gz", np.ones((8, 8, 6), np.float32), fields={"dim": {1: 32767, 2: 32767, 3: 32767}}
    )
    with pytest.raises(InputError, match=r"huge\.nii\.gz: the header announces .* more than a .*\.nii\.gz can hold"):
        load_volume(tmp_path / "huge.nii.gz")
    _nifti_file(tmp_path / "zero.nii", np.ones((8, 8, 6), np.float32), fields={"dim": {2: 0}})
    with pytest.raises(InputError, match=r"zero\.nii: .*size \(8, 0, 6\): every dimension must be at least 1"):
        load_volume(tmp_path / "zero.nii")
    _nifti_file(tmp_path / "complex.nii", np.ones((8, 8, 6), np.complex64))
    with pytest.raises(InputError, match=r"complex64 values"):
        load_volume(tmp_path / "complex.nii")


def test_singular_or_missing_geometry(tmp_path):
    from tractlens.app.io import load_volume

    data = np.ones((8, 8, 6), np.float32)
    _nifti_file(tmp_path / "flat.nii", data, fields={"srow_z": {2: 0.0}})  # the sform says z has no extent
    with pytest.raises(InputError, match=r"flat\.nii: .*transform is singular"):
        load_volume(tmp_path / "flat.nii")
    _nifti_file(tmp_path / "nan.nii", data, fields={"srow_x": {0: np.nan}})
    with pytest.raises(InputError, match=r"nan\.nii: .*not a finite 4x4"):
        load_volume(tmp_path / "nan.nii")
    # no sform/qform: the voxel sizes define the geometry, and NaN ones cannot
    _nifti_file(tmp_path / "pix.nii", data, fields={"sform_code": 0, "qform_code": 0, "pixdim": {1: np.nan}})
    with pytest.raises(InputError, match=r"pix\.nii: .*voxel-to-world"):
        load_volume(tmp_path / "pix.nii")
    # negative voxel sizes are a known writer slip that nibabel repairs (absolute value): loads
    _nifti_file(tmp_path / "neg.nii", data, fields={"sform_code": 0, "qform_code": 0, "pixdim": {1: -2.0}})
    np.testing.assert_allclose(np.abs(np.diag(load_volume(tmp_path / "neg.nii").affine))[:3], [2, 2, 2])
    # and a zero one is repaired to 1 mm (nibabel logs it): still an invertible geometry
    _nifti_file(tmp_path / "nil.nii", data, fields={"sform_code": 0, "qform_code": 0, "pixdim": {1: 0.0}})
    np.testing.assert_allclose(np.abs(np.diag(load_volume(tmp_path / "nil.nii").affine))[:3], [1, 2, 2])


def test_two_d_images_are_not_volumes(tmp_path):
    from tractlens.app.io import load_volume

    _nifti_file(tmp_path / "slice.nii.gz", np.ones((8, 8), np.float32))
    with pytest.raises(InputError, match=r"slice\.nii\.gz: the volume must be a 3-D or 4-D image.*\(8, 8\)"):
        load_volume(tmp_path / "slice.nii.gz")
    with pytest.raises(InputError, match=r"the mask must be a 3-D image"):
        load_mask(tmp_path / "slice.nii.gz")


def test_nan_and_huge_values_in_masks_and_labels(tmp_path):
    from tractlens.app.io import load_labels, load_volume

    values = np.zeros((4, 4, 4), np.float32)
    values[1, 1, 1] = 1
    values[2, 2, 2] = np.nan
    _nifti_file(tmp_path / "m.nii", values)
    assert load_mask(tmp_path / "m.nii").sum() == 1  # NaN is outside
    assert np.isnan(load_volume(tmp_path / "m.nii").data[2, 2, 2])  # a scalar map keeps it
    with pytest.raises(InputError, match="non-negative whole numbers"):
        load_labels(tmp_path / "m.nii")
    big = np.zeros((4, 4, 4), np.int64)
    big[0, 0, 0] = 2**31 - 1
    _nifti_file(tmp_path / "max.nii", big)
    assert load_labels(tmp_path / "max.nii").max() == 2**31 - 1
    big[0, 0, 0] = 2**40
    _nifti_file(tmp_path / "big.nii", big)
    with pytest.raises(InputError, match=r"big\.nii: label values must be below 2\^31"):
        load_labels(tmp_path / "big.nii")


def _trk_bytes(tmp_path):
    tract = Tractogram.from_list([np.ones((3, 3)), np.full((4, 3), 2.0)], affine=np.diag([2.0, 2, 2, 1]))
    tract.dimensions = (8, 8, 8)
    save_tractogram(tract, tmp_path / "seed.trk")
    return bytearray((tmp_path / "seed.trk").read_bytes())


def test_damaged_trk_headers_and_records(tmp_path):
    import struct

    cases = {}
    blob = _trk_bytes(tmp_path)
    singular = blob.copy()
    singular[440:504] = np.zeros((4, 4), np.float32).tobytes()
    singular[440 + 60 : 504] = np.float32(1).tobytes()  # [3, 3] = 1: "recorded", but all zero
    cases["singular"] = (singular, r"transform is (singular|not a finite)|could not be read")
    negative = blob.copy()
    negative[1000:1004] = struct.pack("<i", -5)
    cases["negative"] = (negative, r"streamline 1 announces -5 points")
    huge = blob.copy()
    huge[1000:1004] = struct.pack("<i", 2**31 - 1)
    cases["huge"] = (huge, r"streamline 1 announces 2147483647 points")
    count = blob.copy()
    count[988:992] = struct.pack("<i", 10**9)
    cases["count"] = (count, r"announces 1000000000 streamlines")
    nan = blob.copy()
    nan[1004:1008] = np.float32(np.nan).tobytes()
    cases["nan"] = (nan, r"NaN or infinite")
    for name, (data, match) in cases.items():
        (tmp_path / f"{name}.trk").write_bytes(bytes(data))
        with pytest.raises(InputError, match=match) as info:
            load_tractogram(tmp_path / f"{name}.trk")
        assert f"{name}.trk" in str(info.value) and info.value.fix and "\n" not in str(info.value), name


def test_empty_or_odd_gradient_tables(dwi_copy, recwarn):
    (dwi_copy / "dwi.bval").write_text("")
    _expect_error(r"dwi\.bval: is empty", dwi_copy / "dwi.nii.gz")
    (dwi_copy / "dwi.bval").write_text("# comment only\n\n")
    _expect_error(r"dwi\.bval: is empty", dwi_copy / "dwi.nii.gz")
    assert not [w for w in recwarn if "loadtxt" in str(w.message) or "no data" in str(w.message)]
    (dwi_copy / "dwi.bval").write_text("0 1000\n0 1000 2000\n")
    _expect_error(r"rows have different numbers of values", dwi_copy / "dwi.nii.gz")
    (dwi_copy / "dwi.bval").write_bytes(b"\xff\xfe\x00\x01")
    _expect_error(r"not a text file", dwi_copy / "dwi.nii.gz")


def test_b0_threshold_reaches_the_gradient_check(dwi_copy):
    """A b=100 volume without a direction is a b=0 volume when the threshold says so."""
    bvals = np.loadtxt(dwi_copy / "dwi.bval")
    bvecs = np.loadtxt(dwi_copy / "dwi.bvec")
    bvals[10] = 100
    bvecs[:, 10] = 0
    np.savetxt(dwi_copy / "dwi.bval", bvals[None], fmt="%g")
    np.savetxt(dwi_copy / "dwi.bvec", bvecs)
    _expect_error(r"zero b-vector", dwi_copy / "dwi.nii.gz")  # default threshold 50
    dwi = load_dwi(dwi_copy / "dwi.nii.gz", b0_threshold=150)
    assert dwi.b0_mask[10] and not dwi.bvecs[10].any() and dwi.b0_mask.sum() == 5


def test_nifti2_gz_dwi_and_gradients_beside_an_uncompressed_nii(tmp_path, dwi_copy):
    img = nib.load(dwi_copy / "dwi.nii.gz")
    nib.save(nib.Nifti2Image(np.asanyarray(img.dataobj), img.affine), tmp_path / "n2.nii.gz")
    assert nib.load(tmp_path / "n2.nii.gz").header.sizeof_hdr == 540  # really NIfTI-2
    a = load_dwi(dwi_copy / "dwi.nii.gz")
    b = load_dwi(tmp_path / "n2.nii.gz", dwi_copy / "dwi.bval", dwi_copy / "dwi.bvec")
    np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(a.affine, b.affine)
    plain = tmp_path / "plain"
    plain.mkdir()
    nib.save(img, plain / "sub-01_dwi.nii")
    shutil.copy(dwi_copy / "dwi.bval", plain / "sub-01_dwi.bval")
    shutil.copy(dwi_copy / "dwi.bvec", plain / "sub-01_dwi.bvec")
    c = load_dwi(plain / "sub-01_dwi.nii")  # found beside it: name.bval/name.bvec for name.nii
    assert c.bval_path.endswith("sub-01_dwi.bval") and c.bvec_path.endswith("sub-01_dwi.bvec")
    np.testing.assert_array_equal(a.bvecs, c.bvecs)
