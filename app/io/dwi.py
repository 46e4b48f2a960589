"""Diffusion-weighted series: a 4-D NIfTI plus FSL ``bval``/``bvec`` text files.

Gradient directions in FSL ``bvec`` files are in FSL's voxel frame: image axes,
with x negated when the image affine has a positive determinant (neurological
storage). TractLens keeps directions in plain voxel axes internally, so
:func:`load_dwi` flips x for such images and :func:`gpu_frame_to_fsl` flips it
back for files that FSL users read (tensor, V1). For a negative-determinant
(radiological, e.g. FSL-standard LAS) image both frames are the same.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.host import host_threads

from ..errors import InputError
from ..model import Volume
from ._atomic import atomic_path, split_suffix
from ._pages import release_pages
from .dicom_import import dicom_input
from .nifti import check_exists, load_image, read_array, reason

log = logging.getLogger(__name__)

B0_THRESHOLD = 50.0  # s/mm²; b-values at or below count as non-diffusion-weighted
UNIT_TOLERANCE = 0.1  # |‖g‖ - 1| up to this is normalised with a warning


@dataclass
class DWI:
    """A diffusion-weighted series ready to fit.

    data : (X, Y, Z, K) float32.
    bvals : (K,) s/mm².
    bvecs : (K, 3) unit vectors in voxel axes (zero rows for b=0).
    warnings : what was corrected or noticed while loading, for the user.
    """

    data: np.ndarray
    affine: np.ndarray
    bvals: np.ndarray
    bvecs: np.ndarray
    path: str = ""
    bval_path: str = ""
    bvec_path: str = ""
    warnings: list[str] = field(default_factory=list)
    b0_threshold: float = B0_THRESHOLD
    #: voxels with a NaN or Inf in some volume, as counted when the file was read (None: not
    #: counted); 0 lets a pipeline skip its own scan of the whole series
    nonfinite_voxels: int | None = None

    @property
    def shape3(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.data.shape[:3])

    @property
    def b0_mask(self) -> np.ndarray:
        return self.bvals <= self.b0_threshold

    def mean_b0(self) -> np.ndarray:
        """Mean of the b=0 volumes, NaN/Inf treated as 0."""
        b0 = self.data[..., self.b0_mask]
        if self.nonfinite_voxels != 0:  # not counted, or some: three passes to clean them
            b0 = np.nan_to_num(b0, nan=0.0, posinf=0.0, neginf=0.0)
        return b0.mean(axis=-1)

    def as_volume(self) -> Volume:
        return Volume(Path(self.path).name.split(".")[0] or "dwi", self.data, self.affine, kind="dwi", source=self.path)


def require_weighted(dwi: DWI, b0_threshold: float, what: str) -> None:
    """Refuse a series without a diffusion-weighted volume (every b-value at or below the b=0
    threshold) before a fit: b-values written in ms/µm² (0, 1, 2, 3) read as s/mm² are such a
    series, and said so."""
    bvals = np.asarray(dwi.bvals, dtype=float)
    if (bvals > b0_threshold).any():
        return
    largest = float(bvals.max()) if bvals.size else 0.0
    units = (
        f"; the largest, {largest:g}, looks like ms/µm² (b=1000 s/mm² is 1 ms/µm²): multiply the b-values by 1000"
        if 0 < largest <= 10
        else ""
    )
    raise InputError(
        f"no diffusion-weighted volume: every b-value is at most {b0_threshold:g} s/mm² (the b=0 threshold){units}",
        path=dwi.bval_path or dwi.path,
        fix=f"{what[:1].upper()}{what[1:]} needs diffusion-weighted volumes: check the .bval file (b-values in s/mm²) "
        "or --b0-threshold",
    )


def x_flip_needed(affine: np.ndarray) -> bool:
    """FSL negates bvec x for images stored with a positive-determinant affine."""
    return float(np.linalg.det(np.asarray(affine)[:3, :3])) > 0


def fsl_to_voxel_vectors(vectors: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Directions in FSL's bvec frame -> voxel axes (and back: the map is its own inverse)."""
    out = np.array(vectors, dtype=np.float64, copy=True)
    if x_flip_needed(affine):
        out[..., 0] = -out[..., 0]
    return out


def find_gradient_files(dwi_path: Path) -> tuple[Path | None, Path | None]:
    """``name.bval``/``name.bvec`` beside ``name.nii(.gz)`` (BIDS), else FSL's ``bvals``/``bvecs``."""
    stem, _ = split_suffix(dwi_path)
    folder = dwi_path.parent
    candidates = [
        (folder / f"{stem}.bval", folder / f"{stem}.bvec"),
        (folder / f"{stem}.bvals", folder / f"{stem}.bvecs"),
        (folder / "bvals", folder / "bvecs"),
    ]
    for bval, bvec in candidates:
        if bval.exists() and bvec.exists():
            return bval, bvec
    return None, None


MAX_TABLE_BYTES = 16 * 2**20  # a bval/bvec file of a million volumes is far smaller


def _read_table(path: Path, what: str, fix: str) -> np.ndarray:
    """A whitespace-separated table of numbers (``#`` comments allowed) as a 2-D float64 array.

    Written out rather than ``np.loadtxt`` so that an empty file, text that is not numbers, or
    rows of different lengths each give an :class:`InputError` naming the line (loadtxt warns
    on stderr for an empty file and its messages name no file).
    """
    try:
        size = path.stat().st_size
        if size > MAX_TABLE_BYTES:
            raise InputError(
                f"is {size / 2**20:.0f} MiB, far too large for {what}", path=path, fix=f"Check the file: {fix}"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"could not be read ({reason(exc)})", path=path, fix="Check the file's permissions") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"could not be read as {what} (it is not a text file)", path=path, fix=fix) from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split("#", 1)[0].split()
        if not tokens:
            continue
        try:
            rows.append([_number(token) for token in tokens])
        except ValueError:
            bad = next(token for token in tokens if not _is_number(token))
            raise InputError(
                f"could not be read as {what}: line {number} holds {bad[:20]!r}, not a number", path=path, fix=fix
            ) from None
    if not rows:
        raise InputError(f"is empty: no {what} in it", path=path, fix=fix)
    if len({len(row) for row in rows}) != 1:
        lengths = sorted({len(row) for row in rows})
        raise InputError(
            f"could not be read as {what}: its rows have different numbers of values ({lengths})", path=path, fix=fix
        )
    return np.array(rows, dtype=np.float64)


def _number(token: str) -> float:
    """A decimal number as numpy writes them (also nan/inf, refused later); not 1_000 or non-ASCII digits."""
    if not token.isascii() or "_" in token:
        raise ValueError(token)
    return float(token)


def _is_number(token: str) -> bool:
    try:
        _number(token)
    except ValueError:
        return False
    return True


def read_bvals(path: Path) -> np.ndarray:
    """b-values (s/mm²): one row (or one column) of finite, non-negative numbers."""
    fix = "A bval file holds one row of b-values (s/mm²) separated by spaces, one per volume"
    values = _read_table(path, "b-values", fix)
    if 1 not in values.shape:
        raise InputError(f"b-values must be one row of numbers, found {values.shape[0]} rows", path=path, fix=fix)
    values = values.ravel()
    if not np.isfinite(values).all() or (values < 0).any():
        raise InputError("b-values must be finite and non-negative", path=path, fix=fix)
    return values


def read_bvecs(path: Path, count: int) -> np.ndarray:
    """b-vectors as (count, 3): FSL's three rows, or three columns (MRtrix/DIPY style)."""
    values = _read_table(path, "b-vectors", "It must hold three rows of numbers, one column per volume")
    if values.shape == (3, count):
        return values.T.copy()
    if values.shape == (count, 3):  # MRtrix/DIPY-style columns: accept, FSL writes rows
        return values.copy()
    raise InputError(
        f"b-vectors have shape {values.shape}, but the data has {count} volumes (expected 3 x {count})",
        path=path,
        fix="Use the bvec file that belongs to this series; bval and bvec must list the same volumes",
    )


def check_gradients(
    bvals: np.ndarray, bvecs: np.ndarray, bvec_path, warnings: list[str], b0_threshold: float = B0_THRESHOLD
) -> np.ndarray:
    """Validate b-vectors against b-values; normalise nearly-unit vectors with a warning.

    Volumes with b <= ``b0_threshold`` are non-diffusion-weighted: their vectors are set to 0."""
    dw = bvals > b0_threshold
    bvecs = bvecs.copy()
    bvecs[~dw & ~np.isfinite(bvecs).all(axis=1)] = 0.0
    if not np.isfinite(bvecs[dw]).all():
        raise InputError(
            "b-vectors of diffusion-weighted volumes contain NaN or Inf",
            path=bvec_path,
            fix="Use the bvec file written with this series (every b>0 volume needs a direction)",
        )
    with np.errstate(over="ignore", invalid="ignore"):  # 1e200 components: the norm is inf, refused below
        norms = np.linalg.norm(bvecs, axis=1)
    zero = dw & (norms < 1e-6)
    if zero.any():
        raise InputError(
            f"{int(zero.sum())} diffusion-weighted volume(s) have a zero b-vector "
            f"(volumes {np.flatnonzero(zero)[:10].tolist()})",
            path=bvec_path,
            fix="Check that bval and bvec belong together; b>0 needs a direction",
        )
    off = dw & (np.abs(norms - 1) > 1e-3)
    if off.any():
        worst = float(np.abs(norms[dw] - 1).max())
        if worst > UNIT_TOLERANCE:
            raise InputError(
                f"b-vectors are not unit length (largest deviation {worst:.3f})",
                path=bvec_path,
                fix="These may be unnormalised or scaled by b; normalise them (each row of 3 values to length 1)",
            )
        warnings.append(
            f"{int(off.sum())} b-vector(s) were not unit length (up to {worst:.4f} off) and were normalised"
        )
    with np.errstate(all="ignore"):
        bvecs[dw] /= norms[dw, None]
    bvecs[~dw] = 0.0
    return bvecs


def load_dwi(
    path: str | os.PathLike,
    bval: str | os.PathLike | None = None,
    bvec: str | os.PathLike | None = None,
    *,
    b0_threshold: float = B0_THRESHOLD,
    read_only: bool = False,
) -> DWI:
    """Load and validate a DWI series.

    Finds ``name.bval``/``name.bvec`` beside ``name.nii.gz`` (BIDS) when not given, else FSL's
    ``bvals``/``bvecs`` in the same folder. A DICOM folder is converted (and cached) first.
    Voxels holding NaN/Inf are loaded and counted in ``warnings``; voxels without signal at b=0
    are loaded too and flagged by the fit, not here.

    Parameters
    ----------
    path : str or os.PathLike
        4-D NIfTI (``.nii``, ``.nii.gz``), or a DICOM folder.
    bval, bvec : str or os.PathLike, optional
        FSL gradient files: b-values in s/mm², b-vectors in FSL's bvec frame (image axes, x
        negated for a positive-determinant affine). Three rows or three columns.
    b0_threshold : float
        b-values at or below it (s/mm²) count as b=0.
    read_only : bool
        Map an uncompressed file read-only (its pages can leave the resident set once read);
        writing into ``data`` then raises.

    Returns
    -------
    DWI
        ``data`` (X, Y, Z, K) float32, ``affine`` (voxel → RAS+ mm), ``bvals`` (K,) in s/mm²,
        ``bvecs`` (K, 3) unit vectors in voxel axes, and the ``warnings`` of the checks.

    Raises
    ------
    InputError
        A missing or non-NIfTI file, a 3-D image, missing gradient files, counts that differ
        from the number of volumes, no b=0 volume, zero or non-unit b-vectors (normalised with a
        warning within 10 %), a damaged header or data; the message names the file and the fix.

    References
    ----------
    .. [1] Jenkinson M, Beckmann CF, Behrens TE, Woolrich MW, Smith SM. FSL. NeuroImage
       62:782-790 (2012): the bval/bvec conventions.

    Examples
    --------
    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_dwi
    >>> dwi = load_dwi(demo_path() / "dwi.nii.gz")  # finds dwi.bval and dwi.bvec beside it
    >>> dwi.data.shape
    (56, 56, 24, 68)
    >>> sorted(set(dwi.bvals.round(-2).tolist()))
    [0.0, 1000.0, 2000.0]
    """
    path = check_exists(path, "diffusion data")
    if path.is_dir():  # a DICOM folder: its diffusion series, converted (cached)
        dicom = dicom_input(path, kind="dwi")
        if dicom is not None:
            path, bval, bvec = dicom.nifti, bval or dicom.bval, bvec or dicom.bvec
    img = load_image(path, "diffusion data", mmap="r" if read_only else "c")
    shape = img.shape
    if len(shape) == 3 or (len(shape) == 4 and shape[3] == 1):
        raise InputError(
            f"this is a single 3-D volume {tuple(shape[:3])}, not a diffusion series",
            path=path,
            fix="Give the 4-D diffusion-weighted series (one volume per gradient direction)",
        )
    if len(shape) != 4:
        raise InputError(
            f"a diffusion series must be 4-D, this image has shape {shape}",
            path=path,
            fix="Give the 4-D diffusion-weighted series (X, Y, Z, one volume per gradient direction)",
        )
    n_volumes = int(shape[3])
    if bval is None or bvec is None:
        found_bval, found_bvec = find_gradient_files(path)
        bval = bval or found_bval
        bvec = bvec or found_bvec
        if bval is None or bvec is None:
            stem, _ = split_suffix(path)
            raise InputError(
                "no b-values/b-vectors given and none found beside the image "
                f"(looked for {stem}.bval and {stem}.bvec, and bvals/bvecs)",
                path=path,
                fix=f"Put {stem}.bval and {stem}.bvec beside the image (as BIDS names them), or pass --bval and --bvec",
            )
    bval_path = check_exists(bval, "b-value file")
    bvec_path = check_exists(bvec, "b-vector file")
    bvals = read_bvals(bval_path)
    if len(bvals) != n_volumes:
        raise InputError(
            f"{len(bvals)} b-values for {n_volumes} volumes in {path.name}",
            path=bval_path,
            fix="Use the bval file that belongs to this series",
        )
    bvecs = read_bvecs(bvec_path, n_volumes)
    warnings: list[str] = []
    if not (bvals <= b0_threshold).any():
        raise InputError(
            f"no b=0 volume (smallest b-value {bvals.min():g}, threshold {b0_threshold:g})",
            path=bval_path,
            fix="A tensor fit needs at least one non-diffusion-weighted volume; check the b-values",
        )
    bvecs = check_gradients(bvals, bvecs, bvec_path, warnings, b0_threshold)
    data = read_array(img, path, what="diffusion data")
    nonfinite = _report_bad_voxels(data, warnings)
    if read_only:
        release_pages(data)  # scanned: the pages go back to the page cache
    affine = img.affine.copy()
    return DWI(
        data=data,
        affine=affine,
        bvals=bvals,
        bvecs=fsl_to_voxel_vectors(bvecs, affine),
        path=str(path),
        bval_path=str(bval_path),
        bvec_path=str(bvec_path),
        warnings=warnings,
        b0_threshold=b0_threshold,
        nonfinite_voxels=nonfinite,
    )


def count_nonfinite_voxels(data: np.ndarray) -> int:
    """Voxels of an (X, Y, Z, K) series with a NaN or Inf in any volume.

    A slab of z at a time (a whole-volume boolean temporary is a quarter of the data's size),
    the slabs counted by a pool of threads (``np.isfinite`` releases the GIL; on a
    memory-mapped file this also reads the file's pages in parallel)."""

    def count(z: int) -> int:
        return int(np.count_nonzero(~np.isfinite(data[:, :, z]).all(axis=-1)))

    workers = min(8, host_threads(), data.shape[2])
    if workers <= 1:
        return sum(count(z) for z in range(data.shape[2]))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(count, range(data.shape[2])))


def _report_bad_voxels(data: np.ndarray, warnings: list[str]) -> int:
    count = count_nonfinite_voxels(data)
    if count:
        warnings.append(f"{count} voxel(s) contain NaN or Inf; they are left out of the fit and flagged")
    return count


def save_gradients(bvals: np.ndarray, bvecs_voxel: np.ndarray, affine: np.ndarray, bval_path, bvec_path) -> None:
    """Write FSL-style bval (one row) and bvec (three rows, FSL frame) files atomically."""
    bvecs = fsl_to_voxel_vectors(bvecs_voxel, affine) + 0.0  # no "-0.0" in the file
    with atomic_path(bval_path) as tmp:
        np.savetxt(tmp, np.asarray(bvals)[None, :], fmt="%g")
    with atomic_path(bvec_path) as tmp:
        np.savetxt(tmp, bvecs.T, fmt="%.8f")
