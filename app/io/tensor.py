"""Tensor volumes in the formats found in the wild, to and from the internal form.

Internally a tensor volume is (X, Y, Z, 6) in the order xx, xy, xz, yy, yz, zz,
in voxel axes, mm²/s. On disk:

==========  =============================  ===============================
order       element order of the 6 volumes  frame of the components
==========  =============================  ===============================
``fsl``     xx, xy, xz, yy, yz, zz          FSL bvec frame (dtifit)
``dipy``    xx, xy, yy, xz, yz, zz          bvec frame (DIPY fits the bvecs as given)
``mrtrix``  xx, yy, zz, xy, xz, yz          scanner (RAS world) frame
==========  =============================  ===============================

The order of a bare 6-volume file cannot be told from its numbers, so
:func:`load_tensor` refuses to guess: the caller names it, unless the header
says it (NIfTI intent SYMMATRIX, which stores the lower triangle row by row,
i.e. DIPY's order) or the input is a dtifit folder (FSL).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from tractlens.gpu import sym3

from ..errors import InputError
from ..model import Volume
from .dwi import x_flip_needed
from .nifti import load_image, read_array, save_volume

log = logging.getLogger(__name__)

TENSOR_ORDERS = ("fsl", "dipy", "mrtrix")
# Position of each internal component (xx, xy, xz, yy, yz, zz) in the file's 6 volumes.
_FILE_INDEX = {
    "fsl": (0, 1, 2, 3, 4, 5),
    "dipy": (0, 1, 3, 2, 4, 5),
    "mrtrix": (0, 3, 4, 1, 5, 2),
}
NIFTI_INTENT_SYMMATRIX = 1005


def world_rotation(affine: np.ndarray) -> np.ndarray:
    """The rotation part of a voxel->world affine (zooms and shears removed by polar decomposition)."""
    u, _s, vt = np.linalg.svd(np.asarray(affine)[:3, :3])
    return u @ vt


def from_file_frame(tensor: np.ndarray, order: str, affine: np.ndarray) -> np.ndarray:
    """File components (already reordered to internal order) -> voxel axes."""
    if order == "mrtrix":
        # D_world = R D_vox Rᵀ with R the affine's rotation => D_vox = Rᵀ D_world R.
        rot = world_rotation(affine)
        return sym3.rotate(np, tensor, rot.T)
    return sym3.flip_x_frame(tensor) if x_flip_needed(affine) else tensor


def to_file_frame(tensor: np.ndarray, order: str, affine: np.ndarray) -> np.ndarray:
    if order == "mrtrix":
        return sym3.rotate(np, tensor, world_rotation(affine))
    return sym3.flip_x_frame(tensor) if x_flip_needed(affine) else tensor


def _dtifit_prefix(folder: Path) -> str | None:
    for candidate in sorted(folder.glob("*_tensor.nii*")) + sorted(folder.glob("*_V1.nii*")):
        return candidate.name.rsplit("_", 1)[0]
    if (folder / "tensor.nii.gz").exists() or (folder / "V1.nii.gz").exists():
        return ""
    return None


def _dtifit_file(folder: Path, prefix: str, name: str) -> Path | None:
    stem = f"{prefix}_{name}" if prefix else name
    for suffix in (".nii.gz", ".nii"):
        path = folder / f"{stem}{suffix}"
        if path.exists():
            return path
    return None


def load_tensor(path: str | os.PathLike, order: str | None = None) -> Volume:
    """Load a tensor volume into the internal form (voxel axes, order xx, xy, xz, yy, yz, zz).

    ``path`` is a 6-volume NIfTI file (``order`` required unless the header's
    intent says SYMMATRIX) or an FSL dtifit output folder (``*_tensor`` or
    ``*_V1..3`` with ``*_L1..3``; also TractLens's own fit-dti folder: ``dti_*`` as dtifit
    names the files, or the unprefixed ``tensor``, ``V1``... that earlier versions wrote).
    """
    path = Path(path)
    if not path.exists():
        raise InputError("tensor input not found", path=path, fix="Give a 6-volume tensor NIfTI or a dtifit folder")
    if order is not None and order not in TENSOR_ORDERS:
        raise InputError(f"unknown tensor order {order!r}", path=path, fix=f"Use one of: {', '.join(TENSOR_ORDERS)}")
    if path.is_dir():
        return _load_dtifit_folder(path)
    img = load_image(path, "tensor")
    shape = tuple(img.shape)
    if not (len(shape) == 4 and shape[3] == 6) and not (len(shape) == 5 and shape[3:] == (1, 6)):
        raise InputError(
            f"a tensor file must have 6 volumes (X, Y, Z, 6); this one has shape {shape}",
            path=path,
            fix="Give the tensor output of dtifit, dipy_fit_dti, dwi2tensor or tractlens fit-dti",
        )
    data = read_array(img, path, dtype=np.float64, what="tensor")
    if data.ndim == 5:  # (X, Y, Z, 1, 6): NIfTI's layout for a symmetric matrix
        data = data[:, :, :, 0, :]
        if order is None and int(img.header["intent_code"]) == NIFTI_INTENT_SYMMATRIX:
            order = "dipy"
    if order is None:
        raise InputError(
            "the element order of this 6-volume tensor file cannot be known from its contents",
            path=path,
            fix="Say which tool wrote it with --tensor-order fsl (dtifit, tractlens), dipy or mrtrix",
        )
    tensor = data[..., list(_FILE_INDEX[order])]
    tensor = _sanitise(tensor, path)
    with np.errstate(all="ignore"):  # absurd (1e300) components overflow: background, as NaN is
        tensor = _sanitise(from_file_frame(tensor, order, img.affine), path)
    return Volume(path.name.split(".")[0], tensor, img.affine.copy(), kind="tensor", source=str(path))


def _load_dtifit_folder(folder: Path) -> Volume:
    prefix = _dtifit_prefix(folder)
    if prefix is None:
        raise InputError(
            "this folder holds no dtifit output (no *_tensor.nii.gz or *_V1.nii.gz)",
            path=folder,
            fix="Run dtifit with --save_tensor, or tractlens fit-dti, or give the tensor file itself",
        )
    tensor_path = _dtifit_file(folder, prefix, "tensor")
    if tensor_path is not None:
        return load_tensor(tensor_path, "fsl")
    paths = {n: _dtifit_file(folder, prefix, n) for n in ("V1", "V2", "V3", "L1", "L2", "L3")}
    missing = [n for n, p in paths.items() if p is None]
    if missing:
        raise InputError(
            f"dtifit folder lacks {', '.join(missing)} and has no tensor file",
            path=folder,
            fix="Give a complete dtifit output folder (V1-V3 with L1-L3, or the tensor with --save_tensor)",
        )
    imgs = {n: load_image(p, n) for n, p in paths.items()}
    affine = imgs["V1"].affine
    grid = tuple(imgs["V1"].shape[:3])
    for name, img in imgs.items():
        expected = (*grid, 3) if name.startswith("V") else grid
        if tuple(img.shape) != expected and not (name.startswith("L") and tuple(img.shape) == (*grid, 1)):
            raise InputError(
                f"{name} has shape {tuple(img.shape)}, expected {expected} (the grid of V1)",
                path=paths[name],
                fix="The dtifit outputs must come from one run; run dtifit (or tractlens fit-dti) again",
            )
    vecs = [read_array(imgs[f"V{i}"], paths[f"V{i}"], np.float64, f"V{i}") for i in (1, 2, 3)]
    vals = [read_array(imgs[f"L{i}"], paths[f"L{i}"], np.float64, f"L{i}").reshape(grid) for i in (1, 2, 3)]
    comps = [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]
    tensor = np.zeros((*grid, 6))
    with np.errstate(all="ignore"):  # overflowing products become inf: _sanitise treats them as background
        for v, lam in zip(vecs, vals, strict=True):
            for c, (i, j) in enumerate(comps):
                tensor[..., c] += lam * v[..., i] * v[..., j]
    tensor = _sanitise(tensor, folder)
    with np.errstate(all="ignore"):
        tensor = _sanitise(from_file_frame(tensor, "fsl", affine), folder)
    return Volume(prefix or folder.name, tensor, affine.copy(), kind="tensor", source=str(folder))


def _sanitise(tensor: np.ndarray, path) -> np.ndarray:
    bad = ~np.isfinite(tensor).all(axis=-1)
    if bad.all():
        raise InputError(
            "every voxel of the tensor is NaN or Inf", path=path, fix="The file is damaged; fit the tensors again"
        )
    if bad.any():
        tensor = tensor.copy()
        tensor[bad] = 0.0
        log.warning("%d voxels of %s hold NaN or infinite tensors: treated as background", int(bad.sum()), path)
    return tensor


def save_tensor(tensor: np.ndarray, affine: np.ndarray, path, order: str = "fsl", *, symmatrix: bool = False) -> Path:
    """Write an internal tensor volume in a tool's order and frame (default FSL's, as dtifit).

    ``symmatrix``: NIfTI's own layout of a symmetric matrix, (X, Y, Z, 1, 6) in DIPY's order with
    the SYMMATRIX intent, which says its order itself (:func:`load_tensor` needs no ``order``)."""
    if symmatrix:
        order = "dipy"
    file_tensor = to_file_frame(np.asarray(tensor, dtype=np.float64), order, affine)
    out = np.empty_like(file_tensor)
    out[..., list(_FILE_INDEX[order])] = file_tensor
    if symmatrix:
        return save_volume(out[:, :, :, None, :], affine, path, dtype=np.float32, intent=NIFTI_INTENT_SYMMATRIX)
    return save_volume(out, affine, path, dtype=np.float32)
