"""Minimal geodesics from every seed point to a target region, from the metric's distance map.

Ray tracing shoots fibres and keeps those that happen to reach the target; in a narrow or noisy
bundle few or none do. Solving the same metric as a distance problem from the target instead —
the eikonal equation ``|∇u|_{G⁻¹} = 1`` with ``u = 0`` on the target (Parker, Wheeler-Kingshott
& Barker, "Estimating distributed anatomical connectivity using fast marching methods and
diffusion tensor imaging", IEEE TMI 21, 2002; Jbabdi, Bellec, Toro, Daunizeau, Pélégrini-Issac
& Benali, "Accurate anisotropic fast marching for diffusion-based geodesic tractography",
Int. J. Biomed. Imaging 2008) — gives the geodesic distance from every voxel to the target, and
following it back from a seed point gives the minimal geodesic that joins exactly: no lucky
directions, every seed point connected where the tracking region joins it to the target.

The distance is solved on a graph of the tracking region's voxels (as in graph-based
tractography: Iturria-Medina et al., NeuroImage 36, 2007; Zalesky, IEEE TMI 27, 2008): an edge
to every neighbour in a ``(2r+1)³`` neighbourhood (``r = 1``: 26 neighbours; ``r = 2``: 98
directions, which bends the graph's paths at finer angles), weighted by the metric length
``sqrt(Δxᵀ G Δx)`` of the step (the trapezoid of ``G`` at its ends and, for the longer steps,
at the voxels it crosses), and solved exactly by Dijkstra's algorithm (``scipy.sparse.csgraph``,
multi-source from the target's voxels). Each seed point's path is read back from the
predecessors, lightly smoothed (the graph's paths zigzag between voxel centres), and given
Astola's connectivity measure ``CM = Σ|Δx| / Σ sqrt(Δxᵀ G(x̄) Δx)`` with ``G`` interpolated
at the midpoints, as the ray tracer computes it. Both engines build the edges with array
operations (NumPy or CuPy); Dijkstra runs on the host.

The tracking region is the voxels with the ``TRACK`` bit of the field's region map (the
mask), plus the seed and target voxels; the ray tracer's mask tolerance does not apply (a path
never leaves the region).

The graph of the mask and the distance map from a target are kept with the field
(``GeodesicField.graphs``, shared by the fields :func:`gpu.geodesic_field.with_regions` makes): an
edit of the seed region inside the mask reuses both and only reads the paths back; a new target
reuses the graph and solves Dijkstra again. Seed or target voxels outside the mask add their
own edges, found on a crop around them (the edges of the crop with them less the edges of the
crop without them), so the graph solved is exactly the one a full build would give.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product

import numpy as np

from . import sym3
from .backend import Backend, get_backend
from .geodesic_field import TRACK

#: Passes of the (¼, ½, ¼) smoothing over every path (its end points stay where they are).
SMOOTHING_PASSES = 3
#: Graphs and distance maps kept per field (the oldest go first).
GRAPHS_KEPT, DISTANCES_KEPT = 2, 4


@dataclass
class EikonalResult:
    """One path per seed point that the region joins to the target: ``seed`` (index into the
    seed points), ``distance_mm`` (geodesic length on the graph), ``cm`` (Astola's CM of the
    smoothed path), ``points``/``offsets`` (voxel coordinates, seed point first) and ``point_cm``
    (the CM accumulated up to every point). ``connected`` is per seed point."""

    seed: np.ndarray
    distance_mm: np.ndarray
    cm: np.ndarray
    points: np.ndarray
    offsets: np.ndarray
    point_cm: np.ndarray
    connected: np.ndarray
    provenance: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.seed)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points[self.offsets[i] : self.offsets[i + 1]]


def half_offsets(radius: int) -> np.ndarray:
    """The steps of a ``(2r+1)³`` neighbourhood that are not multiples of a shorter one, one of
    each ± pair (the graph is undirected): 13 for ``r = 1``, 49 for ``r = 2``."""
    if radius not in (1, 2):
        raise ValueError(f"the neighbourhood radius must be 1 or 2 voxels, got {radius}")
    out = []
    for o in product(range(-radius, radius + 1), repeat=3):
        if o == (0, 0, 0) or math.gcd(*(abs(v) for v in o)) != 1:
            continue
        if o > tuple(-v for v in o):  # the lexicographically larger of ±o
            out.append(o)
    return np.array(out, np.int64)


def _step_lengths(xp, g, delta_mm):
    """``sqrt(Δᵀ G Δ)`` for the metric ``g`` (``(..., 6)``) and one step ``Δ`` (mm)."""
    gd = sym3._apply(sym3.components(g), tuple(float(v) for v in delta_mm))
    return xp.sqrt(xp.clip(sum(float(delta_mm[i]) * gd[i] for i in range(3)), 0.0, None))


def metric_graph(
    xp,
    g,
    nodes,
    voxel_size,
    radius: int = 1,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    flat=None,
):
    """The edges of the voxel graph: ``(rows, cols, weights)`` (host arrays; flat voxel numbers)
    between the ``nodes`` (a 3-D bool array), weighted by the metric length of the step.
    ``flat`` numbers the voxels (default: their flat index in ``nodes``; a crop passes its
    voxels' numbers in the whole volume)."""
    shape = nodes.shape
    if flat is None:
        flat = xp.arange(int(np.prod(shape)), dtype=xp.int64).reshape(shape)
    rows, cols, weights = [], [], []
    offsets = half_offsets(radius)
    for n, o in enumerate(offsets):
        if cancelled is not None and cancelled():
            return None
        delta = o * np.asarray(voxel_size, np.float64)
        a = tuple(slice(max(0, -int(v)), shape[k] - max(0, int(v))) for k, v in enumerate(o))
        b = tuple(slice(max(0, int(v)), shape[k] - max(0, -int(v))) for k, v in enumerate(o))
        ok = nodes[a] & nodes[b]
        samples = [_step_lengths(xp, g[a], delta), _step_lengths(xp, g[b], delta)]
        if np.abs(o).max() > 1:  # a longer step: the voxels it crosses must be in the region too
            for half in (np.floor(o / 2.0).astype(int), np.ceil(o / 2.0).astype(int)):
                m = tuple(slice(s.start + int(h), s.stop + int(h)) for s, h in zip(a, half, strict=True))
                ok = ok & nodes[m]
                samples.append(_step_lengths(xp, g[m], delta))
            cost = 0.25 * (samples[0] + samples[1]) + 0.25 * (samples[2] + samples[3])
        else:
            cost = 0.5 * (samples[0] + samples[1])
        rows.append(flat[a][ok])
        cols.append(flat[b][ok])
        weights.append(cost[ok])
        if progress is not None:
            progress(n + 1, len(offsets))
    host = xp.asnumpy if xp is not np else np.asarray
    return (host(xp.concatenate(rows)), host(xp.concatenate(cols)), host(xp.concatenate(weights)))


def _smooth(path: np.ndarray, passes: int) -> np.ndarray:
    for _ in range(passes):
        if len(path) < 3:
            break
        inner = 0.25 * path[:-2] + 0.5 * path[1:-1] + 0.25 * path[2:]
        path = np.concatenate([path[:1], inner, path[-1:]])
    return path


def path_cm(fld, points: np.ndarray, offsets: np.ndarray):
    """Astola's CM accumulated along every path (per point, and per path at its end): the
    Euclidean length over the metric length, ``G`` at every segment's midpoint."""
    vs = np.asarray(fld.voxel_size, np.float64)
    if len(points) < 2:
        return np.ones(len(points)), np.ones(max(len(offsets) - 1, 0))
    mid = 0.5 * (points[1:] + points[:-1])
    dx = (points[1:] - points[:-1]) * vs
    g = fld.metric(mid)
    gdx = np.stack(sym3._apply(sym3.components(g), tuple(dx.T)), -1)
    euclid = np.sqrt(np.sum(dx * dx, 1))
    geo = np.sqrt(np.clip(np.sum(dx * gdx, 1), 0.0, None))
    first = np.zeros(len(points), bool)
    first[offsets[:-1]] = True
    segment_ok = ~first[1:]  # a segment joins two points of the same path
    e = np.concatenate([[0.0], np.where(segment_ok, euclid, 0.0)])
    q = np.concatenate([[0.0], np.where(segment_ok, geo, 0.0)])
    ce, cq = np.cumsum(e), np.cumsum(q)
    start = np.repeat(offsets[:-1], np.diff(offsets))
    e_run, q_run = ce - ce[start], cq - cq[start]
    point_cm = np.where(q_run > 0, e_run / np.where(q_run > 0, q_run, 1.0), 1.0)
    return point_cm, point_cm[offsets[1:] - 1] if len(offsets) > 1 else np.zeros(0)


def connect(
    fld,
    seeds: np.ndarray,
    target: np.ndarray,
    *,
    radius: int = 1,
    smoothing: int = SMOOTHING_PASSES,
    device: str | Backend = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> EikonalResult | None:
    """The minimal geodesic from every seed point (``(P, 3)`` voxel coordinates) to the
    ``target`` region, in the metric of ``fld`` (:func:`gpu.geodesic_field.prepare_metric`), within
    its tracking region. Returns ``None`` when cancelled."""
    backend = get_backend(device)
    t0 = time.perf_counter()
    seeds = np.asarray(seeds, np.float64).reshape(-1, 3)
    shape = fld.shape
    target = np.asarray(target) != 0
    seed_voxels = np.clip(np.floor(seeds + 0.5).astype(np.int64), 0, np.array(shape) - 1)
    nodes = (fld.region & TRACK) != 0
    nodes = nodes | target
    nodes[tuple(seed_voxels.T)] = True
    solved = _distances(fld, backend, nodes, target, radius, cancelled)
    if solved is None:
        return None
    distance, predecessor, info = solved
    t_graph = info.pop("graph_s")
    if cancelled is not None and cancelled():
        return None
    start = np.ravel_multi_index(tuple(seed_voxels.T), shape)
    connected = np.isfinite(distance[start])
    paths, owners = [], []
    for i in np.flatnonzero(connected):
        chain = [start[i]]
        while predecessor[chain[-1]] >= 0:
            chain.append(predecessor[chain[-1]])
        voxels = np.stack(np.unravel_index(np.array(chain), shape), -1).astype(np.float64)
        path = np.concatenate([seeds[i : i + 1], voxels]) if np.abs(voxels[0] - seeds[i]).max() > 1e-9 else voxels
        paths.append(_smooth(path, smoothing))
        owners.append(i)
        if progress is not None and len(owners) % 256 == 0:
            progress(len(owners), int(connected.sum()))
    lengths = np.array([len(p) for p in paths], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    points = np.concatenate(paths) if paths else np.zeros((0, 3))
    point_cm, cm = path_cm(fld, points, offsets)
    if progress is not None:
        progress(len(seeds), len(seeds))
    return EikonalResult(
        seed=np.array(owners, np.int64),
        distance_mm=distance[start[connected]].astype(np.float32),
        cm=np.asarray(cm, np.float32),
        points=points.astype(np.float32),
        offsets=offsets,
        point_cm=point_cm.astype(np.float32),
        connected=connected,
        provenance={
            "method": "eikonal",
            "neighbourhood_radius": radius,
            "graph_nodes": int(nodes.sum()),
            "graph_s": t_graph,
            **info,
            "seconds": time.perf_counter() - t0,
            "backend": backend.name,
        },
    )


def _digest(mask) -> str:
    m = np.ascontiguousarray(np.asarray(mask, bool))
    return hashlib.blake2b(np.packbits(m).tobytes() + repr(m.shape).encode(), digest_size=16).hexdigest()


def _remember(store: dict, key: tuple, value, keep: int) -> None:
    """``store[key] = value``, dropping the oldest entries of the same kind beyond ``keep``."""
    same = [k for k in store if k[0] == key[0]]
    while len(same) >= keep:
        store.pop(same.pop(0), None)
    store[key] = value


def _edges(backend, fld, nodes, radius, cancelled, box=None):
    """:func:`metric_graph` over the whole volume, or over ``box`` (slices) with whole-volume
    voxel numbers."""
    xp = backend.xp
    box = box or tuple(slice(0, n) for n in nodes.shape)
    flat = np.arange(nodes.size, dtype=np.int64).reshape(nodes.shape)[box]
    g = sym3.inverse(xp, backend.asarray(fld.data[(*box, slice(0, 6))]).astype(xp.float64))
    return metric_graph(
        xp, g, backend.asarray(nodes[box]), fld.voxel_size, radius, cancelled, flat=backend.asarray(flat)
    )


def _extra_edges(backend, fld, base, nodes, groups, radius, cancelled):
    """The edges of the graph on ``nodes`` that the graph on ``base`` (a subset) lacks: those
    with an end, or (longer steps) a voxel crossed, among the extra voxels. Found on a crop
    around each group of extra voxels: its edges with them less its edges without them."""
    keys, weights = [], []
    size = nodes.size
    for group in groups:
        where = np.argwhere(group)
        if not len(where):
            continue
        lo = np.maximum(where.min(0) - radius, 0)
        hi = np.minimum(where.max(0) + radius + 1, nodes.shape)
        box = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
        with_extra = _edges(backend, fld, nodes, radius, cancelled, box)
        without = _edges(backend, fld, base, radius, cancelled, box)
        if with_extra is None or without is None:
            return None
        key = with_extra[0] * size + with_extra[1]
        new = ~np.isin(key, without[0] * size + without[1])
        keys.append(key[new])
        weights.append(with_extra[2][new])
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    key, first = np.unique(np.concatenate(keys), return_index=True)  # a pair two crops both found
    return key // size, key % size, np.concatenate(weights)[first]


def _distances(fld, backend, nodes, target, radius, cancelled):
    """Dijkstra's distances and predecessors from ``target`` over the graph of ``nodes`` (the
    mask's voxels with the seed and target voxels), from ``fld.graphs`` where they are kept."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import dijkstra

    t0 = time.perf_counter()
    base = (fld.region & TRACK) != 0
    graph_key = ("graph", backend.name, _digest(base), radius)
    graph_cached = graph_key in fld.graphs
    if not graph_cached:
        edges = _edges(backend, fld, base, radius, cancelled)
        if edges is None:
            return None
        size = base.size
        _remember(fld.graphs, graph_key, coo_matrix((edges[2], edges[:2]), shape=(size, size)).tocsr(), GRAPHS_KEPT)
    graph = fld.graphs[graph_key]
    extra = nodes & ~base
    dist_key = ("distances", graph_key, _digest(extra), _digest(target))
    distances_cached = dist_key in fld.graphs
    extra_edges = 0
    if not distances_cached:
        if extra.any():
            groups = (extra & target, extra & ~target)
            rows, cols, weights = _extra_edges(backend, fld, base, nodes, groups, radius, cancelled) or (None,) * 3
            if rows is None:
                return None
            extra_edges = len(rows)
            graph = graph + coo_matrix((weights, (rows, cols)), shape=graph.shape).tocsr()
        t_graph = time.perf_counter() - t0
        sources = np.flatnonzero(target.ravel())
        distance, predecessor, _ = dijkstra(graph, directed=False, indices=sources, min_only=True,
                                            return_predecessors=True)  # fmt: skip
        _remember(fld.graphs, dist_key, (distance, predecessor, extra_edges, graph.nnz), DISTANCES_KEPT)
    else:
        t_graph = time.perf_counter() - t0
    distance, predecessor, extra_edges, nnz = fld.graphs[dist_key]
    info = {
        "graph_s": t_graph,
        "graph_edges": int(nnz),
        "graph_cached": graph_cached,
        "distances_cached": distances_cached,
        "extra_edges": int(extra_edges),
    }
    return distance, predecessor, info
