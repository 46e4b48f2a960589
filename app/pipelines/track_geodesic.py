"""Use case: geodesic ray tracing from a seed region to a target (see :mod:`gpu.geodesic`).

Shared by ``tractlens track geodesic``, the Geodesic panel and Python scripts (reached through
:mod:`app.pipelines.track` too). Fibres are shot from every seed point, in a number of
directions sized for the engine when not given (:func:`directions_for`), kept when they reach
the target and ranked by their connectivity measure; with ``two_point`` the initial direction
of every seed–target pair is refined until its geodesic hits the target point
(:mod:`gpu.geodesic_shooting`). The summary counts how every fibre ended, and a run that keeps
nothing says why and what to try (:mod:`.track_reasons`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np

from tractlens.gpu import geodesic, geodesic_field, geodesic_params, sym3
from tractlens.gpu.backend import check_device
from tractlens.gpu.engines import decide_device
from tractlens.gpu.geodesic_metrics import metric_for
from tractlens.gpu.interpolate import trilinear
from tractlens.gpu.seeding import seeds_in_mask
from tractlens.gpu.select import select_streamlines
from tractlens.gpu.streamlines import stop_reason_totals

from ..errors import InputError
from ..model import Tractogram
from ..params import GEODESIC_METHODS as METHODS
from ..params import GeodesicSeedingParams, default_of, field_of
from ..regions import Regions
from ._fallback import batches_with_cpu_fallback, run_with_cpu_fallback
from .tensor_field import TensorField, TrackResult, require_seed
from .track_reasons import geodesic_empty_reason
from .track_two_point import eikonal_pipeline, two_point_pipeline

#: Fibres a seed region gets when the directions per point are left to the engine
#: (``directions=0``): on a GPU 2¹⁸ (the kernel traces them in tens of milliseconds), on the
#: CPU 2¹² (a few seconds of the NumPy engine), spread over the seed points.
GPU_FIBRES, CPU_FIBRES = 1 << 18, 1 << 12
#: Directions per seed point when sized for the engine: at least, at most.
MIN_DIRECTIONS, MAX_DIRECTIONS = 16, 20_000


def directions_for(seed_points: int, on_gpu: bool) -> int:
    """Directions per seed point so that the seed region gets about :data:`GPU_FIBRES` (GPU) or
    :data:`CPU_FIBRES` (CPU) fibres, within [:data:`MIN_DIRECTIONS`, :data:`MAX_DIRECTIONS`]."""
    budget = GPU_FIBRES if on_gpu else CPU_FIBRES
    return int(min(MAX_DIRECTIONS, max(MIN_DIRECTIONS, budget // max(seed_points, 1))))


def resolve_method(method: str, has_target: bool, two_point: bool) -> str:
    """``rays`` or ``eikonal`` for a run: ``auto`` is the distance map (``eikonal``) from a seed
    region to a target, ray tracing otherwise (no target, or ``two_point`` asked for). A live
    re-track takes the distance map too: its graph of the mask and its distances from the
    target are kept with the metric field (:mod:`gpu.geodesic_eikonal`), so an edit of the seed
    region only reads the paths back, and a new target solves Dijkstra on the kept graph."""
    if method not in METHODS:
        raise InputError(f"the method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "eikonal" and not has_target:
        raise InputError("the eikonal method joins seed points to a target region", fix="Give or paint a target ROI")
    if method == "eikonal" and two_point:
        raise InputError("--two-point is a form of ray tracing: use it with --method rays (or auto)")
    if method == "auto":
        return "eikonal" if has_target and not two_point else "rays"
    return method


def step_in_voxels(step_mm: float, voxel_size) -> float:
    """A step length in mm as :attr:`gpu.geodesic.GeodesicParams.step` takes it: in voxels of the
    smallest voxel size (the one conversion of the geodesic ``--step``)."""
    return float(step_mm) / float(np.min(voxel_size))


def step_in_mm(step_voxels: float, voxel_size) -> float:
    """A :attr:`GeodesicParams.step` (voxels of the smallest voxel size) in mm: the inverse of
    :func:`step_in_voxels`."""
    return float(step_voxels) * float(np.min(voxel_size))


def step_mm_range(voxel_size) -> tuple[float, float, float]:
    """(lowest, highest, default) step in mm on a grid of ``voxel_size``: the limits and the
    default of :attr:`GeodesicParams.step` converted (the window's step box)."""
    lo, hi = field_of(geodesic_params.GeodesicParams, "step").metadata["limits"]
    default = default_of(geodesic_params.GeodesicParams, "step")
    return step_in_mm(lo, voxel_size), step_in_mm(hi, voxel_size), step_in_mm(default, voxel_size)


def geodesic_params_mm(values: dict, voxel_size) -> geodesic_params.GeodesicParams:
    """:class:`GeodesicParams` from values whose ``step`` is in mm (the window's form, as the
    command line's ``--step``), converted by :func:`step_in_voxels`; raises ValueError as the
    dataclass does."""
    return geodesic_params.GeodesicParams(**{**values, "step": step_in_voxels(values["step"], voxel_size)})


def ending_summary(totals: dict, params) -> dict:
    """How the fibres ended, for the provenance: fibres per stop reason (by name), and the
    excursions out of the tracking mask that the mask tolerance let fibres come back from."""

    return {
        "stop_reasons": stop_reason_totals(totals["stop_counts"]),
        "mask_tolerance_mm": params.mask_tolerance_mm,
        "mask_excursions": totals["excursions"],
        "longest_mask_excursion_mm": round(totals["longest_excursion_mm"], 3),
    }


def geodesic_pipeline(
    field_: TensorField,
    *,
    seed_mask: np.ndarray,
    target: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    include: Sequence[np.ndarray] = (),
    metric=None,
    params=None,
    seeds_per_voxel: int = GeodesicSeedingParams.seeds_per_voxel,
    directions: int = GeodesicSeedingParams.directions,
    cone_deg: float | None = GeodesicSeedingParams.cone_deg,
    top_percent: float = GeodesicSeedingParams.top_percent,
    placement: str = GeodesicSeedingParams.placement,
    rng_seed: int = GeodesicSeedingParams.rng_seed,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    on_batch: Callable[[Tractogram], None] | None = None,
    max_batch: int | None = None,
    first_batch: int | None = None,
    name: str = "geodesic",
    metric_field=None,
    two_point: bool = GeodesicSeedingParams.two_point,
    target_points: int = GeodesicSeedingParams.target_points,
    method: str = GeodesicSeedingParams.method,
    neighbourhood: int = GeodesicSeedingParams.neighbourhood,
) -> TrackResult:
    """Geodesic ray tracing from a seed region (see :mod:`gpu.geodesic`).

    Every seed point shoots ``directions`` fibres (0: as many as :func:`directions_for` sizes
    for the engine that runs): uniform on the sphere, or, with
    ``cone_deg``, within that half-angle around ± the main eigenvector there. With a
    ``target`` only the fibres that reach it are kept, ranked by their CM where they
    first enter it; without, by the CM at their end. ``top_percent`` keeps the best.
    ``include`` masks (waypoints; each of several targets) must all be passed: other fibres
    are dropped batch by batch, before ranking and before ``on_batch`` sees them.
    ``metric_field`` (from :func:`gpu.geodesic_field.prepare_metric` with ``metric``, or a function
    of the metric parameters, ``auto`` resolved for the method, that returns it) skips the
    pre-processing when it is reused, e.g. while an ROI is edited live; ``first_batch``
    makes the first batch (the first ``on_batch``) small, to show something at once.
    With ``two_point`` (a target is needed) every pair of a seed point and one of
    ``target_points`` points of the target is joined by shooting (:func:`two_point_pipeline`).
    """

    params = params or geodesic_params.GeodesicParams()
    notes = list(field_.notes)
    check_device(device)  # an unusable device (gpu forced, none there) is refused before any work
    shape = field_.shape
    try:
        regions = [("seed region", seed_mask), ("target", target), ("tracking mask", mask)]
        regions += [(f"region to pass {i + 1}", m) for i, m in enumerate(include)]
        for name_, volume in regions:
            if volume is None:
                continue
            if np.asarray(volume).shape != shape:
                raise InputError(f"the {name_} has shape {np.asarray(volume).shape}, the tensor field {shape}")
            if not np.asarray(volume).any():
                raise InputError(f"the {name_} is empty", fix="Give or paint a region with at least one voxel")
        if not 0 < top_percent <= 100:
            raise InputError(f"--top-percent must be in (0, 100], got {top_percent}")
        if directions < 0:
            raise InputError(f"the directions per seed point must be ≥ 1 (0 = sized for the engine), got {directions}")
        if two_point and target is None:
            raise InputError("two-point ray tracing needs a target region", fix="Give or paint a target ROI")
        method = resolve_method(method, target is not None, two_point)
        metric = metric_for(metric or geodesic_params.MetricParams(), "two-point" if two_point else method)
        if callable(metric_field):
            metric_field = metric_field(metric)
        if metric_field is not None and metric_field.metric_params not in (None, metric):
            metric_field = None  # made for another metric (auto resolves per method): made again
        positions = seeds_in_mask(seed_mask, seeds_per_voxel, placement=placement, rng_seed=rng_seed)
        choice = None
        if method == "eikonal":
            choice = decide_device("geodesic", len(positions) * GPU_FIBRES, requested=device)
            directions = directions or 1
        elif not directions:
            choice = decide_device("geodesic", len(positions) * GPU_FIBRES * params.max_steps, requested=device)
            directions = directions_for(len(positions), choice.device == "gpu")
        if method == "eikonal":
            dirs = np.zeros((len(positions), 0, 3))
        elif cone_deg is not None:
            tensors = trilinear(np, field_.tensor.astype(np.float64), positions)
            _lams, e1 = sym3.principal(np, tensors)
            dirs = geodesic.cone_directions(np.stack(e1, -1), directions, cone_deg)
        else:
            dirs = np.broadcast_to(geodesic.fibonacci_directions(directions), (len(positions), directions, 3))
        if choice is None:
            choice = decide_device("geodesic", len(positions) * directions * params.max_steps, requested=device)
        device = choice.argument
        if metric_field is None:
            metric_field = run_with_cpu_fallback(
                lambda bk: geodesic_field.prepare_metric(
                    field_.tensor, field_.voxel_size, metric, device=bk, progress=progress, cancelled=cancelled
                ),
                device,
                notes,
                "the geodesic metric",
            )
        fld = geodesic_field.with_regions(metric_field, mask, target)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    notes += fld.notes
    if method == "eikonal":
        return eikonal_pipeline(
            field_, fld, positions, target, params, metric, device=device, choice=choice, notes=notes,
            top_percent=top_percent, name=name, radius=neighbourhood, progress=progress, cancelled=cancelled,
            on_batch=on_batch,
        )  # fmt: skip
    if two_point:
        return two_point_pipeline(
            field_, fld, positions, dirs, target, params, metric, target_points=target_points, device=device,
            choice=choice, notes=notes, top_percent=top_percent, name=name, progress=progress, cancelled=cancelled,
        )  # fmt: skip
    starts = np.repeat(positions, directions, axis=0)
    dirs = np.ascontiguousarray(dirs.reshape(-1, 3))
    t0 = time.perf_counter()
    batches = []
    used: list = []

    def start(engine_backend, first: int):
        """The batches over fibres first..., numbered as fibres of the whole run."""
        used.append(engine_backend)
        shifted = None if progress is None else (lambda done, total: progress(first + done, first + total))
        for part in geodesic.track(
            fld, starts[first:], dirs[first:], params, only_reaching=target is not None, device=engine_backend,
            progress=shifted, cancelled=cancelled, max_batch=max_batch, first_batch=first_batch if not first else None,
        ):  # fmt: skip
            part.fiber = part.fiber + first
            yield part

    removed = 0
    for batch in batches_with_cpu_fallback(start, lambda b: b.provenance["fibers"], device, notes, "geodesic tracking"):
        if len(batch) and include:
            selection = select_streamlines(batch.points, batch.offsets, list(include), [], device=used[-1])
            removed += int((~selection.selected).sum())
            batch = _keep_fibres(batch, selection.selected)
        batches.append(batch)
        if on_batch is not None and len(batch):
            on_batch(_geodesic_tractogram(batch, field_, name, target is not None, directions))
    seconds = time.perf_counter() - t0
    result = geodesic.GeodesicBatch.concatenate(batches) if batches else None
    steps = sum(b.provenance["steps"] for b in batches)
    tractogram = _geodesic_tractogram(result, field_, name, target is not None, directions)
    ranked = tractogram.streamline_scalars["cm"]
    order = np.zeros(0, np.int64)
    if len(ranked):  # ranked on the device when there is one
        ranker = used[-1]
        order = ranker.to_host(geodesic.top_fraction(ranker.asarray(ranked), top_percent, xp=ranker.xp))
    tractogram = tractogram.subset(order)
    provenance = {
        "method": "geodesic",
        "parameters": asdict(params),
        "metric": {**asdict(metric), "gain_used": fld.gain, "repaired_voxels": fld.repaired},
        "backend": " then ".join(b.name for b in used),
        "device": " then ".join(b.device_name for b in used),
        "device_choice": choice.reason,
        "seed_points": len(positions),
        "directions": directions,
        "cone_deg": cone_deg,
        "fibers": len(starts),
        "reached_target": len(result) + removed if (result is not None and target is not None) else None,
        "streamlines_removed_by_rois": removed,
        "streamlines": len(tractogram),
        "top_percent": top_percent,
        "steps": steps,
        "tracking_s": seconds,
        "steps_per_s": steps / seconds if seconds > 0 else None,
        "rng_seed": rng_seed,
        "tensor": field_.source,
        **ending_summary(geodesic.ending_totals(batches), params),
    }
    if len(tractogram) == 0:
        provenance["empty_reason"] = geodesic_empty_reason(provenance)
        notes.append(f"0 streamlines: {provenance['empty_reason']}")
    return TrackResult(tractogram, provenance, notes)


def _keep_fibres(batch, keep: np.ndarray):
    """The fibres of a geodesic batch where ``keep`` is True."""
    keep = np.asarray(keep, dtype=bool)
    lengths = np.diff(batch.offsets)
    per_point = np.repeat(keep, lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(batch.offsets.dtype)
    fields = {name: getattr(batch, name)[keep] for name in batch.FIBRE_FIELDS}
    return type(batch)(
        points=batch.points[per_point], offsets=offsets, cm=batch.cm[per_point], provenance=batch.provenance, **fields
    )


def geodesic_from_regions(field_: TensorField, regions: Regions, **options) -> TrackResult:
    """Geodesic tracking with a document's ROIs in their roles (:mod:`app.regions`): fibres shot
    from the seed union to the targets' union (kept when they reach any target, ranked where
    they first do), and kept only when they pass every waypoint; the exclusion union is taken
    out of the tracking mask (the fitted voxels). Geodesic fibres run to the edge of the mask:
    stop ROIs are not used. ``options`` go to :func:`geodesic_pipeline`."""
    require_seed(regions)
    mask = field_.mask if regions.exclusion is None else field_.mask & ~regions.exclusion
    include = [region.mask for region in regions.waypoints]
    result = geodesic_pipeline(
        field_, seed_mask=regions.seed, target=regions.target_union, mask=mask, include=include, **options
    )
    result.notes[:0] = regions.notes
    if regions.stop is not None:
        result.notes.append("geodesic tracking does not use stop ROIs")
    return result


def _geodesic_tractogram(batch, field_: TensorField, name: str, ranked_at_target: bool, directions: int) -> Tractogram:
    if batch is None:
        return Tractogram(np.zeros((0, 3)), np.zeros(1, np.int64), affine=field_.affine, dimensions=field_.shape,
                          point_scalars={"cm": np.zeros(0, np.float32)},
                          streamline_scalars={"cm": np.zeros(0, np.float32)}, name=name)  # fmt: skip
    cm = batch.cm_target if ranked_at_target else batch.cm_end
    return Tractogram(
        batch.points,
        batch.offsets,
        affine=field_.affine,
        dimensions=field_.shape,
        point_scalars={"cm": batch.cm.astype(np.float32)},
        streamline_scalars={
            "cm": cm.astype(np.float32),
            "cm_end": batch.cm_end.astype(np.float32),
            "seed_point": (batch.fiber // max(directions, 1)).astype(np.float32),
        },
        name=name,
    )
