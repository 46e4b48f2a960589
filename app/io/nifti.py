"""NIfTI volumes, masks and label maps through nibabel (NIfTI-1 and -2, .nii/.nii.gz)."""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np

from ..errors import InputError
from ..model import Volume
from ._atomic import atomic_path

NIFTI_SUFFIXES = (".nii", ".nii.gz")


def check_exists(path: str | os.PathLike, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} not found", path=path, fix="Check the path and spelling")
    return path


def load_image(path: str | os.PathLike, what: str = "image") -> nib.Nifti1Image:
    """Open a NIfTI image lazily, turning nibabel's errors into :class:`InputError`."""
    path = check_exists(path, what)
    if path.is_dir():
        raise InputError(f"expected a NIfTI file for the {what} but this is a folder", path=path)
    lower = path.name.lower()
    if not lower.endswith(NIFTI_SUFFIXES):
        raise InputError(
            f"not a NIfTI file (the {what} must end in .nii or .nii.gz)",
            path=path,
            fix="Convert it first, e.g. with dcm2niix for DICOM or mrconvert for .mif",
        )
    try:
        img = nib.load(path)
    except Exception as exc:  # nibabel raises many types for corrupt files
        raise InputError(
            f"could not be read as NIfTI ({exc})",
            path=path,
            fix="The file may be truncated or not a NIfTI image; re-export it",
        ) from exc
    if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
        raise InputError(f"is a {type(img).__name__}, not a NIfTI image", path=path)
    return img


def read_array(img, path, dtype=np.float32) -> np.ndarray:
    try:
        return np.asarray(img.get_fdata(dtype=np.float32 if dtype == np.float32 else np.float64), dtype=dtype)
    except Exception as exc:
        raise InputError(
            f"the image data could not be read ({exc})", path=path, fix="The file may be truncated"
        ) from exc


def load_volume(path: str | os.PathLike, *, name: str | None = None, kind: str = "scalar") -> Volume:
    """Load a 3-D (or 4-D) NIfTI volume as a :class:`Volume` in its voxel space."""
    img = load_image(path, "volume")
    data = read_array(img, path)
    return Volume(name or Path(path).name.split(".")[0], data, img.affine.copy(), kind=kind, source=str(path))


def load_3d(path: str | os.PathLike, reference: Volume | None, what: str) -> np.ndarray:
    """The raw array of a 3-D image (a single-volume 4-D one is accepted), on ``reference``'s grid."""
    img = load_image(path, what)
    data = np.asanyarray(img.dataobj)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise InputError(f"the {what} must be a 3-D image, this one has shape {data.shape}", path=path)
    if reference is not None:
        check_same_grid(img.affine, data.shape, reference, path, what)
    return data


def load_mask(path: str | os.PathLike, reference: Volume | None = None, *, what: str = "mask") -> np.ndarray:
    """Load a binary mask (non-zero = inside), checked against ``reference``'s grid.

    Raises :class:`InputError` when the mask is not 3-D, does not match the
    reference's shape or affine, or is empty.
    """
    data = load_3d(path, reference, what)
    finite = np.isfinite(data)
    mask = (data != 0) & finite
    if not mask.any():
        raise InputError(f"the {what} is empty (no non-zero voxel)", path=path, fix="Draw or choose a non-empty region")
    return mask


def load_labels(path: str | os.PathLike, reference: Volume | None = None) -> np.ndarray:
    """Load an integer label volume (atlas, parcellation) as int32, checked against ``reference``."""
    values = np.asarray(load_3d(path, reference, "label volume"), dtype=np.float64)
    if not np.isfinite(values).all() or (values != np.round(values)).any() or (values < 0).any():
        raise InputError(
            "label values must be non-negative whole numbers (this looks like a continuous map)",
            path=path,
            fix="Give the parcellation itself, not a probability or intensity image",
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
    if not np.allclose(affine, reference.affine, atol=1e-3):
        raise InputError(
            f"the {what} is on the same number of voxels but a different position or orientation "
            "than the data (affines differ)",
            path=path,
            fix="Resample it to the diffusion data's grid",
        )


def save_volume(data: np.ndarray, affine: np.ndarray, path: str | os.PathLike, *, dtype=None, intent=None) -> Path:
    """Write ``data`` as NIfTI-1 atomically; the suffix (.nii/.nii.gz) picks compression."""
    path = Path(path)
    array = np.asarray(data)
    if dtype is not None:
        array = array.astype(dtype)
    img = nib.Nifti1Image(array, affine)
    img.header.set_xyzt_units("mm", "sec")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    if intent is not None:
        img.header.set_intent(intent)
    with atomic_path(path) as tmp:
        nib.save(img, tmp)
    return path
