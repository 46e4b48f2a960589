"""Save a layer as a file: the use case behind a layer's "Save as…" (the window, Python and
scripts call the same function).

Tractograms go to .trk, .tck or .trx (through :func:`app.io.tractogram.save_tractogram`: every
point and streamline scalar is kept, in the .trk/.trx file or, for .tck, in MRtrix's .tsf side
files); scalar, label and RGB maps and ROIs to NIfTI on their own grid; tensors to NIfTI in FSL's
order and frame (as dtifit writes them). Each kind opens again as the same layer (File ▸ Open).
As DSI Studio, mrview and Slicer do, what was computed in the window can be taken to other tools.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import InputError
from .io.nifti import save_volume
from .io.tensor import save_tensor
from .io.tractogram import save_tractogram
from .layers import Layer

TRACTOGRAM_SUFFIXES = (".trk", ".tck", ".trx")
NIFTI_SUFFIXES = (".nii.gz", ".nii")
#: layer kind -> the suffixes it can be saved as, the first the default
SAVE_SUFFIXES = {
    "tractogram": TRACTOGRAM_SUFFIXES,
    "scalar": NIFTI_SUFFIXES,
    "labels": NIFTI_SUFFIXES,
    "rgb": NIFTI_SUFFIXES,
    "roi": NIFTI_SUFFIXES,
    "tensor": NIFTI_SUFFIXES,
}
FORMAT_NAMES = {".trk": "TrackVis", ".tck": "MRtrix", ".trx": "TRX", ".nii.gz": "NIfTI", ".nii": "NIfTI"}


def save_suffixes(layer: Layer) -> tuple[str, ...]:
    """The file suffixes ``layer`` can be saved as (empty: only within a session)."""
    return SAVE_SUFFIXES.get(layer.kind, ())


def default_file_name(layer: Layer) -> str:
    """A file name for the save dialog: the layer's name with its kind's first suffix."""
    suffixes = save_suffixes(layer)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in layer.name).strip("_") or layer.kind
    return stem + (suffixes[0] if suffixes else "")


def _suffix_of(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in (*NIFTI_SUFFIXES, *TRACTOGRAM_SUFFIXES) if name.endswith(s)), "")


def layer_file_path(layer: Layer, path: str | os.PathLike) -> Path:
    """``path`` with the layer's default suffix added when it has none (another kind's suffix is
    kept, and refused by :func:`save_layer`)."""
    path = Path(path)
    suffixes = save_suffixes(layer)
    if suffixes and not _suffix_of(path):
        path = path.with_name(path.name + suffixes[0])
    return path


def save_layer(layer: Layer, path: str | os.PathLike) -> Path:
    """Write ``layer`` to ``path`` (the format from its suffix, which is added when missing);
    atomic: a failure leaves no file. Returns the path written.

    Raises :class:`InputError` for a kind that is saved only within a session (diffusion series,
    sticks, fODFs) or a suffix the kind cannot be written as."""
    suffixes = save_suffixes(layer)
    if not suffixes:
        raise InputError(
            f"a {layer.kind} layer cannot be saved on its own",
            path=path,
            fix="save the session (File ▸ Save session), which keeps every layer",
        )
    path = layer_file_path(layer, path)
    if _suffix_of(path) not in suffixes:
        raise InputError(
            f"a {layer.kind} layer is saved as {', '.join(suffixes)}, not as {path.suffix or 'a file without suffix'}",
            path=path,
            fix=f"name the file with one of {', '.join(suffixes)}",
        )
    if layer.kind == "tractogram":
        return save_tractogram(layer.data, path)
    volume = layer.data
    if layer.kind == "roi":
        return save_volume(volume.mask.astype(np.uint8), volume.affine, path)
    if layer.kind == "tensor":
        return save_tensor(volume.data, volume.affine, path, symmatrix=True)  # opens again without asking
    if layer.kind == "labels":
        return save_volume(np.asarray(volume.data, dtype=np.int32), volume.affine, path)
    return save_volume(np.asarray(volume.data, dtype=np.float32), volume.affine, path)
