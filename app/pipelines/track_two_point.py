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

from ..model import Tractogram
from ._fallback import run_with_cpu_fallback


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
    from tractlens.gpu import geodesic
    from tractlens.gpu.geodesic_shooting import shoot

    from .track import TrackResult
    from .track_reasons import two_point_empty_reason

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
