"""Use cases of the patient's anatomy and the template: register two images, apply a registration,
bring an atlas (or one of its regions) onto a subject's grid.

Each is one function called alike by the window, the ``tractlens`` command line, batch and Python;
the input checks and messages live here once. Long work takes ``progress(done, total)`` and
``cancelled()`` callbacks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import check_device

from .atlases import atlas_info, load_atlas, load_template, write_lookup_table
from .errors import InputError
from .grid import Grid
from .io import transforms as transform_files
from .io.nifti import check_nifti_output, image_grid, load_image, read_array, save_volume
from .io.outputs import check_output_file, check_output_folder, check_replaceable_folder
from .model import RoiMask, Tractogram, Volume
from .params import RegisterParams
from .registration import ChainedRegistration, Registration, compose_registrations, resample

TEMPLATE_WORDS = ("mni",)
#: Below this share of the fixed image's foreground covered by the registered moving image, the
#: registration is taken to have diverged (or the images show different anatomy).
MIN_OVERLAP = 0.5
#: Below this share of the fixed image's intensity entropy explained by the registered moving image
#: (:func:`app.pipelines.register.shared_information`), the images are taken not to show the same anatomy.
MIN_SHARED_INFORMATION = 0.08
#: A registration whose mutual information ends lower than it started by more than this share is taken
#: to have diverged. Not zero: images already aligned (a T1 already in MNI space, a DWI series and its
#: own b=0) start at the optimum, measured without interpolation, and lose some through the interpolation
#: of the result and the warp's smoothing (3-6 % on the tests' phantoms and on the MNI template onto itself).
MAX_METRIC_LOSS = 0.10
TRACTOGRAM_SUFFIXES = (".trk", ".tck", ".trx")


@dataclass
class LoadedImage:
    """A 3-D image ready to register, and what was done to get it (said to the user)."""

    data: np.ndarray
    grid: Grid
    name: str
    note: str = ""
    template: str | None = None


@dataclass
class RegisterResult:
    registration: Registration
    moving_in_fixed: np.ndarray
    summary: dict = field(default_factory=dict)


def load_for_registration(
    source, volume: int | None = None, what: str = "image", option: str = "--volume"
) -> LoadedImage:
    """A path (NIfTI, MGZ, DICOM folder), the word ``mni``, or a model :class:`Volume`, as one 3-D image.

    A 4-D image is a diffusion series when gradient files sit beside it: its mean b=0 is taken
    (``note`` says so); ``volume`` picks one volume of any 4-D image instead (``option`` names it
    in messages: the moving and the fixed image each have their own)."""
    if isinstance(source, Volume):
        data = np.asarray(source.data, np.float32)
        return _three_d(data, source.affine, source.name, volume, None, what, option)
    if isinstance(source, str) and source.lower() in TEMPLATE_WORDS:
        data, affine = load_template(source.lower())
        return LoadedImage(
            data, Grid(affine, data.shape), source.lower(), "the MNI152 template", template=source.lower()
        )
    path = Path(source)
    img = load_image(path, what)
    if img.ndim == 4 and img.shape[3] > 1 and volume is None:
        from .io.dwi import load_dwi

        try:
            dwi = load_dwi(path)
        except InputError:
            raise InputError(
                f"is a 4-D image of {img.shape[3]} volumes, and registration needs one",
                path=path,
                fix=f"Choose one with {option} N (0 is the first); a diffusion series with its .bval/.bvec "
                f"beside it is registered through its mean b=0 without {option}",
            ) from None
        data = dwi.mean_b0().astype(np.float32)
        count = int(dwi.b0_mask.sum())
        return LoadedImage(data, Grid(dwi.affine, data.shape), path.name, f"the mean of its {count} b=0 volumes")
    data = read_array(img, path, np.float32, what)
    return _three_d(data, img.affine, path.name, volume, path, what, option)


def _three_d(data, affine, name: str, volume, path, what: str, option: str = "--volume") -> LoadedImage:
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim == 4:
        if volume is None:
            raise InputError(
                f"the {what} is 4-D ({data.shape[3]} volumes) and registration needs one",
                path=path,
                fix=f"Choose one with {option} N",
            )
        if not 0 <= volume < data.shape[3]:
            raise InputError(
                f"{option} {volume} is outside the image's {data.shape[3]} volumes (0 to {data.shape[3] - 1})",
                path=path,
            )
        grid = Grid(affine, data.shape[:3])
        return LoadedImage(np.ascontiguousarray(data[..., volume]), grid, name, f"volume {volume}")
    if data.ndim != 3:
        raise InputError(
            f"the {what} has {data.ndim} dimension(s); registration takes a 3-D image", path=path,
            fix="Give a 3-D image (or a 4-D series with a volume chosen)",
        )  # fmt: skip
    if volume not in (None, 0):
        raise InputError(f"{option} {volume} was given but the image is 3-D", path=path)
    return LoadedImage(data, Grid(affine, data.shape), name)


def _mask(source, image: LoadedImage, what: str) -> np.ndarray | None:
    """A brain mask for one image of the registration, on that image's grid (placed by scanner
    coordinates, nearest neighbour): a file, or an open layer's data (an ROI :class:`RoiMask`, or a
    label or scalar :class:`Volume`: its voxels above 0)."""
    if source is None:
        return None
    if isinstance(source, RoiMask):
        data, affine, path = np.asarray(source.mask), source.affine, None
        what = f"{what} ({source.name})"
    elif isinstance(source, Volume):
        data, affine, path = np.asarray(source.data), source.affine, source.source or None
        what = f"{what} ({source.name})"
    else:
        path = source
        img = load_image(path, what)
        data, affine = np.asarray(img.dataobj), img.affine
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise InputError(
            f"the {what} is a {data.ndim}-D image; a mask is 3-D", path=path,
            fix="Choose a 3-D mask, an ROI or a label image",
        )  # fmt: skip
    if not Grid(affine, data.shape[:3]).matches(image.grid):
        data = resample(data, Grid(affine, data.shape[:3]), image.grid, lambda p: p, "nearest")
    mask = np.nan_to_num(data) > 0
    if not mask.any():
        raise InputError(
            f"the {what} is empty where it meets its image", path=path, fix="Check that it belongs to that image"
        )
    return mask


def _mask_name(source) -> str:
    return source.name if isinstance(source, RoiMask | Volume) else Path(source).name


def register_images(
    moving,
    fixed,
    out_dir: str | os.PathLike | None = None,
    params: RegisterParams | None = None,
    *,
    volume: int | None = None,
    fixed_volume: int | None = None,
    moving_mask: str | os.PathLike | Volume | RoiMask | None = None,
    fixed_mask: str | os.PathLike | Volume | RoiMask | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    device: str = "auto",
) -> RegisterResult:
    """Register ``moving`` onto ``fixed`` (paths, ``"mni"`` or model volumes) and, with ``out_dir``,
    write the registration folder (:mod:`app.io.transforms`). ``volume`` picks a volume of a 4-D
    moving image. The masks (files, or an open ROI or image: the window's choice) restrict the
    metric to the brain of each image. Raises :class:`InputError` before writing anything when the
    registration diverged or the images do not overlap.

    The use case behind ``tractlens register`` and the window's registration dialog: centres of
    mass, rigid, affine (mutual information) and for ``syn`` a symmetric diffeomorphic warp, with
    DIPY's registration.

    Parameters
    ----------
    moving, fixed : str, os.PathLike or Volume
        NIfTI, MGZ or a DICOM folder (a diffusion series is registered through its mean b=0), a
        loaded volume, or (``fixed``) the word ``"mni"`` for the MNI152 template.
    out_dir : str or os.PathLike, optional
        Write ``0GenericAffine.mat`` (and ``1Warp.nii.gz``, ``1InverseWarp.nii.gz``) as ANTs
        does, ``moving_in_fixed.nii.gz`` and ``registration.json`` there.
    params : RegisterParams, optional
        Transform type (``rigid``, ``affine``, ``syn``), metric, sampling spacing (mm),
        iterations, random seed.
    volume, fixed_volume : int, optional
        The volume of a 4-D moving (fixed) image to use.
    moving_mask, fixed_mask : str, os.PathLike, Volume or RoiMask, optional
        Masks restricting the metric (a file, or an open image or ROI).
    progress, cancelled : callable, optional
        ``progress(done, total)`` and a cancellation check.
    device : {"auto", "cpu", "gpu"}
        Where the resampling runs.

    Returns
    -------
    RegisterResult
        ``registration`` (the affine in RAS+ mm, the warps, the two grids), ``moving_in_fixed``
        (the moving image resampled on the fixed grid) and the ``summary`` (mutual information
        before and after, overlap, timings).

    Raises
    ------
    InputError
        Unreadable images, images that do not overlap or share too little information to be
        the same anatomy, a registration that diverged; nothing is written.

    References
    ----------
    .. [1] Avants BB, Epstein CL, Grossman M, Gee JC. Symmetric diffeomorphic image registration
       with cross-correlation. Med Image Anal 12:26-41 (2008).
    .. [2] Mattes D et al. PET-CT image registration in the chest using free-form deformations.
       IEEE Trans Med Imaging 22:120-128 (2003): the mutual information metric.

    Examples
    --------
    The demo's label image and the same image placed 4 mm further along x:

    >>> import numpy as np
    >>> from tractlens.app.anatomy import register_images
    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_volume
    >>> from tractlens.app.model import Volume
    >>> from tractlens.app.params import RegisterParams
    >>> image = load_volume(demo_path() / "labels.nii.gz")
    >>> shifted = image.affine.copy()
    >>> shifted[0, 3] += 4.0
    >>> fixed = Volume("fixed", image.data, image.affine)
    >>> moving = Volume("moving", image.data, shifted)
    >>> result = register_images(moving, fixed, params=RegisterParams(type="rigid"), device="cpu")
    >>> (np.round(result.registration.affine[:3, 3], 1) + 0.0).tolist()  # mm
    [4.0, 0.0, 0.0]
    >>> bool(np.abs(result.moving_in_fixed - image.data).mean() < 0.01)
    True
    """
    from .pipelines.register import register_arrays  # SciPy's ndimage and DIPY: not for atlas or apply-transform

    params = params or RegisterParams()
    inputs = tuple(x for x in (moving, fixed, moving_mask, fixed_mask)
                   if isinstance(x, str | os.PathLike) and str(x).lower() not in TEMPLATE_WORDS)  # fmt: skip
    if out_dir is not None:
        out_dir = check_output_folder(out_dir, "registration folder")
        check_replaceable_folder(out_dir, transform_files.SUMMARY_FILE, "registration folder", inputs,
                                 transform_files.REGISTRATION_FILES)  # fmt: skip
    t0 = time.perf_counter()
    mov = load_for_registration(moving, volume, "moving image")
    fix = load_for_registration(fixed, fixed_volume, "fixed image", "--fixed-volume")
    mmask = _mask(moving_mask, mov, "moving mask")
    fmask = _mask(fixed_mask, fix, "fixed mask")
    read_seconds = time.perf_counter() - t0
    run = register_arrays(
        mov.data,
        mov.grid,
        fix.data,
        fix.grid,
        params,
        moving_mask=mmask,
        fixed_mask=fmask,
        progress=progress,
        cancelled=cancelled,
        device=device,
    )
    values = (
        f"mutual information {run.metric_before:.3f} before, {run.metric_after:.3f} after; the registered images "
        f"overlap in {run.overlap:.0%} of the fixed image's foreground and explain {run.shared:.0%} of its intensities"
    )
    if (
        run.overlap < MIN_OVERLAP
        or run.shared < MIN_SHARED_INFORMATION
        or run.metric_after < run.metric_before * (1 - MAX_METRIC_LOSS) - 1e-3
    ):
        raise InputError(
            f"the registration of {mov.name} onto {fix.name} failed ({values}): the images do not overlap, show "
            "different anatomy, or the optimisation diverged; nothing was written",
            fix="Check that both images show the same head; give brain masks (--moving-mask/--fixed-mask), or start "
            "from --type rigid",
        )
    template_side = "fixed" if fix.template else "moving" if mov.template else None
    reg = run.registration
    registration = Registration(
        reg.fixed,
        reg.moving,
        reg.affine,
        reg.warp,
        reg.inverse_warp,
        kind=reg.kind,
        fixed_name=fix.name,
        moving_name=mov.name,
        template=fix.template or mov.template,
        template_side=template_side,
        metric=params.metric,
        folder=str(out_dir) if out_dir is not None else None,
    )
    summary = {
        "moving_image": {
            "name": mov.name,
            "used": mov.note or "the image",
            "shape": list(mov.grid.shape),
            "voxel_mm": [round(float(v), 4) for v in mov.grid.voxel_sizes],
        },
        "fixed_image": {
            "name": fix.name,
            "used": fix.note or "the image",
            "shape": list(fix.grid.shape),
            "voxel_mm": [round(float(v), 4) for v in fix.grid.voxel_sizes],
        },
        "masks": {
            side: None if mask is None else {"name": _mask_name(source), "voxels": int(mask.sum())}
            for side, source, mask in (("moving", moving_mask, mmask), ("fixed", fixed_mask, fmask))
        },
        "type": params.type,
        "metric": params.metric,
        "parameters": {k: getattr(params, k) for k in params.__dataclass_fields__},
        "mutual_information_before": round(run.metric_before, 5),
        "mutual_information_after": round(run.metric_after, 5),
        "overlap": round(run.overlap, 4),
        "shared_information": round(run.shared, 4),
        "seconds": {"read": round(read_seconds, 3), **run.seconds},
        "engine": run.engine,
        "description": registration.describe(),
    }
    if out_dir is not None:
        t1 = time.perf_counter()
        transform_files.save_registration(registration, out_dir, summary, run.moving_in_fixed, inputs)
        summary["seconds"]["write"] = round(time.perf_counter() - t1, 3)
    return RegisterResult(registration, run.moving_in_fixed, summary)


def load_registration(source) -> Registration | ChainedRegistration:
    """A registration object as given: already loaded, the folder of ``tractlens register``, or a
    list of these chained in the order given (:func:`app.registration.compose_registrations`:
    T1 → DWI and T1 → MNI give DWI ↔ MNI through the T1)."""
    if isinstance(source, list | tuple):
        return compose_registrations([load_registration(one) for one in source])
    if isinstance(source, Registration | ChainedRegistration):
        return source
    return transform_files.load_registration(source)


def _check_sides(registration: Registration, grid: Grid, side: str, path) -> None:
    """Refuse an image that is not on the side's grid placement (a transform never applies to images it
    does not belong to; a grid of the same space with other voxels is fine: resampling takes it)."""
    expected = registration.moving if side == "moving" else registration.fixed
    if registration.kind in ("fsl", "ants"):
        return  # other tools' files carry no grid of their images beyond FLIRT's two
    centre = grid.affine[:3, :3] @ ((np.array(grid.shape) - 1) / 2) + grid.affine[:3, 3]
    lo = expected.affine[:3, 3]
    corners = np.array(
        [
            [i, j, k]
            for i in (0, expected.shape[0] - 1)
            for j in (0, expected.shape[1] - 1)
            for k in (0, expected.shape[2] - 1)
        ]
    )
    pts = corners @ expected.affine[:3, :3].T + lo
    margin = 0.25 * (pts.max(0) - pts.min(0))
    if np.any(centre < pts.min(0) - margin) or np.any(centre > pts.max(0) + margin):
        raise InputError(
            f"is not in the {side} image's space of this registration ({registration.describe()}): its centre lies "
            "outside that image's field of view",
            path=path,
            fix=f"Give an image of the {side} side, or use --inverse to map the other way",
        )


def apply_transform(
    input_path: str | os.PathLike,
    registration,
    reference: str | os.PathLike,
    out: str | os.PathLike,
    *,
    inverse: bool = False,
    interp: str = "auto",
    cancelled: Callable[[], bool] | None = None,
    device: str = "auto",
) -> dict:
    """Bring an image, a label/ROI image or a tractogram from one side of a registration to the other,
    onto ``reference``'s grid. Forward (default): from the moving space to the fixed space; ``inverse``:
    from the fixed space to the moving space. Images are pulled through the transform, streamline
    points pushed through its inverse; per-point and per-streamline scalars are kept. ``device``:
    where images are resampled (:func:`tractlens.gpu.resample.resolve_device`; 'auto' takes the
    CPU in a fresh process, the GPU where CuPy already runs)."""
    check_device(device)
    registration = load_registration(registration)
    out = check_output_file(out, "output")
    if Path(input_path).exists() and out.exists() and out.resolve() == Path(input_path).resolve():
        raise InputError("is the input itself; it would be replaced", path=out, fix="Give another output name (-o)")
    if not str(input_path).lower().endswith(TRACTOGRAM_SUFFIXES):
        check_nifti_output(out)
    ref_img = load_image(reference, "reference image")
    ref_grid = image_grid(ref_img, reference, "reference image")
    source_side, target_side = ("fixed", "moving") if inverse else ("moving", "fixed")
    _check_sides(registration, ref_grid, target_side, reference)
    if str(input_path).lower().endswith(TRACTOGRAM_SUFFIXES):
        from .io.tractogram import load_tractogram, save_tractogram

        tract = load_tractogram(input_path, reference=None)
        push = registration.fixed_to_moving if inverse else registration.moving_to_fixed
        moved = moved_tractogram(tract, push, ref_grid)
        save_tractogram(moved, out)
        return {
            "input": str(input_path),
            "output": str(out),
            "kind": "tractogram",
            "streamlines": len(moved),
            "direction": f"{source_side} → {target_side}",
            "registration": registration.describe(),
        }
    img = load_image(input_path, "input image")
    grid = image_grid(img, input_path, "input image")
    data = np.asarray(img.dataobj)
    _check_sides(registration, grid, source_side, input_path)
    chosen = _interpolation(interp, data, Path(input_path).name)
    towards = "moving" if inverse else "fixed"
    moved = registration.pull(data, grid, ref_grid, towards, chosen, cancelled=cancelled, device=device)
    save_volume(moved, ref_grid.affine, out, dtype=data.dtype if chosen == "nearest" else np.float32)
    return {
        "input": str(input_path),
        "output": str(out),
        "kind": "labels" if chosen == "nearest" else "image",
        "interpolation": chosen,
        "shape": list(moved.shape),
        "direction": f"{source_side} → {target_side}",
        "registration": registration.describe(),
    }


def _interpolation(interp: str, data: np.ndarray, name: str) -> str:
    if interp not in ("auto", "linear", "nearest"):
        raise InputError(f"--interp is auto, linear or nearest, not {interp!r}")
    if interp != "auto":
        return interp
    from .loaders import looks_like_labels  # the loaders pull in every pipeline: not at the commands' start

    if data.dtype == bool:
        return "nearest"
    # whatever the storage: label and mask images are often saved as float32 by other tools
    return "nearest" if looks_like_labels(np.asarray(data), name) else "linear"


#: Points mapped per chunk (float64 copies of each chunk: ~120 MB).
POINT_CHUNK = 5_000_000


def moved_tractogram(tract: Tractogram, push: Callable[[np.ndarray], np.ndarray], reference: Grid) -> Tractogram:
    """``tract`` with every point sent through ``push`` (RAS mm -> RAS mm) and expressed in voxel
    coordinates of ``reference``; scalars kept. Works a chunk of points at a time."""
    points = np.empty_like(tract.points)
    to_ras = tract.affine
    from_ras = np.linalg.inv(reference.affine)
    for start in range(0, len(tract.points), POINT_CHUNK):
        chunk = np.asarray(tract.points[start : start + POINT_CHUNK], np.float64)
        ras = push(chunk @ to_ras[:3, :3].T + to_ras[:3, 3])
        points[start : start + len(chunk)] = ras @ from_ras[:3, :3].T + from_ras[:3, 3]
    return Tractogram(
        points,
        tract.offsets,
        reference.affine,
        reference.shape,
        dict(tract.point_scalars),
        dict(tract.streamline_scalars),
        name=tract.name,
    )


def atlas_on_subject(
    name: str, registration, reference_grid: Grid, *, device: str = "auto"
) -> tuple[np.ndarray, tuple[tuple[int, str], ...]]:
    """An atlas's labels drawn on ``reference_grid`` (a grid of the subject's side) through a template
    registration (one whose fixed or moving image is the MNI template), resampled on ``device``."""
    registration = load_registration(registration)
    if registration.template is None:
        raise InputError(
            f"the registration {registration.describe()} does not involve the MNI template, and atlases live there",
            fix="Register the subject to the template first: tractlens register IMAGE mni -o DIR",
        )
    atlas_info(name)
    labels, affine, table = load_atlas(name)
    on_subject = registration.template_to_subject(
        labels, Grid(affine, labels.shape), reference_grid, "nearest", device=device
    )
    return on_subject.astype(np.int32), table


def atlas_region_mask(name: str, registration, reference_grid: Grid, values) -> np.ndarray:
    """A boolean mask of the atlas structures ``values`` on the subject grid (an ROI)."""
    labels, table = atlas_on_subject(name, registration, reference_grid)
    wanted = {int(v) for v in np.atleast_1d(values)}
    unknown = wanted - {value for value, _ in table}
    if unknown:
        raise InputError(f"the atlas {name} has no structure numbered {sorted(unknown)}")
    mask = np.isin(labels, list(wanted))
    if not mask.any():
        names = ", ".join(structure for value, structure in table if value in wanted)
        raise InputError(
            f"the region {names} of {name} falls outside the subject's grid",
            fix="Check the registration and that the reference image covers that part of the brain",
        )
    return mask


def write_atlas(
    name: str, registration, reference: str | os.PathLike, out: str | os.PathLike, *, device: str = "auto"
) -> dict:
    """``tractlens atlas NAME``: the atlas on the subject's grid and its lookup table (``labels.tsv``
    beside it, BIDS ``dseg.tsv`` style, or ``OUT`` with ``.tsv`` instead of ``.nii.gz``); the labels
    are resampled on ``device`` (as :func:`apply_transform`)."""
    atlas_info(name)
    check_device(device)
    out = check_nifti_output(check_output_file(out, "atlas output"), "atlas output")
    ref_img = load_image(reference, "reference image")
    grid = image_grid(ref_img, reference, "reference image")
    t0 = time.perf_counter()
    labels, table = atlas_on_subject(name, registration, grid, device=device)
    save_volume(labels, grid.affine, out, dtype=np.int32)
    stem = out.name[: -len(".nii.gz")] if out.name.endswith(".nii.gz") else out.stem
    tsv = write_lookup_table(table, out.with_name(stem + ".tsv"))
    present = set(np.unique(labels).tolist()) - {0}
    info = atlas_info(name)
    return {
        "atlas": name,
        "title": info.title,
        "output": str(out),
        "lookup_table": str(tsv),
        "structures": len(table),
        "structures_on_grid": len(present),
        "licence": info.licence,
        "citation": info.citation,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def image_volume(path) -> Volume:
    """A 3-D image file as a model volume (for the window's layers)."""
    img = load_image(path, "image")
    return Volume(Path(path).name, np.asarray(img.dataobj, np.float32), img.affine)


__all__ = [
    "RegisterParams",
    "RegisterResult",
    "apply_transform",
    "atlas_on_subject",
    "atlas_region_mask",
    "image_volume",
    "load_for_registration",
    "load_registration",
    "moved_tractogram",
    "register_images",
    "write_atlas",
]


def _corners(g: Grid) -> np.ndarray:
    ijk = np.array([[i, j, k] for i in (0, g.shape[0] - 1) for j in (0, g.shape[1] - 1) for k in (0, g.shape[2] - 1)])
    corners = ijk @ g.affine[:3, :3].T + g.affine[:3, 3]
    return corners[np.lexsort(np.round(corners, 1).T)]


def side_of_grid(registration: Registration, grid: Grid, what: str = "image") -> str:
    """'fixed' or 'moving': the side of ``registration`` whose image ``grid`` covers (the same voxel
    centres' box within half a voxel, whatever the order of the axes: a DICOM series and its NIfTI
    conversion store the same voxels in other orders)."""
    for side in ("fixed", "moving"):
        other = getattr(registration, side)
        tolerance = 0.5 * float(np.min(other.voxel_sizes))
        if sorted(other.shape) == sorted(grid.shape) and np.allclose(_corners(other), _corners(grid), atol=tolerance):
            return side
    raise InputError(
        f"the {what} is neither image of the registration ({registration.describe()})",
        fix="Give the registration made between the diffusion data and this series (tractlens register)",
    )


def points_onto(registration: Registration, target_side: str) -> Callable[[np.ndarray], np.ndarray]:
    """The map that carries RAS points of the other side onto ``target_side``."""
    return registration.fixed_to_moving if target_side == "moving" else registration.moving_to_fixed


def mask_onto(
    registration: Registration, mask: np.ndarray, mask_grid: Grid, target: Grid, target_side: str
) -> np.ndarray:
    """A mask of the other side drawn on ``target`` (nearest neighbour)."""
    return registration.pull(np.asarray(mask, bool), mask_grid, target, target_side, "nearest")
