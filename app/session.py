"""Save and reopen the whole document: every layer, its display settings and provenance.

A session is one file, ``NAME.tractlens``: a zip archive (stored, not compressed: the side
files compress themselves) holding

* ``manifest.json`` — format name and version, the TractLens version, the reference grid,
  the cursor, and per layer its kind, display properties, provenance and side files, plus
  what panels keep (e.g. the presurgical margin and lesion);
* ``layers/NN.nii.gz`` — volumes, ROI masks, label volumes (NIfTI-1, the exact values and the
  layer's affine; FSL, MRtrix and DIPY open them), with ``NN.bval``/``NN.bvec`` (FSL files)
  and ``NN_signal.nii.gz`` for a diffusion series, and ``NN_{th,ph,f}samples.nii.gz`` +
  ``NN_mask.nii.gz`` for posterior samples;
* ``layers/NN.trx`` — tractograms with every per-point and per-streamline scalar (positions
  as float64 mm, so the voxel coordinates come back bit for bit with the manifest's affine);
  ``NN_selection.npy`` the streamlines shown.

Affines are kept in the manifest at full precision (NIfTI headers hold float32). The archive
is written beside the target and renamed over it, so a failure never leaves half a session.
``load_session`` migrates older format versions forward (:data:`MIGRATIONS`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from . import __version__
from .errors import InputError
from .io._atomic import atomic_path
from .io.nifti import save_volume
from .io.tractogram import load_tractogram, save_tractogram
from .model import ROI_ROLES, Document, DWIVolume, DyadsVolume, Layer, RoiMask, Volume

FORMAT = "tractlens-session"
VERSION = 1
SUFFIX = ".tractlens"
#: version -> function(manifest) -> manifest of version + 1
MIGRATIONS: dict = {}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _display(layer: Layer) -> dict:
    return {key: _jsonable(getattr(layer, key)) for key in Layer._DISPLAY}


def _save_nifti(data, affine, folder: Path, name: str) -> str:
    save_volume(np.asarray(data), affine, folder / name)
    return name


def _layer_entry(layer: Layer, index: int, folder: Path) -> dict:
    stem = f"{index:02d}"
    entry = {
        "name": layer.name,
        "kind": layer.kind,
        "display": _display(layer),
        "provenance": _jsonable(layer.provenance),
        "files": {},
    }
    data = layer.data
    files = entry["files"]
    if layer.kind == "tractogram":
        files["tractogram"] = f"{stem}.trx"
        save_tractogram(data, folder / files["tractogram"], exact=True)
        entry["grid"] = {"affine": data.affine.tolist(), "dimensions": list(data.dimensions)}
        entry["tract_name"] = data.name
        entry["tract_source"] = data.source
        if layer.selection is not None:
            files["selection"] = f"{stem}_selection.npy"
            np.save(folder / files["selection"], layer.selection)
        return entry
    if layer.kind == "roi":
        files["mask"] = _save_nifti(data.mask.astype(np.uint8), data.affine, folder, f"{stem}.nii.gz")
        entry["role"] = data.role
        entry["shape"] = None if data.shape is None else _jsonable(data.shape)
        entry["affine"] = data.affine.tolist()
        return entry
    entry["affine"] = data.affine.tolist()
    entry["volume"] = {"name": data.name, "kind": data.kind, "source": data.source}
    if data.lut is not None:
        entry["volume"]["lut"] = {
            "names": {str(k): v for k, v in data.lut.names.items()},
            "colours": {str(k): list(v) for k, v in data.lut.colours.items()},
            "source": data.lut.source,
        }
    files["data"] = _save_nifti(data.data, data.affine, folder, f"{stem}.nii.gz")
    if isinstance(data, DWIVolume):
        dwi = data.dwi
        files["signal"] = _save_nifti(dwi.data, dwi.affine, folder, f"{stem}_signal.nii.gz")
        files["bvals"] = f"{stem}_bvals.npy"
        files["bvecs"] = f"{stem}_bvecs_voxel.npy"  # exactly as held: voxel axes
        np.save(folder / files["bvals"], dwi.bvals)
        np.save(folder / files["bvecs"], dwi.bvecs)
        entry["dwi"] = {"path": dwi.path, "b0_threshold": dwi.b0_threshold, "warnings": list(dwi.warnings)}
    if isinstance(data, DyadsVolume):
        samples = data.samples
        for key in ("theta", "phi", "f"):
            files[key] = _save_nifti(getattr(samples, key), samples.affine, folder, f"{stem}_{key}.nii.gz")
        files["samples_mask"] = _save_nifti(
            samples.mask.astype(np.uint8), samples.affine, folder, f"{stem}_mask.nii.gz"
        )
        entry["samples_path"] = samples.path
    return entry


def save_session(document: Document, path: str | os.PathLike, *, panels: dict | None = None) -> Path:
    """Write the document (and what ``panels`` keep) to ``path`` (``.tractlens`` added if missing)."""
    path = Path(path)
    if path.suffix != SUFFIX:
        path = path.with_name(path.name + SUFFIX)
    with tempfile.TemporaryDirectory(prefix="tractlens-session-") as tmp:
        folder = Path(tmp) / "layers"
        folder.mkdir()
        layers = [_layer_entry(layer, i, folder) for i, layer in enumerate(document.layers)]
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "tractlens": __version__,
            "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "reference": None
            if document.reference_affine is None
            else {"affine": document.reference_affine.tolist(), "shape": list(document.reference_shape)},
            "cursor": [int(v) for v in document.cursor],
            "layers": layers,
            "panels": _jsonable(panels or {}),
        }
        (Path(tmp) / "manifest.json").write_text(json.dumps(manifest, indent=1))
        with atomic_path(path) as target:
            with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
                archive.write(Path(tmp) / "manifest.json", "manifest.json")
                for item in sorted(folder.iterdir()):
                    archive.write(item, f"layers/{item.name}")
    return path


class Session:
    """A reopened session: the document and what the panels kept."""

    def __init__(self, document: Document, panels: dict, manifest: dict, path: Path):
        self.document, self.panels, self.manifest, self.path = document, panels, manifest, path


def _read_manifest(archive: zipfile.ZipFile, path: Path) -> dict:
    try:
        manifest = json.loads(archive.read("manifest.json").decode("utf-8"))
    except KeyError:
        raise InputError("not a TractLens session (no manifest.json inside)", path=path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"the session's manifest is damaged ({exc})", path=path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError("not a TractLens session (unknown manifest format)", path=path)
    version = manifest.get("version")
    if not isinstance(version, int) or version < 1:
        raise InputError(f"the session has an invalid format version {version!r}", path=path)
    if version > VERSION:
        raise InputError(
            f"the session was saved by a newer TractLens (format {version}, this one reads up to {VERSION})",
            path=path,
            fix="Update TractLens to open it",
        )
    while manifest["version"] < VERSION:
        manifest = MIGRATIONS[manifest["version"]](manifest)
    return manifest


def _load_nifti(folder: Path, name: str) -> np.ndarray:
    import nibabel as nib

    return np.asanyarray(nib.load(folder / name).dataobj)


def _restore_layer(entry: dict, folder: Path) -> Layer:
    kind, files = entry["kind"], entry["files"]
    if kind == "tractogram":
        grid = (np.asarray(entry["grid"]["affine"]), tuple(entry["grid"]["dimensions"]))
        tract = load_tractogram(folder / files["tractogram"], grid=grid)
        tract.name = entry.get("tract_name", tract.name)
        tract.source = entry.get("tract_source", "")
        layer = Layer(entry["name"], tract, "tractogram")
        if "selection" in files:
            layer.selection = np.load(folder / files["selection"]).astype(bool)
    elif kind == "roi":
        role = entry.get("role", "seed")
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}")
        roi = RoiMask(entry["name"], _load_nifti(folder, files["mask"]) != 0, np.asarray(entry["affine"]), role=role)
        if entry.get("shape"):
            shape = dict(entry["shape"])
            shape["centre"] = np.asarray(shape["centre"], dtype=float)
            roi.shape = shape
        layer = Layer(entry["name"], roi, "roi")
    else:
        affine = np.asarray(entry["affine"])
        info = entry["volume"]
        data = _load_nifti(folder, files["data"])
        if "signal" in files:
            from .io.dwi import DWI

            dwi = DWI(
                np.asarray(_load_nifti(folder, files["signal"]), dtype=np.float32),
                affine,
                np.load(folder / files["bvals"]),
                np.load(folder / files["bvecs"]),
                path=entry["dwi"].get("path", ""),
                warnings=list(entry["dwi"].get("warnings", [])),
                b0_threshold=float(entry["dwi"].get("b0_threshold", 50.0)),
            )
            volume = DWIVolume(info["name"], dwi)
        elif "theta" in files:
            from .io.bedpostx import BedpostSamples

            samples = BedpostSamples(
                *(np.asarray(_load_nifti(folder, files[k]), dtype=np.float32) for k in ("theta", "phi", "f")),
                _load_nifti(folder, files["samples_mask"]) != 0,
                affine,
                path=entry.get("samples_path", ""),
            )
            volume = DyadsVolume(info["name"], np.asarray(data), samples, source=info.get("source", ""))
        else:
            volume = Volume(info["name"], np.asarray(data), affine, kind=info["kind"], source=info.get("source", ""))
        if "lut" in info:
            from .io.lut import LabelTable

            lut = info["lut"]
            volume.lut = LabelTable(
                {int(k): v for k, v in lut["names"].items()},
                {int(k): tuple(v) for k, v in lut["colours"].items()},
                lut.get("source", ""),
            )
        layer = Layer(entry["name"], volume, kind)
    display = dict(entry.get("display", {}))
    if "clim" in display and display["clim"] is not None:
        display["clim"] = tuple(display["clim"])
    for key, value in display.items():
        if key in Layer._DISPLAY:
            setattr(layer, key, value)
    layer.provenance = dict(entry.get("provenance", {}))
    return layer


def load_session(path: str | os.PathLike) -> Session:
    """Reopen a session file as a new :class:`Document`; :class:`InputError` when it cannot be."""
    path = Path(path)
    if not path.is_file():
        raise InputError("the session file does not exist", path=path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"not a TractLens session ({exc})", path=path, fix="Open a .tractlens file") from None
    with archive, tempfile.TemporaryDirectory(prefix="tractlens-open-") as tmp:
        manifest = _read_manifest(archive, path)
        names = [n for n in archive.namelist() if n.startswith("layers/") and "/.." not in n and not n.endswith("/")]
        for name in names:
            target = Path(tmp) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(name) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
        document = Document()
        try:
            layers = [_restore_layer(entry, Path(tmp) / "layers") for entry in manifest.get("layers", [])]
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"the session is damaged: a layer cannot be restored ({exc})", path=path) from None
    reference = manifest.get("reference")
    if reference:
        document.reference_affine = np.asarray(reference["affine"], dtype=np.float64)
        document.reference_shape = tuple(int(v) for v in reference["shape"])
    for layer in layers:
        document.add_layer(layer)
    if reference:
        document.cursor = np.asarray(manifest.get("cursor", document.cursor), dtype=int)
    return Session(document, dict(manifest.get("panels", {})), manifest, path)
