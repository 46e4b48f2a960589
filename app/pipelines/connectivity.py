"""Use cases: connectivity matrices, along-tract profiles and distance to a lesion.

The GUI (connectivity and presurgical panels), the command line (``tractlens connectome``,
``tractlens profile``) and scripts call these; the arithmetic is in :mod:`gpu.connectivity`
and :mod:`gpu.tractometry`.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.connectivity import (
    DEFAULT_RADIUS_MM,
    Connectome,
    assign_endpoints,
    connectome,
    streamline_lengths_mm,
)
from tractlens.gpu.engines import decide_device
from tractlens.gpu.tractometry import Profile, RegionDistance, profile, region_distance

from ..errors import InputError
from ..io._atomic import write_text_atomic
from ..io.lut import LabelTable
from ..model import Tractogram, Volume
from ..params import WEIGHTS, ConnectomeParams, LesionDistanceParams, ProfileParams

CM_SCALAR, COMMIT_SCALAR = "cm", "commit_weight"
DISTANCE_POINT_SCALAR = "lesion_dist_mm"  # per point: distance to the lesion
DISTANCE_STREAMLINE_SCALAR = (
    "min_lesion_dist_mm"  # .trk names: 20 characters at most  # per streamline: its closest approach
)
DEFAULT_MARGIN_MM = LesionDistanceParams.margin_mm


@dataclass
class ConnectivityMatrix:
    """A matrix for the heat map and the CSV: ``values`` (rows × columns) of ``measure``, with
    ``counts`` (streamlines per cell, for the log scale and the tooltips) and names.

    ``connectome`` is set for a tractogram's matrix (square, symmetric, rows = columns = the
    parcellation's regions; its ``edge_streamlines(i, j)`` selects a cell's streamlines);
    None for a probabilistic run's seed × target counts, whose streamlines are not kept."""

    values: np.ndarray
    counts: np.ndarray
    row_names: list[str]
    column_names: list[str]
    measure: str
    connectome: Connectome | None = None
    provenance: dict = field(default_factory=dict)

    @property
    def symmetric(self) -> bool:
        return self.connectome is not None

    def cell_streamlines(self, row: int, column: int) -> np.ndarray | None:
        """Bool per streamline of the cell's connection (None: a matrix without streamlines)."""
        if self.connectome is None:
            return None
        return self.connectome.edge_streamlines(row, column)


def streamline_weights(tractogram: Tractogram, weight: str, weights: np.ndarray | None = None) -> np.ndarray | None:
    """The per-streamline value a ``weight`` averages (None for ``count``)."""
    if weight not in WEIGHTS:
        raise InputError(f"unknown weight {weight!r}", fix=f"Use one of {', '.join(WEIGHTS)}")
    if weight == "count":
        return None
    if weight == "length":
        return streamline_lengths_mm(tractogram.points, tractogram.offsets, tractogram.affine[:3, :3])
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(weights) != len(tractogram):
            raise InputError(
                f"{len(weights)} streamline weights for {len(tractogram)} streamlines",
                fix="Give the weights file written for this very tractogram (one value per streamline, in order)",
            )
        return weights
    key = CM_SCALAR if weight == "cm" else COMMIT_SCALAR
    values = tractogram.streamline_scalars.get(key)
    if values is None:
        where = (
            "geodesic tracking stores it (in .trk or .trx files)"
            if weight == "cm"
            else "COMMIT's tractogram_filtered keeps it (.trk or .trx), or give --streamline-weights "
            "streamline_weights.txt"
        )
        raise InputError(f"the tractogram has no per-streamline {key!r} for --weight {weight}", fix=where,
                         path=tractogram.source or None)  # fmt: skip
    return np.asarray(values, dtype=np.float64).reshape(len(tractogram), -1)[:, 0]


def label_nodes(labels: np.ndarray, path: str | None = None) -> np.ndarray:
    """The regions of a parcellation: its non-zero label values, ascending (``path`` names its
    file in the error when there is none)."""
    nodes = np.unique(np.asarray(labels))
    nodes = nodes[nodes > 0]
    if len(nodes) == 0:
        raise InputError("the label volume has no region (every voxel is 0)", fix="Give a parcellation", path=path)
    return nodes.astype(np.int64)


def compute_connectome(
    tractogram: Tractogram,
    labels: Volume,
    *,
    weight: str = ConnectomeParams.weight,
    lut: LabelTable | None = None,
    radius_mm: float = DEFAULT_RADIUS_MM,
    weights: np.ndarray | None = None,
    device: str = "auto",
    progress=None,
    cancelled=None,
) -> ConnectivityMatrix:
    """The region × region matrix of ``tractogram`` over the parcellation ``labels``.

    Each streamline end takes the label of the nearest labelled voxel within ``radius_mm``
    (MRtrix's radial search; an end inside a labelled voxel always takes it); a streamline with
    both ends assigned adds to the symmetric cell of their two regions. The use case behind
    ``tractlens connectome`` and the window's Connectivity panel.

    Parameters
    ----------
    tractogram : Tractogram
        The streamlines (any grid: they are mapped onto the labels' through the affines).
    labels : Volume
        An integer parcellation (0 = unlabelled), e.g. ``aparc+aseg`` or an atlas on the
        subject.
    weight : {"count", "length", "cm", "commit"}
        What a cell holds: the streamline count, or the mean length (mm), connectivity measure
        (geodesic tracking) or COMMIT weight of its streamlines.
    lut : LabelTable, optional
        Region names (FreeSurfer/MRtrix colour table or BIDS ``dseg.tsv``); ``label_N`` without.
    radius_mm : float
        Search radius of the end assignment, in mm; 0 takes end voxels only.
    weights : numpy.ndarray, optional
        (S,) per-streamline weights for ``weight="commit"`` (COMMIT's
        ``streamline_weights.txt``), instead of the ``commit_weight`` scalar.
    device : {"auto", "cpu", "gpu"}
        Where the end assignment runs.
    progress, cancelled : callable, optional
        ``progress(done, total)`` and a cancellation check.

    Returns
    -------
    ConnectivityMatrix
        ``values`` (R, R) of ``measure``, ``counts`` (R, R) streamlines per cell, ``row_names``
        = ``column_names`` (the regions present), ``connectome`` (to select a cell's
        streamlines) and the ``provenance``.

    Raises
    ------
    InputError
        An empty tractogram, one wholly outside the labels, a negative or non-finite radius, a
        weight the tractogram lacks.

    References
    ----------
    .. [1] Tournier JD et al. MRtrix3: a fast, flexible and open software framework for medical
       image processing and visualisation. NeuroImage 202:116137 (2019): ``tck2connectome``'s
       radial search.
    .. [2] Hagmann P et al. Mapping the structural core of human cerebral cortex. PLoS Biol
       6:e159 (2008).

    Examples
    --------
    The demo's ground-truth bundles over its parcellation, whose regions 2k−1 and 2k are the two
    ends of bundle k:

    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_tractogram, load_volume
    >>> from tractlens.app.io.lut import load_lut
    >>> from tractlens.app.pipelines.connectivity import compute_connectome
    >>> tract = load_tractogram(demo_path() / "bundles.trk")
    >>> labels = load_volume(demo_path() / "parcellation.nii.gz", kind="labels")
    >>> matrix = compute_connectome(tract, labels, lut=load_lut(demo_path() / "parcellation.txt"), device="cpu")
    >>> matrix.row_names[:2]
    ['crossing_lr_start', 'crossing_lr_end']
    >>> int(matrix.values[0, 1]), int(matrix.values[0, 2])  # streamlines joining the regions
    (13, 0)
    """
    if len(tractogram) == 0:
        raise InputError("the tractogram has no streamlines", fix="Track first, or load another tractogram")
    if not np.isfinite(radius_mm) or radius_mm < 0:
        raise InputError(f"the search radius must be >= 0 mm, not {radius_mm}")
    if not tractogram.meets(labels.affine, labels.data.shape):
        raise InputError(
            "the tractogram lies wholly outside the labels image (none of its points is inside it): they are not in "
            "the same space",
            path=labels.source or None,
            fix="Give labels on the tractogram's subject and space (apply-transform brings one across)",
        )
    values = streamline_weights(tractogram, weight, weights)
    nodes = label_nodes(labels.data, labels.source or None)
    ends, end_offsets = tractogram.ends_on(labels.affine)  # only the ends are assigned: not every point converted
    choice = decide_device("connectome", len(tractogram), requested=device)
    device = choice.argument
    assignment = assign_endpoints(
        ends,
        end_offsets,
        np.asarray(labels.data, dtype=np.int32),
        labels.affine[:3, :3],
        radius_mm=radius_mm,
        device=device,
        progress=progress,
        cancelled=cancelled,
    )
    result = connectome(assignment, nodes, values)
    names = [lut.name(n) if lut is not None else f"label_{n}" for n in nodes]
    matrix = result.counts.astype(np.float64) if weight == "count" else result.mean
    provenance = {
        **result.provenance,
        "device_choice": choice.reason,
        "weight": weight,
        "streamlines": len(tractogram),
        "assigned": result.assigned,
        "regions": len(nodes),
        "labels": labels.source or labels.name,
        "lut": lut.source if lut is not None else None,
    }
    return ConnectivityMatrix(matrix, result.counts, names, names, weight, result, provenance)


def seed_target_matrix(
    seeds: np.ndarray,
    seed_targets: np.ndarray,
    target_names: Sequence[str],
    *,
    labels: Volume | None = None,
    lut: LabelTable | None = None,
) -> ConnectivityMatrix:
    """A probabilistic run's counts (seed voxels × targets) as regions × targets.

    ``seeds`` (N, 3) seed voxel indices on the run's grid, ``seed_targets`` (N, T) counts.
    With a parcellation on that grid, rows are its regions (the seed voxels in each summed,
    seeds outside every region in a row ``unlabelled``); without one, a single row: the seed."""
    seed_targets = np.asarray(seed_targets, dtype=np.int64)
    if seed_targets.ndim != 2 or len(seed_targets) != len(seeds):
        raise ValueError("one row of target counts per seed voxel is needed")
    if labels is None:
        rows, names = seed_targets.sum(axis=0, keepdims=True), ["seed"]
    else:
        seed_labels = np.asarray(labels.data)[tuple(np.asarray(seeds, dtype=np.int64).T)].astype(np.int64)
        nodes = np.unique(seed_labels)
        index = np.searchsorted(nodes, seed_labels)
        rows = np.zeros((len(nodes), seed_targets.shape[1]), dtype=np.int64)
        np.add.at(rows, index, seed_targets)
        names = [("unlabelled" if n == 0 else (lut.name(n) if lut else f"label_{n}")) for n in nodes]
    provenance = {"measure": "count", "seed_voxels": len(seeds), "targets": list(target_names)}
    return ConnectivityMatrix(rows.astype(np.float64), rows, names, list(target_names), "count", None, provenance)


def matrix_csv_text(matrix: ConnectivityMatrix) -> str:
    """The matrix as CSV: a header row of column names, then one row per region, its name first.

    Read it back with ``pandas.read_csv(path, index_col=0)`` or
    ``numpy.loadtxt(path, delimiter=",", skiprows=1, usecols=range(1, n + 1))``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["region", *matrix.column_names])
    integral = matrix.measure == "count"
    for name, row in zip(matrix.row_names, matrix.values):
        writer.writerow([name, *(str(int(v)) if integral else f"{v:.6g}" for v in row)])
    return out.getvalue()


def write_matrix_csv(matrix: ConnectivityMatrix, path: str | os.PathLike) -> Path:
    return write_text_atomic(matrix_csv_text(matrix), path)


# ------------------------------------------------------------------ along-tract profiles


def compute_profile(
    tractogram: Tractogram,
    scalar_map: Volume,
    n_points: int = ProfileParams.n_points,
    *,
    weighting: str = ProfileParams.weighting,
    device: str = "auto",
) -> Profile:
    """Along-tract profile of a 3-D map over a bundle, the bundle resampled to ``n_points``, its
    streamlines averaged with ``weighting`` (see :class:`~tractlens.gpu.tractometry.ProfileParams`)."""
    if len(tractogram) == 0:
        raise InputError("the bundle has no streamlines", fix="Select or load the bundle first")
    if n_points < 2:
        raise InputError(f"a profile needs at least 2 points, not {n_points}")
    data = np.asarray(scalar_map.data)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise InputError(
            f"the map must be a 3-D scalar image (FA, MD, ...), this one has shape {data.shape}",
            path=scalar_map.source or None,
        )
    empty = np.diff(tractogram.offsets) == 0
    if empty.any():
        tractogram = tractogram.subset(~empty)
    points = tractogram.points_on(scalar_map.affine)
    choice = decide_device("profile", len(points), requested=device)
    result = profile(
        points,
        tractogram.offsets,
        data,
        n_points,
        linear=scalar_map.affine[:3, :3],
        weighting=weighting,
        device=choice.argument,
    )
    result.provenance["device_choice"] = choice.reason
    if not np.isfinite(result.mean).any():
        raise InputError(
            "the bundle lies outside the map (no sample inside it)",
            path=scalar_map.source or None,
            fix="Use a map on the tractogram's space",
        )
    result.provenance.update(
        map=scalar_map.source or scalar_map.name, streamlines=len(tractogram), flipped=int(result.flipped.sum())
    )
    return result


def profile_csv_text(result: Profile, affine: np.ndarray, map_name: str = "value") -> str:
    """Columns: point (0..K-1), position (0..1 along the bundle), mean, sd, n and the bundle's
    mean course in RAS mm (x_mm, y_mm, z_mm)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["point", "position", f"{map_name}_mean", f"{map_name}_sd", "n", "x_mm", "y_mm", "z_mm"])
    course = result.course @ affine[:3, :3].T + affine[:3, 3]
    k = len(result.mean)
    for i in range(k):
        writer.writerow(
            [
                i,
                f"{i / (k - 1):.6g}",
                f"{result.mean[i]:.6g}",
                f"{result.sd[i]:.6g}",
                int(result.n[i]),
                *(f"{v:.3f}" for v in course[i]),
            ]
        )
    return out.getvalue()


# ------------------------------------------------------------------ distance to a lesion


LESION_KINDS = ("roi", "labels")  # offered as lesions; a scalar map only when asked for, with a threshold


def is_marked_lesion(layer) -> bool:
    """A layer the user marked as the lesion: an ROI in the role ``lesion``, or a layer named so."""
    if layer.kind == "roi" and layer.data.role == "lesion":
        return True
    return layer.kind in (*LESION_KINDS, "scalar") and "lesion" in layer.name.lower()


def lesion_choices(layers, *, scalar_maps: bool = False) -> list:
    """The layers a lesion may be chosen from: ROIs and label maps, scalar maps (FA, MD…, whose
    non-zero voxels are the whole brain) only when ``scalar_maps`` (they are then thresholded)."""
    kinds = (*LESION_KINDS, "scalar") if scalar_maps else LESION_KINDS
    return [layer for layer in layers if layer.kind in kinds or (layer.kind == "scalar" and is_marked_lesion(layer))]


def default_lesion(layers):
    """The lesion chosen without asking: the newest layer marked as lesion (:func:`is_marked_lesion`),
    else None: never the newest ROI or map, which may be a seed or FA."""
    marked = [layer for layer in layers if is_marked_lesion(layer)]
    return marked[-1] if marked else None


def lesion_mask_of(layer, threshold: float | None = None) -> np.ndarray:
    """The lesion as a bool mask: an ROI's voxels, a label map's non-zero voxels, or a scalar
    map's voxels at or above ``threshold`` (its finite non-zero voxels without one)."""
    if layer.kind == "roi":
        return np.asarray(layer.data.mask, dtype=bool)
    data = np.asarray(layer.data.data)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    finite = np.isfinite(data)
    if layer.kind == "scalar" and threshold is not None:
        return finite & (data >= threshold)
    return finite & (data != 0)


LESION_DISTANCE_MAP = "lesion_distance_mm"  # the DerivedCache kind


def lesion_distance_map(document, layer, threshold: float | None = None) -> np.ndarray:
    """Distance (mm) from every voxel of the lesion layer's grid to the nearest lesion voxel
    centre (0 inside; Euclidean distance transform with the voxel sizes), computed once per
    lesion mask in ``document.derived`` (an ROI edited in place is measured again)."""
    from scipy import ndimage

    if layer.kind == "roi":  # edited in place: the mask's content is the key
        key = ("roi", hash(np.packbits(layer.data.mask).tobytes()))
    else:  # volumes are replaced, never edited in place
        key = ("volume", id(layer.data.data), threshold)

    def compute() -> np.ndarray:
        mask = lesion_mask_of(layer, threshold)
        if not mask.any():
            return np.full(mask.shape, np.inf, dtype=np.float32)
        sizes = np.linalg.norm(np.asarray(layer.data.affine, dtype=np.float64)[:3, :3], axis=0)
        return ndimage.distance_transform_edt(~mask, sampling=sizes).astype(np.float32)

    return document.derived.get(layer.data, LESION_DISTANCE_MAP, key, compute)


def distance_to_lesion_mm(document, layer, world_mm, threshold: float | None = None) -> float | None:
    """Distance (mm) from a RAS point to the lesion (nearest voxel of its grid); None outside
    the lesion's grid or for an empty lesion."""
    distances = lesion_distance_map(document, layer, threshold)
    affine = np.asarray(layer.data.affine, dtype=np.float64)
    ijk = np.rint(np.linalg.solve(affine, np.append(np.asarray(world_mm, dtype=np.float64), 1.0))[:3]).astype(int)
    if np.any(ijk < 0) or np.any(ijk >= distances.shape[:3]):
        return None
    value = float(distances[tuple(ijk)])
    return value if np.isfinite(value) else None


def compute_lesion_distance(
    tractogram: Tractogram,
    lesion: np.ndarray,
    lesion_affine: np.ndarray,
    *,
    device: str = "auto",
    progress=None,
    cancelled=None,
) -> RegionDistance:
    """Per point and per streamline distance (mm) of ``tractogram`` to a lesion mask.

    The presurgical measurement behind ``tractlens distance`` and the window's Presurgical panel:
    the distance from each point to the nearest lesion voxel (each voxel taken as the ellipsoid
    inscribed in it; 0 inside), each segment sampled every quarter voxel, and each streamline's
    closest approach.

    Parameters
    ----------
    tractogram : Tractogram
        The streamlines (mapped onto the lesion's grid through the affines).
    lesion : numpy.ndarray
        (X, Y, Z) mask of the lesion, non-zero inside.
    lesion_affine : numpy.ndarray
        (4, 4) voxel → RAS+ mm affine of ``lesion``.
    device : {"auto", "cpu", "gpu"}
        Where the distances are computed.
    progress, cancelled : callable, optional
        ``progress(done, total)`` and a cancellation check.

    Returns
    -------
    RegionDistance
        ``per_point`` (P,) and ``per_streamline`` (S,) distances in mm, and the ``provenance``.
        :func:`distance_rows` turns them into the table's rows for a margin.

    Raises
    ------
    InputError
        A lesion mask that is not 3-D, or empty.

    References
    ----------
    .. [1] Nimsky C et al. Preoperative and intraoperative diffusion tensor imaging-based fiber
       tracking in glioma surgery. Neurosurgery 56:130-138 (2005).

    Examples
    --------
    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_tractogram, load_volume
    >>> from tractlens.app.pipelines.connectivity import compute_lesion_distance
    >>> tract = load_tractogram(demo_path() / "bundles.trk")
    >>> lesion = load_volume(demo_path() / "lesion.nii.gz")
    >>> distance = compute_lesion_distance(tract, lesion.data != 0, lesion.affine, device="cpu")
    >>> distance.per_point.shape == (len(tract.points),)
    True
    >>> round(float(distance.per_streamline.min()), 1), int((distance.per_streamline < 5).sum())  # mm; within 5 mm
    (2.2, 4)
    """
    lesion = np.asarray(lesion, dtype=bool)
    if lesion.ndim != 3:
        raise InputError("the lesion mask must be 3-D")
    if not lesion.any():
        raise InputError("the lesion mask is empty", fix="Draw or load the lesion first")
    points = tractogram.points_on(lesion_affine)
    choice = decide_device("distance", len(points), requested=device)
    distance = region_distance(
        points,
        tractogram.offsets,
        lesion,
        lesion_affine[:3, :3],
        device=choice.argument,
        progress=progress,
        cancelled=cancelled,
    )
    distance.provenance["device_choice"] = choice.reason
    return distance


def with_distances(tractogram: Tractogram, distance: RegionDistance) -> Tractogram:
    """A copy of the tractogram (arrays shared) carrying the distances as scalars to colour by."""
    return Tractogram(
        tractogram.points,
        tractogram.offsets,
        tractogram.affine,
        tractogram.dimensions,
        {**tractogram.point_scalars, DISTANCE_POINT_SCALAR: distance.per_point.astype(np.float32)},
        {**tractogram.streamline_scalars, DISTANCE_STREAMLINE_SCALAR: distance.per_streamline.astype(np.float32)},
        name=tractogram.name,
        source=tractogram.source,
    )


@dataclass
class DistanceRow:
    """One line of the presurgical distance table."""

    name: str
    streamlines: int
    min_mm: float
    within_margin: int
    shown: str = ""  # what the views show of the tractogram ("0 of 92 shown (selection by ROI target)")

    @property
    def closest_text(self) -> str:
        """The closest approach in words: never "inf" (no streamline in the row)."""
        return f"{self.min_mm:.1f}" if np.isfinite(self.min_mm) else "none (no streamline)"

    @property
    def percent_within(self) -> float:
        return 100.0 * self.within_margin / self.streamlines if self.streamlines else 0.0

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "streamlines": self.streamlines,
            "min_mm": self.min_mm,
            "within_margin": self.within_margin,
            "percent_within": self.percent_within,
            "shown": self.shown,
        }


def distance_row(name: str, per_streamline: np.ndarray, margin_mm: float) -> DistanceRow:
    per_streamline = np.asarray(per_streamline, dtype=np.float64)
    closest = float(per_streamline.min()) if len(per_streamline) else float("inf")
    return DistanceRow(name, len(per_streamline), closest, int((per_streamline <= margin_mm).sum()))


def distance_rows(
    name: str,
    per_streamline: np.ndarray,
    margin_mm: float,
    selection: np.ndarray | None = None,
    selection_by: str | None = None,
) -> list[DistanceRow]:
    """The table's rows for one tractogram: every streamline, and with a selection (ROIs, a
    connectivity cell) a row ``"<name> (selected)"`` over the shown ones; both say how many are
    shown, so no count silently includes fibres the user cannot see."""
    per_streamline = np.asarray(per_streamline, dtype=np.float64)
    total = len(per_streamline)
    row = distance_row(name, per_streamline, margin_mm)
    if selection is not None and len(selection) == total:
        selection = np.asarray(selection, dtype=bool)
    if selection is None or len(selection) != total or selection.all():  # nothing hidden: one row
        row.shown = f"all {total:,} shown"
        return [row]
    shown = f"{int(selection.sum()):,} of {total:,} shown (selection by {selection_by or 'a selection'})"
    row.shown = f"all streamlines ({int(selection.sum()):,} of {total:,} shown)"
    selected = distance_row(f"{name} (selected)", per_streamline[selection], margin_mm)
    selected.shown = shown
    return [row, selected]
