"""Tract and ROI statistics: the numbers a clinician reads off a bundle or a region.

For a tractogram (its shown streamlines only, see :func:`~tractlens.app.selection.shown_mask`):
streamlines shown and in total, length mean ± sd (mm, summed segment lengths), the volume of
the voxels its points visit (mm³, on the tractogram's grid), and the mean ± sd of every open
scalar map sampled at its points (nearest voxel or trilinear). For an ROI: its voxel count,
volume (mm³) and the mean ± sd of every scalar map inside it. The pure functions take arrays
and volumes; :func:`layer_statistics` is the use case over a document's layer (the
statistics panel, the report), :func:`file_statistics` the one over files (``tractlens stats``).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field

import numpy as np

from tractlens.gpu.backend import Cancelled
from tractlens.gpu.connectivity import streamline_lengths_mm
from tractlens.gpu.host import host_threads, run_in_order
from tractlens.gpu.select_host import point_blocks

from .errors import InputError
from .grid import Grid
from .model import Tractogram, Volume
from .params import StatisticsParams
from .selection import shown_mask, shown_of
from .tractogram import on_grid


@dataclass
class Quantity:
    """One line of a statistics table: a value (a mean with its sd) or None when there is none."""

    name: str
    value: float | None
    unit: str = ""
    sd: float | None = None

    @property
    def text(self) -> str:
        """The value in words: ``"42.1 ± 3.0 mm"``, ``"none"`` (never "nan" or "inf")."""
        if self.value is None:
            return "none"
        exact = float(self.value).is_integer() and self.sd is None
        number = f"{self.value:,.0f}" if exact or abs(self.value) >= 1000 else f"{self.value:.4g}"
        sd = f" ± {self.sd:.3g}" if self.sd is not None else ""
        return f"{number}{sd} {self.unit}".strip()


@dataclass
class StatisticsTable:
    """The statistics of one tractogram or ROI (``subject``), line by line."""

    subject: str
    kind: str  # "tractogram" or "roi"
    quantities: list[Quantity] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict:
        return {
            "subject": self.subject,
            "kind": self.kind,
            "note": self.note,
            "quantities": [{"name": q.name, "value": q.value, "sd": q.sd, "unit": q.unit} for q in self.quantities],
        }


def _finite_or_none(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _mean_sd(name: str, values: np.ndarray, unit: str = "") -> Quantity:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Quantity(f"{name} mean", None, unit)
    return Quantity(f"{name} mean", float(values.mean()), unit, float(values.std(ddof=1)) if values.size > 1 else 0.0)


def map_unit(map_name: str) -> str:
    """The unit of a scalar map by its name (``MD``, ``dti_AD``: mm²/s; FA and others: none)."""
    from .pipelines.dti import MAP_UNITS

    return MAP_UNITS.get(map_name) or MAP_UNITS.get(map_name.rsplit("_", 1)[-1], "")


def _map_data(volume: Volume) -> np.ndarray:
    data = np.asarray(volume.data)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise InputError(f"{volume.name} is not a 3-D scalar map (shape {data.shape})", path=volume.source or None)
    return data


def sample_map(volume: Volume, points_ijk: np.ndarray, sampling: str = "nearest") -> np.ndarray:
    """A scalar map's values at points given in its voxel coordinates (NaN outside it)."""
    data = _map_data(volume)
    points = np.asarray(points_ijk, dtype=np.float64).reshape(-1, 3)
    inside = np.all((points >= -0.5) & (points <= np.array(data.shape) - 0.5), axis=1)
    out = np.full(len(points), np.nan)
    if sampling == "trilinear":
        from scipy import ndimage

        out[inside] = ndimage.map_coordinates(data.astype(np.float64), points[inside].T, order=1, mode="nearest")
    else:
        index = np.clip(np.rint(points[inside]).astype(np.int64), 0, np.array(data.shape) - 1)
        out[inside] = data[tuple(index.T)]
    return out


#: Points read at a time for a tractogram's statistics, per host thread: a whole-brain
#: tractogram measured in bounded memory, block by block, rather than as whole float64 and int64
#: copies of its points (~50 GB at 10 M streamlines). A block's temporaries are ~60 bytes a
#: point: 2^21 points made ~2 GB at once on 16 cores, which the allocator then kept (measured as
#: +4 GB resident in the window after a whole-brain selection's statistics); 2^19 is a quarter.
BLOCK_POINTS = 1 << 19


def tract_statistics(
    tractogram: Tractogram,
    shown: np.ndarray | None = None,
    maps: dict[str, Volume] | None = None,
    *,
    name: str = "",
    params: StatisticsParams | None = None,
    by: str | None = None,
    progress=None,
    cancelled=None,
) -> StatisticsTable:
    """Statistics of a tractogram's shown streamlines (``shown``: bool per streamline; None: all),
    read :data:`BLOCK_POINTS` points at a time (a memory-mapped file's points are never made whole).
    ``progress(done, total)`` after each block; ``cancelled()`` true stops it
    (:class:`~tractlens.gpu.backend.Cancelled`)."""
    params = params or StatisticsParams()
    total = len(tractogram)
    shown = np.ones(total, dtype=bool) if shown is None else np.asarray(shown, dtype=bool)
    count = int(shown.sum())
    table = StatisticsTable(name or tractogram.name, "tractogram")
    table.quantities.append(Quantity("streamlines shown", float(count)))
    table.quantities.append(Quantity("streamlines in total", float(total)))
    if count < total:
        table.note = (
            f"{count:,} of {total:,} streamlines shown (selection by {by or 'a selection'}): statistics of those"
        )
    lengths, visited, along = _shown_measures(tractogram, shown, maps or {}, params, progress, cancelled)
    table.quantities.append(_mean_sd("length", lengths, "mm"))
    voxel_mm3 = abs(float(np.linalg.det(tractogram.affine[:3, :3])))
    table.quantities.append(Quantity("volume of voxels visited", visited * voxel_mm3 if visited else None, "mm³"))
    for map_name, (n, mean, m2) in along.items():
        table.quantities.append(_mean_sd_of(f"{map_name} along", n, mean, m2, map_unit(map_name)))
    return table


def _shown_measures(tractogram: Tractogram, shown, maps, params, progress, cancelled):
    """(length in mm of each shown streamline, voxels of the tractogram's grid its points visit,
    per map (count, mean, sum of squared deviations) of its finite values at them), block by
    block of consecutive streamlines on the host's threads (at most one block each at a time),
    combined in block order: the same values whatever the thread count."""
    offsets = np.asarray(tractogram.offsets, dtype=np.int64)
    linear = np.asarray(tractogram.affine[:3, :3], dtype=np.float64)
    dims = np.asarray(tractogram.dimensions, dtype=np.int64)
    grid = np.zeros(tuple(dims + 2), dtype=bool)  # one voxel of margin: rint of a point within half a voxel
    to_map = {k: np.linalg.solve(v.affine, tractogram.affine) for k, v in maps.items()}

    def block(a: int, b: int):
        def measure():
            keep = shown[a:b]
            if not keep.any():
                return np.zeros(0), None, {}
            if keep.all():
                p0 = int(offsets[a])
                points = tractogram.points_rows(p0, int(offsets[b]))
                local = offsets[a : b + 1] - p0
            else:  # the shown streamlines' points only (a selection: a tenth of a whole brain's)
                counts = np.diff(offsets[a : b + 1])[keep]
                local = np.zeros(len(counts) + 1, dtype=np.int64)
                np.cumsum(counts, out=local[1:])
                starts = offsets[a:b][keep]
                points = tractogram.points_take(np.repeat(starts - local[:-1], counts) + np.arange(local[-1]))
            block_lengths = streamline_lengths_mm(points, local, linear)
            voxel = np.rint(points).astype(np.int32)  # (a grid's indices fit: half of int64's memory)
            voxel += 1
            inside = np.all((voxel >= 0) & (voxel < dims + 2), axis=1)
            grid[tuple(voxel[inside].T)] = True  # (threads only ever set: no lost update matters)
            beyond = None if inside.all() else np.unique(voxel[~inside], axis=0)
            values = {}
            for key, volume in maps.items():
                sampled = sample_map(volume, on_grid(points, to_map[key], np.float64), params.sampling)
                values[key] = _combined((0, 0.0, 0.0), sampled[np.isfinite(sampled)])
            return block_lengths, beyond, values

        return measure

    blocks = [] if not shown.any() else point_blocks(offsets, BLOCK_POINTS)
    lengths, beyond = [], []
    along = {k: (0, 0.0, 0.0) for k in maps}
    for done, (block_lengths, outside, values) in enumerate(
        run_in_order((block(a, b) for a, b in blocks), host_threads())
    ):
        if cancelled is not None and cancelled():
            raise Cancelled()
        lengths.append(block_lengths)
        if outside is not None:
            beyond.append(outside)
        for key, summary in values.items():
            along[key] = _merged(along[key], summary)
        if progress is not None:
            progress(done + 1, len(blocks))
    visited = int(grid.sum()) + (len(np.unique(np.concatenate(beyond), axis=0)) if beyond else 0)
    return (np.concatenate(lengths) if lengths else np.zeros(0)), visited, along


def _combined(acc: tuple[int, float, float], values: np.ndarray) -> tuple[int, float, float]:
    """(count, mean, sum of squared deviations) of what ``acc`` summarised and ``values`` together."""
    if len(values) == 0:
        return acc
    mean = float(values.mean())
    return _merged(acc, (len(values), mean, float(((values - mean) ** 2).sum())))


def _merged(a: tuple[int, float, float], b: tuple[int, float, float]) -> tuple[int, float, float]:
    """Two (count, mean, sum of squared deviations) summaries as one (Chan et al.'s pairwise
    update: no loss of the mean in a running sum of squares)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    if n_b == 0:
        return a
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n


def _mean_sd_of(name: str, n: int, mean: float, m2: float, unit: str = "") -> Quantity:
    """:func:`_mean_sd` from a (count, mean, sum of squared deviations) summary."""
    if n == 0:
        return Quantity(f"{name} mean", None, unit)
    return Quantity(f"{name} mean", mean, unit, float(np.sqrt(m2 / (n - 1))) if n > 1 else 0.0)


def roi_statistics(
    mask: np.ndarray, affine: np.ndarray, maps: dict[str, Volume] | None = None, *, name: str = "ROI"
) -> StatisticsTable:
    """Statistics of a region: voxels, volume (mm³) and every map's mean ± sd inside it (each
    ROI voxel centre looked up in the map, nearest voxel)."""
    mask = np.asarray(mask, dtype=bool)
    affine = np.asarray(affine, dtype=np.float64)
    voxels = np.argwhere(mask)
    table = StatisticsTable(name, "roi")
    table.quantities.append(Quantity("voxels", float(len(voxels))))
    table.quantities.append(Quantity("volume", len(voxels) * abs(float(np.linalg.det(affine[:3, :3]))), "mm³"))
    if not len(voxels):
        table.note = "the ROI is empty"
    world = voxels @ affine[:3, :3].T + affine[:3, 3]
    for map_name, volume in (maps or {}).items():
        ijk = (world - volume.affine[:3, 3]) @ np.linalg.inv(volume.affine[:3, :3]).T if len(world) else world
        table.quantities.append(_mean_sd(f"{map_name} inside", sample_map(volume, ijk), map_unit(map_name)))
    return table


def open_scalar_maps(document) -> dict[str, Volume]:
    """Every 3-D scalar map open in the document (FA, MD…), by layer name."""
    out = {}
    for layer in document.layers:
        if layer.kind == "scalar":
            data = np.asarray(layer.data.data)
            if data.ndim == 3 or (data.ndim == 4 and data.shape[3] == 1):
                out[layer.name] = layer.data
    return out


def layer_statistics(
    document, layer, params: StatisticsParams | None = None, *, progress=None, cancelled=None
) -> StatisticsTable:
    """The statistics of a tractogram layer (its shown streamlines) or an ROI layer, with every
    open scalar map (a tractogram's with ``progress`` and ``cancelled``: :func:`tract_statistics`)."""

    maps = open_scalar_maps(document)
    if layer.kind == "tractogram":
        return tract_statistics(
            layer.data,
            shown_mask(layer),
            maps,
            name=layer.name,
            params=params,
            by=shown_of(layer).by,
            progress=progress,
            cancelled=cancelled,
        )
    if layer.kind == "roi":
        return roi_statistics(layer.data.mask, layer.data.affine, maps, name=layer.name)
    raise InputError(f"{layer.name} is a {layer.kind} layer: statistics are of a tractogram or an ROI")


def statistics_csv_text(tables: list[StatisticsTable]) -> str:
    """One row per quantity: ``subject, kind, quantity, value, sd, unit`` (empty cells: none)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["subject", "kind", "quantity", "value", "sd", "unit"])
    for table in tables:
        for q in table.quantities:
            cells = ("" if v is None else f"{v:.6g}" for v in (q.value, q.sd))
            writer.writerow([table.subject, table.kind, q.name, *cells, q.unit])
    return out.getvalue()


def statistics_json_text(tables: list[StatisticsTable]) -> str:
    return json.dumps([table.as_dict() for table in tables], indent=2)


def _roi_meets(mask: np.ndarray, affine: np.ndarray, volume: Volume) -> bool:
    """Whether any voxel centre of the ROI lies inside the map's grid."""
    ijk = np.argwhere(np.asarray(mask))
    if not len(ijk):
        return False
    ijk = ijk[:: max(1, len(ijk) // 100_000)]
    grid = Grid(volume.affine, volume.data.shape[:3])
    return bool(grid.contains(grid.to_voxels(Grid(affine, np.asarray(mask).shape[:3]).to_mm(ijk))).any())


def file_statistics(
    tractogram: Tractogram | None,
    roi: tuple[str, np.ndarray, np.ndarray] | None,
    maps: dict[str, Volume],
    params: StatisticsParams | None = None,
) -> list[StatisticsTable]:
    """``tractlens stats``: the tractogram's and the ROI's (name, mask, affine) tables."""
    if tractogram is None and roi is None:
        raise InputError("nothing to measure", fix="Give a tractogram, an --roi mask, or both")
    tables = []
    for name, volume in maps.items():  # a map of another space gives blank rows, not numbers: refused
        if tractogram is not None and len(tractogram) and not tractogram.meets(volume.affine, volume.data.shape):
            raise InputError(f"the tractogram lies wholly outside the map {name}: they are not in the same space",
                             path=volume.source or None, fix="Give maps on the tractogram's space")  # fmt: skip
        if roi is not None and not _roi_meets(roi[1], roi[2], volume):
            raise InputError(f"the ROI {roi[0]} lies wholly outside the map {name}: they are not in the same space",
                             path=volume.source or None, fix="Give maps on the ROI's space")  # fmt: skip
    if tractogram is not None:
        tables.append(tract_statistics(tractogram, None, maps, params=params))
    if roi is not None:
        tables.append(roi_statistics(roi[1], roi[2], maps, name=roi[0]))
    return tables
