"""Open any supported file as display layers (used by the GUI and ``tractlens view``).

What a path becomes:

* ``.trk``/``.tck``/``.trx``: a tractogram layer (a ``.tck`` takes the open
  document's grid as its reference);
* a 4-D NIfTI with gradient files beside it: a DWI series, kept as a hidden
  ``dwi`` layer (its mean b=0 image; model fits start from it) and fitted on
  load (WLS, on the GPU when present) into FA, colour FA and MD layers;
* a bedpostX folder (one holding ``merged_th1samples``), or one of its
  ``merged_*samples`` files: a ``dyads`` layer (the sticks) over a
  "mean f1" layer;
* a 6-volume tensor NIfTI (with ``tensor_order``) or any other folder (dtifit):
  FA, colour FA and MD computed from the tensors;
* a 3-volume NIfTI: a colour (RGB) layer; a 3-D integer image with few values:
  a label layer; any other 3-D NIfTI: a scalar layer.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpu import dti, sym3

from .errors import InputError
from .io import load_bedpostx, load_dwi, load_tensor, load_tractogram
from .io._atomic import split_suffix
from .io.bedpostx import dyad_volume
from .io.nifti import NIFTI_SUFFIXES, load_image, read_array
from .model import DWIVolume, Layer, Volume

log = logging.getLogger(__name__)

MAX_LABELS = 5000
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
) -> list[Layer]:
    """Open ``path`` as layers (see module docstring); raises :class:`InputError`."""
    layers = _load_layers(path, reference, tensor_order, device, progress, cancelled)
    for layer in layers:
        layer.provenance.setdefault("file", str(Path(path).resolve()))
    return layers


def _load_layers(path, reference, tensor_order, device, progress, cancelled) -> list[Layer]:
    path = Path(path)
    if not path.exists():
        raise InputError("not found", path=path)
    suffix = path.suffix.lower()
    if suffix in (".trk", ".tck", ".trx"):
        tract = load_tractogram(path, reference=reference)
        return [Layer(_stem(path), tract, "tractogram")]
    if BEDPOSTX_SAMPLES.match(path.name) and _is_bedpostx(path.parent):
        path = path.parent  # a sample file stands for its folder
    if path.is_dir():
        if _is_bedpostx(path):
            samples = load_bedpostx(path)
            return bedpostx_layers(dyad_volume(samples), samples.f[..., 0, :].mean(axis=-1), _stem(path))
        return layers_from_tensor(load_tensor(path), _stem(path))
    if not path.name.lower().endswith(NIFTI_SUFFIXES):
        raise InputError(
            "cannot open this kind of file",
            path=path,
            fix="TractLens opens NIfTI images (.nii, .nii.gz), dtifit and bedpostX folders and .trk/.tck/.trx tractograms",
        )
    img = load_image(path)
    shape = img.shape
    if len(shape) == 4 and shape[3] >= 7:  # enough volumes for a tensor: a diffusion series
        return _dwi_layers(path, device, progress, cancelled)
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
    if np.issubdtype(img.get_data_dtype(), np.integer) and _looks_like_labels(data):
        volume = Volume(_stem(path), data.astype(np.int32), img.affine, kind="labels", source=str(path))
        volume.lut = _sidecar_lut(path)
        return [Layer(_stem(path), volume, "labels")]
    volume = Volume(_stem(path), np.nan_to_num(data), img.affine)
    return [Layer(_stem(path), volume, "scalar")]


def _sidecar_lut(path: Path):
    """The lookup table beside a label volume (``NAME.txt``, ``NAME_lut.txt``, ``NAME.tsv``: the
    BIDS dseg sidecar), or None. One that cannot be read is skipped with a warning, not fatal."""
    from .io.lut import load_lut

    stem = _stem(path)
    for name in (f"{stem}.txt", f"{stem}_lut.txt", f"{stem}.tsv", f"{stem}_LUT.txt"):
        candidate = path.with_name(name)
        if candidate.is_file():
            try:
                return load_lut(candidate)
            except InputError as exc:
                log.warning("%s", exc)
    return None


def _looks_like_labels(data: np.ndarray) -> bool:
    values = np.unique(data)
    return values.size <= MAX_LABELS and values.min() >= 0 and values.size < data.size / 4


def _dwi_layers(path: Path, device, progress, cancelled) -> list[Layer]:
    from .pipelines.dti import fit_dti_pipeline

    dwi = load_dwi(path)
    result = fit_dti_pipeline(dwi, device=device, progress=progress, cancelled=cancelled)
    maps = (result.map(name) for name in ("fa", "md", "rgb"))
    series = Layer(_stem(path), DWIVolume(_stem(path), dwi), "dwi", visible=False)
    fitted = dti_layers(*maps, dwi.affine, "", result.map("tensor"))
    for layer in fitted:
        layer.provenance = {"computed": "diffusion tensor fit", "file": str(path.resolve()), **result.summary()}
    return [series, *fitted]
