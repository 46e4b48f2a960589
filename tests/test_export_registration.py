"""export-dicom --registration: bundles and a lesion of the diffusion space placed on a reference series
of another frame of reference through a registration (the patient moved between the series)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
hd = pytest.importorskip("highdicom")

from nibabel.streamlines import Tractogram, save  # noqa: E402

from tests.anatomy_synth import rigid  # noqa: E402
from tests.dicom_synth import make_affine, write_series  # noqa: E402
from tractlens.app.cli import main  # noqa: E402
from tractlens.app.grid import Grid  # noqa: E402
from tractlens.app.io.nifti import save_volume  # noqa: E402
from tractlens.app.io.transforms import save_registration  # noqa: E402
from tractlens.app.registration import Registration  # noqa: E402

SHAPE = (12, 10, 6)
AFFINE = make_affine(spacing=(2.0, 2.0, 2.5), oblique_deg=20.0)
MOVED = rigid(4, -3, 6, (9.0, -6.0, 4.0))  # a diffusion-space point -> the same anatomy in the series' frame


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))


def _to_dwi(voxels_of_reference):
    mm = np.asarray(voxels_of_reference, float) @ AFFINE[:3, :3].T + AFFINE[:3, 3]
    inverse = np.linalg.inv(MOVED)
    return (mm @ inverse[:3, :3].T + inverse[:3, 3]).astype(np.float32)


@pytest.fixture
def case(tmp_path):
    t1 = (np.indices(SHAPE).sum(axis=0) * 20 + 100).astype(np.float32)
    reference = tmp_path / "T1"
    write_series(reference, t1, AFFINE, description="T1w other session", study_uid="1.2.3.4", frame_uid="1.2.3.5")
    line = _to_dwi([[i, 4, 2] for i in np.linspace(1, 7, 13)])
    save(Tractogram([line], affine_to_rasmm=np.eye(4)), str(tmp_path / "line.tck"))
    dwi_grid = Grid(np.linalg.inv(MOVED) @ AFFINE, SHAPE)  # the DWI: the same voxels, where the patient was then
    lesion = np.zeros(SHAPE, np.uint8)
    lesion[2:5, 6:9, 1:4] = 1
    save_volume(lesion, dwi_grid.affine, tmp_path / "lesion_dwi.nii.gz")
    reg = Registration(dwi_grid, Grid(AFFINE, SHAPE), MOVED, kind="rigid", fixed_name="dwi", moving_name="T1")
    save_registration(reg, tmp_path / "reg", {})
    return tmp_path


def test_bundles_and_lesion_land_on_the_series_of_another_frame_through_the_registration(case, capsys):
    args = [
        "export-dicom",
        str(case / "line.tck"),
        "--lesion",
        str(case / "lesion_dwi.nii.gz"),
        "--reference",
        str(case / "T1"),
        "--registration",
        str(case / "reg"),
        "-o",
        str(case / "out"),
        "--as",
        "seg",
        "--json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "rigid" in summary["registration"] and "T1" in summary["registration"]
    seg = hd.seg.segread(summary["files"]["seg"][0])
    datasets = sorted(
        (pydicom.dcmread(p) for p in sorted((case / "T1").iterdir())), key=lambda ds: int(ds.InstanceNumber)
    )
    pixels = seg.get_pixels_by_source_instance(source_sop_instance_uids=[ds.SOPInstanceUID for ds in datasets],
                                               segment_numbers=[1, 2])  # fmt: skip
    line = np.zeros(SHAPE, bool)
    line[1:8, 4, 2] = True
    lesion = np.zeros(SHAPE, bool)
    lesion[2:5, 6:9, 1:4] = True
    np.testing.assert_array_equal(pixels[..., 0].transpose(2, 1, 0).astype(bool), line)
    np.testing.assert_array_equal(pixels[..., 1].transpose(2, 1, 0).astype(bool), lesion)


def test_without_the_registration_the_other_frame_is_refused_naming_the_option(case, capsys, tmp_path):
    from tests.dicom_synth import gradient_table, tensor_signal

    bvals, bvecs = gradient_table(8)
    write_series(case / "DWI", tensor_signal(SHAPE, bvals, bvecs, AFFINE), AFFINE, bvals=bvals, bvecs_world=bvecs,
                 study_uid="1.2.3.4")  # fmt: skip
    args = ["export-dicom", str(case / "line.tck"), "--reference", str(case / "T1"), "--dwi", str(case / "DWI"),
            "-o", str(case / "out2")]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "another frame of reference" in err and "--registration" in err
    assert not (case / "out2").exists() or not any((case / "out2").iterdir())


def test_a_registration_of_other_images_is_refused(case, capsys):
    other = Grid(np.diag([3.0, 3, 3, 1]), (8, 8, 8))
    save_registration(Registration(other, other, np.eye(4)), case / "reg_other", {})
    args = ["export-dicom", str(case / "line.tck"), "--reference", str(case / "T1"), "--registration",
            str(case / "reg_other"), "-o", str(case / "out3")]  # fmt: skip
    assert main(args) == 2
    assert "neither image of the registration" in capsys.readouterr().err
    assert not (case / "out3").exists() or not any((case / "out3").iterdir())
