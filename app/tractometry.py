"""Use case: tract profiles of named bundles for any maps (tractometry), as pyAFQ's tidy table.

``tractlens profile --bundles OUTDIR --map FA=... --map MD=...``, the batch step ``profiles`` and
scripts call :func:`profile_bundles`. It reads a ``tractlens bundles`` folder (``bundles.json`` and
one ``NAME.trx`` per bundle), and for every bundle and map gives the profile at K nodes: each
streamline resampled to K points equally spaced along its length, the streamlines oriented alike
(against the first, refined by the bundle's mean course), each map sampled trilinearly on its own
grid at the nodes' RAS millimetres, and the streamlines averaged with pyAFQ's weights (the inverse
Mahalanobis distance to the bundle's core at each node; Yeatman et al. 2012, PLoS ONE 7(11):
e49790; :mod:`tractlens.gpu.tractometry`). The geometry (resampling, orientation, weights) is done
once per bundle in RAS mm, so maps on different grids see the same nodes and the same weights.

The table has the columns :data:`TIDY_COLUMNS` (one row per subject, session, bundle, node and
metric): what pandas and seaborn read as is. A bundle without streamlines, or whose regions
missed, keeps its K rows per metric with an empty value, and its status and message are in
:attr:`TractometryResult.bundles` (the JSON output and the command's summary), never dropped.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import Cancelled
from tractlens.gpu.engines import decide_device
from tractlens.gpu.tractometry import ProfileParams, node_weights, orient, resample, sample_map, weighted_profile

from .errors import InputError
from .grid import Grid

log = logging.getLogger(__name__)

#: The columns of the tidy table, in this order (pyAFQ's long format).
TIDY_COLUMNS = ("subject", "session", "bundle", "node", "metric", "value")

#: ``bundles.json``'s format name and the versions read.
BUNDLES_FORMAT, BUNDLES_VERSIONS = "tractlens-bundles", (1,)

#: Images of a fit folder that are not maps to profile.
_NOT_MAPS = re.compile(r"(^|_)(mask|flags|S0|tensor|RGB|V[123]|dwi)($|_)", re.IGNORECASE)


@dataclass(frozen=True)
class BundleEntry:
    """One bundle of a bundles folder: its tractogram (None when not written) and what
    ``bundles.json`` says of it."""

    name: str
    path: Path | None
    status: str
    message: str = ""
    streamlines: int | None = None


@dataclass
class TractometryResult:
    """Profiles of several bundles and maps. ``values[(bundle, metric)]``: (K,) weighted means
    (NaN where nothing was sampled); ``bundles[name]``: status, message, streamlines and how many
    were flipped; ``maps``: metric → file."""

    subject: str
    session: str
    n_points: int
    values: dict[tuple[str, str], np.ndarray]
    bundles: dict[str, dict]
    maps: dict[str, str]
    provenance: dict = field(default_factory=dict)

    def rows(self) -> list[tuple]:
        """The tidy rows: (subject, session, bundle, node, metric, value), value NaN where empty."""
        out = []
        for (bundle, metric), profile in self.values.items():
            out += [(self.subject, self.session, bundle, node, metric, float(v)) for node, v in enumerate(profile)]
        return out

    def summary(self) -> dict:
        return {"subject": self.subject, "session": self.session, "points": self.n_points,
                "maps": self.maps, "bundles": self.bundles, **self.provenance}  # fmt: skip


# ------------------------------------------------------------------ inputs


def read_bundles_folder(folder: str | Path, names: Sequence[str] | None = None) -> list[BundleEntry]:
    """The bundles of a ``tractlens bundles`` output folder (all, or ``names`` in that order)."""
    folder = Path(folder)
    index = folder / "bundles.json"
    if not folder.is_dir():
        raise InputError(
            "the bundles folder does not exist", path=folder, fix="Give the -o folder of tractlens bundles"
        )
    try:
        manifest = json.loads(index.read_text())
    except FileNotFoundError:
        raise InputError("not a bundles folder: bundles.json is missing", path=folder,
                         fix="Give the -o folder of tractlens bundles") from None  # fmt: skip
    except (OSError, ValueError) as exc:
        raise InputError(f"bundles.json cannot be read ({exc})", path=index,
                         fix="Run tractlens bundles again") from None  # fmt: skip
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLES_FORMAT:
        raise InputError(f"bundles.json is not a {BUNDLES_FORMAT} file", path=index,
                         fix="Give the -o folder of tractlens bundles")  # fmt: skip
    if manifest.get("version") not in BUNDLES_VERSIONS:
        raise InputError(f"bundles.json has version {manifest.get('version')!r}, this program reads "
                         f"{', '.join(map(str, BUNDLES_VERSIONS))}", path=index,
                         fix="Update TractLens, or run tractlens bundles again with this version")  # fmt: skip
    listed = manifest.get("bundles")
    if not isinstance(listed, dict):
        raise InputError("bundles.json lists no bundles", path=index, fix="Run tractlens bundles again")
    wanted = list(listed) if not names else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in listed]
    if unknown:
        raise InputError(f"no bundle {', '.join(unknown)} in this folder", path=folder,
                         fix=f"Choose among: {', '.join(listed)}")  # fmt: skip
    entries = []
    for name in wanted:
        info = listed[name] if isinstance(listed[name], dict) else {}
        path = folder / info["file"] if info.get("file") else None
        status = str(info.get("status", "ok"))
        if status == "ok" and (path is None or not path.is_file()):
            raise InputError(f"the tractogram of bundle {name} is missing", path=path or folder,
                             fix="Run tractlens bundles again for this bundle")  # fmt: skip
        count = info.get("streamlines")
        entries.append(BundleEntry(name, path if path is not None and path.is_file() else None, status,
                                   str(info.get("message", "")), int(count) if count is not None else None))  # fmt: skip
    return entries


def metric_name(path: str | Path) -> str:
    """The metric a map's file name stands for: ``dti_FA.nii.gz`` → FA, a BIDS derivative
    ``..._param-fa_dwimap.nii.gz`` → FA, ``NDI.nii.gz`` → NDI."""
    stem = Path(path).name.split(".")[0]
    bids = re.search(r"(?:^|_)param-([A-Za-z0-9]+)", stem)
    if bids:
        return bids.group(1).upper() if len(bids.group(1)) <= 3 else bids.group(1)
    return stem.removeprefix("dti_")


def collect_maps(maps: Sequence[str] | Mapping[str, str | Path] = (), fit: str | Path | None = None) -> dict[str, Path]:
    """Metric name → map file, from ``NAME=PATH`` or ``PATH`` words (or a mapping) and the 3-D maps
    of a fit folder (fit-dti's ``dti_FA.nii.gz``... or fit-model's ``NDI.nii.gz``...; masks, flags,
    S0, tensors and vectors left out). Names must be unique."""
    found: dict[str, Path] = {}
    if fit is not None:
        folder = Path(fit)
        if not folder.is_dir():
            raise InputError("the fit folder does not exist", path=folder, fix="Give a fit-dti or fit-model -o folder")
        for path in sorted(folder.glob("*.nii*")):
            name = metric_name(path)
            if not _NOT_MAPS.search(path.name.split(".")[0]) and _is_3d(path):
                found[name] = path
        if not found:
            raise InputError("the fit folder holds no 3-D map", path=folder,
                             fix="Give a fit-dti or fit-model -o folder, or --map NAME=FILE")  # fmt: skip
    items = maps.items() if isinstance(maps, Mapping) else [_split_map(word) for word in maps]
    for name, path in items:
        if name in found and Path(path) != found[name]:
            raise InputError(f"two maps are named {name}", path=path, fix="Name them: --map NAME=FILE")
        found[name] = Path(path)
    if not found:
        raise InputError("no map to profile", fix="Give --map NAME=FILE (repeat) or --fit DIR")
    for name, path in found.items():
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
            raise InputError(f"the metric name {name!r} has characters a table column cannot keep",
                             path=path, fix="Name the map with letters and digits: --map NAME=FILE")  # fmt: skip
    return found


def _split_map(word: str) -> tuple[str, Path]:
    name, sep, path = str(word).partition("=")
    if sep and name and "/" not in name:
        return name, Path(path)
    return metric_name(word), Path(word)


def _is_3d(path: Path) -> bool:
    import nibabel as nib

    try:
        shape = nib.load(str(path)).shape
    except Exception:  # not an image we can read: not a map of this fit
        return False
    return len(shape) == 3 or (len(shape) == 4 and shape[3] == 1)


def bids_entities(*paths: str | Path | None) -> tuple[str, str]:
    """``(sub-XX, ses-YY)`` from the first path that names them ('' when none does)."""
    subject = session = ""
    for path in paths:
        if path is None:
            continue
        text = str(Path(path).absolute())
        subject = subject or next(iter(re.findall(r"(?:^|[/_])(sub-[A-Za-z0-9]+)", text)), "")
        session = session or next(iter(re.findall(r"(?:^|[/_])(ses-[A-Za-z0-9]+)", text)), "")
    return subject, session


# ------------------------------------------------------------------ the use case


def profile_bundles(
    source: str | Path,
    maps: Sequence[str] | Mapping[str, str | Path] = (),
    *,
    fit: str | Path | None = None,
    names: Sequence[str] | None = None,
    params: ProfileParams | None = None,
    subject: str | None = None,
    session: str | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> TractometryResult:
    """Profiles of every bundle of ``source`` (a bundles folder, or one tractogram file: one bundle
    named after it) for every map. ``subject``/``session`` default to the BIDS entities in the
    paths. Raises :class:`InputError` for a bad folder, map or name, and when a map does not
    overlap any bundle (a map of another subject or space)."""
    params = params or ProfileParams()
    if params.n_points < 2:
        raise InputError(f"a profile needs at least 2 points, not {params.n_points}", fix="Give --points 2 or more")
    source = Path(source)
    if source.is_dir():
        entries = read_bundles_folder(source, names)
    elif source.is_file():
        entries = [BundleEntry(source.name.split(".")[0], source, "ok")]
    else:
        raise InputError("neither a bundles folder nor a tractogram", path=source,
                         fix="Give the -o folder of tractlens bundles (--bundles) or a .trx/.trk/.tck file")  # fmt: skip
    files = collect_maps(maps, fit)
    volumes = {name: _load_map(path) for name, path in files.items()}
    found_subject, found_session = bids_entities(source, *files.values())
    result = TractometryResult(
        subject if subject is not None else found_subject,
        session if session is not None else found_session,
        params.n_points, {}, {}, {n: str(p) for n, p in files.items()}, {"weighting": params.weighting},
    )  # fmt: skip
    sampled_any = dict.fromkeys(volumes, False)
    extents = []
    for done, entry in enumerate(entries):
        if cancelled is not None and cancelled():
            raise Cancelled("tractometry cancelled")
        nodes, record = _bundle_nodes(entry, params)
        result.bundles[entry.name] = record
        if nodes is not None:
            extents.append(nodes.reshape(-1, 3))
            weights = node_weights(nodes, params.weighting)
            # the engine's crossover decides auto: samples of this bundle in all maps
            choice = decide_device("profile", nodes.shape[0] * nodes.shape[1] * len(volumes), requested=device)
            record["device"] = choice.reason
        for metric, volume in volumes.items():
            profile = np.full(params.n_points, np.nan)
            if nodes is not None:
                values = sample_map(volume.grid.to_voxels(nodes.reshape(-1, 3)).reshape(nodes.shape),
                                    volume.data, choice.argument)  # fmt: skip
                profile = weighted_profile(values, weights)[0]
                sampled_any[metric] |= bool(np.isfinite(values).any())
            result.values[(entry.name, metric)] = profile
        if progress is not None:
            progress(done + 1, len(entries))
    _check_overlap(sampled_any, volumes, extents)
    result.provenance["device"] = device
    return result


@dataclass(frozen=True)
class _Map:
    grid: Grid
    data: np.ndarray
    source: str


def _load_map(path: Path) -> _Map:
    from .io import load_volume

    volume = load_volume(path)
    data = np.asarray(volume.data)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    elif data.ndim != 3:
        raise InputError(f"the map must be a 3-D scalar image (FA, MD, ...), this one has shape {data.shape}",
                         path=path, fix="Give one scalar map per --map")  # fmt: skip
    return _Map(Grid(volume.affine, data.shape), data, str(path))


def _bundle_nodes(entry: BundleEntry, params: ProfileParams) -> tuple[np.ndarray | None, dict]:
    """The bundle's K nodes per streamline in RAS mm, oriented (None when it has no streamline),
    and its record (status, message, streamlines, flipped)."""
    from .io import load_tractogram

    record = {"status": entry.status, "message": entry.message, "streamlines": entry.streamlines or 0, "flipped": 0}
    if entry.path is None:
        record["message"] = record["message"] or f"bundle {entry.name}: {entry.status}, no tractogram"
        log.warning("bundle %s: %s (%s): its profile is empty", entry.name, entry.status, record["message"])
        return None, record
    tract = load_tractogram(entry.path)
    tract = tract.subset(np.diff(tract.offsets) > 0) if len(tract) and (np.diff(tract.offsets) == 0).any() else tract
    record["streamlines"] = len(tract)
    if len(tract) == 0:
        if record["status"] == "ok":
            record["status"] = "empty"
        record["message"] = record["message"] or f"bundle {entry.name} has no streamlines"
        log.warning("bundle %s: %s: its profile is empty", entry.name, record["message"])
        return None, record
    mm = tract.points_on(np.eye(4))
    nodes = resample(mm, tract.offsets, params.n_points)
    flipped = orient(nodes)
    record["flipped"] = int(flipped.sum())
    return np.where(flipped[:, None, None], nodes[:, ::-1], nodes), record


def _check_overlap(sampled_any: dict, volumes: dict, extents: list) -> None:
    if not extents:
        return
    points = np.concatenate(extents)
    low, high = points.min(axis=0), points.max(axis=0)
    for metric, sampled in sampled_any.items():
        if sampled:
            continue
        grid = volumes[metric].grid
        corners = grid.to_mm(np.array(np.meshgrid(*[[-0.5, n - 0.5] for n in grid.shape])).reshape(3, -1).T)
        raise InputError(
            f"the map {metric} does not overlap the bundles: they lie within RAS "
            f"{_box(low, high)} mm, the map covers {_box(corners.min(axis=0), corners.max(axis=0))} mm",
            path=volumes[metric].source,
            fix="Give a map of this subject in the space of its tractograms (e.g. its fit-dti maps)",
        )


def _box(low, high) -> str:
    return " × ".join(f"[{a:.0f}, {b:.0f}]" for a, b in zip(low, high))
