"""Registration folders and other tools' transform files, in ITK/ANTs conventions, through nitransforms.

A folder written by ``tractlens register`` holds what ``antsRegistration`` would write, so ANTs
(``antsApplyTransforms -t 1Warp.nii.gz -t 0GenericAffine.mat``), nitransforms and ITK-SNAP read it:

- ``0GenericAffine.mat``: the affine, fixed → moving points, LPS, ITK's Matlab-v4 layout;
- ``1Warp.nii.gz`` / ``1InverseWarp.nii.gz`` (SyN only): ITK displacement fields on the fixed grid
  (5-D, vector intent, LPS millimetres), forward and inverse;
- ``moving_in_fixed.nii.gz``: the moving image drawn on the fixed grid;
- ``fixed_grid.nii.gz`` / ``moving_grid.nii.gz``: the two grids (header-only-sized images: one byte a
  voxel), so a registration is never applied to images it does not belong to;
- ``registration.json``: provenance, the metric before and after, timings.

Other tools' files (:func:`load_user_transforms`): ITK/ANTs affine ``.mat`` and displacement fields,
FSL FLIRT matrices (with the two images FLIRT was given) and FNIRT displacement fields.

The affine of a folder is written and read with NumPy (the bytes nitransforms writes, the matrix it
reads: tested against it), so a rigid or affine registration and an atlas never import nitransforms;
the displacement fields are written through it.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nibabel as nib
import numpy as np

from ..errors import InputError
from ..grid import Grid
from ..registration import Registration
from ._atomic import atomic_folder, atomic_path, write_text_atomic
from .nifti import check_exists, load_image

AFFINE_FILE = "0GenericAffine.mat"
WARP_FILE = "1Warp.nii.gz"
INVERSE_WARP_FILE = "1InverseWarp.nii.gz"
MOVING_IN_FIXED = "moving_in_fixed.nii.gz"
SUMMARY_FILE = "registration.json"
GRID_FILES = {"fixed": "fixed_grid.nii.gz", "moving": "moving_grid.nii.gz"}
#: Every file a registration folder may hold (an earlier version's record lists none).
REGISTRATION_FILES = (
    AFFINE_FILE,
    WARP_FILE,
    INVERSE_WARP_FILE,
    MOVING_IN_FIXED,
    *GRID_FILES.values(),
    SUMMARY_FILE,
)
FORMAT = "tractlens-registration/1"


def _nitransforms():
    try:
        import nitransforms  # noqa: F401
        from nitransforms import linear
        from nitransforms.io import fsl, itk
    except ImportError:
        raise InputError(
            "transform files are read and written with nitransforms, which comes with the anatomy extra",
            path=None,
            fix="Install it: pip install 'tractlens[anatomy]'",
        ) from None
    return linear, itk, fsl


# --------------------------------------------------------------------------------------- writing
def _write_grid(grid: Grid, path: Path) -> None:
    img = nib.Nifti1Image(np.zeros(grid.shape, np.uint8), grid.affine)
    with atomic_path(path) as tmp:
        nib.save(img, tmp)


def _write_field(field_ras: np.ndarray, grid: Grid, path: Path) -> None:
    _, itk, _ = _nitransforms()
    img = itk.ITKDisplacementsField.to_image(nib.Nifti1Image(np.asarray(field_ras, np.float32), grid.affine))
    img.set_data_dtype(np.float32)
    with atomic_path(path) as tmp:
        nib.save(img, tmp)


def write_itk_affine(affine: np.ndarray, path: Path) -> None:
    """A 4x4 RAS affine as ITK's binary ``.mat`` (MATLAB v4), written with NumPy: the bytes nitransforms
    writes (``linear.Affine(affine).to_filename(path, fmt="itk")``: the LPS matrix and translation as
    ``AffineTransform_double_3_3``, a zero centre as single-precision ``fixed``), without importing
    nitransforms, SciPy's io and h5py (a tenth of a second of a rigid registration)."""
    lps = _LPS @ np.asarray(affine, np.float64) @ _LPS
    parameters = np.concatenate([lps[:3, :3].reshape(-1), lps[:3, 3]])
    path.write_bytes(_matlab_v4_bytes({"AffineTransform_double_3_3": parameters, "fixed": np.zeros(3, np.float32)}))


def _matlab_v4_bytes(variables: dict[str, np.ndarray]) -> bytes:
    """MATLAB v4 variables, each a real column vector of float64 or float32, little-endian."""
    parts = []
    for name, values in variables.items():
        column = np.asarray(values).reshape(-1)
        kind = {np.dtype(np.float64): 0, np.dtype(np.float32): 10}[column.dtype]  # MOPT: little-endian, full
        parts.append(np.array([kind, column.size, 1, 0, len(name) + 1], "<i4").tobytes())
        parts.append(name.encode("ascii") + b"\x00")
        parts.append(column.astype(column.dtype.newbyteorder("<")).tobytes())
    return b"".join(parts)


def save_registration(
    registration: Registration,
    folder: str | os.PathLike,
    summary: dict,
    moving_in_fixed: np.ndarray | None = None,
    inputs: tuple = (),
) -> Path:
    """Write ``registration`` as a folder (see the module's docstring). The folder is built beside its
    final name and renamed into place, so an interrupted run leaves no half folder behind; an
    existing folder is replaced only when it is empty or an earlier registration holding none of
    ``inputs`` (the images' paths) (:func:`~._atomic.check_replaceable_folder`)."""
    folder = Path(folder)
    with atomic_folder(folder, SUMMARY_FILE, "registration folder", inputs, REGISTRATION_FILES) as staging:
        write_itk_affine(registration.affine, staging / AFFINE_FILE)
        if registration.nonlinear:
            _write_field(registration.warp, registration.fixed, staging / WARP_FILE)
            _write_field(registration.inverse_warp, registration.fixed, staging / INVERSE_WARP_FILE)
        for side, name in GRID_FILES.items():
            _write_grid(getattr(registration, side), staging / name)
        if moving_in_fixed is not None:
            nib.save(
                nib.Nifti1Image(np.asarray(moving_in_fixed, np.float32), registration.fixed.affine),
                staging / MOVING_IN_FIXED,
            )
        record = {
            "format": FORMAT,
            "type": registration.kind,
            "metric": registration.metric,
            "fixed": registration.fixed_name,
            "moving": registration.moving_name,
            "template": registration.template,
            "template_side": registration.template_side,
            "convention": "ITK/ANTs: the transforms map fixed points to moving points; apply to a moving image with "
            f"antsApplyTransforms -r FIXED -t {WARP_FILE} -t {AFFINE_FILE}"
            if registration.nonlinear
            else f"ITK/ANTs: the transform maps fixed points to moving points; antsApplyTransforms -r FIXED -t {AFFINE_FILE}",
            "files": [*sorted(p.name for p in staging.iterdir()), SUMMARY_FILE],
            **summary,
        }
        write_text_atomic(json.dumps(record, indent=2, default=str), staging / SUMMARY_FILE)
    return folder


# --------------------------------------------------------------------------------------- reading
def _grid_of(path: Path, what: str) -> Grid:
    img = load_image(path, what)
    return Grid(img.affine, img.shape[:3])


#: ITK's affine .mat: MATLAB v4 variables (the parameters, then the centre); LPS points.
_ITK_AFFINE = ("AffineTransform_double_3_3", "AffineTransform_float_3_3")
_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def _matlab_v4(raw: bytes) -> dict[str, np.ndarray] | None:
    """The variables of a MATLAB v4 file of real full matrices (what ITK writes for an affine), or
    None for anything else (nitransforms then reads it)."""
    found, at = {}, 0
    while at < len(raw):
        for order in ("<", ">"):
            if at + 20 > len(raw):
                return None
            kind, rows, cols, imaginary, name_length = np.frombuffer(raw, f"{order}i4", 5, at).tolist()
            machine, rest = divmod(kind, 1000)
            if machine == (0 if order == "<" else 1) and rest in (0, 10) and not imaginary and 0 < name_length < 64:
                break
        else:
            return None
        dtype = np.dtype(f"{order}f8" if rest == 0 else f"{order}f4")
        start = at + 20 + name_length
        end = start + rows * cols * dtype.itemsize
        if end > len(raw):
            return None
        name = raw[at + 20 : start].rstrip(b"\x00").decode("ascii", "replace")
        found[name] = np.frombuffer(raw, dtype, rows * cols, start).reshape(cols, rows).T.astype(np.float64)
        at = end
    return found


def read_itk_affine(path: Path) -> np.ndarray | None:
    """An ITK affine ``.mat`` (binary, MATLAB v4) as a 4x4 RAS matrix, read with NumPy, as
    nitransforms reads it (``linear.load(path, fmt="itk").matrix``: the parameters about the fixed
    centre, LPS to RAS); None when the file is not that (the caller then asks nitransforms). The
    registration folder is read on every atlas and apply-transform; nitransforms' import (SciPy's
    ndimage and interpolate, h5py) cost more than the rest of the reading."""
    variables = _matlab_v4(path.read_bytes())
    if variables is None or "fixed" not in variables:
        return None
    parameters = next((variables[key].ravel() for key in _ITK_AFFINE if key in variables), None)
    centre = variables["fixed"].ravel()
    if parameters is None or parameters.size != 12 or centre.size != 3:
        return None
    matrix = parameters[:9].reshape(3, 3)
    lps = np.eye(4)
    lps[:3, :3] = matrix
    lps[:3, 3] = parameters[9:] + centre - matrix @ centre
    return _LPS @ lps @ _LPS


def _read_field(path: Path, grid: Grid) -> np.ndarray:
    img = load_image(path, "displacement field")
    if img.ndim != 5 or img.shape[3] != 1 or img.shape[4] != 3:
        raise InputError(
            f"is not an ITK displacement field (shape {img.shape}, expected X×Y×Z×1×3)",
            path=path,
            fix="Give the 1Warp.nii.gz or 1InverseWarp.nii.gz that ANTs or tractlens register wrote",
        )
    if not grid.matches(Grid(img.affine, img.shape[:3])):
        raise InputError(
            "the displacement field is not on the registration's fixed grid",
            path=path,
            fix="The folder mixes files of two registrations: register again",
        )
    # ITK's field in RAS, as nitransforms' ITKDisplacementsField.from_image gives it: x and y negated
    field = np.asarray(img.dataobj, dtype=np.float32).reshape(*img.shape[:3], 3)
    field[..., :2] *= -1.0
    return field


def load_registration(folder: str | os.PathLike) -> Registration:
    """A folder written by ``tractlens register`` (or by :func:`save_registration`). The affine is read
    with NumPy (:func:`read_itk_affine`; nitransforms for any other layout), the two fields at the
    same time (inflating a .nii.gz releases the GIL)."""
    folder = check_exists(folder, "registration folder")
    if not folder.is_dir() or not (folder / SUMMARY_FILE).is_file():
        raise InputError(
            f"is not a registration folder (no {SUMMARY_FILE})",
            path=folder,
            fix="Give the -o folder of 'tractlens register', or other tools' files with --transform",
        )
    try:
        record = json.loads((folder / SUMMARY_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{SUMMARY_FILE} cannot be read ({exc})", path=folder, fix="Register again") from None
    if record.get("format") != FORMAT:
        raise InputError(
            f"{SUMMARY_FILE} is not of this version of TractLens ({record.get('format')!r})",
            path=folder,
            fix="Register again with this version",
        )
    for name in (AFFINE_FILE, *GRID_FILES.values()):
        if not (folder / name).is_file():
            raise InputError(f"the registration folder lacks {name}", path=folder, fix="Register again")
    fixed = _grid_of(folder / GRID_FILES["fixed"], "fixed grid")
    moving = _grid_of(folder / GRID_FILES["moving"], "moving grid")
    try:
        affine = read_itk_affine(folder / AFFINE_FILE)
        if affine is None:
            linear, _, _ = _nitransforms()
            affine = linear.load(str(folder / AFFINE_FILE), fmt="itk").matrix
    except InputError:
        raise
    except Exception as exc:  # nitransforms raises several kinds for a damaged file
        raise InputError(
            f"the affine {AFFINE_FILE} cannot be read ({exc})", path=folder, fix="Register again"
        ) from None
    warp = inverse = None
    if record.get("type") == "syn":
        for name in (WARP_FILE, INVERSE_WARP_FILE):
            if not (folder / name).is_file():
                raise InputError(f"the nonlinear registration folder lacks {name}", path=folder, fix="Register again")
        with ThreadPoolExecutor(max_workers=2) as pool:
            warp, inverse = pool.map(lambda name: _read_field(folder / name, fixed), (WARP_FILE, INVERSE_WARP_FILE))
    return Registration(
        fixed,
        moving,
        affine,
        warp,
        inverse,
        kind=record.get("type", "affine"),
        fixed_name=str(record.get("fixed", "fixed")),
        moving_name=str(record.get("moving", "moving")),
        template=record.get("template"),
        template_side=record.get("template_side"),
        folder=str(folder),
        metric=str(record.get("metric", "")),
    )


def _is_itk_matrix(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(256)
    return b"\x00" in head or head.lstrip().startswith(b"#Insight")


def _check_flirt_matrix(path: Path) -> None:
    """A FLIRT matrix is text of four rows of four numbers, the last 0 0 0 1: anything else is
    named as such before FLIRT's images are asked for."""
    try:
        rows = [line.split() for line in path.read_text(errors="strict").splitlines() if line.strip()]
        matrix = np.array([[float(v) for v in row] for row in rows], dtype=float)
        good = matrix.shape == (4, 4) and np.isfinite(matrix).all() and np.allclose(matrix[3], (0, 0, 0, 1))
    except (ValueError, UnicodeDecodeError):
        good = False
    if not good:
        raise InputError(
            "is neither an ITK/ANTs transform nor an FSL FLIRT matrix (four rows of four numbers, the last 0 0 0 1)",
            path=path,
            fix="Give the .mat ANTs or FLIRT wrote, or a displacement field .nii(.gz)",
        )


def load_user_transforms(
    transforms: list[str | os.PathLike],
    reference: Grid,
    *,
    inverse_warp: str | os.PathLike | None = None,
    flirt_ref: str | os.PathLike | None = None,
    flirt_in: str | os.PathLike | None = None,
    moving: Grid | None = None,
) -> Registration:
    """Other tools' transforms as a :class:`Registration` whose fixed side is ``reference``'s space.

    ``transforms`` in antsApplyTransforms order: an optional displacement field first (ITK 5-D, or
    an FSL FNIRT 4-D field, which holds FNIRT's whole mapping), then an optional affine (ITK ``.mat``,
    or a FLIRT ``.mat`` with ``flirt_ref``/``flirt_in``, the images FLIRT was given). A warp's own grid
    becomes the fixed grid; ``inverse_warp`` (ITK) is needed to push points (tractograms) the other way.
    """
    linear, itk, fsl = _nitransforms()
    paths = [check_exists(p, "transform") for p in transforms]
    if not paths or len(paths) > 2:
        raise InputError(
            f"{len(paths)} transforms were given",
            path=None,
            fix="Give one or two with --transform: a displacement field, an affine, or the field then the affine",
        )
    affine, warp, fixed, kind = np.eye(4), None, reference, "ants"
    for index, path in enumerate(paths):
        name = path.name.lower()
        if name.endswith((".nii", ".nii.gz")):
            if index != 0:
                raise InputError(
                    "comes after the affine",
                    path=path,
                    fix="Give the displacement field first, then the affine (antsApplyTransforms' order)",
                )
            img = load_image(path, "displacement field")
            if img.ndim == 5 and img.shape[3:] == (1, 3):
                warp = np.asarray(itk.ITKDisplacementsField.from_image(img).dataobj, dtype=np.float32)
            elif img.ndim == 4 and img.shape[3] == 3:
                warp, kind = np.asarray(fsl.FSLDisplacementsField.from_image(img).dataobj, dtype=np.float32), "fsl"
            else:
                raise InputError(
                    f"is not a displacement field ITK or FSL writes (shape {img.shape})",
                    path=path,
                    fix="Give an ANTs warp (X×Y×Z×1×3) or an FNIRT field (X×Y×Z×3)",
                )
            fixed = Grid(img.affine, img.shape[:3])
        elif name.endswith((".mat", ".txt")):
            try:
                if _is_itk_matrix(path):
                    affine = linear.load(str(path), fmt="itk").matrix
                else:
                    _check_flirt_matrix(path)
                    if flirt_ref is None or flirt_in is None:
                        raise InputError(
                            "is an FSL FLIRT matrix, which only means something with the two images FLIRT was given",
                            path=path,
                            fix="Add --flirt-ref IMAGE and --flirt-in IMAGE (FLIRT's -ref and -in)",
                        )
                    ref_img = load_image(flirt_ref, "FLIRT reference")
                    in_img = load_image(flirt_in, "FLIRT input")
                    affine = linear.load(str(path), fmt="fsl", reference=ref_img, moving=in_img).matrix
                    kind = "fsl"
            except InputError:
                raise
            except Exception as exc:
                raise InputError(
                    f"cannot be read as an ITK or FSL affine ({exc})",
                    path=path,
                    fix="Give the .mat ANTs or FLIRT wrote (a FLIRT matrix with --flirt-ref and --flirt-in)",
                ) from None
        else:
            raise InputError(
                "is not a transform file TractLens reads",
                path=path,
                fix="Give an ANTs/ITK or FLIRT .mat (.txt), or a displacement field .nii(.gz)",
            )
    inverse = None
    if warp is not None:
        if inverse_warp is not None:
            inverse = _read_field(check_exists(inverse_warp, "inverse displacement field"), fixed)
    else:
        fixed = reference
    return Registration(
        fixed, moving or fixed, affine, warp, inverse, kind=kind, fixed_name="fixed", moving_name="moving"
    )
