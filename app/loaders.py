"""Open any supported file as display layers (used by the GUI and ``tractlens view``).

What a path becomes:

* ``.trk``/``.tck``/``.trx``: a tractogram layer (a ``.tck`` takes the open
  document's grid as its reference);
* a 4-D NIfTI with gradient files beside it: a DWI series, kept as a hidden
  ``dwi`` layer (its mean b=0 image; model fits start from it) and fitted on
  load (WLS, on the GPU when present) into FA, colour FA and MD layers;
* a ``fit-csd`` folder or an fODF image: an ``fod`` layer (:mod:`app.fod_layers`);
* a bedpostX folder (one holding ``merged_th1samples``), or one of its
  ``merged_*samples`` files: a ``dyads`` layer (the sticks) over a
  "mean f1" layer;
* a 6-volume tensor NIfTI (with ``tensor_order``) or any other folder (dtifit):
  FA, colour FA and MD computed from the tensors;
* a 3-volume NIfTI: a colour (RGB) layer; a 3-D image that is a parcellation or a
  mask (see :func:`looks_like_labels`): a label layer; any other 3-D NIfTI (a T1,
  an FA map...): a scalar layer. :func:`show_as` turns one into the other.

When is an image a label map? Scanners also store anatomical images as integers
(int16, uint8), so the data type alone says nothing. An image is shown as labels
when its values are whole numbers ≥ 0 and one of these holds, in this order:

1. a lookup table lies beside it (``NAME.txt``, ``NAME_lut.txt``, ``NAME.tsv``);
2. its name says so: it contains ``aparc``, ``aseg``, ``dseg``, ``parc``,
   ``label``, ``atlas`` or ``segmentation``, or has a ``seg`` part (FSL FAST's
   ``*_seg``);
3. it is a mask: one value besides 0;
4. it is piecewise constant like a parcellation: at most :data:`MAX_LABELS`
   distinct values and, of the pairs of neighbouring non-zero voxels, at least
   :data:`LABEL_AGREEMENT` hold the same value (regions are blobs of one value;
   in a T1 or a b=0 image, even one stored as uint8 with 200 grey levels,
   neighbours differ by noise: about 5 % agree).

Anything else is a scalar image; the layer menu's "Show as scalar / labels"
switches when the guess is wrong.

An ROI file (File > Open ROI) is read by :func:`load_roi_file`: any non-zero voxel is inside,
the mask is brought onto the document's grid (nearest neighbour) and refused when none of it
lies in the image.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from tractlens.gpu import dti, sym3

from .errors import InputError
from .fod_layers import is_fod_path, load_fod_layers
from .grid import Grid
from .io import load_bedpostx, load_dwi, load_tensor, load_tractogram, split_suffix
from .io.bedpostx import SAMPLES_BASE, dyad_volume
from .io.dicom_import import layer_sources
from .io.dicom_series import is_dicom_folder
from .io.dwi import find_gradient_files
from .io.lut import load_lut
from .io.nifti import IMAGE_SUFFIXES, NIFTI_SUFFIXES, load_3d, load_image, read_array
from .io.tractogram_mapped import check_positions as check_tractogram_positions
from .model import ROI_ROLES, DWIVolume, Layer, RoiMask, Volume
from .pipelines.dti import fit_dti_pipeline

log = logging.getLogger(__name__)

MAX_LABELS = 5000  # more distinct values than this: never a parcellation by content alone
LABEL_AGREEMENT = 0.8  # fraction of neighbouring non-zero voxel pairs with the same value (rule 4)
LABEL_NAME = re.compile(r"aparc|aseg|dseg|parc|label|atlas|segmentation|(^|[^a-z0-9])seg([^a-z0-9]|$)", re.IGNORECASE)
BEDPOSTX_SAMPLES = re.compile(r"merged_(th|ph|f)\d+samples\.nii(\.gz)?$")


def _stem(path: Path) -> str:
    return split_suffix(path)[0]


def dti_layers(fa, md, rgb, affine, prefix: str = "", tensor: np.ndarray | None = None) -> list[Layer]:
    """The standard DTI display: colour FA over FA, MD hidden, tensor glyphs off."""
    name = f"{prefix} " if prefix else ""
    glyphs = []
    if tensor is not None:
        volume = Volume(f"{name}tensors", tensor.astype(np.float32), affine, kind="tensor")
        glyphs = [Layer(f"{name}tensors", volume, "tensor", visible=False)]
    return [
        *glyphs,
        Layer(f"{name}FA", Volume(f"{name}FA", fa, affine), "scalar", colormap="gray", clim=(0.0, 1.0)),
        Layer(f"{name}MD", Volume(f"{name}MD", md, affine), "scalar", colormap="hot", visible=False),
        Layer(f"{name}colour FA", Volume(f"{name}colour FA", rgb, affine, kind="rgb"), "rgb", opacity=1.0),
    ]


def layers_from_tensor(tensor: Volume, prefix: str = "") -> list[Layer]:
    """FA, MD and colour FA of a tensor volume (internal order, voxel axes)."""
    flat = tensor.data.reshape(-1, 6)
    evals, evecs = sym3.eigh(np, flat)
    evals = np.maximum(evals, 0.0)
    maps = dti.scalar_maps(np, evals, evecs)
    shape = tensor.shape3
    return dti_layers(
        maps["fa"].reshape(shape).astype(np.float32),
        maps["md"].reshape(shape).astype(np.float32),
        maps["rgb"].reshape((*shape, 3)).astype(np.float32),
        tensor.affine,
        prefix,
        tensor.data,
    )


def bedpostx_layers(dyads: Volume, mean_f1: np.ndarray, prefix: str = "", *, f1_visible: bool = True) -> list[Layer]:
    """A ball & sticks result shown: the sticks (``dyads`` volume) over the first stick's mean
    fraction in grey (0..1; hidden with ``f1_visible=False``, e.g. over an open FA map)."""
    name = f"{prefix} " if prefix else ""
    f1 = Volume(f"{name}mean f1", np.asarray(mean_f1, dtype=np.float32), dyads.affine, source=dyads.source)
    return [
        Layer(f1.name, f1, "scalar", colormap="gray", clim=(0.0, 1.0), visible=f1_visible),
        Layer(f"{name}dyads", dyads, "dyads"),
    ]


def _is_bedpostx(folder: Path) -> bool:
    return any((folder / f"merged_th1samples{suffix}").exists() for suffix in NIFTI_SUFFIXES)


def load_layers(
    path: str | os.PathLike,
    *,
    reference: tuple[np.ndarray, tuple[int, int, int]] | None = None,
    tensor_order: str | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    gradients: tuple[str | os.PathLike, str | os.PathLike] | None = None,
    dicom_series: str | None = None,
    check_positions: bool = True,
) -> list[Layer]:
    """Open ``path`` as layers (see module docstring); raises :class:`InputError`.

    ``gradients``: the (bval, bvec) files of a diffusion series that has none beside it (see
    :func:`needs_gradient_files`); ignored for other files. A DICOM folder opens its diffusion
    series and every image series, converted (:func:`app.io.dicom_import.layer_sources`);
    ``dicom_series`` picks the diffusion series when there are several. ``check_positions``
    False: an uncompressed .trx's positions (NaN, infinite, beyond the grid) are checked after it
    is shown, by :func:`check_opened` (a window's first frame does not wait for a pass over a
    whole-brain file)."""

    if is_dicom_folder(path):
        return _dicom_layers(Path(path), dicom_series, reference, device, progress, cancelled)
    layers = _load_layers(path, reference, tensor_order, device, progress, cancelled, gradients, check_positions)
    for layer in layers:
        layer.provenance.setdefault("file", str(Path(path).resolve()))
    return layers


def check_opened(layer: Layer) -> None:
    """What :func:`load_layers` left for later (``check_positions=False``): raises
    :class:`InputError`, the message opening would have given, when a tractogram's positions are
    NaN, infinite or beyond its grid; :func:`withdraw_opened` then takes the layer back out."""
    if layer.kind == "tractogram":
        check_tractogram_positions(layer.data)


def check_pending(layer: Layer) -> bool:
    """Is ``layer`` not known to be sound yet: :func:`check_opened` still to come, or refused it
    (and :func:`withdraw_opened` is on its way)? What reads its points waits meanwhile."""
    mapped = getattr(layer.data, "mapped", None) if layer.kind == "tractogram" else None
    return mapped is not None and not (mapped.checked and mapped.positions_fit())


def withdraw_opened(document, layer: Layer, reference_before) -> None:
    """Take out a layer that :func:`check_opened` refused, leaving the document as if it had not
    been opened: the reference grid it gave an empty document (``reference_before``: the
    document's affine before it was added) goes too when no layer is left. Other layers stay."""
    if layer in document.layers:
        document.remove_layer(layer)
    if reference_before is None and not document.layers:
        document.reference_affine = document.reference_shape = None


def _dicom_layers(folder: Path, series, reference, device, progress, cancelled) -> list[Layer]:
    layers: list[Layer] = []
    for conv in layer_sources(folder, series):
        gradients = (conv.bval, conv.bvec) if conv.kind == "dwi" else None
        for layer in _load_layers(conv.nifti, reference, None, device, progress, cancelled, gradients):
            layer.name = layer.name.replace("series", conv.series.description or "series", 1)
            layer.provenance.setdefault("file", str(folder.resolve()))
            layer.provenance["dicom"] = {
                "series_instance_uid": conv.series.uid,
                "study_instance_uid": conv.series.study_uid,
                "frame_of_reference_uid": conv.series.frame_uid,
                "series": conv.series.label,
                "nifti": str(conv.nifti),
            }
            layers.append(layer)
    return layers


def _load_layers(path, reference, tensor_order, device, progress, cancelled, gradients=None, check_positions=True):
    path = Path(path)
    if not path.exists() and path.name == SAMPLES_BASE and _is_bedpostx(path.parent):
        path = path.parent  # probtrackx's DIR/merged names the bedpostX folder
    if not path.exists():
        raise InputError("not found", path=path)
    suffix = path.suffix.lower()
    if suffix in (".trk", ".tck", ".trx"):
        tract = load_tractogram(path, reference=reference, check_positions=check_positions)
        return [Layer(_stem(path), tract, "tractogram")]
    if BEDPOSTX_SAMPLES.match(path.name) and _is_bedpostx(path.parent):
        path = path.parent  # a sample file stands for its folder

    if is_fod_path(path):  # a fit-csd folder or an fODF image (app.fod_layers)
        return load_fod_layers(path)
    if path.is_dir():
        if _is_bedpostx(path):
            samples = load_bedpostx(path)
            return bedpostx_layers(dyad_volume(samples), samples.f[..., 0, :].mean(axis=-1), _stem(path))
        return layers_from_tensor(load_tensor(path), _stem(path))
    if not path.name.lower().endswith(IMAGE_SUFFIXES):
        raise InputError(
            "cannot open this kind of file",
            path=path,
            fix="TractLens opens NIfTI images (.nii, .nii.gz), FreeSurfer .mgz/.mgh, dtifit, bedpostX and fit-csd folders and .trk/.tck/.trx tractograms",
        )
    img = load_image(path)
    shape = img.shape
    if is_diffusion_shape(shape):
        return _dwi_layers(path, device, progress, cancelled, gradients)
    if len(shape) in (4, 5) and shape[-1] == 6:
        return layers_from_tensor(load_tensor(path, tensor_order), _stem(path))
    data = read_array(img, path)
    if data.ndim == 4 and data.shape[3] == 3:
        rgb = np.clip(np.nan_to_num(data), 0, None)
        if rgb.max() > 1.0:  # 0..255 colour maps
            rgb = rgb / rgb.max()
        return [Layer(_stem(path), Volume(_stem(path), rgb, img.affine, kind="rgb"), "rgb")]
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise InputError(f"cannot show an image of shape {shape}", path=path)
    stored = img.get_data_dtype()
    lut = _sidecar_lut(path) if np.issubdtype(stored, np.integer) else None
    if np.issubdtype(stored, np.integer) and looks_like_labels(data, path.name, lut is not None):
        volume = Volume(_stem(path), data.astype(np.int32), img.affine, kind="labels", source=str(path))
        volume.lut = lut
        layer = Layer(_stem(path), volume, "labels")
    else:
        volume = Volume(_stem(path), np.nan_to_num(data), img.affine, source=str(path))
        volume.lut = lut  # kept for "Show as labels"
        layer = Layer(_stem(path), volume, "scalar")
    layer.provenance["stored_as"] = str(stored)  # an integer image is probably anatomical (see is_anatomical)
    return [layer]


def _sidecar_lut(path: Path):
    """The lookup table beside a label volume (``NAME.txt``, ``NAME_lut.txt``, ``NAME.tsv``: the
    BIDS dseg sidecar), or None. One that cannot be read is skipped with a warning, not fatal."""

    stem = _stem(path)
    for name in (f"{stem}.txt", f"{stem}_lut.txt", f"{stem}.tsv", f"{stem}_LUT.txt"):
        candidate = path.with_name(name)
        if candidate.is_file():
            try:
                return load_lut(candidate)
            except InputError as exc:
                log.warning("%s", exc)
    return None


def looks_like_labels(data: np.ndarray, name: str = "", has_lut: bool = False) -> bool:
    """Is an integer-typed image a label map (parcellation, segmentation, mask)? The rule is
    in the module docstring; ``data`` as read (float after scaling), ``name`` the file name."""
    if data.size == 0 or not np.isfinite(data).all():
        return False
    if data.min() < 0 or not np.array_equal(data, np.rint(data)):  # scaled to fractions: not labels
        return False
    if has_lut or LABEL_NAME.search(_stem(Path(name)) if name else ""):
        return True
    sample = data[::4, ::4, ::4]
    if np.unique(sample).size > MAX_LABELS:  # cheap early exit for images with many grey levels
        return False
    values = np.unique(data)
    if values.size > MAX_LABELS:
        return False
    if values.size <= 2 and values[0] == 0:  # a mask (or an empty image)
        return True
    return neighbour_agreement(data) >= LABEL_AGREEMENT


def neighbour_agreement(data: np.ndarray) -> float:
    """Of the pairs of face-neighbouring voxels that are both non-zero, the fraction with equal values."""
    same = pairs = 0
    for axis in range(data.ndim):
        a = np.moveaxis(data, axis, 0)
        lo, hi = a[:-1], a[1:]
        both = (lo != 0) & (hi != 0)
        pairs += int(np.count_nonzero(both))
        same += int(np.count_nonzero(both & (lo == hi)))
    return same / pairs if pairs else 1.0


ANATOMICAL_NAME = re.compile(r"(^|[^a-z0-9])(t1w?|t2w?|flair|mprage|pdw?|anat|t1_?brain)([^a-z0-9]|$)", re.IGNORECASE)


def is_anatomical(layer: Layer) -> bool:
    """Is a loaded scalar layer an anatomical image (a T1, T2, FLAIR) rather than a map? Then
    the window puts it under the maps already open. Scanners store anatomy as integers; maps
    computed from diffusion data (FA, MD) are floats: an integer image, or one whose file
    name says T1/T2/FLAIR/MPRAGE/PD/anat, counts as anatomical."""
    if layer.kind != "scalar":
        return False
    stored = layer.provenance.get("stored_as", "")
    if stored and np.issubdtype(np.dtype(stored), np.integer):
        return True
    source = getattr(layer.data, "source", "") or ""
    return bool(ANATOMICAL_NAME.search(_stem(Path(source)) if source else layer.name))


def show_as(layer: Layer, kind: str) -> Layer:
    """A scalar image as a label layer or a label layer as a scalar image: a new layer with the
    same name, visibility, opacity and provenance (put it in the layer's place with
    :meth:`Document.replace_layer`). Labels need whole numbers ≥ 0 (:class:`InputError`
    otherwise); a lookup table found beside the file when it was opened goes with it."""
    if kind not in ("scalar", "labels") or layer.kind not in ("scalar", "labels"):
        raise ValueError(f"a {layer.kind} layer cannot be shown as {kind}")
    old = layer.data
    if kind == "labels":
        data = np.asarray(old.data)
        if not (np.isfinite(data).all() and data.min() >= 0 and np.array_equal(data, np.rint(data))):
            raise InputError(
                f"{layer.name} cannot be shown as labels: its values are not whole numbers ≥ 0",
                fix="Labels are region numbers 0, 1, 2, …; keep it as a scalar image",
            )
        new_data = np.rint(data).astype(np.int32)
    else:
        new_data = np.asarray(old.data, dtype=np.float32)
    volume = Volume(old.name, new_data, old.affine, kind="scalar" if kind == "scalar" else "labels", source=old.source)
    volume.lut = old.lut
    if kind == "labels" and volume.lut is None and old.source:
        volume.lut = _sidecar_lut(Path(old.source))
    new = Layer(layer.name, volume, kind, visible=layer.visible, opacity=layer.opacity)
    new.provenance = dict(layer.provenance)
    return new


def is_diffusion_shape(shape) -> bool:
    """A 4-D image with enough volumes for a tensor (7) is opened as a diffusion series."""
    return len(shape) == 4 and shape[3] >= 7


def needs_gradient_files(path: str | os.PathLike) -> bool:
    """Is ``path`` a diffusion series without ``.bval``/``.bvec`` beside it (see
    :func:`app.io.dwi.find_gradient_files`)? Then the window asks for them and ``tractlens view``
    takes ``--bval``/``--bvec``. Reads the header only; False for anything unreadable (the
    loader says what is wrong with it)."""
    path = Path(path)
    if not path.is_file() or not path.name.lower().endswith(IMAGE_SUFFIXES):
        return False

    try:
        shape = load_image(path).shape
        if is_fod_path(path):  # SH coefficients, not a diffusion series
            return False
    except InputError:
        return False
    return is_diffusion_shape(shape) and find_gradient_files(path) == (None, None)


class GradientFilesMissing(InputError):
    """A diffusion series opened without its b-values and b-vectors (none beside it, none given)."""


def _dwi_layers(path: Path, device, progress, cancelled, gradients=None) -> list[Layer]:
    bval, bvec = gradients if gradients is not None else (None, None)
    if gradients is None and find_gradient_files(path) == (None, None):
        stem = _stem(path)
        raise GradientFilesMissing(
            f"no b-values/b-vectors beside this diffusion series (looked for {stem}.bval and {stem}.bvec, "
            "and bvals/bvecs)",
            path=path,
            fix="Choose them when the window asks (File ▸ Open), or give them: "
            "tractlens view DWI --bval FILE --bvec FILE",
        )
    dwi = load_dwi(path, bval, bvec)
    result = fit_dti_pipeline(dwi, device=device, progress=progress, cancelled=cancelled)
    maps = (result.map(name) for name in ("fa", "md", "rgb"))
    series = Layer(_stem(path), DWIVolume(_stem(path), dwi), "dwi", visible=False)
    fitted = dti_layers(*maps, dwi.affine, "", result.map("tensor"))
    for layer in fitted:
        layer.provenance = {"computed": "diffusion tensor fit", "file": str(path.resolve()), **result.summary()}
    return [series, *fitted]


def unique_name(name: str, taken: Iterable[str]) -> str:
    """``name``, or ``name (2)``, ``name (3)``, ... when one of ``taken`` has it already."""
    taken = set(taken)
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name} ({number})"
    return candidate


def load_roi_file(
    path: str | os.PathLike, reference: Grid | None, *, role: str = "seed", taken: Iterable[str] = ()
) -> tuple[RoiMask, list[str]]:
    """A NIfTI mask as an ROI on the ``reference`` grid (None: its own grid, the first image of
    a document) and the notices to show the user: a mask on another grid is resampled
    (nearest neighbour), an empty one is kept as a blank to draw in. Every non-zero, finite
    voxel is inside. The ROI is named after the file, made unique among ``taken``.

    Raises :class:`InputError` when the file cannot be read or when the mask lies outside the
    image (none of its voxels lands on the reference grid)."""
    if role not in ROI_ROLES:
        raise ValueError(f"unknown ROI role {role!r}: one of {', '.join(ROI_ROLES)}")
    path = Path(path)
    img = load_image(path, "ROI")
    data = np.asarray(load_3d(path, None, "ROI"))
    mask = (data != 0) & np.isfinite(data)
    empty = not mask.any()
    own = Grid(img.affine, mask.shape)
    notices = []
    grid = own if reference is None else Grid.of(reference)
    if not grid.matches(own):
        mask = grid.resample_nearest(mask, own)
        if not empty and not mask.any():
            raise InputError(
                "the ROI lies outside the image: none of its voxels is inside the volume",
                path=path,
                fix="Check that it belongs to this subject and space (its affine)",
            )
        notices.append(f"{path.name} was on another grid: resampled (nearest neighbour)")
    if empty:
        notices.append(f"{path.name} is empty (no non-zero voxel): added as an empty ROI")
    name = unique_name(_stem(path), taken)
    return RoiMask(name, mask, np.array(grid.affine), role=role), notices
