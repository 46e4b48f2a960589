"""Structural connectivity: streamline endpoints to the nodes of a parcellation, and matrices.

Each end of a streamline is assigned the label of the nearest labelled voxel (distance
from the end point to the voxel's centre, in mm) within ``radius_mm``, as MRtrix's
``tck2connectome -assignment_radial_search`` does; an end that lands in a labelled voxel
takes that voxel's label whatever the radius (radius 0 assigns end voxels only). Ends with
no labelled voxel within the radius are unassigned (node -1) and the streamline is left out of the matrix.

The search visits integer voxel offsets in order of a lower bound on the distance they
can give (``|M o| - h``, ``h`` the largest distance from a point to the centre of the
voxel holding it), and drops an end once no remaining offset can come closer than the
best found, so ends inside or next to a labelled voxel are settled after the first
shell. Everything is array operations on ``xp`` (NumPy or CuPy), one code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .backend import Backend, get_backend, iter_batched
from .indices import flatnonzero
from .params import meta


@dataclass(frozen=True)
class EndpointParams:
    """How streamline ends find their region."""

    radius_mm: float = field(
        default=4.0,  # MRtrix tck2connectome's default radial search
        metadata=meta(
            "Search radius",
            "search this far from a streamline's end for a region (0: the end's voxel only)",
            "mm",
            (0.0, 50.0),
        ),
    )


DEFAULT_RADIUS_MM = EndpointParams.radius_mm
_CHUNK_OFFSETS = 32  # offsets tried at once per end (a shell, or a part of one)


def search_offsets(linear: np.ndarray, radius_mm: float) -> tuple[np.ndarray, np.ndarray]:
    """Integer voxel offsets whose centres may lie within ``radius_mm`` of a point, and the
    lower bound of that distance for each, sorted by the bound (then by the offset, so the
    order, and the choice between equally near voxels, is the same on every backend).

    ``linear``: the 3×3 part of the voxel → mm affine."""
    linear = np.asarray(linear, dtype=np.float64)
    half = 0.5 * np.abs(linear).sum(axis=1)  # |M (p - round p)| <= |M| · (0.5, 0.5, 0.5) per row
    h = float(np.linalg.norm(half))
    smallest = float(np.linalg.svd(linear, compute_uv=False).min())
    reach = int(np.ceil((radius_mm + h) / smallest))
    grid = np.arange(-reach, reach + 1)
    offsets = np.stack(np.meshgrid(grid, grid, grid, indexing="ij"), -1).reshape(-1, 3)
    bound = np.maximum(0.0, np.linalg.norm(offsets @ linear.T, axis=1) - h)
    keep = bound <= radius_mm
    offsets, bound = offsets[keep], bound[keep]
    order = np.lexsort((offsets[:, 2], offsets[:, 1], offsets[:, 0], bound))
    return offsets[order].astype(np.int64), bound[order]


def nearest_labels(xp, ends, labels, linear, radius_mm: float, offsets=None, bounds=None):
    """Label (0: none) and distance in mm of the nearest labelled voxel within ``radius_mm`` of
    each point. ``ends`` (E, 3) voxel coordinates on ``labels``' grid (float64 on ``xp``)."""
    if offsets is None:
        offsets, bounds = search_offsets(linear, radius_mm)
    n = len(ends)
    if n == 0:
        return xp.zeros(0, dtype=xp.int32), xp.zeros(0, dtype=xp.float64)
    shape = xp.asarray(labels.shape, dtype=xp.int64)
    lin = xp.asarray(np.asarray(linear, dtype=np.float64))
    base = xp.floor(ends + 0.5).astype(xp.int64)
    # an end in a labelled voxel takes that label whatever the radius (radius 0: end voxels only)
    own_inside = xp.all((base >= 0) & (base < shape), axis=1)
    own = xp.clip(base, 0, shape - 1)
    own_value = xp.where(own_inside, labels[own[:, 0], own[:, 1], own[:, 2]], 0).astype(xp.int32)
    own_diff = (base - ends).astype(xp.float64) @ lin.T
    labelled = own_value > 0
    best_label = own_value
    best_dist = xp.where(labelled, xp.sqrt((own_diff * own_diff).sum(axis=1)), np.inf)
    active = flatnonzero(xp, ~labelled)
    for start in range(0, len(offsets), _CHUNK_OFFSETS):
        if len(active) == 0:
            break
        # an end whose best is no farther than the next bound cannot improve any more
        still = best_dist[active] > bounds[start]
        active = active[still]
        if len(active) == 0:
            break
        chunk = xp.asarray(offsets[start : start + _CHUNK_OFFSETS])  # (C, 3)
        voxel = base[active][:, None, :] + chunk[None, :, :]  # (A, C, 3)
        inside = xp.all((voxel >= 0) & (voxel < shape), axis=2)
        clipped = xp.clip(voxel, 0, shape - 1)
        value = labels[clipped[..., 0], clipped[..., 1], clipped[..., 2]]
        diff = (voxel - ends[active][:, None, :]).astype(xp.float64) @ lin.T
        dist = xp.sqrt((diff * diff).sum(axis=2))
        dist = xp.where(inside & (value > 0) & (dist <= radius_mm), dist, np.inf)
        pick = xp.argmin(dist, axis=1)  # the first of equally near voxels, in the offsets' order
        rows = xp.arange(len(active))
        near = dist[rows, pick]
        better = near < best_dist[active]
        chosen = active[better]
        best_dist[chosen] = near[better]
        best_label[chosen] = value[rows, pick][better]
    return best_label, best_dist


@dataclass
class EndpointAssignment:
    """Per streamline: the labels of its two ends (0: none within the radius) and their distances in mm."""

    labels: np.ndarray  # (S, 2) int32
    distances: np.ndarray  # (S, 2) float64 (inf where unassigned)
    provenance: dict = field(default_factory=dict)


def assign_endpoints(
    points: np.ndarray,
    offsets: np.ndarray,
    labels: np.ndarray,
    linear: np.ndarray,
    *,
    radius_mm: float = DEFAULT_RADIUS_MM,
    device: str | Backend = "auto",
    progress=None,
    cancelled=None,
) -> EndpointAssignment:
    """Assign both ends of every streamline (``points`` in voxel coordinates of ``labels``' grid)."""
    backend = get_backend(device)
    xp = backend.xp
    if radius_mm < 0 or not np.isfinite(radius_mm):
        raise ValueError(f"the search radius must be a finite distance >= 0 mm, got {radius_mm}")
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    first = np.asarray(points[offsets[:-1][lengths > 0]], dtype=np.float64)
    last = np.asarray(points[offsets[1:][lengths > 0] - 1], dtype=np.float64)
    ends = np.stack([first, last], axis=1).reshape(-1, 3)
    search, bounds = search_offsets(linear, radius_mm)
    device_labels = backend.asarray(np.asarray(labels, dtype=np.int32))
    out_label = np.zeros((n, 2), dtype=np.int32)
    out_dist = np.full((n, 2), np.inf)
    rows = np.flatnonzero(lengths > 0)
    per_end = 8 * 3 * 8 * _CHUNK_OFFSETS  # the (A, C, 3) temporaries of one chunk

    def work(start, stop):
        lab, dist = nearest_labels(
            xp, backend.asarray(ends[start:stop]), device_labels, linear, radius_mm, search, bounds
        )
        return start, stop, backend.to_host(lab), backend.to_host(dist)

    flat_label = np.zeros(len(ends), dtype=np.int32)
    flat_dist = np.full(len(ends), np.inf)
    for start, stop, lab, dist in iter_batched(
        backend, len(ends), per_end, work, progress=progress, cancelled=cancelled, maximum=4_000_000
    ):
        flat_label[start:stop], flat_dist[start:stop] = lab, dist
    out_label[rows] = flat_label.reshape(-1, 2)
    out_dist[rows] = flat_dist.reshape(-1, 2)
    provenance = {"backend": backend.name, "device": backend.device_name, "radius_mm": float(radius_mm)}
    return EndpointAssignment(out_label, out_dist, provenance)


def streamline_lengths_mm(points: np.ndarray, offsets: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """Length of each streamline in mm (``points`` in voxel coordinates, ``linear`` voxel → mm)."""
    points = np.asarray(points, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if len(points) < 2:
        return np.zeros(n)
    steps = np.linalg.norm(np.diff(points, axis=0) @ np.asarray(linear, np.float64).T, axis=1)
    cumulative = np.concatenate([[0.0], np.cumsum(steps)])
    lengths = np.diff(offsets)
    out = np.zeros(n)
    has = lengths > 1
    out[has] = cumulative[offsets[1:][has] - 1] - cumulative[offsets[:-1][has]]
    return out


@dataclass
class Connectome:
    """An undirected connectivity matrix over ``nodes`` (label values, ascending).

    ``counts[a, b]``: streamlines with one end at node a and the other at node b (symmetric;
    a streamline with both ends in one node counts once on the diagonal). ``sums[a, b]``:
    the sum of a per-streamline weight over those streamlines; ``mean`` = sums / counts
    (0 where there is no streamline). ``streamline_nodes`` (S, 2): the node index of each
    end (-1: unassigned), which selects an edge's streamlines."""

    nodes: np.ndarray
    counts: np.ndarray
    sums: np.ndarray
    streamline_nodes: np.ndarray
    provenance: dict = field(default_factory=dict)

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), 0.0)

    def edge_streamlines(self, a: int, b: int) -> np.ndarray:
        """Bool per streamline: it joins node indices ``a`` and ``b`` (either way round)."""
        ends = self.streamline_nodes
        return ((ends[:, 0] == a) & (ends[:, 1] == b)) | ((ends[:, 0] == b) & (ends[:, 1] == a))

    @property
    def assigned(self) -> int:
        return int(np.all(self.streamline_nodes >= 0, axis=1).sum())


def node_indices(end_labels: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Node index (position in ``nodes``) of each end label; -1 for 0 or a label not among the nodes."""
    end_labels = np.asarray(end_labels)
    if len(nodes) == 0:
        return np.full(end_labels.shape, -1, dtype=np.int64)
    where = np.clip(np.searchsorted(nodes, end_labels), 0, len(nodes) - 1)
    found = (nodes[where] == end_labels) & (end_labels > 0)
    return np.where(found, where, -1).astype(np.int64)


def connectome_from_nodes(streamline_nodes: np.ndarray, n_nodes: int, weights: np.ndarray | None = None):
    """(counts, sums) symmetric n×n matrices from the node index of each end (-1: left out)."""
    ends = np.asarray(streamline_nodes, dtype=np.int64)
    valid = np.all(ends >= 0, axis=1)
    a, b = ends[valid, 0], ends[valid, 1]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    flat = lo * n_nodes + hi
    counts = np.bincount(flat, minlength=n_nodes * n_nodes).reshape(n_nodes, n_nodes).astype(np.int64)
    w = np.ones(len(ends)) if weights is None else np.asarray(weights, dtype=np.float64)
    sums = np.bincount(flat, weights=w[valid], minlength=n_nodes * n_nodes).reshape(n_nodes, n_nodes)
    counts = counts + counts.T - np.diag(np.diag(counts))
    sums = sums + sums.T - np.diag(np.diag(sums))
    return counts, sums


def connectome(assignment: EndpointAssignment, nodes: np.ndarray, weights: np.ndarray | None = None) -> Connectome:
    """The matrix over ``nodes`` (sorted label values) from assigned endpoints."""
    nodes = np.asarray(nodes, dtype=np.int64)
    ends = node_indices(assignment.labels, nodes)
    counts, sums = connectome_from_nodes(ends, len(nodes), weights)
    return Connectome(nodes, counts, sums, ends, dict(assignment.provenance))
