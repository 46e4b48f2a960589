"""fODFs as layers: opening ``fit-csd`` folders and fODF images, a CSD fit's results shown,
the session entry of an fODF layer, and the one door to fODF tracking.

What opens as fODFs (:func:`app.loaders.load_layers` asks :func:`is_fod_path` first):

* a folder holding ``fod.nii.gz`` (``tractlens fit-csd -o DIR``): the fODF layer, its peaks
  as sticks (a ``dyads`` layer, hidden), GM and CSF maps of a multi-tissue fit (hidden), and
  the fODF's l=0 term as a grey background (the mean amplitude, MRtrix's "AFD total");
* a 4-D NIfTI whose volume count is that of an even-order SH series (15, 28, 45, 66, ...)
  written by ``fit-csd``, or without b-values beside it (a diffusion series of 45 volumes
  stays one) whose header names its basis (MRtrix, DIPY's descoteaux) or whose name says
  fODF (``fod``, ``fodf``, ``odf``, ``wmfod``); an fODF image that does not state its basis
  is refused by :func:`app.io.fod.load_fod` with what to do.

Coefficients are read through :func:`app.io.fod.load_fod`: MRtrix's basis, world frame.
A session keeps an fODF layer opened from a file as that file's path and basis (fODFs are
large: 650 MB for a 1.25 mm brain at lmax 8); one computed in the window keeps its data.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from tractlens.gpu.sh import Y00, lmax_of

from .errors import InputError
from .io import split_suffix
from .io.dwi import find_gradient_files
from .io.fod import load_fod, world_rotation
from .io.nifti import NIFTI_SUFFIXES, load_image, read_array
from .model import Layer, Volume
from .pipelines.track_fod import track_fod_deterministic

FOD_NAME = re.compile(r"(^|[^a-z])(wm)?f?odf?([^a-z]|$)", re.IGNORECASE)
FOD_FILE = "fod.nii.gz"


def _stem(path: Path) -> str:
    return split_suffix(path)[0]


def is_csd_folder(path: str | os.PathLike) -> bool:
    """A ``fit-csd`` output folder (one holding ``fod.nii.gz``)."""
    return Path(path).is_dir() and (Path(path) / FOD_FILE).is_file()


def is_fod_path(path: str | os.PathLike) -> bool:
    """Does ``path`` open as fODFs (see the module docstring)? Reads the header only."""
    path = Path(path)
    if is_csd_folder(path):
        return True
    if not path.is_file() or not path.name.lower().endswith(NIFTI_SUFFIXES):
        return False
    try:
        img = load_image(path)
    except InputError:
        return False
    if len(img.shape) != 4:
        return False
    try:
        lmax_of(int(img.shape[3]))
    except ValueError:
        return False
    description = bytes(img.header.get("descrip", b"")).split(b"\0")[0].decode("latin-1").lower()
    if "tractlens fod" in description:
        return True
    if find_gradient_files(path) != (None, None):  # a series of 45 volumes with its gradients
        return False
    return "mrtrix" in description or "descoteaux" in description or bool(FOD_NAME.search(_stem(path)))


def fod_layer(name: str, sh: np.ndarray, affine: np.ndarray, *, source: str = "", basis: str = "mrtrix") -> Layer:
    """An fODF layer over (X, Y, Z, C) coefficients (MRtrix basis, world frame)."""
    layer = Layer(name, Volume(name, np.asarray(sh, dtype=np.float32), affine, kind="fod", source=source), "fod")
    layer.provenance["basis"] = basis
    return layer


def amplitude_layer(name: str, sh: np.ndarray, affine: np.ndarray, visible: bool = True) -> Layer:
    """The fODF's mean amplitude (l=0 coefficient × Y00) as a grey scalar layer."""
    mean = np.nan_to_num(np.asarray(sh[..., 0], dtype=np.float32) * np.float32(Y00))
    return Layer(name, Volume(name, mean, affine), "scalar", colormap="gray", visible=visible)


def peaks_layer(name: str, peaks_world: np.ndarray, affine: np.ndarray) -> Layer:
    """Peaks (X, Y, Z, 3P: world direction × amplitude, as ``peaks.nii.gz`` and MRtrix's
    ``sh2peaks``) as a hidden ``dyads`` layer: unit voxel-axis directions, f = amplitude over
    the largest amplitude (so stick lengths compare across voxels), largest first."""
    peaks = np.nan_to_num(np.asarray(peaks_world, dtype=np.float64))
    peaks = peaks.reshape(*peaks.shape[:3], -1, 3)
    amplitude = np.linalg.norm(peaks, axis=-1)
    unit = peaks / np.maximum(amplitude, 1e-30)[..., None]
    voxel = unit @ world_rotation(affine)  # world -> voxel axes (the rotation is orthogonal)
    top = float(amplitude.max()) if amplitude.size else 0.0
    fraction = amplitude / top if top > 0 else amplitude
    order = np.argsort(-fraction, axis=-1, kind="stable")
    fraction = np.take_along_axis(fraction, order, axis=-1)
    voxel = np.take_along_axis(voxel, order[..., None], axis=-2)
    dyads = np.concatenate([voxel, fraction[..., None]], axis=-1).astype(np.float32)
    return Layer(name, Volume(name, dyads, affine, kind="dyads"), "dyads", visible=False)


def load_fod_layers(path: str | os.PathLike, basis: str = "auto") -> list[Layer]:
    """The layers of a ``fit-csd`` folder or an fODF image (see the module docstring), bottom first."""
    path = Path(path)
    folder = path if path.is_dir() else None
    image = path / FOD_FILE if folder is not None else path
    sh, affine, _lmax, read_as = load_fod(image, basis)
    base = _stem(folder if folder is not None else path)
    base = "" if base.lower() == "fod" else f"{base} "
    prefix = f"{base}fODF"
    layers = [amplitude_layer(f"{prefix} l=0", sh, affine)]
    if folder is not None:
        for tissue in ("gm", "csf"):
            tissue_file = folder / f"{tissue}.nii.gz"
            if tissue_file.is_file():
                data = read_array(load_image(tissue_file), tissue_file)
                volume = Volume(f"{base}{tissue.upper()}", data[..., 0] if data.ndim == 4 else data, affine)
                layers.append(Layer(volume.name, volume, "scalar", colormap="hot", visible=False))
        if (folder / "peaks.nii.gz").is_file():
            peaks = read_array(load_image(folder / "peaks.nii.gz"), folder / "peaks.nii.gz")
            layers.append(peaks_layer(f"{base}peaks", peaks, affine))
    layers.append(fod_layer(prefix, sh, affine, source=str(image.resolve()), basis=read_as))
    return layers


def csd_result_layers(result, name: str = "CSD") -> list[Layer]:
    """A CSD fit (:class:`app.pipelines.csd.CSDResult`) shown: GM and CSF maps of a
    multi-tissue fit (hidden), the peaks (hidden sticks) and the fODF layer on top."""
    affine = result.affine
    layers = []
    if result.model.msmt:
        for tissue in ("gm", "csf"):
            volume = Volume(f"{name} {tissue.upper()}", result.tissue(tissue), affine)
            layers.append(Layer(volume.name, volume, "scalar", colormap="hot", visible=False))
    layers.append(peaks_layer(f"{name} peaks", result.peaks(), affine))
    layers.append(fod_layer(f"{name} fODF", result.fod(), affine))
    return layers


# ------------------------------------------------------------------ sessions
def fod_session_entry(layer: Layer) -> dict | None:
    """What a session keeps of an fODF layer read from a file that still exists: its path and
    basis ({"path", "basis"}); None: keep the coefficients themselves (computed in the window)."""
    source = getattr(layer.data, "source", "")
    if layer.kind != "fod" or not source or not Path(source).is_file():
        return None
    return {"path": source, "basis": layer.provenance.get("basis", "auto")}


class FodFileMissing(InputError):
    """A session's fODF layer refers to a file that is no longer there."""


def restore_fod_volume(info: dict, name: str) -> Volume:
    """The fODF volume of a session entry written by :func:`fod_session_entry` (read again);
    :class:`FodFileMissing` when the file has gone."""
    if not Path(info["path"]).is_file():
        raise FodFileMissing(
            f"the fODF layer {name!r} is kept as its file, which is no longer there",
            path=info["path"],
            fix="Put the file back where it was, or open the fODF again and save the session",
        )
    sh, affine, _lmax, _basis = load_fod(info["path"], info.get("basis", "auto"))
    return Volume(name, sh, affine, kind="fod", source=info["path"])


# ------------------------------------------------------------------ tracking
def track_on_fod(volume: Volume, regions, **options):
    """Deterministic tracking on an fODF volume with a document's ROIs in their roles: the
    file's path (or (coefficients, affine) for a fit made in the window) and the regions go
    to :func:`app.pipelines.track_fod.track_fod_deterministic` with ``options`` (whole_brain,
    params, device, progress, cancelled, on_batch, seeding...). Returns its result."""

    source = volume.source if volume.source and Path(volume.source).is_file() else (volume.data, volume.affine)
    return track_fod_deterministic(source, regions, **options)
