"""Tractograms: TrackVis .trk and MRtrix .tck through nibabel, .trx through trx-python.

In memory a :class:`~app.model.Tractogram` holds points in voxel index
coordinates of a reference grid; the files hold RAS+ millimetres (nibabel and
trx convert). Per-point and per-streamline scalars are kept where the format
allows: .trk and .trx keep both; a .tck keeps them beside it as MRtrix does, a ``.tsf`` file per
per-point scalar and a text file per per-streamline one (:mod:`.tractogram_tsf`), read back with it.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import struct
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.streamlines import ArraySequence, Field
from nibabel.streamlines import Tractogram as NibTractogram
from nibabel.streamlines.trk import header_2_dtype as TRK_FIELDS

from tractlens.gpu.host import host_threads

from ..errors import InputError
from ..model import Tractogram, Volume
from ..tractogram import MappedPoints
from ._atomic import atomic_path
from ._pages import PreadRows, release_pages
from .nifti import check_affine, load_image, reason
from .outputs import check_output_file
from .tractogram_points import affine_rows, points_fit_grid
from .tractogram_tsf import (
    content_timestamp,
    points_crc,
    read_mrtrix_header,
    read_sidecars,
    sidecar_paths,
    write_streamline_values,
    write_tsf,
)

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


_DAMAGED = {
    ".trk": "The file is damaged or not a TrackVis file; write it again (e.g. with DIPY, TrackVis or tractlens)",
    ".tck": "The file is damaged or not an MRtrix track file; write it again (e.g. with tckgen or tckedit)",
    ".trx": "The file is damaged or not a TRX archive; write it again (e.g. with tff_convert_tractogram)",
}
#: Why a tractogram whose positions are not finite numbers on its grid is refused
BAD_POSITIONS = "some streamline points are NaN or infinite (or too far away for the grid)"
#: .trk headers hold at most 10 scalar and 10 property names.
TRK_MAX_VALUES = 10


def load_tractogram(path: str | os.PathLike, reference=None, *, grid=None, check_positions: bool = True) -> Tractogram:
    """Read .trk/.tck/.trx into voxel coordinates of its grid.

    .trk and .trx carry their grid; .tck does not, so ``reference`` (a
    :class:`Volume`, a NIfTI path or ``(affine, dims)``) gives it. Without one,
    a .tck stays in millimetres (identity affine). ``grid`` ``(affine, dims)`` overrides the
    file's own grid (sessions keep the exact float64 affine; the files hold it as float32).

    Raises :class:`InputError` for a missing, damaged or inconsistent file: a .trk whose
    header or point counts do not fit the file, a singular or non-finite voxel-to-RAS
    transform, NaN/Inf coordinates, scalars that do not match the streamlines. ``check_positions``
    False: an uncompressed .trx's positions are checked later (:meth:`MappedPoints.positions_fit`).
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.exists():
        raise InputError("tractogram not found", path=path, fix="Check the path and spelling")
    if not path.is_file():
        raise InputError("expected a tractogram file but this is a folder", path=path, fix="Give the file itself")
    if grid is None and suffix == ".tck":
        grid = _reference_grid(reference)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if suffix == ".trx":
                return _read_trx(path, grid, check_positions)  # converted while its memory maps are open
            else:
                old_style = suffix == ".trk" and _check_trk(path)
                arrays = _read_nibabel(path, grid)
                if suffix == ".tck":
                    arrays = _with_sidecars(path, arrays)
                if old_style:
                    arrays = _place_old_trk(path, arrays, grid if grid is not None else reference)
    except InputError:
        raise
    except MemoryError:
        raise InputError(
            "the tractogram is too large for the memory available (or its header is damaged)",
            path=path,
            fix="Split it (e.g. tckedit -number) or check the file",
        ) from None
    except Exception as exc:
        raise InputError(
            f"could not be read as a {suffix} tractogram ({reason(exc)})", path=path, fix=_DAMAGED[suffix]
        ) from None
    return _tractogram_from_mm(*arrays, path)


def _read_nibabel(path: Path, grid):
    tract_file = nib.streamlines.load(str(path))
    if grid is None:  # .trk: its own grid
        header = tract_file.header
        grid = (header[Field.VOXEL_TO_RASMM], header[Field.DIMENSIONS])
    tract = tract_file.tractogram
    return (
        tract.streamlines.get_data(),
        tract.streamlines._lengths,
        grid,
        {k: v.get_data() for k, v in tract.data_per_point.items()},
        dict(tract.data_per_streamline.items()),
    )


def _with_sidecars(path: Path, arrays):
    """A .tck's arrays with the scalars of its side files (``.tsf`` of the same timestamp, ``.txt``)."""
    points_mm, lengths, grid, per_point, per_streamline = arrays
    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    timestamp = read_mrtrix_header(path, b"mrtrix tracks")[0].get("timestamp")
    point, streamline = read_sidecars(path, offsets, timestamp)
    return points_mm, lengths, grid, {**point, **per_point}, {**streamline, **per_streamline}


def _check_trk(path: Path) -> bool:
    """Walk a .trk file's records before nibabel reads them: counts must be sane and fit the file.

    nibabel reads each streamline's announced point count in one go, so a damaged count
    (negative, or 2^31) would make it request gigabytes; a damaged n_count or scalar count
    makes it misread everything after. True for an old-style file (see :func:`_place_old_trk`)."""
    size = path.stat().st_size
    fix = _DAMAGED[".trk"]
    if size < TRK_FIELDS.itemsize:
        raise InputError(
            f"could not be read as a .trk tractogram: it has {size} bytes, a header alone has 1000", path=path, fix=fix
        )
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        raw = data[: TRK_FIELDS.itemsize]  # a copy: a view would keep the map from closing
        header = np.frombuffer(raw, dtype=TRK_FIELDS)[0]
        endian = "<"
        if int(header["hdr_size"]) != TRK_FIELDS.itemsize:
            header = np.frombuffer(raw, dtype=TRK_FIELDS.newbyteorder())[0]
            endian = ">"
            if int(header["hdr_size"]) != TRK_FIELDS.itemsize:
                raise InputError(
                    "could not be read as a .trk tractogram (its header size field is wrong: not a TrackVis file)",
                    path=path,
                    fix=fix,
                )
        n_scalars = int(header["nb_scalars_per_point"])
        n_properties = int(header["nb_properties_per_streamline"])
        n_count = int(header["nb_streamlines"])
        if not (0 <= n_scalars <= TRK_MAX_VALUES and 0 <= n_properties <= TRK_MAX_VALUES):
            raise InputError(
                f"the .trk header announces {n_scalars} scalars per point and {n_properties} per streamline "
                f"(0 to {TRK_MAX_VALUES} each)",
                path=path,
                fix=fix,
            )
        per_point = 4 * (3 + n_scalars)
        per_streamline = 4 + 4 * n_properties
        body = size - TRK_FIELDS.itemsize
        if n_count < 0 or n_count * per_streamline > body:
            raise InputError(
                f"the .trk header announces {n_count} streamlines, which {size} bytes cannot hold",
                path=path,
                fix=fix,
            )
        count = struct.Struct(endian + "i")
        position, seen = TRK_FIELDS.itemsize, 0
        while position < size and (n_count == 0 or seen < n_count):
            if position + 4 > size:
                break  # a few stray bytes at the end: nibabel reports what it makes of them
            (n_points,) = count.unpack_from(data, position)
            end = position + per_streamline + n_points * per_point
            if n_points < 0 or end > size:
                raise InputError(
                    f"streamline {seen + 1} announces {n_points} points, which the rest of the file cannot hold: "
                    "the file is truncated or damaged",
                    path=path,
                    fix=fix,
                )
            position, seen = end, seen + 1
        if seen < n_count:
            raise InputError(
                f"the .trk header announces {n_count} streamlines but the file holds {seen}: it is truncated",
                path=path,
                fix=fix,
            )
    # TrackVis version 1 has no voxel-to-RAS matrix (those bytes are reserved); in version 2 a
    # matrix whose last element is 0 was never recorded. nibabel takes the identity for both.
    return int(header["version"]) == 1 or float(header["voxel_to_rasmm"][3][3]) == 0.0


def _place_old_trk(path: Path, arrays, reference):
    """An old-style .trk (no voxel-to-RAS matrix) placed on ``reference``'s grid, with a warning.

    nibabel reads such a file as if its matrix were the identity, which puts the streamlines in
    voxel indices at the scanner's origin: wrong for every real image, so a silent read would make
    masks and labels miss every streamline. Without a reference it is refused; the reference must
    be the grid of the header (its dimensions and voxel sizes) and its affine becomes the matrix:
    the points are mapped from nibabel's identity placement to that of the reference affine,
    through TrackVis's voxel-mm convention (:func:`nibabel.streamlines.trk.get_affine_trackvis_to_rasmm`)."""
    from nibabel.streamlines.trk import get_affine_trackvis_to_rasmm

    header = nib.streamlines.load(str(path), lazy_load=True).header  # as nibabel read it (identity matrix)
    dims = tuple(int(d) for d in header[Field.DIMENSIONS])
    sizes = np.asarray(header[Field.VOXEL_SIZES], dtype=np.float64)
    described = f"grid {dims} of {'x'.join(f'{v:g}' for v in sizes)} mm voxels"
    fix = (
        "Place it on the image its streamlines were tracked on: commands that take an image (--include, "
        f"--labels, --map, --lesion) use theirs when it has the file's {described}; in the window, open that "
        "image first; from Python, load_tractogram(FILE, reference=IMAGE). Or write the file again with its "
        "voxel-to-RAS matrix (e.g. DIPY: load_tractogram(FILE, IMAGE) then save_tractogram)"
    )
    what = "an old-style .trk: its header has no voxel-to-RAS matrix (TrackVis version 1, or the matrix is all zeros)"
    if reference is None:
        raise InputError(f"{what}, so where its streamlines lie is unknown", path=path, fix=fix)
    affine, ref_dims = _reference_grid(reference)
    ref_sizes = np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(0))
    if tuple(ref_dims) != dims or not np.allclose(ref_sizes, sizes, rtol=1e-3, atol=1e-4):
        raise InputError(
            f"{what}, and the reference is not on the {described} it was tracked on "
            f"(the reference: {tuple(ref_dims)} of {'x'.join(f'{v:g}' for v in ref_sizes)} mm)",
            path=path,
            fix=fix,
        )
    identity = get_affine_trackvis_to_rasmm(header).astype(np.float64)
    placed = get_affine_trackvis_to_rasmm({**header, Field.VOXEL_TO_RASMM: np.asarray(affine, np.float32)})
    points_mm, lengths, _grid, per_point, per_streamline = arrays
    transform = placed.astype(np.float64) @ np.linalg.inv(identity)
    points_mm = nib.affines.apply_affine(transform, np.asarray(points_mm, dtype=np.float64))
    log.warning(
        "%s is %s; its streamlines were placed on the reference grid %s (affine of the reference). "
        "Check that this is the image they were tracked on.",
        path,
        what,
        tuple(ref_dims),
    )
    return points_mm, lengths, (affine, ref_dims), per_point, per_streamline


def _read_trx(path: Path, grid, check_positions: bool = True):
    from trx.trx_file_memmap import load as trx_load

    compressed = _compressed_trx(path)
    trx = trx_load(str(path))
    if not compressed and trx.streamlines._data.dtype != np.float64:
        return _mapped_trx(trx, path, grid, check_positions)  # not closed: closing would unmap what it keeps
    try:
        if grid is None:
            grid = (trx.header["VOXEL_TO_RASMM"], trx.header["DIMENSIONS"])
        # A compressed .trx is extracted to a folder that close() removes (and float64 positions,
        # as sessions write them, are no use to the 3-D view as they are): everything is read
        # (the positions a chunk at a time) and converted before close().
        return _tractogram_from_mm(
            trx.streamlines._data,
            np.array(trx.streamlines._lengths),
            grid,
            {k: v._data for k, v in trx.data_per_vertex.items()},
            dict(trx.data_per_streamline.items()),
            path,
        )
    finally:
        trx.close()


def _compressed_trx(path: Path) -> bool:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return any(info.compress_type != zipfile.ZIP_STORED for info in zf.infolist())


def _mapped_trx(trx, path: Path, grid, check_positions: bool = True) -> Tractogram:
    """An uncompressed .trx (``trx``: trx-python's, opened) as a tractogram over its
    memory-mapped float16/32 positions (RAS mm): nothing is converted or copied (see
    :class:`app.tractogram.MappedPoints`); the positions are read once, a chunk at a time and
    never kept, to check that they are finite and lie where the grid's voxel coordinates can
    hold them (now, or with ``check_positions`` False when first asked). Per-point scalars stay
    memory maps too."""
    if grid is None:
        grid = (trx.header["VOXEL_TO_RASMM"], trx.header["DIMENSIONS"])
    affine, dims = _check_grid(grid, path)
    fix = _DAMAGED[".trx"]
    points_mm = trx.streamlines._data
    lengths = np.asarray(trx.streamlines._lengths)
    if points_mm.size == 0 and lengths.size == 0:
        points_mm, lengths = np.zeros((0, 3), np.float32), np.zeros(0, np.int64)
    if points_mm.ndim != 2 or points_mm.shape[1:] != (3,) or lengths.ndim != 1:
        raise InputError(f"the points have shape {points_mm.shape}, not (N, 3)", path=path, fix=fix)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if (lengths < 0).any() or int(offsets[-1]) != len(points_mm):
        raise InputError("the streamline lengths do not add up to the number of points", path=path, fix=fix)
    to_voxel = np.linalg.inv(affine)
    reader = PreadRows.over(points_mm)  # opens the file now: what is read later is this file
    fits = functools.partial(points_fit_grid, reader, to_voxel)
    if check_positions and not fits():
        raise InputError(BAD_POSITIONS, path=path, fix=fix)

    def column(values):  # (n, 1) columns as (n,) views: a memory map stays one
        return values[:, 0] if values.ndim == 2 and values.shape[1] == 1 else values

    try:
        return Tractogram(
            MappedPoints(points_mm, to_voxel, _to_voxels, release_pages, reader, None if check_positions else fits),
            offsets,
            affine,
            dims,
            {k: column(v._data) for k, v in trx.data_per_vertex.items()},
            {k: _single_column(v) for k, v in trx.data_per_streamline.items()},
            name=path.name.split(".")[0],
            source=str(path),
        )
    except ValueError as exc:  # scalars that do not match the streamlines
        raise InputError(f"the file is inconsistent: {reason(exc)}", path=path, fix=fix) from None


def _single_column(values) -> np.ndarray:
    """Copy a scalar array out of the file's buffers; (n, 1) columns become (n,)."""
    array = np.array(values)
    return array[:, 0] if array.ndim == 2 and array.shape[1] == 1 else array


def _check_grid(grid, path: Path) -> tuple[np.ndarray, tuple[int, int, int]]:
    fix = "The header's voxel-to-RAS transform or dimensions are damaged; write the file again"
    try:
        affine = np.asarray(grid[0], dtype=np.float64)
        dims = np.asarray(grid[1], dtype=np.float64).ravel()
    except (TypeError, ValueError, IndexError, OverflowError):
        raise InputError("the tractogram's grid (voxel-to-RAS transform, dimensions) is unreadable", path=path,
                         fix=fix) from None  # fmt: skip
    affine = check_affine(affine, path, "tractogram", fix=fix)
    if dims.shape != (3,) or not np.isfinite(dims).all() or (dims < 1).any() or (dims != np.round(dims)).any():
        raise InputError(
            f"the tractogram's grid dimensions {dims.tolist()} are not three whole numbers of at least 1",
            path=path,
            fix=fix,
        )
    if (dims > 2**31 - 1).any():
        raise InputError(f"the tractogram's grid dimensions {dims.tolist()} are absurd", path=path, fix=fix)
    return affine, tuple(int(d) for d in dims)


#: Points converted to voxel coordinates at a time when a tractogram is read (48 MB of float64)
LOAD_CHUNK_POINTS = 1 << 21
#: Threads converting chunks of points
LOAD_THREADS = min(16, host_threads())  # a batch worker's share of the cores (TRACTLENS_THREADS)
#: Chunks read from a memory-mapped file between releases of its pages (see :mod:`._pages`)
RELEASE_EVERY_CHUNKS = 8


def _to_voxels(points_mm, to_voxel: np.ndarray) -> np.ndarray | None:
    """``points_mm`` (P, 3) (any float type; a memory map is read a chunk at a time) through
    ``to_voxel`` in float64, stored as float32: the values of converting all at once and casting,
    without the whole float64 copies (72 bytes a point at the peak; now the output's 12 and a
    chunk per thread). Chunks are converted by a pool of threads (NumPy releases the GIL; on a
    memory map this also reads the file in parallel). None when a converted point is NaN or
    infinite in float32."""
    out = np.empty((len(points_mm), 3), dtype=np.float32)
    starts = range(0, len(points_mm), LOAD_CHUNK_POINTS)
    source = PreadRows.over(points_mm)  # a memory-mapped file is read with pread: no page faults
    mapped = source is points_mm  # an array in memory, or a map pread cannot read

    def convert(k_lo) -> bool:
        k, lo = k_lo
        part = out[lo : lo + LOAD_CHUNK_POINTS]
        with np.errstate(all="ignore"):
            affine_rows(to_voxel, np.asarray(source[lo : lo + LOAD_CHUNK_POINTS], np.float64), part)
        if mapped and k % RELEASE_EVERY_CHUNKS == RELEASE_EVERY_CHUNKS - 1:
            release_pages(points_mm)
        return bool(np.isfinite(part).all())

    workers = min(LOAD_THREADS, len(starts))
    try:
        if workers <= 1:
            finite = all([convert(item) for item in enumerate(starts)])
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                finite = all(list(pool.map(convert, enumerate(starts))))
    finally:
        if not mapped:
            source.close()
    release_pages(points_mm)
    return out if finite else None


def _tractogram_from_mm(points_mm, lengths, grid, per_point: dict, per_streamline: dict, path: Path):
    """Streamlines in RAS mm (as the libraries give them) -> a Tractogram in voxel coordinates."""
    affine, dims = _check_grid(grid, path)
    fix = _DAMAGED[path.suffix.lower()]
    lengths = np.asarray(lengths)
    points_mm = np.asanyarray(points_mm)  # a memory map stays one
    if points_mm.size == 0 and lengths.size == 0:
        # 0 streamlines is an ordinary result (a target nothing reached); the libraries give
        # its points as a flat (0,) array
        points_mm, lengths = np.zeros((0, 3), np.float64), np.zeros(0, np.int64)
    if points_mm.ndim != 2 or points_mm.shape[1:] != (3,) or lengths.ndim != 1:
        raise InputError(f"the points have shape {points_mm.shape}, not (N, 3)", path=path, fix=fix)
    if (lengths < 0).any() or int(lengths.sum(dtype=np.int64)) != len(points_mm):
        raise InputError("the streamline lengths do not add up to the number of points", path=path, fix=fix)
    points = _to_voxels(points_mm, np.linalg.inv(affine))
    if points is None:
        raise InputError(BAD_POSITIONS, path=path, fix=fix)
    offsets = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    try:
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
    except ValueError as exc:  # scalars that do not match the streamlines
        raise InputError(f"the file is inconsistent: {reason(exc)}", path=path, fix=fix) from None


def _nib_tractogram(tractogram: Tractogram, keep_scalars: bool, exact: bool = False) -> NibTractogram:
    if exact:  # float64 mm: back in voxel coordinates, the float32 points come out bit for bit
        points_mm = np.empty((tractogram.n_points, 3), dtype=np.float64)  # filled in chunks: no temporaries
        rotation, shift = tractogram.affine[:3, :3].T, tractogram.affine[:3, 3]
        for start in range(0, len(points_mm), LOAD_CHUNK_POINTS):  # (a mapped file's: converted as read)
            chunk = tractogram.points_rows(start, start + LOAD_CHUNK_POINTS).astype(np.float64)
            np.matmul(chunk, rotation, out=points_mm[start : start + LOAD_CHUNK_POINTS])
            points_mm[start : start + LOAD_CHUNK_POINTS] += shift
    else:
        points_mm = tractogram.points_world().astype(np.float32)
    return nib_tractogram_mm(
        points_mm,
        tractogram.offsets,
        tractogram.point_scalars if keep_scalars else {},
        tractogram.streamline_scalars if keep_scalars else {},
        exact,
    )


def nib_tractogram_mm(points_mm, offsets, point_scalars: dict, streamline_scalars: dict, exact: bool = False):
    """A nibabel Tractogram over ``points_mm`` (RAS mm) without copying them; scalars as float32
    (in their own dtypes with ``exact``), (n,) columns as (n, 1)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    seq = ArraySequence()
    seq._data = points_mm
    seq._offsets = offsets[:-1].copy()
    seq._lengths = np.diff(offsets)
    data_per_point = {}
    data_per_streamline = {}
    for key, values in point_scalars.items():
        arr = np.asarray(values, dtype=None if exact else np.float32)
        arr = arr[:, None] if arr.ndim == 1 else arr
        per = ArraySequence()
        per._data = arr
        per._offsets = seq._offsets.copy()
        per._lengths = seq._lengths.copy()
        data_per_point[key] = per
    for key, values in streamline_scalars.items():
        arr = np.asarray(values, dtype=None if exact else np.float32)
        data_per_streamline[key] = arr[:, None] if arr.ndim == 1 else arr
    return NibTractogram(
        seq, data_per_streamline=data_per_streamline, data_per_point=data_per_point, affine_to_rasmm=np.eye(4)
    )


def trk_header(affine: np.ndarray, dimensions) -> dict:
    """The .trk header fields of a grid (voxel -> RAS mm ``affine``, ``dimensions``)."""
    return {
        Field.VOXEL_TO_RASMM: affine,
        Field.DIMENSIONS: np.array(dimensions, dtype=np.int16),
        Field.VOXEL_SIZES: np.sqrt((affine[:3, :3] ** 2).sum(0)).astype(np.float32),
        Field.VOXEL_ORDER: "".join(nib.aff2axcodes(affine)),
    }


def trx_reference(affine: np.ndarray, dimensions) -> nib.Nifti1Header:
    """The NIfTI header trx-python takes a .trx file's grid from."""
    header = nib.Nifti1Header()
    header.set_data_shape(dimensions)
    header.set_qform(affine, code=1)
    header.set_sform(affine, code=1)
    header.set_zooms(np.sqrt((affine[:3, :3] ** 2).sum(0)))
    return header


def save_tractogram(tractogram: Tractogram, path: str | os.PathLike, *, exact: bool = False) -> Path:
    """Write .trk/.tck/.trx (format from the suffix), atomically, in RAS mm.

    ``exact`` (.trx only): positions as float64 and scalars in their own dtypes, so that
    reading the file back gives the same arrays bit for bit (sessions use it). To write
    streamlines as they are computed, without holding them all, see
    :mod:`app.io.tractogram_stream` (the same bytes)."""
    path = Path(path)
    suffix = _suffix(path)
    if exact and suffix != ".trx":
        raise ValueError("exact tractograms are written as .trx")
    nib_tract = _nib_tractogram(tractogram, keep_scalars=suffix != ".tck", exact=exact)
    with atomic_path(path) as tmp:
        if suffix == ".trx":
            _save_trx(nib_tract, tractogram, tmp, exact)
        elif suffix == ".trk":
            nib.streamlines.save(nib_tract, str(tmp), header=trk_header(tractogram.affine, tractogram.dimensions))
        else:
            timestamp = content_timestamp(len(tractogram), points_crc(nib_tract.streamlines._data))
            nib.streamlines.save(nib_tract, str(tmp), header={"timestamp": timestamp})
    if suffix == ".tck" and len(tractogram):  # as the streamed writer: no side files for no streamlines
        write_tck_sidecars(path, tractogram, timestamp)
    return path


def tck_scalar_columns(scalars: dict) -> dict[str, np.ndarray]:
    """Scalars as single columns for the side files: a (n, k) one becomes NAME0..NAME{k-1}."""
    columns = {}
    for name, values in scalars.items():
        values = np.asarray(values)
        if values.ndim == 2 and values.shape[1] != 1:
            columns.update({f"{name}{j}": values[:, j] for j in range(values.shape[1])})
        else:
            columns[name] = values.reshape(len(values))
    return columns


def write_tck_sidecars(path: Path, tractogram: Tractogram, timestamp: str) -> list[Path]:
    """The scalars of ``tractogram`` beside its .tck ``path``: a .tsf per per-point scalar (with the
    .tck's ``timestamp``), a text file per per-streamline one."""
    point = tck_scalar_columns(tractogram.point_scalars)
    streamline = tck_scalar_columns(tractogram.streamline_scalars)
    paths = sidecar_paths(path, point, streamline)
    written = [write_tsf(paths[name], values, tractogram.offsets, timestamp) for name, values in point.items()]
    written += [write_streamline_values(paths[name], values) for name, values in streamline.items()]
    return written


def _save_trx(nib_tract: NibTractogram, tractogram: Tractogram, tmp: Path, exact: bool = False) -> None:
    from trx.trx_file_memmap import TrxFile
    from trx.trx_file_memmap import save as trx_save

    header = trx_reference(tractogram.affine, tractogram.dimensions)
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
