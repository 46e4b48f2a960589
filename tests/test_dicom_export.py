"""DICOM out: bundles exported on a synthesized reference series come back equal to the masks
they were made from (SEG read with highdicom; RTSTRUCT contours rasterised within a voxel at
the border), refer to the source study, series and frame of reference, lose the patient's name
and ID with --deidentify, and bad input is one clear error with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
hd = pytest.importorskip("highdicom")

from nibabel.streamlines import Tractogram, save  # noqa: E402
from scipy import ndimage  # noqa: E402

from tests.dicom_synth import gradient_table, make_affine, tensor_signal, write_series  # noqa: E402
from tractlens.app.cli import main  # noqa: E402

SHAPE = (12, 10, 6)
AFFINE = make_affine(spacing=(2.0, 2.0, 2.5), oblique_deg=20.0)
STUDY, FRAME = "1.2.826.0.1.3680043.8.498.1001", "1.2.826.0.1.3680043.8.498.1002"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))


def _mm(voxels):
    voxels = np.asarray(voxels, dtype=np.float64)
    return (voxels @ AFFINE[:3, :3].T + AFFINE[:3, 3]).astype(np.float32)


@pytest.fixture
def case(tmp_path):
    """A reference T1 series, two bundles whose voxels are known, a lesion mask."""
    return make_case(tmp_path)


def make_case(tmp_path) -> dict:
    """What :func:`case` gives (also for other test modules)."""
    t1 = (np.indices(SHAPE).sum(axis=0) * 20 + 100).astype(np.float32)
    reference = tmp_path / "T1"
    uids = write_series(reference, t1, AFFINE, description="T1w MPRAGE", series_number=2, study_uid=STUDY,
                        frame_uid=FRAME)  # fmt: skip
    line = _mm([[i, 4, 2] for i in np.linspace(1, 7, 13)])  # along i through voxel centres: (1..7, 4, 2)
    tube = [_mm([[x, j, z] for j in np.linspace(2, 8, 4)]) for x in (8, 9, 10) for z in (3, 4)]  # skips voxels
    save(Tractogram([line], affine_to_rasmm=np.eye(4)), str(tmp_path / "line.tck"))
    save(Tractogram(tube, affine_to_rasmm=np.eye(4)), str(tmp_path / "tube.tck"))
    expected = {"line": np.zeros(SHAPE, bool), "tube": np.zeros(SHAPE, bool), "lesion": np.zeros(SHAPE, bool)}
    expected["line"][1:8, 4, 2] = True
    expected["tube"][8:11, 2:9, 3:5] = True  # the 2-voxel steps between points are filled in
    expected["lesion"][2:5, 6:9, 1:4] = True
    from tractlens.app.io.nifti import save_volume

    save_volume(expected["lesion"].astype(np.uint8), AFFINE, tmp_path / "lesion.nii.gz")
    return {"dir": tmp_path, "reference": reference, "uids": uids, "expected": expected, "t1": t1}


def _export(case, *extra):
    d = case["dir"]
    args = ["export-dicom", str(d / "line.tck"), str(d / "tube.tck"), "--lesion", str(d / "lesion.nii.gz")]
    return main([*args, "--reference", str(case["reference"]), "-o", str(d / "out"), "--quiet", "--json", *extra])


def _sorted_reference(case):
    datasets = [pydicom.dcmread(p) for p in sorted(case["reference"].iterdir())]
    return sorted(datasets, key=lambda ds: int(ds.InstanceNumber))  # written bottom to top


def test_seg_read_back_with_highdicom_equals_each_bundle_mask(case, capsys):
    assert _export(case) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in summary["structures"]] == ["line", "tube", "lesion"]
    seg = hd.seg.segread(summary["files"]["seg"][0])
    sources = [ds.SOPInstanceUID for ds in _sorted_reference(case)]
    pixels = seg.get_pixels_by_source_instance(source_sop_instance_uids=sources, segment_numbers=[1, 2, 3])
    for n, name in enumerate(("line", "tube", "lesion")):
        assert seg.get_segment_description(n + 1).segment_label == name
        np.testing.assert_array_equal(pixels[..., n].transpose(2, 1, 0).astype(bool), case["expected"][name])


def _rasterise(rtstruct, roi_number, case):
    """An ROI's contours back onto the reference grid: a voxel is inside when its centre is inside
    an odd number of the slice's contours (holes are contours inside contours)."""
    from matplotlib.path import Path as Polygon

    lps_to_voxel = np.linalg.inv(np.diag([-1.0, -1.0, 1.0, 1.0]) @ AFFINE)
    mask = np.zeros(SHAPE, dtype=bool)
    ii, jj = np.meshgrid(np.arange(SHAPE[0]), np.arange(SHAPE[1]), indexing="ij")
    centres = np.column_stack([ii.ravel(), jj.ravel()])
    item = next(c for c in rtstruct.ROIContourSequence if c.ReferencedROINumber == roi_number)
    for contour in item.ContourSequence:
        points = np.asarray(contour.ContourData, dtype=np.float64).reshape(-1, 3)
        voxel = np.column_stack([points, np.ones(len(points))]) @ lps_to_voxel.T
        k = int(np.rint(voxel[:, 2].mean()))
        assert np.allclose(voxel[:, 2], k, atol=1e-3)  # planar, on a reference slice
        inside = Polygon(voxel[:, :2]).contains_points(centres).reshape(ii.shape)
        mask[:, :, k] ^= inside
    return mask


def test_rtstruct_contours_rasterised_back_equal_the_masks_within_a_voxel_at_the_border(case, capsys):
    assert _export(case, "--as", "rtstruct") == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["files"]) == {"rtstruct"}
    rtstruct = pydicom.dcmread(summary["files"]["rtstruct"][0])
    names = {roi.ROINumber: roi.ROIName for roi in rtstruct.StructureSetROISequence}
    assert list(names.values()) == ["line", "tube", "lesion"]
    for number, name in names.items():
        truth = case["expected"][name]
        back = _rasterise(rtstruct, number, case)
        border = ndimage.binary_dilation(truth) & ~ndimage.binary_erosion(truth)
        assert not np.any((back ^ truth) & ~border), name
        assert (back ^ truth).sum() <= 0.1 * truth.sum(), name


def test_every_object_refers_to_the_source_study_series_and_frame_of_reference(case, capsys):
    assert _export(case) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    series_uid = case["uids"]["series"]
    seg = pydicom.dcmread(files["seg"][0])
    rt = pydicom.dcmread(files["rtstruct"][0])
    overlay = [pydicom.dcmread(p) for p in files["overlay"]]
    for ds in (seg, rt, *overlay):
        assert ds.StudyInstanceUID == STUDY and ds.FrameOfReferenceUID == FRAME
        assert ds.PatientName == "Doe^Jane" and ds.PatientID == "PID-12345"  # copied from the source
        assert ds.SeriesInstanceUID != series_uid  # a new series of the same study
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == series_uid
    frame = rt.ReferencedFrameOfReferenceSequence[0]
    assert frame.FrameOfReferenceUID == FRAME
    assert frame.RTReferencedStudySequence[0].ReferencedSOPInstanceUID == STUDY
    assert frame.RTReferencedStudySequence[0].RTReferencedSeriesSequence[0].SeriesInstanceUID == series_uid
    assert len(overlay) == SHAPE[2] and "not for diagnosis" in overlay[0].SeriesDescription
    assert all(ds.ReferencedSeriesSequence[0].SeriesInstanceUID == series_uid for ds in overlay)
    sources = {ds.SOPInstanceUID for ds in _sorted_reference(case)}
    assert {ds.SourceImageSequence[0].ReferencedSOPInstanceUID for ds in overlay} == sources
    # the coloured voxels are where the bundles are, grey elsewhere
    by_source = {ds.SourceImageSequence[0].ReferencedSOPInstanceUID: ds for ds in overlay}
    ref = _sorted_reference(case)
    rgb = np.stack([by_source[ds.SOPInstanceUID].pixel_array.transpose(1, 0, 2) for ds in ref], axis=2)
    coloured = (rgb.max(axis=-1).astype(int) - rgb.min(axis=-1)) > 10
    union = case["expected"]["line"] | case["expected"]["tube"] | case["expected"]["lesion"]
    np.testing.assert_array_equal(coloured, union)


def test_deidentify_leaves_no_patient_name_or_id(case, capsys):
    assert _export(case, "--deidentify") == 0
    out = case["dir"] / "out"
    files = [p for p in out.rglob("*.dcm")]
    assert len(files) == 2 + SHAPE[2]
    for path in files:
        raw = path.read_bytes()
        assert b"Doe" not in raw and b"PID-12345" not in raw and b"19700101" not in raw
        ds = pydicom.dcmread(path)
        assert not str(ds.get("PatientName", "")) and not ds.get("PatientID", "")
        assert ds.PatientIdentityRemoved == "YES" and ds.StudyInstanceUID == STUDY


def test_dilate_grows_a_bundle_by_the_given_distance(case, capsys):
    d = case["dir"]
    args = ["export-dicom", str(d / "line.tck"), "--reference", str(case["reference"]), "--as", "seg"]
    assert main([*args, "--dilate", "2", "-o", str(d / "out"), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # 7 voxels along i; 2 mm reaches the j neighbours (2 mm) and the ends (2 mm), not k (2.5 mm)
    assert summary["structures"][0]["voxels"] == 7 * 3 + 2


def test_reference_in_another_frame_of_reference_is_refused_and_nothing_written(case, capsys):
    dwi = case["dir"] / "DWI"
    bvals, bvecs = gradient_table(8)
    write_series(dwi, tensor_signal(SHAPE, bvals, bvecs, AFFINE), AFFINE, bvals=bvals, bvecs_world=bvecs,
                 study_uid=STUDY)  # fmt: skip  # a new frame of reference
    assert _export(case, "--dwi", str(dwi)) == 2
    err = capsys.readouterr().err
    assert "another frame of reference" in err and "same session" in err
    assert not (case["dir"] / "out").exists() or not any((case["dir"] / "out").iterdir())


def test_export_into_a_folder_with_an_earlier_export_keeps_it_and_writes_nothing(case, capsys):
    assert _export(case, "--as", "seg") == 0
    first = sorted(p.stat().st_mtime_ns for p in (case["dir"] / "out").rglob("*"))
    capsys.readouterr()
    assert _export(case) == 2
    assert "exists already" in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in (case["dir"] / "out").rglob("*")) == first
    assert not (case["dir"] / "out" / "RTSTRUCT").exists()


def test_report_section_lists_each_object_with_its_uids_the_reference_de_identification_and_dilation(case, capsys):
    from types import SimpleNamespace

    from tractlens.app.report_data import export_rows, export_summary, navigation_exports

    assert _export(case, "--dilate", "2", "--deidentify") == 0
    summary = json.loads(capsys.readouterr().out)
    layers = [SimpleNamespace(provenance={"dicom_export": summary}) for _ in range(2)]  # two bundles, one export
    layers.append(SimpleNamespace(provenance={"file": "t1.nii.gz"}))
    exports = navigation_exports(SimpleNamespace(layers=layers))
    assert exports == [summary]
    line = export_summary(summary)
    assert '"T1w MPRAGE"' in line and case["uids"]["series"] in line
    assert "de-identified: yes" in line and "dilation 2 mm" in line and str(case["dir"] / "out") in line
    rows = export_rows(summary)
    assert [row[0] for row in rows] == ["Segmentation (SEG)", "RT Structure Set (RTSTRUCT)",
                                        "coloured series (overlay, not for diagnosis)"]  # fmt: skip
    for row, kind in zip(rows, ("seg", "rtstruct")):
        written = pydicom.dcmread(summary["files"][kind][0])
        assert row[1] == str(next((case["dir"] / "out").rglob(f"*{kind}.dcm")).relative_to(case["dir"] / "out"))
        assert row[2] == written.SeriesInstanceUID and row[3] == written.SOPInstanceUID
    overlay = [pydicom.dcmread(p) for p in summary["files"]["overlay"]]
    assert rows[2][1] == f"OVERLAY/ ({SHAPE[2]} files)" and rows[2][2] == overlay[0].SeriesInstanceUID
    assert rows[2][3].startswith(f"{SHAPE[2]} instances: {overlay[0].SOPInstanceUID} …")
    assert rows[2][3].endswith(overlay[-1].SOPInstanceUID)


def test_enhanced_multiframe_reference_exports_seg_rtstruct_and_overlay_on_its_frames(case, capsys):
    """The T1 as one Enhanced MR image (highdicom's legacy converter): SEG frames follow the
    source frames, contours and overlay images name their frame and lie on its plane."""
    legacy = sorted(_sorted_reference(case), key=lambda ds: -int(ds.InstanceNumber))
    enhanced = hd.legacy.LegacyConvertedEnhancedMRImage(
        legacy_datasets=legacy, series_instance_uid=hd.UID(), series_number=7, sop_instance_uid=hd.UID(),
        instance_number=1,
    )  # fmt: skip
    folder = case["dir"] / "T1mf"
    folder.mkdir()
    enhanced.save_as(folder / "mf.dcm")
    case = {**case, "reference": folder}
    assert _export(case) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["reference"]["series_instance_uid"] == enhanced.SeriesInstanceUID
    source = pydicom.dcmread(folder / "mf.dcm")
    frames = source.PerFrameFunctionalGroupsSequence
    lps_to_voxel = np.linalg.inv(np.diag([-1.0, -1.0, 1.0, 1.0]) @ AFFINE)
    positions = [[*f.PlanePositionSequence[0].ImagePositionPatient, 1.0] for f in frames]
    k_of_frame = [int(np.rint(lps_to_voxel[2] @ np.asarray(p, float))) for p in positions]  # the slice of each frame
    assert sorted(k_of_frame) == list(range(SHAPE[2]))
    seg = hd.seg.segread(summary["files"]["seg"][0])
    numbers = list(range(1, len(frames) + 1))
    pixels = seg.get_pixels_by_source_frame(source_sop_instance_uid=source.SOPInstanceUID,
                                            source_frame_numbers=numbers, segment_numbers=[1, 2, 3])  # fmt: skip
    for n, name in enumerate(("line", "tube", "lesion")):
        back = np.zeros(SHAPE, bool)
        for f in range(len(frames)):
            back[:, :, k_of_frame[f]] = pixels[f, ..., n].T.astype(bool)
        np.testing.assert_array_equal(back, case["expected"][name])
    rtstruct = pydicom.dcmread(summary["files"]["rtstruct"][0])
    for number, name in {roi.ROINumber: roi.ROIName for roi in rtstruct.StructureSetROISequence}.items():
        truth, back = case["expected"][name], _rasterise(rtstruct, number, case)
        border = ndimage.binary_dilation(truth) & ~ndimage.binary_erosion(truth)
        assert not np.any((back ^ truth) & ~border), name
    for item in rtstruct.ROIContourSequence[0].ContourSequence:
        image = item.ContourImageSequence[0]
        assert image.ReferencedSOPInstanceUID == source.SOPInstanceUID and 1 <= image.ReferencedFrameNumber <= SHAPE[2]
    overlay = [pydicom.dcmread(p) for p in summary["files"]["overlay"]]
    assert sorted(ds.SourceImageSequence[0].ReferencedFrameNumber for ds in overlay) == numbers
    by_frame = {ds.SourceImageSequence[0].ReferencedFrameNumber: ds for ds in overlay}
    for f in numbers:
        position = frames[f - 1].PlanePositionSequence[0].ImagePositionPatient
        np.testing.assert_allclose(by_frame[f].ImagePositionPatient, position, atol=1e-4)
        rgb = by_frame[f].pixel_array.transpose(1, 0, 2)
        coloured = (rgb.max(axis=-1).astype(int) - rgb.min(axis=-1)) > 10
        union = case["expected"]["line"] | case["expected"]["tube"] | case["expected"]["lesion"]
        np.testing.assert_array_equal(coloured, union[:, :, k_of_frame[f - 1]])


def test_an_empty_bundle_is_left_out_with_a_warning_and_alone_is_refused(case, capsys, caplog):
    """``bundles`` writes an empty .trx for a bundle nothing reached: exporting the whole folder
    leaves it out (as a bundle outside the series), it does not abort the export."""
    d = case["dir"]
    save(Tractogram([], affine_to_rasmm=np.eye(4)), str(d / "empty.tck"))
    with caplog.at_level("WARNING", logger="tractlens"):
        assert main(["export-dicom", str(d / "line.tck"), str(d / "empty.tck"), str(d / "tube.tck"), "--lesion",
                     str(d / "lesion.nii.gz"), "--reference", str(case["reference"]), "-o", str(d / "out"),
                     "--quiet", "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in summary["structures"]] == ["line", "tube", "lesion"]
    assert any("empty.tck holds no streamlines" in r.getMessage() for r in caplog.records)
    code = main(["export-dicom", str(d / "empty.tck"), "--reference", str(case["reference"]), "-o",
                 str(d / "out2"), "--quiet"])  # fmt: skip
    assert code == 2 and "0 streamlines" in capsys.readouterr().err and not (d / "out2").exists()


def test_a_bundle_partly_outside_the_series_is_clipped_with_a_warning(case, capsys, caplog):
    d = case["dir"]
    beyond = _mm([[i, 4, 2] for i in np.linspace(1, SHAPE[0] + 6, 40)])  # its last points beyond the series
    save(Tractogram([beyond], affine_to_rasmm=np.eye(4)), str(d / "long.tck"))
    with caplog.at_level("WARNING", logger="tractlens"):
        assert main(["export-dicom", str(d / "long.tck"), "--reference", str(case["reference"]), "-o",
                     str(d / "out"), "--quiet", "--json"]) == 0  # fmt: skip
    [warning] = [r.getMessage() for r in caplog.records if "lie outside the reference series" in r.getMessage()]
    assert "long" in warning and "clipped" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="tractlens"):
        assert main(["export-dicom", str(d / "line.tck"), str(d / "tube.tck"), "--reference", str(case["reference"]),
                     "-o", str(d / "out_inside"), "--quiet", "--json"]) == 0  # fmt: skip
    assert not [r for r in caplog.records if "lie outside" in r.getMessage()]  # bundles inside: no warning


def test_the_fraction_outside_is_the_same_counted_a_chunk_at_a_time(monkeypatch):
    from tractlens.app.grid import Grid
    from tractlens.app.io import dicom_export

    grid = Grid(AFFINE, SHAPE)
    points = grid.to_mm(np.random.default_rng(3).uniform(-3, 14, size=(1001, 3)))
    whole = dicom_export._fraction_outside(points, grid)
    monkeypatch.setattr(dicom_export, "OUTSIDE_CHUNK", 7)
    assert dicom_export._fraction_outside(points, grid) == pytest.approx(whole, abs=1e-12) and 0 < whole < 1
    assert dicom_export._fraction_outside(points[:0], grid) == 0.0
