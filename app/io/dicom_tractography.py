"""DICOM Tractography Results objects (SOP Class 1.2.840.10008.5.1.4.1.1.66.6; DICOM PS3.3
A.90.1, Supplement 181): the bundles themselves, as navigation systems import them, written and
read back with pydicom (highdicom has no class for this IOD).

One object per export, in the reference series' study and frame of reference, with:

* Patient, General Study, Frame of Reference (the reference's), General and Enhanced General
  Equipment, SOP Common and Common Instance Reference modules (the reference images);
* the Tractography Results Series module (General Series, Modality ``MR``, a new series);
* the Tractography Results module: Content Identification (instance number, label,
  description, creator), content date and time, the Referenced Instance Sequence (the
  reference images) and the **Track Set Sequence**, one track set per bundle:

  - Track Set Number, Label (the bundle's name), Description, Anatomical Type (white matter),
    Diffusion Model (CID 7261) and Tracking Algorithm Identification (CID 7262 family, name,
    version);
  - the bundle's colour as Recommended Display CIELab Value (sRGB → CIE L*a*b* with the D65
    white point, encoded as DICOM scales it: L* 0..100 and a*, b* −128..127 onto 0..65535);
  - the Track Sequence: one item per streamline, its points as Point Coordinates Data
    (float32 x, y, z triplets in the patient coordinate system, LPS millimetres);
  - per-point FA, when the tractogram carries it, in the Measurements Sequence (concept
    Fractional Anisotropy, DCM 110808, no units; one Measurement Values item per track, all of
    its points, so no Track Point Index List);
  - per-track length in the Track Statistics Sequence (concept Length SCT 410668003, modifier
    Total, millimetres: the sum of the track's segment lengths; and, with FA, its mean per track).

:func:`read_tractography` reads such an object back (any writer's) into streamlines in RAS+
millimetres, colours and the per-point and per-track values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .dicom_series import require

TRACTOGRAPHY_RESULTS_STORAGE = "1.2.840.10008.5.1.4.1.1.66.6"
#: The modules of the IOD (PS3.3 A.90.1.3) and, per module, the attributes a writer must fill
#: (types 1 and 2; the tests check them).
REQUIRED = {
    "Patient": ("PatientName", "PatientID", "PatientBirthDate", "PatientSex"),
    "General Study": (
        "StudyInstanceUID",
        "StudyDate",
        "StudyTime",
        "ReferringPhysicianName",
        "StudyID",
        "AccessionNumber",
    ),
    "Tractography Results Series": ("Modality", "SeriesInstanceUID", "SeriesNumber"),
    "Frame of Reference": ("FrameOfReferenceUID", "PositionReferenceIndicator"),
    "General Equipment": ("Manufacturer",),
    "Enhanced General Equipment": ("Manufacturer", "ManufacturerModelName", "DeviceSerialNumber", "SoftwareVersions"),
    "Tractography Results": (
        "InstanceNumber",
        "ContentLabel",
        "ContentDescription",
        "ContentCreatorName",
        "ContentDate",
        "ContentTime",
        "TrackSetSequence",
        "ReferencedInstanceSequence",
    ),
    "Common Instance Reference": ("ReferencedSeriesSequence",),
    "SOP Common": ("SOPClassUID", "SOPInstanceUID"),
}
#: Required in each Track Set Sequence item (type 1) and in each Track Sequence item.
TRACK_SET_REQUIRED = ("TrackSetNumber", "TrackSetLabel", "TrackSetAnatomicalTypeCodeSequence", "TrackSequence",
                      "DiffusionModelCodeSequence", "TrackingAlgorithmIdentificationSequence")  # fmt: skip
TRACK_REQUIRED = ("PointCoordinatesData",)

RAS_TO_LPS = np.array([-1.0, -1.0, 1.0], dtype=np.float32)


# ------------------------------------------------------------------ colour
def _srgb_to_linear(c):
    c = np.asarray(c, dtype=np.float64)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


_RGB_TO_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                        [0.0193339, 0.1191920, 0.9503041]])  # fmt: skip
_D65 = np.array([0.95047, 1.0, 1.08883])


def rgb_to_dicom_lab(rgb255) -> list[int]:
    """An sRGB colour (0..255) as DICOM's Recommended Display CIELab Value (three 0..65535)."""
    xyz = _RGB_TO_XYZ @ _srgb_to_linear(np.asarray(rgb255, dtype=np.float64) / 255.0) / _D65
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    lab = np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])
    scaled = [lab[0] / 100 * 65535, (lab[1] + 128) / 255 * 65535, (lab[2] + 128) / 255 * 65535]
    return [int(np.clip(round(v), 0, 65535)) for v in scaled]


def dicom_lab_to_rgb(values) -> tuple[int, int, int]:
    """The inverse of :func:`rgb_to_dicom_lab` (sRGB 0..255, rounded)."""
    L, a, b = (
        float(values[0]) / 65535 * 100,
        float(values[1]) / 65535 * 255 - 128,
        float(values[2]) / 65535 * 255 - 128,
    )
    fy = (L + 16) / 116
    f = np.array([fy + a / 500, fy, fy - b / 200])
    xyz = np.where(f > 6 / 29, f**3, 3 * (6 / 29) ** 2 * (f - 4 / 29)) * _D65
    linear = np.clip(np.linalg.solve(_RGB_TO_XYZ, xyz), 0.0, 1.0)
    srgb = np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * linear ** (1 / 2.4) - 0.055)
    return tuple(int(np.rint(v * 255)) for v in srgb)


# ------------------------------------------------------------------ writing
@dataclass
class TrackSet:
    """One bundle: its name, colour (0..255), streamlines in RAS+ mm (flat points + offsets),
    per-point FA (or None) and per-track length (mm)."""

    name: str
    color: tuple[int, int, int]
    points_mm: np.ndarray  # (P, 3) float32
    offsets: np.ndarray  # (N + 1,) int64
    fa: np.ndarray | None = None  # (P,) float32
    lengths_mm: np.ndarray | None = field(default=None)

    def streamlines(self) -> list[np.ndarray]:
        return [self.points_mm[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]


def track_lengths_mm(points_mm: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each track's length: the sum of its segments' lengths (mm)."""
    steps = np.linalg.norm(np.diff(np.asarray(points_mm, dtype=np.float64), axis=0), axis=1)
    steps = np.concatenate([steps, [0.0]])
    ends = np.asarray(offsets)
    starts, last = ends[:-1], ends[1:] - 1  # segment i joins point i and i + 1: the last point of a track starts none
    csum = np.concatenate([[0.0], np.cumsum(steps)])
    return (csum[last] - csum[starts]).astype(np.float32)


def _code(concept):
    item = _item()
    item.CodeValue = concept.value
    item.CodingSchemeDesignator = concept.scheme_designator
    item.CodeMeaning = concept.meaning
    return item


def _item():
    from pydicom.dataset import Dataset

    return Dataset()


def _track_set(number: int, track_set: TrackSet, method: str):
    from pydicom.sr.codedict import codes

    from .dicom_objects import _version

    item = _item()
    item.TrackSetNumber = number
    item.TrackSetLabel = track_set.name[:64]
    item.TrackSetDescription = f"{track_set.name}: {len(track_set.offsets) - 1} streamlines (TractLens)"
    item.TrackSetAnatomicalTypeCodeSequence = [_code(codes.SCT.WhiteMatter)]
    item.RecommendedDisplayCIELabValue = rgb_to_dicom_lab(track_set.color)
    item.DiffusionModelCodeSequence = [_code(codes.cid7261.MultiTensor if method == "probabilistic"
                                             else codes.cid7261.SingleTensor)]  # fmt: skip
    algorithm = _item()
    algorithm.AlgorithmFamilyCodeSequence = [_code(codes.cid7262.Probabilistic if method == "probabilistic"
                                                   else codes.cid7262.Deterministic)]  # fmt: skip
    algorithm.AlgorithmName = "TractLens tractography"
    algorithm.AlgorithmVersion = _version()
    item.TrackingAlgorithmIdentificationSequence = [algorithm]
    tracks = []
    for line in track_set.streamlines():
        track = _item()
        track.PointCoordinatesData = (np.asarray(line, np.float32) * RAS_TO_LPS).astype("<f4").tobytes()
        tracks.append(track)
    item.TrackSequence = tracks
    lengths = track_set.lengths_mm
    if lengths is None:
        lengths = track_lengths_mm(track_set.points_mm, track_set.offsets)
    statistics = [_statistic(codes.SCT.Length, codes.cid7464.Total, codes.UCUM.Millimeter, lengths)]
    if track_set.fa is not None:
        fa = np.asarray(track_set.fa, dtype=np.float32)
        measurement = _item()
        measurement.ConceptNameCodeSequence = [_code(codes.DCM.FractionalAnisotropy)]
        measurement.MeasurementUnitsCodeSequence = [_code(codes.UCUM.NoUnits)]
        values = []
        for a, b in zip(track_set.offsets[:-1], track_set.offsets[1:]):
            value = _item()
            value.FloatingPointValues = fa[a:b].astype("<f4").tobytes()
            values.append(value)
        measurement.MeasurementValuesSequence = values
        item.MeasurementsSequence = [measurement]
        means = np.array([fa[a:b].mean() for a, b in zip(track_set.offsets[:-1], track_set.offsets[1:])], np.float32)
        statistics.append(_statistic(codes.DCM.FractionalAnisotropy, codes.cid7464.Mean, codes.UCUM.NoUnits, means))
    item.TrackStatisticsSequence = statistics
    return item


def _statistic(concept, modifier, units, values):
    item = _item()
    item.ConceptNameCodeSequence = [_code(concept)]
    item.ModifierCodeSequence = [_code(modifier)]
    item.MeasurementUnitsCodeSequence = [_code(units)]
    item.FloatingPointValues = np.asarray(values, dtype="<f4").tobytes()
    return item


def write_tractography(reference, track_sets: list[TrackSet], folder: Path, *, deidentify: bool = False,
                       method: str = "deterministic") -> list[Path]:  # fmt: skip
    """One Tractography Results object with a track set per bundle, in ``reference``'s study
    and frame of reference (see the module docstring)."""
    require("pydicom")
    from pydicom.uid import generate_uid

    from .dicom_objects import _deidentify, _new_series, _ref, _save

    ds = _item()
    _new_series(ds, reference, "TractLens tracts (Tractography Results)", 1003)
    ds.Modality = "MR"
    for keyword in REQUIRED["Patient"] + REQUIRED["General Study"]:
        if keyword not in ds:
            setattr(ds, keyword, "")  # type 2: present, empty when the reference has none
    ds.PositionReferenceIndicator = reference.first.get("PositionReferenceIndicator", "")
    ds.ManufacturerModelName = "TractLens"
    ds.DeviceSerialNumber = "0"
    ds.SOPInstanceUID = generate_uid()
    ds.InstanceNumber = 1
    ds.ContentLabel = "TRACTS"
    ds.ContentDescription = "Streamlines of the bundles, one track set each"
    ds.ContentCreatorName = ""
    ds.ReferencedInstanceSequence = [_ref(d) for d in reference.datasets]
    ds.TrackSetSequence = [_track_set(i + 1, t, method) for i, t in enumerate(track_sets)]
    if deidentify:
        _deidentify(ds)
    path = folder / "TRACTOGRAPHY" / "tracts.dcm"
    _save(ds, path, TRACTOGRAPHY_RESULTS_STORAGE)
    return [path]


# ------------------------------------------------------------------ reading
def _floats(element_value) -> np.ndarray:
    return np.frombuffer(bytes(element_value), dtype="<f4")


def read_tractography(path) -> list[TrackSet]:
    """The track sets of a Tractography Results file: streamlines in RAS+ mm (float32), the
    colour (sRGB from CIELab), per-point FA and per-track length when present."""
    pydicom = require("pydicom")
    ds = pydicom.dcmread(path)
    if str(ds.SOPClassUID) != TRACTOGRAPHY_RESULTS_STORAGE:
        from ..errors import InputError

        raise InputError(
            f"not a Tractography Results object (SOP class {ds.SOPClassUID})",
            path=path,
            fix="Give a file written by export-dicom --as tractography (or another Tractography Results writer)",
        )
    out = []
    for item in ds.TrackSetSequence:
        lines = [(_floats(track.PointCoordinatesData).reshape(-1, 3) * RAS_TO_LPS) for track in item.TrackSequence]
        offsets = np.concatenate([[0], np.cumsum([len(line) for line in lines])]).astype(np.int64)
        fa = lengths = None
        for measurement in item.get("MeasurementsSequence", []):
            if measurement.ConceptNameCodeSequence[0].CodeValue == "110808":
                fa = np.concatenate([_floats(v.FloatingPointValues) for v in measurement.MeasurementValuesSequence])
        for statistic in item.get("TrackStatisticsSequence", []):
            if statistic.ConceptNameCodeSequence[0].CodeValue == "410668003":
                lengths = _floats(statistic.FloatingPointValues).copy()
        color = (
            dicom_lab_to_rgb(item.RecommendedDisplayCIELabValue)
            if "RecommendedDisplayCIELabValue" in item
            else (255, 255, 255)
        )
        points = np.concatenate(lines).astype(np.float32) if lines else np.zeros((0, 3), np.float32)
        out.append(TrackSet(str(item.TrackSetLabel), color, points, offsets, fa, lengths))
    return out
