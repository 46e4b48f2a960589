"""Save and reopen the whole document: every layer, its display settings and provenance.

A session is one file, ``NAME.tractlens``: a zip archive (stored, not compressed: the side
files compress themselves) holding

* ``manifest.json`` — format name and version, the TractLens version, the reference grid,
  the cursor, and per layer its kind, display properties, provenance and side files, plus
  what the window keeps (``panels``: the presurgical margin and lesion, the 3-D camera, the
  radiological convention);
* ``layers/*.nii.gz`` — volumes, ROI masks, label volumes (NIfTI-1, the exact values and the
  layer's affine; FSL, MRtrix and DIPY open them), the diffusion series of a ``dwi`` layer
  with its b-values and b-vectors, and the posterior samples of a ``dyads`` layer (an fODF
  layer read from a file keeps only that file's path, :func:`app.fod_layers.fod_session_entry`);
* ``layers/*.trx`` — tractograms with every per-point and per-streamline scalar (positions
  as float64 mm, so the voxel coordinates come back bit for bit with the manifest's affine; a
  tractogram read memory-mapped from a .trx keeps its file's positions, float32 or float16,
  written a chunk at a time: :mod:`app.io.tractogram_exact`);
  ``*_selection.npy`` the streamlines shown.

The same content can also live in a folder (``manifest.json`` + ``layers/``):
:func:`load_session` opens either. The autosave (:mod:`app.recovery`) keeps such a folder up
to date with :class:`SessionFolder`, which rewrites only the side files whose content changed.

Writing never reads the live document: :func:`snapshot` takes a detached copy first (ROI masks,
selections and scalars are copied; volumes, which the model only ever replaces, are shared),
so a worker can write while the user goes on painting. Affines are kept in the manifest at full
precision (NIfTI headers hold float32). Every file is written beside its target, flushed and
renamed over it, so a failure (a full disk) never leaves half a session and keeps the previous
one. ``load_session`` migrates older format versions forward (:data:`MIGRATIONS`).

Format history: 1 — the first release; 2 — layer ``uid`` (the autosave's file names) and
``panels["view"]`` (camera, radiological convention). Version-1 files are read through
:func:`_migrate_1_to_2`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import __version__
from .errors import InputError
from .fod_layers import FodFileMissing, fod_session_entry, restore_fod_volume
from .io._atomic import SaveError, atomic_path, save_error, write_text_atomic
from .io.bedpostx import BedpostSamples
from .io.dwi import DWI
from .io.lut import LabelTable
from .io.nifti import load_image, read_raw, reason, save_volume
from .io.tractogram import load_tractogram
from .io.tractogram_exact import save_tractogram_exact
from .model import ROI_ROLES, Document, DWIVolume, DyadsVolume, Layer, RoiMask, Tractogram, Volume
from .session_arrays import in_layer_dtype, nifti_storable, restore_empty_scalars, scalar_types
from .session_arrays import jsonable as _jsonable
from .session_registrations import FOLDER as REGISTRATIONS
from .session_registrations import archive_name, read_registrations, write_registrations

FORMAT = "tractlens-session"
VERSION = 2
SUFFIX = ".tractlens"
MANIFEST = "manifest.json"


def _migrate_1_to_2(manifest: dict) -> dict:
    """Version 1 had no layer uids and no view settings: number the layers, default view."""
    manifest = dict(manifest, version=2)
    manifest["layers"] = [dict(entry, uid=f"L{i}") for i, entry in enumerate(manifest.get("layers", []))]
    panels = dict(manifest.get("panels") or {})
    panels.setdefault("view", {})
    manifest["panels"] = panels
    return manifest


#: version -> function(manifest) -> manifest of version + 1
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _migrate_1_to_2}


# ------------------------------------------------------------------ snapshots
_UIDS: dict[int, str] = {}  # id(layer) -> uid, for the layers alive now
_UID_LOCK = threading.Lock()
_NEXT_UID = [0]


def layer_uid(layer: Layer) -> str:
    """A name for a layer object that stays the same while it lives (file names of the autosave)."""
    with _UID_LOCK:
        uid = getattr(layer, "_session_uid", None)
        if uid is None:
            _NEXT_UID[0] += 1
            uid = f"L{_NEXT_UID[0]}"
            layer._session_uid = uid
        return uid


def _detached(obj):
    """A shallow copy of a model object without its listeners."""
    twin = copy.copy(obj)
    twin._listeners = []
    return twin


def snapshot_layer(layer: Layer) -> Layer:
    """A copy of ``layer`` that later edits of the document do not reach.

    What the model edits in place (ROI masks, shapes) and small per-layer state (selection,
    provenance, scalar dicts) is copied; volume and streamline arrays, which the model only
    ever replaces, are shared.
    """
    twin = _detached(layer)
    twin._session_uid = layer_uid(layer)
    twin.provenance = copy.deepcopy(layer.provenance)
    twin.selection = None if layer.selection is None else np.array(layer.selection, dtype=bool)
    twin.selection_by = layer.selection_by
    data = _detached(layer.data)
    if isinstance(data, RoiMask):
        data.mask = np.array(layer.data.mask, dtype=bool)
        data.shape = copy.deepcopy(layer.data.shape)
    elif isinstance(data, Tractogram):
        data.point_scalars = dict(layer.data.point_scalars)
        data.streamline_scalars = dict(layer.data.streamline_scalars)
    twin.data = data
    return twin


@dataclass
class DocumentSnapshot:
    """What :func:`write_session` writes: detached layers, the grid, the cursor, the panels' state."""

    layers: list[Layer]
    reference_affine: np.ndarray | None
    reference_shape: tuple[int, int, int] | None
    cursor: np.ndarray
    panels: dict = field(default_factory=dict)
    registrations: dict = field(default_factory=dict)  # id -> Registration (frozen: shared)


def snapshot(document: Document, panels: dict | None = None) -> DocumentSnapshot:
    """Take a :class:`DocumentSnapshot` (on the thread that owns the document: cheap, no I/O)."""
    return DocumentSnapshot(
        [snapshot_layer(layer) for layer in document.layers],
        None if document.reference_affine is None else document.reference_affine.copy(),
        document.reference_shape,
        np.array(document.cursor),
        copy.deepcopy(_jsonable(panels or {})),
        dict(document.registrations),
    )


# ------------------------------------------------------------ side files
@dataclass
class _Part:
    """One side file of a layer: where it goes in ``entry["files"]``, what identifies its content
    (``key``: the folder writer reuses a file whose key is unchanged) and how it is written."""

    role: str
    suffix: str
    key: tuple
    write: Callable[[Path], None]
    keep_alive: tuple = ()  # the arrays whose ids the key holds (so no other array takes an id)
    dtype: str | None = None  # the layer's own dtype, where the file holds the values in another one


def _digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    packed = np.packbits(array) if array.dtype == bool else array.view(np.uint8)
    return hashlib.blake2b(packed.tobytes(), digest_size=16).hexdigest()


def _by_identity(*arrays) -> tuple:
    return tuple((id(a), np.shape(a), str(np.asarray(a).dtype)) for a in arrays)


def _nifti_part(role: str, array, affine, nifti_suffix: str, key: tuple | None = None) -> _Part:
    """A volume as NIfTI when its values fit a NIfTI-1 type exactly, else as ``.npy`` (the grid is
    the manifest's affine either way); ``dtype`` records the layer's own type to restore it."""
    array = np.asarray(array)
    affine = np.asarray(affine, dtype=np.float64)
    key = key if key is not None else ("nifti", *_by_identity(array), affine.tobytes())
    stored = nifti_storable(array)
    dtype = None if stored is array else array.dtype.str
    if stored is None:
        part = _npy_part(role, array, key)
        part.dtype = dtype
        return part
    return _Part(role, nifti_suffix, key, lambda path: save_volume(stored, affine, path), (array,), dtype)


def _npy_part(role: str, array, key: tuple | None = None) -> _Part:
    array = np.asarray(array)

    def write(path: Path) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as out:
            np.save(out, array)

    return _Part(role, ".npy", key if key is not None else ("npy", *_by_identity(array)), write, (array,))


def _layer_parts(layer: Layer, nifti_suffix: str) -> tuple[dict, list[_Part]]:
    """The manifest entry of a (snapshot) layer without its file names, and its side files."""
    entry = {
        "uid": layer_uid(layer),
        "name": layer.name,
        "kind": layer.kind,
        "display": {key: _jsonable(getattr(layer, key)) for key in Layer._DISPLAY},
        "provenance": _jsonable(layer.provenance),
    }
    data = layer.data
    parts: list[_Part] = []
    if layer.kind == "tractogram":
        scalars = [*data.point_scalars.values(), *data.streamline_scalars.values()]
        key = (
            "trx",
            *_by_identity(data.mapped or data.points, data.offsets, *scalars),  # a file's map: not converted here
            tuple(data.point_scalars),
            tuple(data.streamline_scalars),
            data.affine.tobytes(),
        )
        keep = (data.mapped or data.points, data.offsets, *scalars)
        parts.append(_Part("tractogram", ".trx", key, lambda path: save_tractogram_exact(data, path), keep))
        entry["grid"] = {"affine": data.affine.tolist(), "dimensions": list(data.dimensions)}
        entry["tract_name"] = data.name
        entry["tract_source"] = data.source
        entry["scalars"] = scalar_types(data)  # TRX writes no array of a 0-streamline tractogram
        if layer.selection is not None:
            parts.append(_npy_part("selection", layer.selection, ("selection", _digest(layer.selection))))
            entry["selection_by"] = layer.selection_by  # what made it, said with every count
        return entry, parts
    if layer.kind == "roi":
        mask = data.mask.astype(np.uint8)
        parts.append(
            _nifti_part("mask", mask, data.affine, nifti_suffix, ("roi", _digest(data.mask), data.affine.tobytes()))
        )
        entry["role"] = data.role
        entry["shape"] = None if data.shape is None else _jsonable(data.shape)
        entry["affine"] = data.affine.tolist()
        return entry, parts
    entry["affine"] = data.affine.tolist()
    entry["volume"] = {"name": data.name, "kind": data.kind, "source": data.source}
    if (fod := fod_session_entry(layer)) is not None:  # an fODF file: its path, not 650 MB again
        entry["fod"] = fod
        return entry, parts
    if data.lut is not None:
        entry["volume"]["lut"] = {
            "names": {str(k): v for k, v in data.lut.names.items()},
            "colours": {str(k): list(v) for k, v in data.lut.colours.items()},
            "source": data.lut.source,
        }
    parts.append(_nifti_part("data", data.data, data.affine, nifti_suffix))
    if isinstance(data, DWIVolume):
        dwi = data.dwi
        parts.append(_nifti_part("signal", dwi.data, dwi.affine, nifti_suffix))
        parts.append(_npy_part("bvals", dwi.bvals))
        parts.append(_npy_part("bvecs", dwi.bvecs))  # exactly as held: voxel axes
        entry["dwi"] = {"path": dwi.path, "b0_threshold": dwi.b0_threshold, "warnings": list(dwi.warnings)}
    if isinstance(data, DyadsVolume):
        samples = data.samples
        for key in ("theta", "phi", "f"):
            parts.append(_nifti_part(key, getattr(samples, key), samples.affine, nifti_suffix))
        parts.append(
            _nifti_part(
                "samples_mask",
                samples.mask.astype(np.uint8),
                samples.affine,
                nifti_suffix,
                ("nifti", *_by_identity(samples.mask), samples.affine.tobytes()),
            )
        )
        entry["samples_path"] = samples.path
    return entry, parts


def _record_dtype(entry: dict, part: _Part) -> None:
    if part.dtype is not None:
        entry.setdefault("dtypes", {})[part.role] = part.dtype


def _manifest(snap: DocumentSnapshot, layers: list[dict], registrations: list[dict]) -> dict:
    return {
        "registrations": registrations,
        "format": FORMAT,
        "version": VERSION,
        "tractlens": __version__,
        "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "reference": None
        if snap.reference_affine is None
        else {"affine": snap.reference_affine.tolist(), "shape": list(snap.reference_shape)},
        "cursor": [int(v) for v in snap.cursor],
        "layers": layers,
        "panels": snap.panels,
    }


def write_session(snap: DocumentSnapshot, path: str | os.PathLike) -> Path:
    """Write a snapshot as one ``.tractlens`` file (suffix added if missing); atomic."""
    path = Path(path)
    if path.suffix != SUFFIX:
        path = path.with_name(path.name + SUFFIX)
    try:
        _write_archive(snap, path)
    except SaveError as exc:  # a side file failed: the error is the session's, not a staging file's
        cause = exc.__cause__
        raise (save_error(cause, path) if isinstance(cause, OSError) else exc) from cause
    except OSError as exc:
        raise save_error(exc, path) from exc
    return path


def _write_archive(snap: DocumentSnapshot, path: Path) -> None:
    # Side files are staged beside the target (the same disk: a full disk shows here, not in
    # a small /tmp), then stored in the archive, which replaces the target atomically.
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}-", dir=path.parent) as tmp:
        folder = Path(tmp) / "layers"
        folder.mkdir()
        entries = []
        for index, layer in enumerate(snap.layers):
            entry, parts = _layer_parts(layer, ".nii.gz")
            entry["files"] = {}
            for part in parts:
                name = f"{index:02d}_{part.role}{part.suffix}"
                part.write(folder / name)
                entry["files"][part.role] = name
                _record_dtype(entry, part)
            entries.append(entry)
        registrations = write_registrations(snap.registrations, Path(tmp) / REGISTRATIONS)
        (Path(tmp) / MANIFEST).write_text(json.dumps(_manifest(snap, entries, registrations), indent=1))
        with atomic_path(path) as target:
            with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
                archive.write(Path(tmp) / MANIFEST, MANIFEST)
                for item in sorted(p for p in (Path(tmp) / REGISTRATIONS).rglob("*") if p.is_file()):
                    archive.write(item, item.relative_to(tmp).as_posix())
                for item in sorted(folder.iterdir()):
                    archive.write(item, f"layers/{item.name}")


def save_session(document: Document, path: str | os.PathLike, *, panels: dict | None = None) -> Path:
    """Write the document (and what ``panels`` keep) to ``path`` (``.tractlens`` added if missing)."""
    return write_session(snapshot(document, panels), path)


class SessionFolder:
    """A session kept up to date in a folder, rewriting only what changed (the autosave's store).

    Each :meth:`write` writes the side files whose content key is new, then replaces
    ``manifest.json`` atomically, then deletes the side files the new manifest no longer
    names. At every moment the manifest on disk names complete files only, so a process killed
    in the middle of a write leaves the previous state readable by :func:`load_session`.
    Side files are uncompressed NIfTI (``.nii``): fast to write, and the folder is temporary.
    """

    def __init__(self, folder: str | os.PathLike, *, nifti_suffix: str = ".nii"):
        self.folder = Path(folder)
        self.nifti_suffix = nifti_suffix
        self._files: dict[tuple, tuple[str, tuple]] = {}  # part key -> (file name, arrays kept alive)
        self._counter = 0
        self._registrations: dict = {}  # id -> the registration written to registrations/ID
        self.last_state: str | None = None  # the manifest written last, without its time

    def write(self, snap: DocumentSnapshot, *, extra: dict | None = None) -> bool:
        """Bring the folder up to ``snap``; False (nothing written) when nothing changed."""
        layers_dir = self.folder / "layers"
        layers_dir.mkdir(parents=True, exist_ok=True)
        entries, files = [], {}
        for layer in snap.layers:
            entry, parts = _layer_parts(layer, self.nifti_suffix)
            entry["files"] = {}
            for part in parts:
                full_key = (entry["uid"], part.role, part.key)
                if full_key not in self._files:
                    self._counter += 1
                    name = f"{entry['uid']}_{part.role}_{self._counter}{part.suffix}"
                    part.write(layers_dir / name)
                    self._files[full_key] = (name, part.keep_alive)
                files[full_key] = self._files[full_key]
                entry["files"][part.role] = files[full_key][0]
                _record_dtype(entry, part)
            entries.append(entry)
        registrations = write_registrations(snap.registrations, self.folder / REGISTRATIONS, self._registrations)
        manifest = _manifest(snap, entries, registrations)
        manifest.update(extra or {})
        state = json.dumps({k: v for k, v in manifest.items() if k not in ("saved", "autosaved")}, sort_keys=True)
        if state == self.last_state:
            return False
        write_text_atomic(json.dumps(manifest, indent=1), self.folder / MANIFEST)
        self.last_state = state
        self._files = files  # forget (and let go of) what the new manifest does not name
        named = {name for name, _ in files.values()}
        for item in layers_dir.iterdir():
            if item.name not in named:
                item.unlink(missing_ok=True)
        return True


# ------------------------------------------------------------------ reading
class Session:
    """A reopened session: the document and what the panels kept."""

    def __init__(self, document: Document, panels: dict, manifest: dict, path: Path):
        self.document, self.panels, self.manifest, self.path = document, panels, manifest, path


DAMAGED = "Open an earlier copy of the session, or the autosave TractLens offers at start-up"
FOREIGN = "Open a .tractlens file (or a session folder) saved by TractLens"


def _parse_manifest(raw: bytes, path: Path) -> dict:
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"the session's manifest is damaged ({reason(exc)})", path=path, fix=DAMAGED) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError("not a TractLens session (unknown manifest format)", path=path, fix=FOREIGN)
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InputError(f"the session has an invalid format version {version!r}", path=path, fix=DAMAGED)
    if version > VERSION:
        raise InputError(
            f"the session was saved by a newer TractLens (format {version}, this one reads up to {VERSION})",
            path=path,
            fix="Update TractLens to open it",
        )
    while manifest["version"] < VERSION:
        manifest = MIGRATIONS[manifest["version"]](manifest)
    if not isinstance(manifest.get("layers", []), list):
        raise InputError("the session's manifest is damaged (its layer list is not a list)", path=path, fix=DAMAGED)
    return manifest


def _member(folder: Path, name) -> Path:
    """A side file named by the manifest: a plain name inside ``folder``, nothing else."""
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise ValueError(f"a side file has an invalid name {name!r}")
    return folder / name


def _load_nifti(folder: Path, name: str, dtype: str | None = None) -> np.ndarray:
    """A volume side file (NIfTI, or ``.npy`` for values no NIfTI-1 type holds), in ``dtype`` when given."""
    path = _member(folder, name)
    if path.suffix == ".npy":
        array = np.load(path, allow_pickle=False)
    else:  # header checked before the data is read (a damaged one could ask for GiB)
        array = read_raw(load_image(path, "session side file"), path, "session side file")
    return array if dtype is None else in_layer_dtype(array, dtype)


def _restore_layer(entry: dict, folder: Path) -> Layer:
    kind, files = entry["kind"], entry["files"]
    if kind == "tractogram":
        grid = (np.asarray(entry["grid"]["affine"], dtype=np.float64), tuple(entry["grid"]["dimensions"]))
        tract = load_tractogram(_member(folder, files["tractogram"]), grid=grid)
        tract.name = entry.get("tract_name", tract.name)
        tract.source = entry.get("tract_source", "")
        if len(tract) == 0:
            restore_empty_scalars(tract, entry.get("scalars") or {})
        layer = Layer(entry["name"], tract, "tractogram")
        if "selection" in files:
            layer.selection = np.load(_member(folder, files["selection"]), allow_pickle=False).astype(bool)
            if layer.selection.shape != (len(tract),):
                raise ValueError("the selection does not match the tractogram")
            layer.selection_by = entry.get("selection_by")
    elif kind == "roi":
        role = entry.get("role", "seed")
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}")
        mask = _load_nifti(folder, files["mask"]) != 0
        roi = RoiMask(entry["name"], mask, np.asarray(entry["affine"], dtype=np.float64), role=role)
        if entry.get("shape"):
            shape = dict(entry["shape"])
            shape["centre"] = np.asarray(shape["centre"], dtype=float)
            roi.shape = shape
        layer = Layer(entry["name"], roi, "roi")
    else:
        affine = np.asarray(entry["affine"], dtype=np.float64)
        info = entry["volume"]
        dtypes = entry.get("dtypes") or {}
        data = None if "fod" in entry else _load_nifti(folder, files["data"], dtypes.get("data"))
        if "fod" in entry:
            volume = restore_fod_volume(entry["fod"], info["name"])
        elif "signal" in files:
            dwi = DWI(
                np.asarray(_load_nifti(folder, files["signal"]), dtype=np.float32),
                affine,
                np.load(_member(folder, files["bvals"]), allow_pickle=False),
                np.load(_member(folder, files["bvecs"]), allow_pickle=False),
                path=entry["dwi"].get("path", ""),
                warnings=list(entry["dwi"].get("warnings", [])),
                b0_threshold=float(entry["dwi"].get("b0_threshold", 50.0)),
            )
            volume = DWIVolume(info["name"], dwi)
        elif "theta" in files:
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


def _document(manifest: dict, layers_dir: Path, path: Path) -> Document:
    document = Document()
    try:
        layers = [_restore_layer(entry, layers_dir) for entry in manifest.get("layers", [])]
        reference = manifest.get("reference")
        if reference:
            document.reference_affine = np.asarray(reference["affine"], dtype=np.float64)
            document.reference_shape = tuple(int(v) for v in reference["shape"])
        for layer in layers:
            document.add_layer(layer)
        if reference:
            document.set_cursor(manifest.get("cursor", document.cursor))
        document.registrations = read_registrations(manifest.get("registrations"), layers_dir.parent / REGISTRATIONS)
    except FodFileMissing:  # not the session's fault: the fODF file it refers to has gone
        raise
    except InputError as exc:  # a side file's error names a file in a temporary folder: name the session
        side = f" ({Path(exc.path).name})" if exc.path else ""
        raise InputError(f"the session is damaged{side}: {exc.problem}", path=path, fix=DAMAGED) from None
    except Exception as exc:  # a damaged or hand-edited session: any inconsistency is the file's
        raise InputError(
            f"the session is damaged: a layer cannot be restored ({reason(exc)})", path=path, fix=DAMAGED
        ) from None
    return document


def load_session(path: str | os.PathLike) -> Session:
    """Reopen a session (a ``.tractlens`` file or a session folder) as a new :class:`Document`;
    :class:`InputError` when it cannot be."""
    path = Path(path)
    if path.is_dir():
        if not (path / MANIFEST).is_file():
            raise InputError("this folder holds no TractLens session (no manifest.json)", path=path, fix=FOREIGN)
        manifest = _parse_manifest((path / MANIFEST).read_bytes(), path)
        document = _document(manifest, path / "layers", path)
        return Session(document, dict(manifest.get("panels") or {}), manifest, path)
    if not path.is_file():
        raise InputError("the session file does not exist", path=path, fix="Check the path and spelling")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InputError(f"not a TractLens session ({reason(exc)})", path=path, fix=FOREIGN) from None
    with archive, tempfile.TemporaryDirectory(prefix="tractlens-open-") as tmp:
        try:
            raw = archive.read(MANIFEST)
        except KeyError:
            raise InputError("not a TractLens session (no manifest.json inside)", path=path, fix=FOREIGN) from None
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise InputError(f"the session file is damaged ({reason(exc)})", path=path, fix=DAMAGED) from None
        manifest = _parse_manifest(raw, path)
        layers_dir = Path(tmp) / "layers"
        layers_dir.mkdir()
        try:
            for name in archive.namelist():
                if (inner := archive_name(name)) is not None:  # a registration's folder file
                    (Path(tmp) / REGISTRATIONS / inner).parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(name) as source, open(Path(tmp) / REGISTRATIONS / inner, "wb") as out:
                        shutil.copyfileobj(source, out)
                base = name[len("layers/") :] if name.startswith("layers/") else ""
                if not base or Path(base).name != base or base in (".", ".."):
                    continue
                with archive.open(name) as source, open(layers_dir / base, "wb") as out:
                    shutil.copyfileobj(source, out)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise InputError(f"the session file is damaged ({reason(exc)})", path=path, fix=DAMAGED) from None
        document = _document(manifest, layers_dir, path)
    panels = manifest.get("panels") or {}
    if not isinstance(panels, dict):
        raise InputError("the session file is damaged (its panel settings are not a table)", path=path, fix=DAMAGED)
    return Session(document, panels, manifest, path)
