"""Tractograms: TrackVis .trk and MRtrix .tck through nibabel, .trx through trx-python.

In memory a :class:`~app.model.Tractogram` holds points in voxel index
coordinates of a reference grid; the files hold RAS+ millimetres (nibabel and
trx convert). Per-point and per-streamline scalars are kept where the format
allows: .trk and .trx keep both; .tck keeps neither (a warning says so).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.streamlines import ArraySequence, Field
from nibabel.streamlines import Tractogram as NibTractogram

from ..errors import InputError
from ..model import Tractogram, Volume
from ._atomic import atomic_path
from .nifti import load_image
from .outputs import check_output_file

log = logging.getLogger(__name__)

TRACTOGRAM_SUFFIXES = (".trk", ".tck", ".trx")


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in TRACTOGRAM_SUFFIXES:
        raise InputError(
            f"unknown tractogram format {suffix or '(no extension)'}",
            path=path,
            fix="Use .trk (TrackVis), .tck (MRtrix) or .trx",
        )
    return suffix


def check_output_suffix(path: str | os.PathLike) -> Path:
    """Fail before a long computation when the output tractogram cannot be written."""
    path = Path(path)
    _suffix(path)
    return check_output_file(path, "output tractogram")


def _reference_grid(reference) -> tuple[np.ndarray, tuple[int, int, int]]:
    if reference is None:
        return np.eye(4), (1, 1, 1)
    if isinstance(reference, Volume):
        return reference.affine, reference.shape3
    if isinstance(reference, str | os.PathLike):
        img = load_image(reference, "reference image")
        return img.affine, tuple(int(s) for s in img.shape[:3])
    affine, dims = reference
    return np.asarray(affine, dtype=np.float64), tuple(int(d) for d in dims)


def load_tractogram(path: str | os.PathLike, reference=None, *, grid=None) -> Tractogram:
    """Read .trk/.tck/.trx into voxel coordinates of its grid.

    .trk and .trx carry their grid; .tck does not, so ``reference`` (a
    :class:`Volume`, a NIfTI path or ``(affine, dims)``) gives it. Without one,
    a .tck stays in millimetres (identity affine). ``grid`` ``(affine, dims)`` overrides the
    file's own grid (sessions keep the exact float64 affine; the files hold it as float32).
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.exists():
        raise InputError("tractogram not found", path=path)
    try:
        if suffix == ".trx":
            return _load_trx(path, grid)
        tract_file = nib.streamlines.load(str(path))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"could not be read as a {suffix} tractogram ({exc})", path=path) from exc
    if grid is not None:
        affine, dims = np.asarray(grid[0], dtype=np.float64), tuple(int(d) for d in grid[1])
    elif suffix == ".trk":
        header = tract_file.header
        affine = np.asarray(header[Field.VOXEL_TO_RASMM], dtype=np.float64)
        dims = tuple(int(d) for d in header[Field.DIMENSIONS])
    else:
        affine, dims = _reference_grid(reference)
    tract = tract_file.tractogram
    return _tractogram_from_mm(
        tract.streamlines.get_data(),
        tract.streamlines._lengths,
        affine,
        dims,
        {k: v.get_data() for k, v in tract.data_per_point.items()},
        dict(tract.data_per_streamline.items()),
        path,
    )


def _load_trx(path: Path, grid=None) -> Tractogram:
    from trx.trx_file_memmap import load as trx_load

    trx = trx_load(str(path))
    if grid is None:
        grid = (trx.header["VOXEL_TO_RASMM"], trx.header["DIMENSIONS"])
    try:
        return _tractogram_from_mm(
            trx.streamlines._data,
            trx.streamlines._lengths,
            np.asarray(grid[0], dtype=np.float64),
            tuple(int(d) for d in grid[1]),
            {k: v._data for k, v in trx.data_per_vertex.items()},
            dict(trx.data_per_streamline.items()),
            path,
        )
    finally:
        trx.close()


def _single_column(values) -> np.ndarray:
    """Copy a scalar array out of the file's buffers; (n, 1) columns become (n,)."""
    array = np.array(values)
    return array[:, 0] if array.ndim == 2 and array.shape[1] == 1 else array


def _tractogram_from_mm(points_mm, lengths, affine, dims, per_point: dict, per_streamline: dict, path: Path):
    """Streamlines in RAS mm (as the libraries give them) -> a Tractogram in voxel coordinates."""
    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    points = nib.affines.apply_affine(np.linalg.inv(affine), np.asarray(points_mm, dtype=np.float64))
    return Tractogram(
        points,
        offsets,
        affine,
        dims,
        {k: _single_column(v) for k, v in per_point.items()},
        {k: _single_column(v) for k, v in per_streamline.items()},
        name=path.name.split(".")[0],
        source=str(path),
    )


def _nib_tractogram(tractogram: Tractogram, keep_scalars: bool, exact: bool = False) -> NibTractogram:
    if exact:  # float64 mm: back in voxel coordinates, the float32 points come out bit for bit
        points_mm = tractogram.points.astype(np.float64) @ tractogram.affine[:3, :3].T + tractogram.affine[:3, 3]
    else:
        points_mm = tractogram.points_world().astype(np.float32)
    seq = ArraySequence()
    seq._data = points_mm
    seq._offsets = tractogram.offsets[:-1].copy()
    seq._lengths = tractogram.lengths.copy()
    data_per_point = {}
    data_per_streamline = {}
    if keep_scalars:
        for key, values in tractogram.point_scalars.items():
            arr = np.asarray(values, dtype=None if exact else np.float32)
            arr = arr[:, None] if arr.ndim == 1 else arr
            per = ArraySequence()
            per._data = arr
            per._offsets = seq._offsets.copy()
            per._lengths = seq._lengths.copy()
            data_per_point[key] = per
        for key, values in tractogram.streamline_scalars.items():
            arr = np.asarray(values, dtype=None if exact else np.float32)
            data_per_streamline[key] = arr[:, None] if arr.ndim == 1 else arr
    return NibTractogram(
        seq, data_per_streamline=data_per_streamline, data_per_point=data_per_point, affine_to_rasmm=np.eye(4)
    )


def save_tractogram(tractogram: Tractogram, path: str | os.PathLike, *, exact: bool = False) -> Path:
    """Write .trk/.tck/.trx (format from the suffix), atomically, in RAS mm.

    ``exact`` (.trx only): positions as float64 and scalars in their own dtypes, so that
    reading the file back gives the same arrays bit for bit (sessions use it)."""
    path = Path(path)
    suffix = _suffix(path)
    if exact and suffix != ".trx":
        raise ValueError("exact tractograms are written as .trx")
    has_scalars = bool(tractogram.point_scalars or tractogram.streamline_scalars)
    if suffix == ".tck" and has_scalars:
        log.warning("%s: .tck cannot store per-point or per-streamline scalars; they are not written", path)
    nib_tract = _nib_tractogram(tractogram, keep_scalars=suffix != ".tck", exact=exact)
    with atomic_path(path) as tmp:
        if suffix == ".trx":
            _save_trx(nib_tract, tractogram, tmp, exact)
        elif suffix == ".trk":
            header = {
                Field.VOXEL_TO_RASMM: tractogram.affine,
                Field.DIMENSIONS: np.array(tractogram.dimensions, dtype=np.int16),
                Field.VOXEL_SIZES: np.sqrt((tractogram.affine[:3, :3] ** 2).sum(0)).astype(np.float32),
                Field.VOXEL_ORDER: "".join(nib.aff2axcodes(tractogram.affine)),
            }
            nib.streamlines.save(nib_tract, str(tmp), header=header)
        else:
            nib.streamlines.save(nib_tract, str(tmp))
    return path


def _save_trx(nib_tract: NibTractogram, tractogram: Tractogram, tmp: Path, exact: bool = False) -> None:
    from trx.trx_file_memmap import TrxFile
    from trx.trx_file_memmap import save as trx_save

    header = nib.Nifti1Header()
    header.set_data_shape(tractogram.dimensions)
    header.set_qform(tractogram.affine, code=1)
    header.set_sform(tractogram.affine, code=1)
    header.set_zooms(np.sqrt((tractogram.affine[:3, :3] ** 2).sum(0)))
    dtypes = None
    if exact:
        dtypes = {
            "positions": np.float64,
            "offsets": np.uint64,
            "dpv": {k: v._data.dtype for k, v in nib_tract.data_per_point.items()},
            "dps": {k: np.asarray(v).dtype for k, v in nib_tract.data_per_streamline.items()},
        }
    trx = TrxFile.from_tractogram(nib_tract, reference=header, dtype_dict=dtypes)
    try:
        trx_save(trx, str(tmp))
    finally:
        trx.close()
