"""DICOM in: series synthesized with pydicom from arrays of known truth come back through
``import-dicom`` (dcm2niix) and through a folder given to a reader with the same voxels, world
geometry and gradient directions; a tensor fit on them equals the fit on the original; bad
input gives one clear error and writes nothing."""

from __future__ import annotations

import json
import time

import nibabel as nib
import numpy as np
import pytest

pytest.importorskip("pydicom", reason="the dicom extra is part of the test extra")  # not silent: -ra lists it
pytest.importorskip("dcm2niix")

from tests.dicom_synth import gradient_table, make_affine, tensor_signal, write_series
from tractlens.app.cli import main
from tractlens.app.errors import InputError
from tractlens.app.io import load_dwi
from tractlens.app.io.dicom_import import import_dicom
from tractlens.app.io.dicom_series import SeveralSeries, list_series

SHAPE = (10, 9, 6)
ORIENTATIONS = {
    "axial": {},
    "oblique": {"oblique_deg": 23.0},
    "left-right flipped": {"flip_lr": True},
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))


def _dwi_truth(affine):
    bvals, bvecs = gradient_table(12)
    return tensor_signal(SHAPE, bvals, bvecs, affine), bvals, bvecs


def _voxel_map(imported_affine, original_affine):
    """Original voxel indices -> imported voxel indices (dcm2niix may store the axes flipped)."""
    m = np.linalg.solve(imported_affine, original_affine)
    assert np.allclose(m[:3, :3], np.rint(m[:3, :3]), atol=1e-3), "not the same grid up to flips"
    ijk = np.indices(SHAPE).reshape(3, -1)
    return tuple(np.rint(m[:3, :3] @ ijk + m[:3, 3:]).astype(int))


def _world_directions(dwi):
    """Unit gradient directions of a loaded DWI (voxel axes) in RAS+ world space."""
    axes = dwi.affine[:3, :3] / np.linalg.norm(dwi.affine[:3, :3], axis=0)
    return dwi.bvecs @ axes.T


@pytest.mark.parametrize("orientation", list(ORIENTATIONS))
def test_imported_dwi_equals_the_original_in_voxels_geometry_and_world_gradients(tmp_path, orientation):
    affine = make_affine(**ORIENTATIONS[orientation])
    signal, bvals, bvecs = _dwi_truth(affine)
    write_series(tmp_path / "dicom", signal, affine, bvals=bvals, bvecs_world=bvecs, description="ep2d_diff")
    assert main(["import-dicom", str(tmp_path / "dicom"), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    nifti = tmp_path / "out" / "sub-PID12345" / "dwi" / "sub-PID12345_dwi.nii.gz"  # the patient ID, alphanumeric
    img = nib.load(nifti)
    index = _voxel_map(img.affine, affine)
    data = np.asarray(img.dataobj)
    assert np.array_equal(data[index].reshape(-1, len(bvals)), signal.reshape(-1, len(bvals)))
    corners = np.array([[0, 0, 0, 1], [SHAPE[0] - 1, SHAPE[1] - 1, SHAPE[2] - 1, 1]], float).T
    assert np.allclose(img.affine @ np.vstack([np.array(index)[:, [0, -1]], [1, 1]]), affine @ corners, atol=1e-3)
    dwi = load_dwi(nifti)
    np.testing.assert_allclose(dwi.bvals, bvals, atol=1e-3)
    world = _world_directions(dwi)
    dw = bvals > 0
    np.testing.assert_allclose(np.abs(np.sum(world[dw] * bvecs[dw], axis=1)), 1.0, atol=1e-4)
    sidecar = json.loads((nifti.parent / "sub-PID12345_dwi.json").read_text())
    assert sidecar["FrameOfReferenceUID"] and sidecar["SeriesDescription"] == "ep2d_diff"


def test_tensor_fit_on_a_dicom_folder_equals_the_fit_on_the_original(tmp_path):
    """The folder itself goes where a DWI NIfTI goes (converted on the fly into the cache)."""
    from tractlens.app.io.dwi import save_gradients
    from tractlens.app.io.nifti import save_volume
    from tractlens.app.pipelines.dti import fit_dti_pipeline

    affine = make_affine(oblique_deg=15.0)
    signal, bvals, bvecs = _dwi_truth(affine)
    write_series(tmp_path / "dicom", signal, affine, bvals=bvals, bvecs_world=bvecs)
    save_volume(signal, affine, tmp_path / "orig.nii.gz")
    axes = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    save_gradients(bvals, bvecs @ axes, affine, tmp_path / "orig.bval", tmp_path / "orig.bvec")  # world -> voxel
    original = fit_dti_pipeline(load_dwi(tmp_path / "orig.nii.gz"), device="cpu")
    from_dicom = load_dwi(tmp_path / "dicom")
    assert str(tmp_path / "cache") in from_dicom.path  # converted into the private cache
    imported = fit_dti_pipeline(from_dicom, device="cpu")
    index = _voxel_map(from_dicom.affine, affine)
    for name in ("fa", "md"):
        np.testing.assert_allclose(imported.map(name)[index].ravel(), original.map(name).ravel(), atol=1e-5)
    world_orig = _world_tensors(original.map("tensor"), affine)
    world_imp = _world_tensors(imported.map("tensor")[index].reshape(*SHAPE, 6), from_dicom.affine)
    np.testing.assert_allclose(world_imp, world_orig, atol=2e-6)  # mm²/s: diffusivities ~1e-3
    assert (original.map("fa") > 0.5).mean() > 0.5  # anisotropic tensors: the directions were tested


def _world_tensors(tensor6, affine):
    """Tensors (xx, xy, xz, yy, yz, zz in voxel axes) as 3×3 matrices in world axes."""
    t = np.asarray(tensor6, dtype=np.float64)
    m = t[..., [0, 1, 2, 1, 3, 4, 2, 4, 5]].reshape(*t.shape[:-1], 3, 3)
    axes = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    return axes @ m @ axes.T


def test_cache_is_reused_and_renewed_when_a_file_changes(tmp_path):
    affine = make_affine()
    volume = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) % 97
    write_series(tmp_path / "t1", volume, affine, description="T1w MPRAGE")
    from tractlens.app.io.nifti import load_volume

    first = load_volume(tmp_path / "t1")
    np.testing.assert_array_equal(np.sort(first.data.ravel()), np.sort(volume.ravel()))
    entries = list((tmp_path / "cache" / "dicom").iterdir())
    assert len(entries) == 1
    stamp = (entries[0] / "series.nii.gz").stat().st_mtime_ns
    load_volume(tmp_path / "t1")
    assert (entries[0] / "series.nii.gz").stat().st_mtime_ns == stamp  # read from the cache
    time.sleep(0.01)
    write_series(tmp_path / "t1", volume * 2, affine, description="T1w MPRAGE")  # the same files rewritten
    again = load_volume(tmp_path / "t1")
    assert again.data.max() == pytest.approx(volume.max() * 2)


def test_enhanced_multiframe_series_lists_as_one_multiframe_series(tmp_path):
    """highdicom's legacy converter makes an Enhanced MR image of a classic series."""
    hd = pytest.importorskip("highdicom")
    import pydicom

    affine = make_affine()
    volume = (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 50 * 10).astype(np.float32)
    write_series(tmp_path / "classic", volume, affine, description="T1w")
    datasets = [pydicom.dcmread(p) for p in sorted((tmp_path / "classic").iterdir())]
    enhanced = hd.legacy.LegacyConvertedEnhancedMRImage(
        legacy_datasets=datasets, series_instance_uid=hd.UID(), series_number=5, sop_instance_uid=hd.UID(),
        instance_number=1,
    )  # fmt: skip
    (tmp_path / "enhanced").mkdir()
    enhanced.save_as(tmp_path / "enhanced" / "mf.dcm")
    listed = list_series(tmp_path / "enhanced")
    assert len(listed) == 1 and listed[0].multiframe and listed[0].slices == SHAPE[2]
    out = import_dicom(tmp_path / "enhanced", tmp_path / "out")
    img = nib.load(out[0].nifti)
    index = _voxel_map(img.affine, affine)
    np.testing.assert_array_equal(np.asarray(img.dataobj)[index].ravel(), volume.ravel())


def _two_series(tmp_path, *, dwi_twice=False, gradients=True):
    affine = make_affine()
    signal, bvals, bvecs = _dwi_truth(affine)
    folder = tmp_path / "cd"
    write_series(folder, signal, affine, bvals=bvals, bvecs_world=bvecs, series_number=3, gradients=gradients)
    second = signal if dwi_twice else signal[..., 0]
    write_series(folder, second, affine, bvals=bvals if dwi_twice else None, bvecs_world=bvecs, series_number=4,
                 description="DWI b1000 repeat" if dwi_twice else "T1w")  # fmt: skip
    return folder


def test_several_dwi_series_are_listed_and_chosen_with_series(tmp_path, capsys):
    folder = _two_series(tmp_path, dwi_twice=True)
    with pytest.raises(SeveralSeries) as caught:
        import_dicom(folder, tmp_path / "out")
    assert "3 " in str(caught.value) and "4 " in str(caught.value) and "--series" in caught.value.fix
    assert not (tmp_path / "out" / "dwi").exists()
    assert main(["import-dicom", str(folder), "-o", str(tmp_path / "out"), "--quiet"]) == 2
    assert "several diffusion series" in capsys.readouterr().err
    assert main(["import-dicom", str(folder), "-o", str(tmp_path / "out"), "--series", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [c["number"] for c in summary["converted"]] == [4]
    assert len(summary["found"]) == 2


@pytest.mark.parametrize(
    "problem",
    ["no dicom", "no gradients", "missing slices"],
)
def test_bad_dicom_input_is_one_clear_error_and_nothing_written(tmp_path, problem):
    folder = tmp_path / "cd"
    affine = make_affine()
    signal, bvals, bvecs = _dwi_truth(affine)
    if problem == "no dicom":
        folder.mkdir()
        (folder / "README.txt").write_text("patient CD")
        expected = "no DICOM files"
    elif problem == "no gradients":
        write_series(folder, signal, affine, bvals=bvals, bvecs_world=bvecs, gradients=False, description="DTI_30dir")
        expected = "no gradient information"
    else:
        write_series(folder, signal[..., 0], affine, skip_slices=(3,), description="T1w")
        expected = "missing"
    with pytest.raises(InputError) as caught:
        import_dicom(folder, tmp_path / "out")
    assert expected in str(caught.value) and caught.value.fix
    assert not list((tmp_path / "out").rglob("*.nii.gz")) if (tmp_path / "out").exists() else True
    assert not [p for p in (tmp_path / "out").rglob("*")] if (tmp_path / "out").exists() else True


def _t1_and_dwi(folder, *, patient_id="PID-12345", second_patient=None):
    affine = make_affine()
    signal, bvals, bvecs = _dwi_truth(affine)
    write_series(folder, signal, affine, bvals=bvals, bvecs_world=bvecs, series_number=3, patient_id=patient_id)
    write_series(folder, signal[..., 0], affine, series_number=4, description="T1w",
                 patient_id=second_patient or patient_id)  # fmt: skip


def _imported(out):
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.nii.gz"))


@pytest.mark.parametrize(
    ("patient_id", "options", "subject"),
    [
        ("PID-12345", [], "PID12345"),  # the patient ID, letters and digits only
        ("PID-12345", ["--subject", "P042"], "P042"),
        ("PID-12345", ["--subject", "sub-7"], "7"),
        ("", [], "01"),  # no patient ID
        ("-_. ", [], "01"),  # nothing alphanumeric in it
        ("PID-12345", ["--deidentify"], "01"),
        ("PID-12345", ["--deidentify", "--subject", "A1"], "A1"),
    ],
)
def test_import_names_the_subject_after_the_patient_id_or_the_subject_given(tmp_path, patient_id, options, subject):
    _t1_and_dwi(tmp_path / "cd", patient_id=patient_id)
    out = tmp_path / "out"
    assert main(["import-dicom", str(tmp_path / "cd"), "-o", str(out), "--quiet", *options]) == 0
    assert _imported(out) == [
        f"sub-{subject}/anat/sub-{subject}_T1w.nii.gz",
        f"sub-{subject}/dwi/sub-{subject}_dwi.nii.gz",
    ]


def test_deidentified_import_leaves_the_patient_fields_out_of_every_file(tmp_path):
    import gzip

    _t1_and_dwi(tmp_path / "cd")
    out = tmp_path / "kept"
    assert main(["import-dicom", str(tmp_path / "cd"), "-o", str(out), "--quiet"]) == 0
    kept = json.loads((out / "sub-PID12345" / "dwi" / "sub-PID12345_dwi.json").read_text())
    assert kept["PatientID"] == "PID-12345" and "Doe" in kept["PatientName"]  # the report prints them
    out = tmp_path / "anonymous"
    assert main(["import-dicom", str(tmp_path / "cd"), "-o", str(out), "--quiet", "--deidentify"]) == 0
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) == 6  # T1 .nii.gz + .json, DWI .nii.gz + .bval + .bvec + .json
    for path in files:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        assert b"Doe" not in raw and b"PID" not in raw and b"19700101" not in raw, path.name
    sidecar = json.loads((out / "sub-01" / "dwi" / "sub-01_dwi.json").read_text())
    assert not {"PatientName", "PatientID", "PatientBirthDate"} & set(sidecar)
    assert sidecar["FrameOfReferenceUID"] and sidecar["SeriesInstanceUID"]  # an export still refers back


def test_bad_subject_label_and_several_patients_are_refused_and_nothing_written(tmp_path, capsys):
    _t1_and_dwi(tmp_path / "cd")
    out = tmp_path / "out"
    assert main(["import-dicom", str(tmp_path / "cd"), "-o", str(out), "--quiet", "--subject", "P-42"]) == 2
    assert "not a BIDS subject label" in capsys.readouterr().err
    _t1_and_dwi(tmp_path / "two", second_patient="OTHER-1")
    assert main(["import-dicom", str(tmp_path / "two"), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "several patients" in err and "OTHER1" in err and "--subject" in err
    assert not out.exists() or not list(out.rglob("*.nii.gz"))


def test_several_patients_are_refused_when_deidentified_and_named_when_merged(tmp_path, capsys, caplog):
    """De-identified, two patients' series went silently into sub-01; --subject puts them under one
    label on purpose (one patient under two IDs) and the IDs are named in a warning."""
    _t1_and_dwi(tmp_path / "two", second_patient="OTHER-1")
    out = tmp_path / "out"
    assert main(["import-dicom", str(tmp_path / "two"), "-o", str(out), "--quiet", "--deidentify"]) == 2
    assert "several patients" in capsys.readouterr().err
    assert not out.exists() or not list(out.rglob("*.nii.gz"))
    with caplog.at_level("WARNING", logger="tractlens"):
        assert main(["import-dicom", str(tmp_path / "two"), "-o", str(out), "--quiet", "--subject", "P42"]) == 0
    assert any("2 patient IDs" in r.getMessage() and "OTHER1" in r.getMessage() for r in caplog.records)
