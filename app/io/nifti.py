"""NIfTI volumes, masks and label maps through nibabel (NIfTI-1 and -2, .nii/.nii.gz).

FreeSurfer's MGH images (``.mgz``/``.mgh``: ``aparc+aseg.mgz``, ``T1.mgz``...) are read wherever a
NIfTI is, with nibabel's voxel-to-RAS affine (the scanner one, not FreeSurfer's tkr); outputs are
always NIfTI."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import nibabel as nib
import numpy as np

from ..errors import InputError
from ..grid import Grid
from ..model import Volume
from . import _gzip
from ._atomic import atomic_path
from .dicom_import import dicom_input

_gzip.install()  # .nii.gz through ISA-L when python-isal is installed (the fast-io extra)

NIFTI_SUFFIXES = (".nii", ".nii.gz")
#: FreeSurfer's MGH format, compressed (.mgz) or not (.mgh).
MGH_SUFFIXES = (".mgz", ".mgh")
#: Every image file TractLens reads.
IMAGE_SUFFIXES = NIFTI_SUFFIXES + MGH_SUFFIXES
#: deflate expands at most ~1032:1, so a .nii.gz cannot hold more than this times its size.
MAX_GZIP_RATIO = 1100
REEXPORT = "The file is damaged or was not written as NIfTI; export it again from the tool that made it"


def reason(exc: BaseException, limit: int = 200) -> str:
    """A library's error message as one short line (they may hold newlines and paths)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable, else free pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.1f} MiB"


def check_exists(path: str | os.PathLike, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} not found", path=path, fix="Check the path and spelling")
    return path


def load_image(path: str | os.PathLike, what: str = "image", *, mmap: str = "c") -> nib.Nifti1Image:
    """Open a NIfTI (or FreeSurfer MGH) image lazily, turning nibabel's errors into :class:`InputError`.

    The header is checked (:func:`check_header`) before any data is read, so a damaged
    header never makes a reader allocate or read what the file cannot hold. ``mmap``: how an
    uncompressed file's data are mapped ("c" copy-on-write, nibabel's default; "r" read-only,
    for readers that never write into the array and release its pages once read)."""
    path = check_exists(path, what)
    if path.is_dir():  # a DICOM folder (or series folder): its image, converted (cached)
        dicom = dicom_input(path, kind=None)
        if dicom is not None:
            return load_image(dicom.nifti, what, mmap=mmap)
    if path.is_dir():
        raise InputError(
            f"expected a NIfTI file for the {what} but this is a folder",
            path=path,
            fix="Give the .nii or .nii.gz file inside it",
        )
    lower = path.name.lower()
    if not lower.endswith(IMAGE_SUFFIXES):
        raise InputError(
            f"not a NIfTI file (the {what} must end in .nii or .nii.gz; FreeSurfer's .mgz and .mgh are read too)",
            path=path,
            fix="Convert it first, e.g. with dcm2niix for DICOM or mrconvert for .mif",
        )
    if lower.endswith(MGH_SUFFIXES):
        return _load_mgh(path, what, mmap)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img = nib.load(path, mmap=mmap)
    except Exception as exc:  # nibabel raises many types for corrupt files
        raise InputError(
            f"could not be read as NIfTI ({reason(exc)})",
            path=path,
            fix="The file may be truncated or not a NIfTI image; re-export it",
        ) from None
    if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
        raise InputError(
            f"is a {type(img).__name__}, not a NIfTI image",
            path=path,
            fix="Convert it to NIfTI (e.g. with mrconvert or fslchfiletype)",
        )
    check_header(img, path, what)
    return img


def _load_mgh(path: Path, what: str, mmap: str) -> nib.MGHImage:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img = nib.MGHImage.from_filename(str(path), mmap=mmap if path.suffix.lower() == ".mgh" else False)
    except Exception as exc:
        raise InputError(
            f"could not be read as a FreeSurfer MGH image ({reason(exc)})",
            path=path,
            fix="The file may be truncated or damaged; copy it again, or convert it with mri_convert to .nii.gz",
        ) from None
    check_header(img, path, what)
    return img


def check_header(img, path: str | os.PathLike, what: str = "image") -> None:
    """Refuse a header that cannot describe this file's data, before the data is read.

    Checks: every dimension at least 1; a real-valued data type; the data the header
    announces fits the file (uncompressed: between the data offset and the end; gzip:
    at most :data:`MAX_GZIP_RATIO` times the compressed size) and the memory available;
    a finite, invertible voxel-to-world affine (which also covers zero or NaN voxel sizes
    where they define the geometry). Raises :class:`InputError`.
    """
    path = Path(path)
    header = img.header
    try:
        shape = tuple(int(s) for s in header.get_data_shape())
        dtype = np.dtype(header.get_data_dtype())
        offset = int(header.get_data_offset())
    except Exception as exc:
        raise InputError(f"the {what}'s header is damaged ({reason(exc)})", path=path, fix=REEXPORT) from None
    if not shape or min(shape) < 1:
        raise InputError(
            f"the {what}'s header gives it the size {shape}: every dimension must be at least 1",
            path=path,
            fix=REEXPORT,
        )
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise InputError(
            f"the {what} stores {'colour (RGB)' if dtype.fields else dtype.name} values; TractLens reads real numbers",
            path=path,
            fix="Convert it to a float or integer image (e.g. fslmaths IN OUT -odt float)",
        )
    voxels = math.prod(shape)
    nbytes = voxels * dtype.itemsize
    size = path.stat().st_size
    compressed = path.name.lower().endswith((".gz", ".mgz"))
    if offset < 0:
        raise InputError(f"the {what}'s header has a negative data offset ({offset})", path=path, fix=REEXPORT)
    if not compressed and offset + nbytes > size:
        raise InputError(
            f"the file is truncated or its header is wrong: the header announces {shape} {dtype} values "
            f"({nbytes} bytes from byte {offset}) but the file has {size} bytes",
            path=path,
            fix="Copy or export the file again (an interrupted download or copy truncates it)",
        )
    if compressed and offset + nbytes > MAX_GZIP_RATIO * size + 4096:
        raise InputError(
            f"the header announces {shape} {dtype} values ({_gib(nbytes)}), more than a {size}-byte {'.mgz' if path.suffix.lower() == '.mgz' else '.nii.gz'} "
            "can hold: the header (or the file) is damaged",
            path=path,
            fix="Copy or export the file again",
        )
    needed = voxels * 8  # the largest form a loader makes (float64)
    free = available_memory()
    if free is not None and needed > free:
        raise InputError(
            f"the {what} ({shape}) needs {_gib(needed)} of memory to load, {_gib(free)} is available",
            path=path,
            fix="Close other programs, or crop or downsample the image first",
        )
    check_affine(img.affine, path, what)


def check_affine(affine, path, what: str = "image", fix: str | None = None) -> np.ndarray:
    """A voxel-to-world affine that is finite and invertible, as float64; else :class:`InputError`."""
    affine = np.asarray(affine, dtype=np.float64)
    fix = fix or (
        "Its voxel sizes or orientation (sform/qform, pixdim) are missing or damaged; repair the header "
        "(e.g. fslorient, or nibabel) or export the image again"
    )
    if affine.shape != (4, 4) or not np.isfinite(affine).all():
        raise InputError(f"the {what}'s voxel-to-world transform is not a finite 4x4 matrix", path=path, fix=fix)
    with np.errstate(all="ignore"):
        singular = np.linalg.svd(affine[:3, :3], compute_uv=False)
    if not np.isfinite(singular).all() or singular[-1] <= 1e-8 * max(singular[0], 1e-300) or singular[-1] < 1e-12:
        raise InputError(
            f"the {what}'s voxel-to-world transform is singular (a voxel size is zero, or two axes coincide)",
            path=path,
            fix=fix,
        )
    return affine


def _read(img, path, what: str, fn) -> np.ndarray:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except MemoryError:
        raise InputError(
            f"the {what} is too large for the memory available", path=path, fix="Crop or downsample it first"
        ) from None
    except Exception as exc:
        raise InputError(
            f"the image data could not be read ({reason(exc)})",
            path=path,
            fix="The file may be truncated or damaged; copy or export it again",
        ) from None


#: Bytes of stored data converted at a time by :func:`read_array` (bounds its temporaries).
CONVERT_CHUNK_BYTES = 64 * 2**20


def read_array(img, path, dtype=np.float32, what: str = "image") -> np.ndarray:
    """The image's data, scaled, as float32 (or float64); values that overflow become ±inf.

    The values are nibabel's ``get_fdata`` values, read without its temporaries: an
    uncompressed ``.nii`` already stored in the wanted type without scaling is returned as a
    (copy-on-write) memory map of the file, no copy at all; otherwise the stored data (a memory
    map, or the decompressed bytes of a ``.nii.gz``) are scaled and converted a slab of the last
    axis at a time into one array in the file's (column-major) order."""
    wanted = np.dtype(np.float32 if dtype == np.float32 else np.float64)
    proxy = img.dataobj
    if not hasattr(proxy, "get_unscaled") or not hasattr(proxy, "slope"):
        return _read(img, path, what, lambda: np.asarray(img.get_fdata(dtype=wanted), dtype=dtype))
    return _read(img, path, what, lambda: np.asarray(_scaled(proxy, wanted), dtype=dtype))


def _scaled(proxy, wanted: np.dtype) -> np.ndarray:
    """``np.asanyarray(proxy, dtype=wanted)`` (nibabel's scaling, bit for bit) slab by slab."""
    from nibabel.volumeutils import apply_read_scaling

    raw = proxy.get_unscaled()
    shape = tuple(proxy.shape)
    raw = raw.reshape(shape, order="F") if raw.shape != shape else raw
    slope, inter = np.asanyarray(proxy.slope), np.asanyarray(proxy.inter)
    if np.can_cast(slope, wanted):
        slope = slope.astype(wanted)
    if np.can_cast(inter, wanted):
        inter = inter.astype(wanted)
    unscaled = (slope, inter) == (1, 0)
    if unscaled and raw.dtype == wanted:
        return np.asarray(raw)  # a memory map stays one: no copy of the file
    if raw.ndim == 0 or not shape:
        return np.asarray(apply_read_scaling(raw, slope, inter), dtype=wanted)
    out = np.empty(shape, dtype=wanted, order="F")
    per_slab = max(1, math.prod(shape[:-1]) * max(raw.dtype.itemsize, wanted.itemsize))
    step = max(1, CONVERT_CHUNK_BYTES // per_slab)
    for start in range(0, shape[-1], step):
        part = apply_read_scaling(raw[..., start : start + step], slope, inter)
        out[..., start : start + step] = part.astype(np.promote_types(part.dtype, wanted), copy=False)
    return out


def read_raw(img, path, what: str = "image") -> np.ndarray:
    """The image's data in its stored type (scaled, when the header says so)."""
    return _read(img, path, what, lambda: np.asanyarray(img.dataobj))


def _spatial_shape(img, path, what: str, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """The header's shape with trailing length-1 axes beyond the third dropped; checked against ``allowed``."""
    shape = tuple(int(s) for s in img.shape)
    while len(shape) > max(allowed) and shape[-1] == 1:
        shape = shape[:-1]
    if len(shape) not in allowed:
        dims = " or ".join(f"{n}-D" for n in allowed)
        raise InputError(
            f"the {what} must be a {dims} image, this one has shape {tuple(img.shape)}",
            path=path,
            fix="A 2-D image (one slice) or a series cannot be used here; give the 3-D image",
        )
    return shape


def image_grid(img, path, what: str = "image", allowed: tuple[int, ...] = (3, 4)) -> Grid:
    """The voxel grid of an image read with :func:`load_image`; a 2-D image (or one of more axes
    than ``allowed``) is refused with the reason instead of failing later."""
    return Grid(img.affine, _spatial_shape(img, path, what, allowed)[:3])


#: What :func:`save_volume` writes: single-file NIfTI-1 (``.img``/``.hdr`` pairs are not written).
NIFTI_SUFFIXES = (".nii", ".nii.gz")


def check_nifti_output(path: str | os.PathLike, what: str = "output image") -> Path:
    """Refuse an image output whose name does not end in .nii or .nii.gz (before any work)."""
    path = Path(path)
    if not path.name.lower().endswith(NIFTI_SUFFIXES):
        raise InputError(
            f"the {what} is written as NIfTI, and its name must end in .nii.gz or .nii", path=path,
            fix=f"Name it e.g. {path.name.split('.')[0] or 'out'}.nii.gz",
        )  # fmt: skip
    return path


def load_volume(path: str | os.PathLike, *, name: str | None = None, kind: str = "scalar") -> Volume:
    """Load a 3-D (or 4-D) NIfTI (or MGH) volume as a :class:`Volume` in its voxel space."""
    img = load_image(path, "volume")
    shape = _spatial_shape(img, path, "volume", (3, 4))
    data = read_array(img, path, what="volume").reshape(shape)
    return Volume(name or Path(path).name.split(".")[0], data, img.affine.copy(), kind=kind, source=str(path))


def load_3d(path: str | os.PathLike, reference: Volume | None, what: str) -> np.ndarray:
    """The raw array of a 3-D image (a single-volume 4-D one is accepted), on ``reference``'s grid."""
    img = load_image(path, what)
    shape = _spatial_shape(img, path, what, (3,))
    if reference is not None:
        check_same_grid(img.affine, shape, reference, path, what)
    return read_raw(img, path, what).reshape(shape)


def load_mask(path: str | os.PathLike, reference: Volume | None = None, *, what: str = "mask") -> np.ndarray:
    """Load a binary mask (non-zero = inside), checked against ``reference``'s grid.

    NaN voxels count as outside. Raises :class:`InputError` when the mask is not 3-D,
    does not match the reference's shape or affine, or is empty.
    """
    data = load_3d(path, reference, what)
    mask = (data != 0) & np.isfinite(data)
    if not mask.any():
        raise InputError(f"the {what} is empty (no non-zero voxel)", path=path, fix="Draw or choose a non-empty region")
    return mask


LABEL_MAX = int(np.iinfo(np.int32).max)


def load_labels(path: str | os.PathLike, reference: Volume | None = None) -> np.ndarray:
    """Load an integer label volume (atlas, parcellation) as int32, checked against ``reference``.

    Labels must be whole numbers from 0 to 2^31 - 1; NaN, Inf, negative or fractional values
    mean the image is not a parcellation (:class:`InputError`)."""
    raw = load_3d(path, reference, "label volume")
    values = np.asarray(raw, dtype=np.float64)
    with np.errstate(all="ignore"):
        bad = not np.isfinite(values).all() or (values != np.round(values)).any() or (values < 0).any()
    if bad:
        raise InputError(
            "label values must be non-negative whole numbers (this looks like a continuous map)",
            path=path,
            fix="Give the parcellation itself, not a probability or intensity image",
        )
    if values.size and values.max() > LABEL_MAX:
        raise InputError(
            f"label values must be below 2^31 (the largest here is {values.max():.0f})",
            path=path,
            fix="Renumber the regions (e.g. with labelconvert) or check that this is a parcellation",
        )
    return values.astype(np.int32)


def check_same_grid(affine, shape, reference: Volume, path, what: str) -> None:
    ref_shape = reference.shape3
    if tuple(shape[:3]) != tuple(ref_shape):
        raise InputError(
            f"the {what} has {tuple(shape[:3])} voxels but the data has {tuple(ref_shape)}: "
            "it lies (partly) outside the volume",
            path=path,
            fix="Resample it to the diffusion data's grid (e.g. flirt -applyxfm or mrgrid)",
        )
    if not Grid.affines_match(affine, reference.affine):
        raise InputError(
            f"the {what} is on the same number of voxels but a different position or orientation "
            "than the data (affines differ)",
            path=path,
            fix="Resample it to the diffusion data's grid",
        )


def _nifti_image(data, affine: np.ndarray, intent=None) -> nib.Nifti1Image:
    img = nib.Nifti1Image(data, affine)
    img.header.set_xyzt_units("mm", "sec")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    if intent is not None:
        img.header.set_intent(intent)
    return img


def save_volume(data: np.ndarray, affine: np.ndarray, path: str | os.PathLike, *, dtype=None, intent=None) -> Path:
    """Write ``data`` as NIfTI-1 atomically; the suffix (.nii/.nii.gz) picks compression."""
    path = check_nifti_output(path)
    array = np.asarray(data)
    if dtype is not None:
        array = array.astype(dtype, copy=False)  # float32 maps are written as they are, not copied
    img = _nifti_image(array, affine, intent)
    with atomic_path(path) as tmp:
        nib.save(img, tmp)
    return path


def save_volume_slabs(
    shape: tuple[int, ...],
    affine: np.ndarray,
    path: str | os.PathLike,
    slabs: Iterable[np.ndarray],
    *,
    dtype=np.float32,
    intent=None,
) -> Path:
    """Write a NIfTI-1 image of ``shape`` whose data come as slabs of its last axis, in order:
    the same file as :func:`save_volume` of the whole array, without the whole array in memory.

    Each slab is an array of ``shape[:-1] + (k,)`` (any layout); it is written in the file's
    column-major order as it comes. The header is nibabel's, made as ``nib.save`` makes it
    (``to_file_map``: same scaling decision, offset and extensions) for an array of this shape
    and type."""
    from nibabel.arraywriters import get_slope_inter, make_array_writer
    from nibabel.volumeutils import seek_tell

    path = Path(path)
    dtype = np.dtype(dtype)
    template = np.broadcast_to(np.zeros((), dtype), shape)  # no memory: only shape and type
    img = _nifti_image(template, affine, intent)
    img.update_header()
    header = img.header
    writer = make_array_writer(template, dtype, header.has_data_slope, header.has_data_intercept)
    header.set_slope_inter(*get_slope_inter(writer))
    done = 0
    with atomic_path(path) as tmp:
        with nib.openers.ImageOpener(tmp, "wb") as stream:
            header.write_to(stream)
            seek_tell(stream, header.get_data_offset(), write0=True)
            for slab in slabs:
                slab = np.asarray(slab, dtype=dtype)
                if slab.shape[:-1] != tuple(shape[:-1]) or done + slab.shape[-1] > shape[-1]:
                    raise ValueError(f"slab of shape {slab.shape} does not continue an image of shape {shape}")
                stream.write(np.asfortranarray(slab).T.tobytes() if not slab.flags.f_contiguous else slab.T.data)
                done += slab.shape[-1]
        if done != shape[-1]:
            raise ValueError(f"{done} of the {shape[-1]} slabs of {path.name} were given")
    return path
