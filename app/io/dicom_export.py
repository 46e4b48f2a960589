"""Bundles exported as DICOM objects on a reference series, for neuronavigation and PACS.

``export_dicom`` writes, in the patient's own study and on the grid of a reference series
(usually the T1 the navigation system plans on):

* a Segmentation (SEG, through highdicom) with one segment per bundle (and the lesion);
* an RT Structure Set (RTSTRUCT) with each bundle's outline on every slice it crosses;
* a derived series for PACS viewers: the reference images with the bundles burned in in colour,
  "not for diagnosis" in its series description.

The objects are built in :mod:`.dicom_objects`. A bundle's volume is the set of reference voxels
its streamlines pass through (each segment sampled at a quarter of the smallest voxel size),
optionally grown by ``--dilate`` millimetres (a Euclidean distance on the reference grid), so the
navigation system shows a solid object. Every object refers to the source study, series and
frame of reference; ``--deidentify`` empties the patient's identifiers (the UIDs stay, so the
objects still belong to that study). Everything is written into a temporary folder and moved into
place when all are complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..grid import Grid
from ..params import DicomExportParams
from . import dicom_objects as objects
from .dicom_series import choose, list_series, require

log = logging.getLogger(__name__)

LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


@dataclass
class ReferenceSeries:
    """A series read whole: a classic one (its datasets by slice position) or an enhanced
    multi-frame image (one dataset; ``frames``: the 0-based frame of each slice), and its grid.

    Voxel (i, j, k) is column i, row j of the k-th slice; ``affine`` maps it to RAS+ mm."""

    folder: Path
    datasets: list
    affine: np.ndarray
    shape: tuple[int, int, int]
    frames: list[int] | None = None

    def slice_source(self, k: int):
        """The dataset that holds slice ``k``."""
        return self.datasets[0] if self.frames is not None else self.datasets[k]

    def slice_frame(self, k: int) -> int | None:
        """The 1-based frame number of slice ``k`` in a multi-frame image (None for a classic series)."""
        return None if self.frames is None else self.frames[k] + 1

    def slice_geometry(self, k: int) -> dict:
        """Slice ``k``'s plane: ImagePositionPatient, ImageOrientationPatient, PixelSpacing, SliceThickness."""
        if self.frames is None:
            ds = self.datasets[k]
            return {key: ds.data_element(key).value for key in GEOMETRY if key in ds}
        return _frame_geometry(self.datasets[0], self.frames[k])

    @property
    def first(self):
        return self.datasets[0]

    @property
    def frame_uid(self) -> str:
        return str(self.first.get("FrameOfReferenceUID", ""))

    def pixels(self) -> np.ndarray:
        """(columns, rows, slices) float32 in the stored values' units (rescale applied)."""
        if self.frames is not None:
            values = self.first.pixel_array.astype(np.float32).reshape(-1, self.shape[1], self.shape[0])
            return values[self.frames].transpose(2, 1, 0)
        slices = []
        for ds in self.datasets:
            values = ds.pixel_array.astype(np.float32)
            values = values * float(ds.get("RescaleSlope", 1) or 1) + float(ds.get("RescaleIntercept", 0) or 0)
            slices.append(values.T)
        return np.stack(slices, axis=-1)


def read_reference(folder: str | os.PathLike, series: str | None = None) -> ReferenceSeries:
    """The reference series of ``folder`` (its only one, or its only image series, or ``series``)."""
    folder = Path(folder)
    listed = list_series(folder)
    chosen = choose(listed, series, folder, kind=None if series is not None or len(listed) == 1 else "anat")
    pydicom = require("pydicom")
    if chosen.multiframe and len(chosen.files) == 1 and chosen.kind == "anat":
        return _read_enhanced(folder, pydicom.dcmread(chosen.files[0]), chosen.label)
    if chosen.multiframe or chosen.volumes > 1:
        raise InputError(
            f"series {chosen.label} cannot be a reference: it is a diffusion, multi-volume or multi-file "
            "multi-frame series",
            path=folder,
            fix="Give a 3-D image series (one file per slice, or one enhanced multi-frame file), e.g. the T1 "
            "the navigation system plans on",
        )
    datasets = [pydicom.dcmread(path) for path in chosen.files]
    orientation = np.asarray([float(v) for v in datasets[0].ImageOrientationPatient])
    normal = np.cross(orientation[:3], orientation[3:])
    datasets.sort(key=lambda ds: float(np.asarray([float(v) for v in ds.ImagePositionPatient]) @ normal))
    first = np.asarray([float(v) for v in datasets[0].ImagePositionPatient])
    last = np.asarray([float(v) for v in datasets[-1].ImagePositionPatient])
    step = (
        (last - first) / (len(datasets) - 1)
        if len(datasets) > 1
        else normal * float(datasets[0].get("SpacingBetweenSlices", datasets[0].get("SliceThickness", 1.0)) or 1.0)
    )
    row_spacing, col_spacing = (float(v) for v in datasets[0].PixelSpacing)
    lps = np.eye(4)
    lps[:3, 0] = orientation[:3] * col_spacing
    lps[:3, 1] = orientation[3:] * row_spacing
    lps[:3, 2] = step
    lps[:3, 3] = first
    shape = (int(datasets[0].Columns), int(datasets[0].Rows), len(datasets))
    return ReferenceSeries(folder, datasets, LPS @ lps, shape)


GEOMETRY = ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing", "SliceThickness")


def _frame_geometry(ds, frame: int) -> dict:
    """A frame's plane from an enhanced image's functional groups (per-frame, else shared)."""

    def group(name: str):
        for groups in (ds.PerFrameFunctionalGroupsSequence[frame], ds.get("SharedFunctionalGroupsSequence", [None])[0]):
            if groups is not None and name in groups:
                return groups[name].value[0]
        return None

    position, orientation, measures = (group(n) for n in ("PlanePositionSequence", "PlaneOrientationSequence",
                                                           "PixelMeasuresSequence"))  # fmt: skip
    if position is None or orientation is None or measures is None:
        return {}
    out = {"ImagePositionPatient": position.ImagePositionPatient,
           "ImageOrientationPatient": orientation.ImageOrientationPatient, "PixelSpacing": measures.PixelSpacing}  # fmt: skip
    if "SliceThickness" in measures:
        out["SliceThickness"] = measures.SliceThickness
    return out


def _read_enhanced(folder: Path, ds, label: str) -> ReferenceSeries:
    """An enhanced (multi-frame) image as a reference: its frames ordered along the slice normal."""
    count = int(ds.get("NumberOfFrames", 1))
    geometry = [_frame_geometry(ds, f) for f in range(count)]
    if not all(geometry) or len({tuple(float(v) for v in g["ImageOrientationPatient"]) for g in geometry}) != 1:
        raise InputError(
            f"series {label} cannot be a reference: its frames lack a plane position or are not all parallel",
            path=folder,
            fix="Give a 3-D image series of parallel slices, e.g. the T1 the navigation system plans on",
        )
    orientation = np.asarray([float(v) for v in geometry[0]["ImageOrientationPatient"]])
    normal = np.cross(orientation[:3], orientation[3:])
    positions = [np.asarray([float(v) for v in g["ImagePositionPatient"]]) for g in geometry]
    order = sorted(range(count), key=lambda f: float(positions[f] @ normal))
    first, last = positions[order[0]], positions[order[-1]]
    thickness = float(geometry[0].get("SliceThickness", 1.0) or 1.0)
    step = (last - first) / (count - 1) if count > 1 else normal * thickness
    row_spacing, col_spacing = (float(v) for v in geometry[0]["PixelSpacing"])
    lps = np.eye(4)
    lps[:3, 0], lps[:3, 1], lps[:3, 2], lps[:3, 3] = (
        orientation[:3] * col_spacing,
        orientation[3:] * row_spacing,
        step,
        first,
    )
    shape = (int(ds.Columns), int(ds.Rows), count)
    return ReferenceSeries(folder, [ds], LPS @ lps, shape, frames=order)


def bundle_mask(points_mm: list[np.ndarray] | np.ndarray, offsets, affine, shape, dilate_mm: float = 0.0) -> np.ndarray:
    """The voxels of the grid (``affine``, ``shape``) that streamlines pass through.

    ``points_mm`` (P, 3) RAS+ mm and ``offsets`` (S + 1,) as in :class:`app.tractogram.Tractogram`.
    Every segment is sampled at a quarter of the smallest voxel size, so a streamline crossing a
    voxel between two of its points still marks it; ``dilate_mm`` grows the set by a distance."""
    points = np.asarray(points_mm, dtype=np.float64).reshape(-1, 3)
    offsets = np.asarray(offsets, dtype=np.int64)
    inverse = np.linalg.inv(np.asarray(affine, dtype=np.float64))
    voxels = points @ inverse[:3, :3].T + inverse[:3, 3]
    mask = np.zeros(shape, dtype=bool)
    if len(voxels) == 0:
        return mask
    same_line = np.ones(len(voxels), dtype=bool)
    same_line[offsets[1:-1] - 1] = False  # no segment from a streamline's end to the next one's start
    same_line[-1] = False
    starts = np.flatnonzero(same_line[:-1]) if len(voxels) > 1 else np.zeros(0, dtype=np.int64)
    samples = [voxels]
    if len(starts):
        delta = voxels[starts + 1] - voxels[starts]
        counts = np.maximum(1, np.ceil(np.abs(delta).max(axis=1) / 0.25).astype(np.int64))
        which = np.repeat(np.arange(len(starts)), counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        fraction = (within / np.repeat(counts, counts))[:, None]
        samples.append(voxels[starts][which] + fraction * delta[which])
    index = np.rint(np.concatenate(samples)).astype(np.int64)
    inside = np.all((index >= 0) & (index < np.asarray(shape)), axis=1)
    index = index[inside]
    mask[index[:, 0], index[:, 1], index[:, 2]] = True
    return dilate(mask, affine, dilate_mm)


def dilate(mask: np.ndarray, affine, distance_mm: float) -> np.ndarray:
    """``mask`` grown by ``distance_mm`` (Euclidean, with the grid's voxel sizes)."""
    if distance_mm <= 0 or not mask.any():
        return mask
    from scipy.ndimage import distance_transform_edt

    sizes = np.linalg.norm(np.asarray(affine)[:3, :3], axis=0)
    return distance_transform_edt(~mask, sampling=sizes) <= distance_mm


@dataclass
class Structure:
    """One exported object's content: a name, a mask on the reference grid, a colour (0..255)."""

    name: str
    mask: np.ndarray
    color: tuple[int, int, int]
    kind: str = "bundle"  # or "lesion", or "envelope" (a bundle's uncertainty envelope at a level)
    tract: tuple | None = None  # a bundle's streamlines: (points RAS+ mm, offsets, per-point FA or None)


#: Bundle colours (Okabe–Ito, told apart with colour vision deficiency), then repeated.
PALETTE = ((230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (0, 114, 178), (204, 121, 167))
LESION_COLOR = (213, 94, 0)
#: Envelope colours, innermost level first (the viridis ramp: dark to light as the level widens).
ENVELOPE_COLORS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


@dataclass
class ExportResult:
    """What an export wrote: the files by kind, each object's UIDs (``objects``: kind, file,
    series_instance_uid, sop_instance_uids), the structures, the reference series, whether the
    patient's identifiers were removed and the dilation."""

    outdir: Path
    files: dict[str, list[Path]] = field(default_factory=dict)
    structures: list[dict] = field(default_factory=list)
    reference: dict = field(default_factory=dict)
    deidentified: bool = False
    dilate_mm: float = 0.0
    objects: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "outdir": str(self.outdir),
            "files": {kind: [str(p) for p in paths] for kind, paths in self.files.items()},
            "objects": self.objects,
            "structures": self.structures,
            "reference": self.reference,
            "deidentified": self.deidentified,
            "dilate_mm": self.dilate_mm,
        }


def _object_record(kind: str, paths: list[Path], placed: list[Path]) -> dict:
    """An object's kind, file (its folder when it is a series of files) and UIDs, read back from
    what was written."""
    pydicom = require("pydicom")
    headers = [pydicom.dcmread(p, stop_before_pixels=True, specific_tags=["SeriesInstanceUID", "SOPInstanceUID"])
               for p in paths]  # fmt: skip
    return {
        "kind": kind,
        "file": str(placed[0] if len(placed) == 1 else placed[0].parent),
        "instances": len(paths),
        "series_instance_uid": str(headers[0].SeriesInstanceUID),
        "sop_instance_uids": [str(h.SOPInstanceUID) for h in headers],
    }


def check_frame_of_reference(reference: ReferenceSeries, dwi_frame_uid: str | None, dwi_source: str = "") -> None:
    """Refuse a reference series in another frame of reference than the diffusion data: their
    millimetres are not the same, so the bundles would land in the wrong place."""
    if dwi_frame_uid and reference.frame_uid and dwi_frame_uid != reference.frame_uid:
        raise InputError(
            f"the reference series is in another frame of reference ({reference.frame_uid}) than the "
            f"diffusion data{f' ({dwi_source})' if dwi_source else ''} ({dwi_frame_uid}): the bundles "
            "would be placed wrongly",
            path=reference.folder,
            fix="Choose a reference series of the same session (same frame of reference as the DWI), or register "
            "the diffusion data and that series (tractlens register) and give the folder with --registration DIR",
        )


def structures_on_reference(
    reference: ReferenceSeries, bundles: list, lesion=None, dilate_mm: float = 0.0, envelopes=()
):
    """:class:`Structure` of each bundle ((name, points_mm, offsets)), of each envelope level
    ((name, mask, affine), named with its level, e.g. "CST envelope 95 %") and of the lesion
    ((name, mask, affine)); masks resampled nearest neighbour onto the reference grid."""

    grid = Grid(reference.affine, reference.shape)

    def on_reference(mask, affine) -> np.ndarray:
        resampled = grid.resample_nearest(np.asarray(mask, dtype=bool), Grid(affine, np.asarray(mask).shape))
        return np.asarray(resampled, dtype=bool)

    structures = []
    for i, (name, points_mm, offsets, *fa) in enumerate(bundles):
        mask = bundle_mask(points_mm, offsets, reference.affine, reference.shape, dilate_mm)
        outside = _fraction_outside(points_mm, grid)
        if 0 < outside < 1 and mask.any():
            log.warning(
                "%.1f %% of %s's points lie outside the reference series: it is clipped there", 100 * outside, name
            )
        tract = (np.asarray(points_mm, dtype=np.float32), np.asarray(offsets), fa[0] if fa else None)
        structures.append(Structure(name, mask, PALETTE[i % len(PALETTE)], tract=tract))
    for i, (name, mask, affine) in enumerate(envelopes):
        color = ENVELOPE_COLORS[min(i, len(ENVELOPE_COLORS) - 1)]
        structures.append(Structure(name, on_reference(mask, affine), color, "envelope"))
    if lesion is not None:
        name, mask, affine = lesion
        structures.append(Structure(name, on_reference(mask, affine), LESION_COLOR, "lesion"))
    empty = [s.name for s in structures if not s.mask.any()]
    if len(empty) == len(structures):
        raise InputError(
            "no bundle (nor the lesion) passes through the reference series' volume",
            path=reference.folder,
            fix="Give the reference series of this patient's session that covers the bundles",
        )
    for name in empty:
        log.warning("%s lies outside the reference series and is left out", name)
    return [s for s in structures if s.mask.any()]


#: Points converted at a time by :func:`_fraction_outside` (float64 copies: ~100 MB a chunk).
OUTSIDE_CHUNK = 4_000_000


def _fraction_outside(points_mm, grid: Grid) -> float:
    """The fraction of the points beyond the grid's volume (its voxels' outer faces), a chunk of
    points at a time: a whole-brain tractogram's copy is not made at once."""
    n = len(points_mm)
    if not n:
        return 0.0
    inside = sum(int(grid.contains(grid.to_voxels(points_mm[i : i + OUTSIDE_CHUNK])).sum())
                 for i in range(0, n, OUTSIDE_CHUNK))  # fmt: skip
    return 1.0 - inside / n


def write_tracts(reference: ReferenceSeries, structures: list[Structure], folder: Path, *, deidentify=False):
    """The bundles' streamlines as one Tractography Results object (:mod:`.dicom_tractography`)."""
    from .dicom_tractography import TrackSet, write_tractography

    sets = [TrackSet(s.name, s.color, *s.tract) for s in structures if s.kind == "bundle" and s.tract is not None]
    if not sets:
        raise InputError(
            "--as tractography writes streamlines: give at least one tractogram",
            path=reference.folder,
            fix="Add the bundles' tractograms, or leave tractography out of --as",
        )
    return write_tractography(reference, sets, folder, deidentify=deidentify)


def export_dicom(
    reference: ReferenceSeries,
    structures: list[Structure],
    outdir: str | os.PathLike,
    params: DicomExportParams,
    progress=None,
) -> ExportResult:
    """Write the objects ``params.kinds`` asks for into ``outdir`` (all or nothing)."""

    outdir = Path(outdir)
    result = ExportResult(outdir, deidentified=params.deidentify, dilate_mm=float(params.dilate_mm))
    result.structures = [{"name": s.name, "kind": s.kind, "voxels": int(s.mask.sum())} for s in structures]
    first = reference.first
    result.reference = {
        "folder": str(reference.folder),
        "study_instance_uid": str(first.StudyInstanceUID),
        "series_instance_uid": str(first.SeriesInstanceUID),
        "frame_of_reference_uid": reference.frame_uid,
        "series_description": str(first.get("SeriesDescription", "")),
    }
    outdir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-dicom-", dir=outdir))
    writers = {"seg": objects.write_seg, "rtstruct": objects.write_rtstruct, "overlay": objects.write_overlay,
               "tractography": write_tracts}  # fmt: skip
    try:
        written = {}
        for i, kind in enumerate(params.kinds):
            written[kind] = writers[kind](reference, structures, staging, deidentify=params.deidentify)
            if progress is not None:
                progress(i + 1, len(params.kinds))
        for paths in written.values():
            clash = outdir / paths[0].relative_to(staging).parts[0]
            if clash.exists():
                raise InputError(f"{clash} exists already", path=outdir,
                                 fix="Give an empty output folder (-o), or move the earlier export away")  # fmt: skip
        for kind, paths in written.items():
            result.files[kind] = [outdir / p.relative_to(staging) for p in paths]
            result.objects.append(_object_record(kind, paths, result.files[kind]))
        for paths in written.values():
            top = paths[0].relative_to(staging).parts[0]
            os.replace(staging / top, outdir / top)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result
