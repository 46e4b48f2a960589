"""Use case: two-point geodesic ray tracing between a seed region and a target region.

Every seed point is joined to ``target_points`` points of the target by refining the initial
direction until the geodesic hits them (:mod:`gpu.geodesic_shooting`). The tractogram holds
the pairs that were joined, best CM first, with per streamline ``cm``, ``miss_mm``,
``seed_point`` and ``target_point``; the provenance counts the pairs tried and joined.
"""

from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np

from tractlens.gpu import geodesic
from tractlens.gpu.geodesic_eikonal import connect
from tractlens.gpu.geodesic_shooting import shoot

from ..model import Tractogram
from ._fallback import run_with_cpu_fallback
from .tensor_field import TrackResult
from .track_reasons import two_point_empty_reason


def target_points_of(target: np.ndarray, count: int) -> np.ndarray:
    """Up to ``count`` voxel centres of the target region, spread over it (every n-th voxel in
    index order), as voxel coordinates."""
    voxels = np.argwhere(np.asarray(target) != 0).astype(np.float64)
    if len(voxels) <= count:
        return voxels
    return voxels[np.unique(np.linspace(0, len(voxels) - 1, count).round().astype(np.int64))]


def two_point_pipeline(field_, fld, positions, dirs, target, params, metric, *, target_points: int, device, choice,
                       notes: list, top_percent: float, name: str, progress=None, cancelled=None):  # fmt: skip
    """Join every seed point (``positions``) to the target's points; ``dirs`` ``(P, K, 3)`` are
    the sampled initial directions of each seed point."""

    targets = target_points_of(target, target_points)
    t0 = time.perf_counter()
    used = []

    def run(backend):
        used.append(backend)
        return shoot(fld, positions, targets, np.asarray(dirs), params, device=backend, cancelled=cancelled)

    result = run_with_cpu_fallback(run, device, notes, "two-point ray tracing")
    seconds = time.perf_counter() - t0
    if progress is not None:
        progress(len(result), len(result))
    hits = np.flatnonzero(result.hit)
    order = hits[np.argsort(-result.cm[hits], kind="stable")]
    if len(order):
        order = order[geodesic.top_fraction(result.cm[order], top_percent)]
    lengths = np.diff(result.offsets)[order]
    flat = np.concatenate([np.arange(result.offsets[i], result.offsets[i + 1]) for i in order]) if len(order) else []
    flat = np.asarray(flat, np.int64)
    tractogram = Tractogram(
        result.points[flat],
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        affine=field_.affine,
        dimensions=field_.shape,
        point_scalars={"cm": np.repeat(result.cm[order], lengths).astype(np.float32)},
        streamline_scalars={
            "cm": result.cm[order].astype(np.float32),
            "miss_mm": result.miss_mm[order].astype(np.float32),
            "seed_point": result.seed[order].astype(np.float32),
            "target_point": result.target[order].astype(np.float32),
        },
        name=name,
    )
    joined = len(np.unique(result.seed[result.hit]))
    provenance = {
        "method": "geodesic two-point",
        "parameters": asdict(params),
        "device": " then ".join(b.device_name for b in used) or "cpu",
        "metric": {**asdict(metric), "gain_used": fld.gain, "repaired_voxels": fld.repaired},
        "backend": " then ".join(b.name for b in used) or "cpu",
        "device_choice": choice.reason,
        "seed_points": len(positions),
        "target_points": len(targets),
        "directions": int(np.asarray(dirs).shape[1]),
        "fibers": len(result),
        "pairs": len(result),
        "pairs_joined": int(result.hit.sum()),
        "seed_points_joined": joined,
        "reached_target": int(result.hit.sum()),
        "streamlines": len(tractogram),
        "median_miss_mm": result.provenance["median_miss_mm"],
        "tolerance_mm": result.provenance["tolerance_mm"],
        "top_percent": top_percent,
        "tracking_s": seconds,
        "steps": 0,
        "steps_per_s": None,
        "tensor": field_.source,
    }
    if len(tractogram) == 0:
        provenance["empty_reason"] = two_point_empty_reason(provenance)
        notes.append(f"0 streamlines: {provenance['empty_reason']}")
    return TrackResult(tractogram, provenance, notes)


#: What the distance map's provenance tells of its graph (built or reused).
GRAPH_KEYS = ("graph_nodes", "graph_edges", "graph_s", "graph_cached", "distances_cached")


def eikonal_pipeline(field_, fld, positions, target, params, metric, *, device, choice, notes: list,
                     top_percent: float, name: str, radius: int = 1, progress=None, cancelled=None,
                     on_batch=None):  # fmt: skip
    """Join every seed point (``positions``) to the target by the minimal geodesic of the metric
    (:func:`gpu.geodesic_eikonal.connect`): one path per seed point that the tracking region
    joins to the target, best CM first."""

    t0 = time.perf_counter()
    used = []

    def run(backend):
        used.append(backend)
        return connect(fld, positions, target, radius=radius, device=backend, progress=progress, cancelled=cancelled)

    result = run_with_cpu_fallback(run, device, notes, "the geodesic distance map")
    seconds = time.perf_counter() - t0
    if result is None:  # cancelled
        result_len, order = 0, np.zeros(0, np.int64)
    else:
        result_len = len(result)
        order = geodesic.top_fraction(result.cm, top_percent) if result_len else np.zeros(0, np.int64)
    if result_len:
        lengths = np.diff(result.offsets)[order]
        flat = np.concatenate([np.arange(result.offsets[i], result.offsets[i + 1]) for i in order])
        points, point_cm = result.points[flat], result.point_cm[flat]
        scalars = {
            "cm": result.cm[order],
            "geodesic_mm": result.distance_mm[order],
            "seed_point": result.seed[order].astype(np.float32),
        }
    else:
        lengths, points, point_cm = np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros(0)
        scalars = {k: np.zeros(0, np.float32) for k in ("cm", "geodesic_mm", "seed_point")}
    tractogram = Tractogram(
        points,
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        affine=field_.affine,
        dimensions=field_.shape,
        point_scalars={"cm": np.asarray(point_cm, np.float32)},
        streamline_scalars={k: np.asarray(v, np.float32) for k, v in scalars.items()},
        name=name,
    )
    if on_batch is not None and len(tractogram):
        on_batch(tractogram)  # the paths come at once: one batch, as ray tracing's live view expects
    joined = int(result.connected.sum()) if result is not None else 0
    provenance = {
        "method": "geodesic eikonal",
        "parameters": asdict(params),
        "device": " then ".join(b.device_name for b in used) or "cpu",
        "metric": {**asdict(metric), "gain_used": fld.gain, "repaired_voxels": fld.repaired},
        "backend": " then ".join(b.name for b in used) or "cpu",
        "device_choice": choice.reason if choice is not None else None,
        "seed_points": len(positions),
        "seed_points_joined": joined,
        "fibers": len(positions),
        "reached_target": result_len,
        "streamlines": len(tractogram),
        "top_percent": top_percent,
        "tracking_s": seconds,
        "steps": 0,
        "steps_per_s": None,
        "cancelled": result is None,
        "tensor": field_.source,
        **({} if result is None else {k: result.provenance[k] for k in GRAPH_KEYS}),
    }
    if len(tractogram) == 0 and result is not None:
        provenance["empty_reason"] = (
            "the tracking mask does not join any seed point to the target (no path of mask voxels between them)"
        )
        notes.append(f"0 streamlines: {provenance['empty_reason']}")
    elif joined < len(positions) and result is not None:
        notes.append(
            f"{len(positions) - joined} of {len(positions)} seed points have no path in the mask to the target"
        )
    return TrackResult(tractogram, provenance, notes)
