"""DICOM Tractography Results (``export-dicom --as tractography``): the IOD's required modules and
attributes, one track set per bundle with its colour, per-point FA and per-track length, in the
reference's study and frame of reference, read back into the input streamlines within float32;
a reference in another frame of reference is refused, naming --registration. Envelope levels
go into SEG and RTSTRUCT named with their level."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
hd = pytest.importorskip("highdicom")

from nibabel.streamlines import Tractogram  # noqa: E402

from tests.dicom_synth import gradient_table, tensor_signal, write_series  # noqa: E402
from tests.test_dicom_export import AFFINE, FRAME, SHAPE, STUDY, _mm, _sorted_reference, make_case  # noqa: E402
from tractlens.app.cli import main  # noqa: E402
from tractlens.app.io.dicom_export import PALETTE  # noqa: E402
from tractlens.app.io.dicom_tractography import (  # noqa: E402
    REQUIRED,
    TRACK_REQUIRED,
    TRACK_SET_REQUIRED,
    TRACTOGRAPHY_RESULTS_STORAGE,
    dicom_lab_to_rgb,
    read_tractography,
    rgb_to_dicom_lab,
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def case(tmp_path):
    """The export tests' reference series, bundles and lesion (:func:`tests.test_dicom_export.make_case`)."""
    return make_case(tmp_path)


def _bundles(case):
    """Two bundles as .trk with per-point FA (the trackers' output) and their streamlines in mm."""
    rng = np.random.default_rng(0)
    lines = {
        "line": [_mm([[i, 4, 2] for i in np.linspace(1, 7, 13)]), _mm([[i, 5, 3] for i in np.linspace(1, 6, 9)])],
        "tube": [_mm([[x, j, 3.3] for j in np.linspace(2, 8, 7)]) for x in (8.2, 9.1, 10.4)],
    }
    fa = {name: [rng.random(len(s)).astype(np.float32) for s in streams] for name, streams in lines.items()}
    for name, streams in lines.items():
        tract = Tractogram(streams, data_per_point={"fa": [f[:, None] for f in fa[name]]}, affine_to_rasmm=np.eye(4))
        header = {"voxel_to_rasmm": AFFINE, "dimensions": SHAPE, "voxel_sizes": (2.0, 2.0, 2.5), "voxel_order": "RAS"}
        nib.streamlines.save(tract, str(case["dir"] / f"{name}_fa.trk"), header=header)
    return lines, fa


def _export_tracts(case, *extra):
    d = case["dir"]
    args = ["export-dicom", str(d / "line_fa.trk"), str(d / "tube_fa.trk"), "--as", "tractography"]
    return main([*args, "--reference", str(case["reference"]), "-o", str(d / "out"), "--quiet", "--json", *extra])


def test_tractography_results_hold_every_required_module_and_read_back_equal(case, capsys):
    lines, fa = _bundles(case)
    assert _export_tracts(case) == 0
    summary = json.loads(capsys.readouterr().out)
    path = summary["files"]["tractography"][0]
    ds = pydicom.dcmread(path)
    assert ds.SOPClassUID == TRACTOGRAPHY_RESULTS_STORAGE == "1.2.840.10008.5.1.4.1.1.66.6"
    assert ds.file_meta.MediaStorageSOPClassUID == TRACTOGRAPHY_RESULTS_STORAGE
    for module, keywords in REQUIRED.items():
        for keyword in keywords:
            assert keyword in ds, (module, keyword)
    for keyword in ("SOPInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID", "InstanceNumber", "ContentLabel",
                    "ContentDate", "ContentTime", "Manufacturer", "ManufacturerModelName", "DeviceSerialNumber",
                    "SoftwareVersions", "SeriesNumber", "Modality"):  # fmt: skip
        assert str(ds.data_element(keyword).value) != "", keyword  # type 1: a value
    assert ds.Modality == "MR"
    # In the source study and the reference's frame of reference; the reference images referenced.
    reference = _sorted_reference(case)
    assert ds.StudyInstanceUID == STUDY and ds.FrameOfReferenceUID == FRAME
    assert ds.SeriesInstanceUID != reference[0].SeriesInstanceUID
    assert {r.ReferencedSOPInstanceUID for r in ds.ReferencedInstanceSequence} == {r.SOPInstanceUID for r in reference}
    assert ds.ReferencedSeriesSequence[0].SeriesInstanceUID == reference[0].SeriesInstanceUID
    # One track set per bundle, with its colour, FA per point and length per track.
    assert [str(s.TrackSetLabel) for s in ds.TrackSetSequence] == ["line_fa", "tube_fa"]
    for number, item in enumerate(ds.TrackSetSequence, start=1):
        assert item.TrackSetNumber == number
        for keyword in TRACK_SET_REQUIRED:
            assert keyword in item, keyword
        for track in item.TrackSequence:
            for keyword in TRACK_REQUIRED:
                assert keyword in track
        assert item.DiffusionModelCodeSequence[0].CodingSchemeDesignator == "DCM"
        assert item.TrackingAlgorithmIdentificationSequence[0].AlgorithmFamilyCodeSequence[0].CodeValue == "113211"
        assert item.MeasurementsSequence[0].ConceptNameCodeSequence[0].CodeValue == "110808"
        assert len(item.MeasurementsSequence[0].MeasurementValuesSequence) == len(item.TrackSequence)
    sets = read_tractography(path)
    for track_set, name, colour in zip(sets, ("line", "tube"), PALETTE):
        assert max(abs(a - b) for a, b in zip(track_set.color, colour)) <= 1  # CIELab round trip
        back = track_set.streamlines()
        assert len(back) == len(lines[name])
        for got, want in zip(back, lines[name]):
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, np.abs(want).max()))  # float32
        np.testing.assert_allclose(track_set.fa, np.concatenate(fa[name]), rtol=1e-6)
        expected_length = [np.linalg.norm(np.diff(s.astype(np.float64), axis=0), axis=1).sum() for s in lines[name]]
        np.testing.assert_allclose(track_set.lengths_mm, expected_length, rtol=1e-5)


def test_colours_convert_to_cielab_and_back():
    for rgb in [(0, 0, 0), (255, 255, 255), (230, 159, 0), (86, 180, 233), (255, 0, 0)]:
        lab = rgb_to_dicom_lab(rgb)
        assert all(0 <= v <= 65535 for v in lab)
        assert max(abs(a - b) for a, b in zip(dicom_lab_to_rgb(lab), rgb)) <= 1
    assert rgb_to_dicom_lab((255, 255, 255))[0] == 65535  # L* 100


def test_tractography_in_another_frame_of_reference_is_refused_naming_registration(case, capsys):
    _bundles(case)
    dwi = case["dir"] / "DWI"
    bvals, bvecs = gradient_table(8)
    write_series(dwi, tensor_signal(SHAPE, bvals, bvecs, AFFINE), AFFINE, bvals=bvals, bvecs_world=bvecs,
                 study_uid=STUDY)  # fmt: skip  # a new frame of reference
    assert _export_tracts(case, "--dwi", str(dwi)) == 2
    err = capsys.readouterr().err
    assert "another frame of reference" in err and "--registration" in err
    assert not (case["dir"] / "out").exists() or not any((case["dir"] / "out").iterdir())


def test_tractography_without_tractograms_is_refused(case, capsys, tmp_path):
    env = tmp_path / "env"
    paths = np.zeros(SHAPE)
    paths[2:6, 3:6, 2:4] = np.arange(24).reshape(4, 3, 2) + 1
    prob = tmp_path / "prob"
    prob.mkdir()
    nib.save(nib.Nifti1Image(paths.astype(np.float32), AFFINE), prob / "fdt_paths.nii.gz")
    (prob / "waytotal").write_text("9\n")
    assert main(["envelopes", str(prob), "-o", str(env), "--quiet"]) == 0
    args = ["export-dicom", "--envelopes", str(env), "--as", "tractography", "--reference", str(case["reference"])]
    assert main([*args, "-o", str(tmp_path / "out"), "--quiet"]) == 2
    assert "tractography writes streamlines" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_envelope_levels_export_as_seg_segments_and_rtstruct_rois_named_with_their_level(case, capsys, tmp_path):
    from tractlens.app.pipelines.envelope_files import read_envelopes

    rng = np.random.default_rng(2)
    paths = np.zeros(SHAPE)
    paths[2:9, 3:7, 1:5] = rng.integers(1, 40, (7, 4, 4))
    prob = tmp_path / "CST"
    prob.mkdir()
    nib.save(nib.Nifti1Image(paths.astype(np.float32), AFFINE), prob / "fdt_paths.nii.gz")
    (prob / "waytotal").write_text("40\n")
    env = tmp_path / "envelopes" / "CST"
    assert main(["envelopes", str(prob), "--levels", "50,90,95", "-o", str(env), "--quiet"]) == 0
    capsys.readouterr()
    d = case["dir"]
    args = ["export-dicom", str(d / "line.tck"), "--envelopes", str(env), "--as", "seg,rtstruct"]
    assert main([*args, "--reference", str(case["reference"]), "-o", str(d / "out"), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    names = ["line", "CST envelope 50 %", "CST envelope 90 %", "CST envelope 95 %"]
    assert [s["name"] for s in summary["structures"]] == names
    seg = hd.seg.segread(summary["files"]["seg"][0])
    sources = [ds.SOPInstanceUID for ds in _sorted_reference(case)]
    pixels = seg.get_pixels_by_source_instance(source_sop_instance_uids=sources, segment_numbers=[1, 2, 3, 4])
    envelopes = read_envelopes(env).envelopes
    for n, envelope in enumerate(envelopes, start=1):
        assert seg.get_segment_description(n + 1).segment_label == names[n]
        np.testing.assert_array_equal(pixels[..., n].transpose(2, 1, 0).astype(bool), envelope.mask)  # same grid
    rtstruct = pydicom.dcmread(summary["files"]["rtstruct"][0])
    assert [roi.ROIName for roi in rtstruct.StructureSetROISequence] == names
    kinds = [o.RTROIInterpretedType for o in rtstruct.RTROIObservationsSequence]
    assert kinds == ["AVOIDANCE"] * 4
