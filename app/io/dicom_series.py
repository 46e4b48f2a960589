"""The series in a folder of DICOM files, listed with pydicom (headers only).

What a CD or a PACS export holds is told here before anything is converted: each series'
number, description, kind (diffusion or anatomy), frame of reference and slices, and what
is wrong with it — a half-copied series (missing slices), several diffusion series where one
is needed. Conversion itself is dcm2niix's (:mod:`.dicom_import`); no pixel data is read here.

A series counts as diffusion when its files carry the standard b-value (0018,9087) with
more than one value, its image type says ``DIFFUSION``, or its description names it (DWI,
DTI, diffusion); the converter's gradient table has the last word (:mod:`.dicom_import`).
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError

INSTALL_HINT = "Install the DICOM support: pip install 'tractlens[dicom]'"
DIFFUSION_NAME = re.compile(r"dwi|dti|diff|hardi|dmri|tensor|tracto", re.IGNORECASE)
#: Files larger than this are not probed as DICOM when listing (a stray video, an archive).
MAX_PROBE_BYTES = 2**31
#: Gaps between neighbouring slice positions larger than this many times the usual step mean
#: slices are missing.
GAP_FACTOR = 1.5


def require(module: str, path: str | os.PathLike | None = None):
    """Import one of the optional DICOM libraries, or say how to install it (naming the folder
    that needed it, when known)."""

    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(
            f"DICOM support needs the Python package {module!r}, which is not installed", path=path, fix=INSTALL_HINT
        ) from None


@dataclass
class DicomSeries:
    """One series of a DICOM folder, as its headers describe it."""

    uid: str
    number: int | None
    description: str
    modality: str
    kind: str  # "dwi" or "anat" (anything that is not diffusion)
    files: list[Path] = field(default_factory=list)
    study_uid: str = ""
    frame_uid: str = ""
    patient_id: str = ""
    slices: int = 0
    volumes: int = 1
    bvalues: tuple[float, ...] = ()
    multiframe: bool = False
    positions: list = field(default_factory=list, repr=False)  # along the slice normal, per file

    @property
    def label(self) -> str:
        """How the series is named to a user: ``7 "ep2d_diff" (dwi, 40 slices × 31 volumes)``."""
        number = f"{self.number} " if self.number is not None else ""
        shape = f"{self.slices} slices" + (f" × {self.volumes} volumes" if self.volumes > 1 else "")
        return f'{number}"{self.description or "no description"}" ({self.kind}, {shape})'

    def as_dict(self) -> dict:
        return {
            "number": self.number,
            "description": self.description,
            "kind": self.kind,
            "modality": self.modality,
            "series_instance_uid": self.uid,
            "study_instance_uid": self.study_uid,
            "frame_of_reference_uid": self.frame_uid,
            "files": len(self.files),
            "slices": self.slices,
            "volumes": self.volumes,
        }

    def matches(self, choice: str) -> bool:
        """Whether ``--series CHOICE`` names this series: its number, UID or description."""
        choice = str(choice).strip()
        return choice in (str(self.number), self.uid) or choice.lower() == self.description.strip().lower()


def is_dicom_file(path: Path) -> bool:
    """The DICOM preamble (``DICM`` at byte 128), as every conforming file has."""
    try:
        with open(path, "rb") as f:
            f.seek(128)
            return f.read(4) == b"DICM"
    except OSError:
        return False


def dicom_files(folder: Path, limit: int | None = None) -> list[Path]:
    """The DICOM files under ``folder`` (recursively, DICOMDIR excluded), sorted by path."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            if name.upper() == "DICOMDIR" or name.startswith("."):
                continue
            path = Path(root) / name
            try:
                if path.stat().st_size > MAX_PROBE_BYTES:
                    continue
            except OSError:
                continue
            if is_dicom_file(path):
                found.append(path)
                if limit is not None and len(found) >= limit:
                    return found
    return found


def is_dicom_folder(path: str | os.PathLike) -> bool:
    """A folder with at least one DICOM file in it (cheap: stops at the first one)."""
    path = Path(path)
    return path.is_dir() and bool(dicom_files(path, limit=1))


def list_series(folder: str | os.PathLike) -> list[DicomSeries]:
    """Every series under ``folder``, by series number. Raises :class:`InputError` for a folder
    with no DICOM in it and for a series with missing slices."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("not a folder", path=folder, fix="Give the folder that holds the DICOM files")
    files = dicom_files(folder)
    if not files:
        raise InputError(
            "no DICOM files in this folder (none with the DICOM preamble, looked recursively)",
            path=folder,
            fix="Give the folder copied from the CD or PACS export (the one with the image files), or a NIfTI file",
        )
    pydicom = require("pydicom", folder)
    groups: dict[str, list] = {}
    for path in files:
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
        except Exception:  # an unreadable file among readable ones: skipped, like dcm2niix does
            continue
        if "PixelData" not in ds and "SeriesInstanceUID" in ds and ds.get("Modality") in ("SR", "PR", "KO"):
            continue  # reports and presentation states hold no image
        groups.setdefault(str(ds.get("SeriesInstanceUID", "")), []).append((path, ds))
    series = [_describe(uid, members) for uid, members in groups.items()]
    series = [s for s in series if s.slices > 0]
    if not series:
        raise InputError(
            "the DICOM files in this folder hold no images", path=folder, fix="Give the folder of an MR series"
        )
    series.sort(key=lambda s: (s.number is None, s.number or 0, s.description))
    for s in series:
        check_complete(s, folder)
    return series


def _describe(uid: str, members: list) -> DicomSeries:
    first = members[0][1]
    bvalues = sorted({round(float(ds[0x00189087].value), 1) for _, ds in members if 0x00189087 in ds})
    multiframe = int(first.get("NumberOfFrames", 1) or 1) > 1
    if multiframe:
        bvalues = sorted(set(bvalues) | _enhanced_bvalues(first))
    image_type = " ".join(str(v) for v in first.get("ImageType", [])).upper()
    description = str(first.get("SeriesDescription", "") or first.get("ProtocolName", "") or "")
    diffusion = len(bvalues) > 1 or "DIFFUSION" in image_type or bool(DIFFUSION_NAME.search(description))
    number = first.get("SeriesNumber")
    s = DicomSeries(
        uid=uid,
        number=int(number) if number not in (None, "") else None,
        description=description,
        modality=str(first.get("Modality", "")),
        kind="dwi" if diffusion else "anat",
        files=[p for p, _ in members],
        study_uid=str(first.get("StudyInstanceUID", "")),
        frame_uid=str(first.get("FrameOfReferenceUID", "")),
        patient_id=str(first.get("PatientID", "") or "").strip(),
        bvalues=tuple(bvalues),
        multiframe=multiframe,
    )
    s.positions = [_position(ds) for _, ds in members]
    if multiframe:
        s.slices = int(first.get("NumberOfFrames", 1))
    else:
        distinct = _distinct_positions(s.positions)
        s.slices = len(distinct)
        s.volumes = max(1, len(members) // max(1, s.slices))
    return s


def _enhanced_bvalues(ds) -> set[float]:
    values = set()
    for frame in ds.get("PerFrameFunctionalGroupsSequence", []):
        for item in frame.get("MRDiffusionSequence", []):
            if "DiffusionBValue" in item:
                values.add(round(float(item.DiffusionBValue), 1))
    return values


def _position(ds) -> float | None:
    """A slice's position along the normal of its plane (mm), or None without geometry."""
    try:
        orientation = np.asarray([float(v) for v in ds.ImageOrientationPatient])
        position = np.asarray([float(v) for v in ds.ImagePositionPatient])
    except (AttributeError, TypeError, ValueError):
        return None
    normal = np.cross(orientation[:3], orientation[3:])
    return float(position @ normal)


def _distinct_positions(positions: list[float | None]) -> list[float]:
    known = sorted(p for p in positions if p is not None)
    distinct: list[float] = []
    for p in known:
        if not distinct or p - distinct[-1] > 1e-3:
            distinct.append(p)
    return distinct or [0.0] * (1 if positions else 0)


def check_complete(series: DicomSeries, folder: Path) -> None:
    """Refuse a half-copied series: gaps between slice positions, or slice positions that do
    not all have the same number of images (one per volume)."""
    if series.multiframe:
        return
    positions = [p for p in series.positions if p is not None]
    distinct = _distinct_positions(positions)
    problem = ""
    if len(distinct) >= 3:
        steps = np.diff(distinct)
        usual = float(np.median(steps))
        gaps = int(np.sum(np.rint(steps / usual) - 1)) if usual > 0 else 0
        if usual > 0 and steps.max() > GAP_FACTOR * usual:
            problem = f"{gaps} slice(s) are missing (gaps in the slice positions)"
    if not problem and distinct:
        counts = np.unique(np.round(positions, 3), return_counts=True)[1]
        if counts.min() != counts.max():
            problem = f"slice positions have {counts.min()} to {counts.max()} images each: some images are missing"
    if problem:
        raise InputError(
            f"series {series.label} is incomplete: {problem}",
            path=folder,
            fix="The series was copied only in part; copy the whole series again from the CD or PACS",
        )


def several_dwi_message(dwi: list[DicomSeries]) -> str:
    return "several diffusion series: " + "; ".join(s.label for s in dwi)


def choose(series: list[DicomSeries], choice: str | None, folder: Path, *, kind: str | None = None) -> DicomSeries:
    """The one series a command works on: named by ``choice`` (number, UID or description),
    else the only one of ``kind`` (all when None). Raises :class:`InputError` listing the
    candidates when there are several or none."""
    candidates = [s for s in series if kind is None or s.kind == kind]
    if choice is not None:
        named = [s for s in series if s.matches(choice)]
        if len(named) != 1:
            listed = "; ".join(s.label for s in series)
            raise InputError(
                f"no single series is named {choice!r} (series here: {listed})",
                path=folder,
                fix="Give --series with one of the numbers listed",
            )
        return named[0]
    if len(candidates) == 1:
        return candidates[0]
    what = {"dwi": "diffusion series", "anat": "image series", None: "series"}[kind]
    if not candidates:
        listed = "; ".join(s.label for s in series)
        raise InputError(
            f"no {what} in this folder (series here: {listed})",
            path=folder,
            fix="Give a folder that holds the series you want",
        )
    raise SeveralSeries(
        f"several {what}: " + "; ".join(s.label for s in candidates),
        path=folder,
        fix="Choose one with --series NUMBER (tractlens view DIR --series NUMBER, or tractlens import-dicom DIR "
        "--series NUMBER -o OUTDIR), or give that series' own folder",
        candidates=candidates,
    )


class SeveralSeries(InputError):
    """A folder with several candidate series where one is needed; ``candidates`` lists them
    so that the window can ask which."""

    def __init__(self, problem: str, *, path=None, fix: str = "", candidates: list[DicomSeries] | None = None):
        super().__init__(problem, path=path, fix=fix)
        self.candidates = candidates or []
