"""The DICOM objects of an export for navigation (see :mod:`.dicom_export`): SEG, RTSTRUCT and
the derived image series, each in the reference series' study and frame of reference.

* SEG: highdicom's :class:`highdicom.seg.Segmentation`, binary, one segment per structure.
* RTSTRUCT: highdicom does not write RT Structure Sets and rt-utils needs OpenCV (a second
  copy of Qt beside PySide6), so the dataset is assembled with pydicom; the outlines are the
  0.5 iso-lines of each slice's mask, traced by contourpy (matplotlib's contour tracer). They
  pass half-way between inside and outside voxel centres, so the contour rasterised back (a
  voxel is inside when its centre is) gives the mask again.
* Overlay: the reference images with each structure blended in its colour, as RGB Secondary
  Capture images on the reference geometry, "not for diagnosis" in the series description.

``deidentify`` empties the patient's name and ID (and removes birth date, sex, accession
number, referring physician, institution), marking the object ``PatientIdentityRemoved``.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from .dicom_series import require

RTSTRUCT_STORAGE = "1.2.840.10008.5.1.4.1.1.481.3"
SECONDARY_CAPTURE_STORAGE = "1.2.840.10008.5.1.4.1.1.7"
STUDY_COMPONENT_MANAGEMENT = "1.2.840.10008.3.1.2.3.1"
NOT_FOR_DIAGNOSIS = "not for diagnosis"
#: Opacity of a structure's colour over the grey image in the overlay series.
OVERLAY_ALPHA = 0.55
PATIENT_EMPTIED = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "AccessionNumber",
                   "ReferringPhysicianName", "StudyID")  # fmt: skip
PATIENT_REMOVED = ("OtherPatientIDs", "OtherPatientIDsSequence", "OtherPatientNames", "PatientAddress",
                   "PatientAge", "PatientWeight", "PatientSize", "PatientTelephoneNumbers", "InstitutionName",
                   "InstitutionAddress", "PerformingPhysicianName", "OperatorsName", "PatientComments")  # fmt: skip
PATIENT_STUDY = ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "StudyInstanceUID", "StudyDate",
                 "StudyTime", "StudyID", "AccessionNumber", "ReferringPhysicianName", "StudyDescription")  # fmt: skip


def _version() -> str:
    from ... import __version__

    return __version__


def deidentify(ds) -> None:
    """Empty or remove the patient's identifiers in ``ds`` (the UIDs stay)."""
    for keyword in PATIENT_EMPTIED:
        if keyword in ds:
            setattr(ds, keyword, "")
    for keyword in PATIENT_REMOVED:
        if keyword in ds:
            delattr(ds, keyword)
    ds.PatientIdentityRemoved = "YES"
    ds.DeidentificationMethod = "TractLens: patient identifiers removed, UIDs kept"


def _new_series(ds, reference, description: str, number_offset: int) -> None:
    from pydicom.uid import generate_uid

    first = reference.first
    for keyword in PATIENT_STUDY:
        if keyword in first:
            setattr(ds, keyword, first.data_element(keyword).value)
    now = datetime.datetime.now()
    ds.SeriesInstanceUID = generate_uid()
    ds.SeriesNumber = int(first.get("SeriesNumber", 0) or 0) + number_offset
    ds.SeriesDescription = description
    ds.SeriesDate, ds.SeriesTime = now.strftime("%Y%m%d"), now.strftime("%H%M%S")
    ds.ContentDate, ds.ContentTime = ds.SeriesDate, ds.SeriesTime
    ds.FrameOfReferenceUID = reference.frame_uid
    ds.Manufacturer = "TractLens"
    ds.SoftwareVersions = _version()
    ref_series = _dataset()
    ref_series.SeriesInstanceUID = first.SeriesInstanceUID
    ref_series.ReferencedInstanceSequence = [_ref(d) for d in reference.datasets]
    ds.ReferencedSeriesSequence = [ref_series]


def _dataset():
    from pydicom.dataset import Dataset

    return Dataset()


def _ref(source, frame: int | None = None):
    item = _dataset()
    item.ReferencedSOPClassUID = source.SOPClassUID
    item.ReferencedSOPInstanceUID = source.SOPInstanceUID
    if frame is not None:  # one frame of an enhanced (multi-frame) image
        item.ReferencedFrameNumber = frame
    return item


def _save(ds, path: Path, sop_class: str) -> None:
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = ds.get("SOPInstanceUID") or generate_uid()
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta = meta
    ds.preamble = b"\0" * 128
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def _tract(structure) -> bool:
    """A bundle or one of its uncertainty envelopes (white matter to avoid), not the lesion."""
    return structure.kind in ("bundle", "envelope")


def write_seg(reference, structures, folder: Path, *, deidentify: bool = False) -> list[Path]:
    """One binary SEG with a segment per structure, frames on the reference slices."""
    hd = require("highdicom")
    from pydicom.sr.codedict import codes

    masks = np.stack([s.mask.transpose(2, 1, 0) for s in structures], axis=-1).astype(np.uint8)  # (k, rows, cols, n)
    if reference.frames is not None:  # one multi-frame source: the SEG's frames follow its frames
        by_frame = np.zeros_like(masks)
        by_frame[reference.frames] = masks
        masks = by_frame
    descriptions = [
        hd.seg.SegmentDescription(
            segment_number=i + 1,
            segment_label=s.name[:64],
            segmented_property_category=codes.SCT.Tissue if _tract(s) else codes.SCT.MorphologicallyAbnormalStructure,
            segmented_property_type=codes.SCT.WhiteMatter if _tract(s) else codes.SCT.Lesion,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC if _tract(s) else "MANUAL",
            algorithm_identification=hd.AlgorithmIdentificationSequence(
                name="TractLens tractography" + (" uncertainty envelope" if s.kind == "envelope" else ""),
                version=_version(),
                family=codes.cid7162.ArtificialIntelligence,
            )
            if _tract(s)
            else None,
        )
        for i, s in enumerate(structures)
    ]
    first = reference.first
    seg = hd.seg.Segmentation(
        source_images=reference.datasets,
        pixel_array=masks,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=descriptions,
        series_instance_uid=hd.UID(),
        series_number=int(first.get("SeriesNumber", 0) or 0) + 1000,
        sop_instance_uid=hd.UID(),
        instance_number=1,
        manufacturer="TractLens",
        manufacturer_model_name="TractLens",
        software_versions=_version(),
        device_serial_number="0",
        series_description="TractLens bundles (SEG)",
        content_label="BUNDLES",
        omit_empty_frames=False,
    )
    if deidentify:
        _deidentify(seg)
    path = folder / "SEG" / "bundles_seg.dcm"
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return [path]


def _deidentify(ds) -> None:
    deidentify(ds)


def slice_contours(mask2d: np.ndarray) -> list[np.ndarray]:
    """Closed outlines (N, 2) of a slice mask (i, j), in voxel coordinates: the 0.5 iso-lines."""
    import contourpy

    padded = np.pad(mask2d.astype(np.float64), 1)
    generator = contourpy.contour_generator(z=padded.T, line_type=contourpy.LineType.Separate)
    lines = []
    for line in generator.lines(0.5):
        line = np.asarray(line, dtype=np.float64)
        if len(line) > 1 and np.allclose(line[0], line[-1]):
            line = line[:-1]
        if len(line) >= 3:
            lines.append(line - 1.0)  # undo the padding
    return lines


def write_rtstruct(reference, structures, folder: Path, *, deidentify: bool = False) -> list[Path]:
    """One RT Structure Set: an ROI per structure, its closed planar contours slice by slice."""
    require("pydicom")
    require("contourpy")
    from pydicom.uid import generate_uid

    ds = _dataset()
    _new_series(ds, reference, "TractLens bundles (RTSTRUCT)", 1001)
    del ds.ReferencedSeriesSequence  # an RTSTRUCT refers to its images through the frame of reference
    ds.Modality = "RTSTRUCT"
    ds.SOPInstanceUID = generate_uid()
    ds.InstanceNumber = 1
    ds.StructureSetLabel = "TractLens"
    ds.StructureSetName = "bundles"
    ds.StructureSetDate, ds.StructureSetTime = ds.SeriesDate, ds.SeriesTime
    ds.ApprovalStatus = "UNAPPROVED"
    contour_images = [_ref(reference.slice_source(k), reference.slice_frame(k)) for k in range(reference.shape[2])]
    series_item = _dataset()
    series_item.SeriesInstanceUID = reference.first.SeriesInstanceUID
    series_item.ContourImageSequence = contour_images
    study_item = _dataset()
    study_item.ReferencedSOPClassUID = STUDY_COMPONENT_MANAGEMENT
    study_item.ReferencedSOPInstanceUID = reference.first.StudyInstanceUID
    study_item.RTReferencedSeriesSequence = [series_item]
    frame_item = _dataset()
    frame_item.FrameOfReferenceUID = reference.frame_uid
    frame_item.RTReferencedStudySequence = [study_item]
    ds.ReferencedFrameOfReferenceSequence = [frame_item]
    lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ reference.affine
    rois, contours, observations = [], [], []
    for number, s in enumerate(structures, start=1):
        roi = _dataset()
        roi.ROINumber = number
        roi.ReferencedFrameOfReferenceUID = reference.frame_uid
        roi.ROIName = s.name[:64]
        roi.ROIGenerationAlgorithm = "AUTOMATIC" if _tract(s) else "MANUAL"
        rois.append(roi)
        item = _dataset()
        item.ROIDisplayColor = list(s.color)
        item.ReferencedROINumber = number
        item.ContourSequence = []
        for k in range(s.mask.shape[2]):
            for line in slice_contours(s.mask[:, :, k]):
                voxel = np.column_stack([line, np.full(len(line), k), np.ones(len(line))])
                points = voxel @ lps.T
                contour = _dataset()
                contour.ContourImageSequence = [_ref(reference.slice_source(k), reference.slice_frame(k))]
                contour.ContourGeometricType = "CLOSED_PLANAR"
                contour.NumberOfContourPoints = len(points)
                contour.ContourData = [f"{v:.3f}" for v in points[:, :3].ravel()]
                item.ContourSequence.append(contour)
        contours.append(item)
        observation = _dataset()
        observation.ObservationNumber = number
        observation.ReferencedROINumber = number
        observation.RTROIInterpretedType = "AVOIDANCE" if _tract(s) else "GTV"
        observation.ROIInterpreter = ""
        observations.append(observation)
    ds.StructureSetROISequence = rois
    ds.ROIContourSequence = contours
    ds.RTROIObservationsSequence = observations
    if deidentify:
        _deidentify(ds)
    path = folder / "RTSTRUCT" / "bundles_rtstruct.dcm"
    _save(ds, path, RTSTRUCT_STORAGE)
    return [path]


def overlay_images(reference, structures) -> np.ndarray:
    """(columns, rows, slices, 3) uint8: the reference in grey (1st–99.5th percentile), each
    structure blended in its colour."""
    grey = reference.pixels()
    low, high = np.percentile(grey, [1.0, 99.5])
    grey = np.clip((grey - low) / max(high - low, 1e-6), 0, 1) * 255.0
    rgb = np.repeat(grey[..., None], 3, axis=-1)
    for s in structures:
        color = np.asarray(s.color, dtype=np.float64)
        rgb[s.mask] = (1 - OVERLAY_ALPHA) * rgb[s.mask] + OVERLAY_ALPHA * color
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def write_overlay(reference, structures, folder: Path, *, deidentify: bool = False) -> list[Path]:
    """The derived series: one RGB Secondary Capture image per reference slice, same geometry."""
    from pydicom.uid import generate_uid

    rgb = overlay_images(reference, structures)
    description = f"{reference.first.get('SeriesDescription', '')} + TractLens bundles ({NOT_FOR_DIAGNOSIS})"
    template = _dataset()
    _new_series(template, reference, description.strip()[:64], 1002)
    series_uid = template.SeriesInstanceUID
    paths = []
    for k in range(reference.shape[2]):
        source, frame = reference.slice_source(k), reference.slice_frame(k)
        ds = _dataset()
        ds.update(template)
        ds.SeriesInstanceUID = series_uid
        ds.Modality = source.get("Modality", "MR")
        ds.ConversionType = "WSD"
        ds.ImageType = ["DERIVED", "SECONDARY", "TRACTOGRAPHY"]
        ds.SOPInstanceUID = generate_uid()
        ds.InstanceNumber = k + 1
        ds.BurnedInAnnotation = "NO"
        ds.DerivationDescription = f"bundles drawn in colour over the source image; {NOT_FOR_DIAGNOSIS}"
        ds.SourceImageSequence = [_ref(source, frame)]
        ds.ReferencedSeriesSequence[0].ReferencedInstanceSequence = [_ref(source, frame)]
        for keyword, value in reference.slice_geometry(k).items():
            setattr(ds, keyword, value)
        if frame is None and "SliceLocation" in source:
            ds.SliceLocation = source.SliceLocation
        ds.Rows, ds.Columns = int(source.Rows), int(source.Columns)
        ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, "RGB", 0
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.PixelData = np.ascontiguousarray(rgb[:, :, k].transpose(1, 0, 2)).tobytes()
        if deidentify:
            _deidentify(ds)
        path = folder / "OVERLAY" / f"IM{k + 1:05d}.dcm"
        _save(ds, path, SECONDARY_CAPTURE_STORAGE)
        paths.append(path)
    return paths
