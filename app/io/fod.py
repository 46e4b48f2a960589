"""fODF images (spherical-harmonic coefficients) and MRtrix response files, in and out.

TractLens writes fODFs as MRtrix does (``dwi2fod``): a 4-D NIfTI whose volumes are the
even-order coefficients in MRtrix3's basis (:mod:`gpu.sh`), in the world (RAS, "scanner")
frame, so ``mrview`` and ``tckgen`` read them as they are. Its header's description says
``tractlens fod basis=mrtrix``.

Reading accepts fODFs written by MRtrix3 (NIfTI export of ``dwi2fod``: same basis, world
frame) and by DIPY: its ``tournier07`` basis is MRtrix's; its default ``descoteaux07``
(``legacy=True``, what ``dipy_fit_csd`` saves) is converted. DIPY's coefficients are in the
frame of the b-vectors it was given (FSL's, i.e. voxel axes with x flipped for a
positive-determinant affine); they are turned into the world frame (``dipy-tournier``:
MRtrix's basis in that frame). A file that says nothing
about its basis needs ``basis=`` (``--basis``): the two bases are permutations of each other
with signs, and an fODF is a valid fODF in either, so it cannot be told from the values.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tractlens.gpu.csd_response import Response
from tractlens.gpu.sh import degrees_orders, lmax_of, rotation_matrix

from ..errors import InputError
from ._atomic import atomic_path, write_text_atomic
from .nifti import _nifti_image, load_image, read_array

BASES = ("auto", "mrtrix", "dipy-descoteaux", "dipy-tournier")
DESCRIPTION = "tractlens fod basis=mrtrix"


def world_rotation(affine: np.ndarray) -> np.ndarray:
    """The orthogonal part of an affine's 3x3 (polar decomposition): voxel axes -> world
    directions, as MRtrix takes an image's orientation (a reflection stays a reflection)."""
    u, _s, vt = np.linalg.svd(np.asarray(affine, dtype=np.float64)[:3, :3])
    return u @ vt


def descoteaux_to_mrtrix(coefficients: np.ndarray, lmax: int) -> np.ndarray:
    """DIPY's legacy ``descoteaux07`` coefficients (.., C) -> MRtrix's, same function.

    DIPY's legacy basis is √2 Im Y_l^m for m > 0 (MRtrix's (l, -m)) and √2 Re Y_l^|m| for
    m < 0 (MRtrix's (l, |m|)): a permutation of the coefficients."""
    degrees, orders = degrees_orders(lmax)
    out = np.empty_like(coefficients)
    for j, (degree, order) in enumerate(zip(degrees, orders)):
        target = degree * (degree + 1) // 2 + (-order if order > 0 else abs(order))
        out[..., target] = coefficients[..., j]
    return out


def save_fod(sh: np.ndarray, affine: np.ndarray, path: str | os.PathLike) -> Path:
    """Write (X, Y, Z, C) coefficients (MRtrix basis, world frame) as float32 NIfTI, atomically."""
    path = Path(path)
    img = _nifti_image(np.asarray(sh, dtype=np.float32), affine)
    img.header["descrip"] = DESCRIPTION.encode()
    import nibabel as nib

    with atomic_path(path) as tmp:
        nib.save(img, tmp)
    return path


def _stated_basis(img) -> str | None:
    description = bytes(img.header.get("descrip", b"")).split(b"\0")[0].decode("latin-1").lower()
    if "basis=mrtrix" in description or "mrtrix" in description:
        return "mrtrix"
    if "descoteaux" in description:
        return "dipy-descoteaux"
    return None


def load_fod(path: str | os.PathLike, basis: str = "auto") -> tuple[np.ndarray, np.ndarray, int, str]:
    """An fODF image as (X, Y, Z, C) float32 coefficients in MRtrix's basis and the world
    frame, its affine, lmax, and the basis it was read as."""
    if basis not in BASES:
        raise InputError(f"unknown SH basis {basis!r}", path=path, fix=f"Use one of {', '.join(BASES)}")
    img = load_image(path, "fODF image")
    if len(img.shape) != 4:
        raise InputError(
            f"an fODF image is 4-D (one volume per SH coefficient); this one has shape {img.shape}",
            path=path,
            fix="Give the fod.nii.gz written by fit-csd, MRtrix's dwi2fod or DIPY",
        )
    try:
        lmax = lmax_of(int(img.shape[3]))
    except ValueError as exc:
        raise InputError(str(exc), path=path, fix="Give an even-order SH image (45 volumes for lmax 8)") from None
    stated = _stated_basis(img)
    if basis == "auto":
        if stated is None:
            raise InputError(
                "the file does not say which spherical-harmonic basis it uses",
                path=path,
                fix="Pass --basis mrtrix (MRtrix3), dipy-descoteaux (DIPY's default) or dipy-tournier (DIPY's tournier07)",
            )
        basis = stated
    sh = read_array(img, path, what="fODF image")
    affine = img.affine.copy()
    if basis.startswith("dipy-"):  # DIPY: the b-vectors' (FSL) frame, not the world's
        if basis == "dipy-descoteaux":
            sh = descoteaux_to_mrtrix(sh, lmax)
        rotation = world_rotation(affine)
        if np.linalg.det(affine[:3, :3]) > 0:  # FSL's b-vector frame: voxel x flipped
            rotation = rotation @ np.diag([-1.0, 1.0, 1.0])
        sh = (sh.reshape(-1, sh.shape[-1]) @ rotation_matrix(rotation, lmax).T.astype(np.float32)).reshape(sh.shape)
    return np.asarray(sh, dtype=np.float32), affine, lmax, basis


def write_response(response: Response, path: str | os.PathLike) -> Path:
    """MRtrix's response format: a ``# Shells:`` comment, then one row of zonal coefficients a shell."""
    lines = [
        f"# {response.tissue} response, zonal SH coefficients (l = 0, 2, .., {response.lmax}), one row per shell",
        "# Shells: " + ",".join(f"{b:g}" for b in response.bvalues),
    ]
    lines += [" ".join(f"{v:.6g}" for v in row) for row in response.zonal]
    return write_text_atomic("\n".join(lines) + "\n", path)


def read_response(path: str | os.PathLike, tissue: str = "wm", bvalues: np.ndarray | None = None) -> Response:
    """A response file (MRtrix's format; TractLens's and ``dwi2response``'s). Rows are matched
    to shells by its ``# Shells:`` line, else to ``bvalues`` (the data's shells) in order."""
    path = Path(path)
    if not path.is_file():
        raise InputError("the response file does not exist", path=path, fix="Check the --response path")
    shells, rows = None, []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        text = line.strip()
        if text.lower().startswith("# shells:"):
            shells = [float(v) for v in text.split(":", 1)[1].replace(",", " ").split()]
            continue
        if not text or text.startswith("#"):
            continue
        try:
            rows.append([float(v) for v in text.replace(",", " ").split()])
        except ValueError:
            raise InputError(
                f"line {number} is not a row of numbers", path=path, fix="Give an MRtrix response file"
            ) from None
    if not rows:
        raise InputError("the response file holds no coefficients", path=path, fix="Give an MRtrix response file")
    width = max(len(r) for r in rows)
    zonal = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        zonal[i, : len(r)] = r
    if shells is None:
        if bvalues is None or len(bvalues) != len(rows):
            count = "?" if bvalues is None else len(bvalues)
            raise InputError(
                f"{len(rows)} response rows for {count} shells of the data, and no '# Shells:' line to match them",
                path=path,
                fix="Give one row per shell (b=0 included for multi-shell data), or add a '# Shells: 0,1000,...' line",
            )
        shells = list(bvalues)
    if len(shells) != len(rows):
        raise InputError(
            f"{len(rows)} rows for {len(shells)} shells in the '# Shells:' line",
            path=path,
            fix="Give one row per shell listed",
        )
    if (width - 1) * 2 > 16:
        raise InputError(
            f"{width} coefficients per row is more than lmax 16", path=path, fix="Give zonal coefficients up to lmax 16"
        )
    return Response(tissue, np.asarray(shells, dtype=np.float64), zonal)
