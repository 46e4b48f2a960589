"""Use case: streamline tractography from a tensor field (deterministic and geodesic).

Shared by ``tractlens track ...``, the GUI's tracking panels and Python scripts.
Inputs are a tensor field (a tensor file or folder, or a DWI series fitted on the
fly), seeds (a mask, points, or the whole white matter) and ROIs in their roles:
a mask bounds tracking, stop regions end streamlines, waypoints and targets must
be passed (all of them), exclusion regions must not be. Streamlines come back in
batches while they are computed (``on_batch``) and as one tractogram at the end.

The roles mean what :mod:`app.regions` says: the command line's repeated ``--include``
masks are the GUI's target and waypoint ROIs (each one passed, AND), its ``--exclude`` and
``--stop`` masks the exclusion and stop ROIs (unions). :func:`deterministic_from_regions`
and :func:`geodesic_from_regions` run a method on a document's :class:`~app.regions.Regions`;
:func:`tensor_field_of` and :func:`geodesic_metric_of` keep the derived fields in the
document's cache (``document.derived``) so that a re-run does not recompute them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tractlens.gpu import deterministic, geodesic_field, geodesic_params, tracking
from tractlens.gpu.backend import check_device
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.engines import decide_device
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams
from tractlens.gpu.interpolate import trilinear
from tractlens.gpu.seeding import check_points, seeds_in_mask
from tractlens.gpu.select import select_streamlines
from tractlens.gpu.streamlines import STOP_REASONS, StreamlineBatch, StreamlineScalars, stop_reason_totals

from ..errors import InputError
from ..grid import Grid
from ..io import load_dwi, load_tensor
from ..model import Tractogram, Volume
from ..params import SeedingParams
from ..regions import Regions
from ..timing import phase
from ._fallback import batches_with_cpu_fallback
from .dti import fit_dti_pipeline
from .select import load_masks_on_reference
from .tensor_field import TensorField, TrackResult, require_seed
from .track_geodesic import geodesic_from_regions, geodesic_pipeline
from .track_parts import PIECE_POINTS, PathLength, deterministic_part, join_parts
from .track_reasons import empty_result_reason

__all__ = [
    "INTERACTIVE_FIRST_BATCH",
    "DeterministicParams",
    "GeodesicParams",
    "MetricParams",
    "TensorField",
    "TrackResult",
    "deterministic_from_regions",
    "deterministic_pipeline",
    "geodesic_from_regions",
    "geodesic_metric_of",
    "geodesic_pipeline",
    "masks_on_field",
    "tensor_field_of",
    "tracking_choices",
]

log = logging.getLogger(__name__)
# Fibres in the first batch of an interactive run (the GUI, live re-tracking): a small
# first batch is back on screen sooner; the rest streams in after it.
INTERACTIVE_FIRST_BATCH = 2_000


def load_tensor_field(
    *,
    tensor: str | os.PathLike | None = None,
    tensor_order: str | None = None,
    dwi: str | os.PathLike | None = None,
    bval: str | os.PathLike | None = None,
    bvec: str | os.PathLike | None = None,
    mask: str | os.PathLike | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> TensorField:
    """The tensor field to track in: read from a tensor file/folder, or fitted to a DWI series."""
    if (tensor is None) == (dwi is None):
        raise InputError("give either a tensor (file or dtifit folder) or a DWI series, not both or neither")
    if tensor is not None:
        with phase("read"):
            volume = load_tensor(tensor, tensor_order)
        with phase("compute"):  # eigenvalues and FA of every voxel
            return TensorField.from_tensor(volume.data, volume.affine, str(tensor))

    with phase("read"):
        series = load_dwi(dwi, bval, bvec)
    with phase("compute"):  # tensors fitted before tracking
        result = fit_dti_pipeline(series, mask_path=mask, device=device, progress=progress, cancelled=cancelled)
    out = TensorField.from_tensor(result.map("tensor"), result.affine, f"{dwi} (tensors fitted, WLS)", result.warnings)
    out.mask &= result.mask
    return out


def masks_on_field(paths: Sequence[str | os.PathLike], what: str, field_: TensorField, notes: list[str]):
    """Masks from files, checked and brought onto the tensor grid (nearest neighbour). Repeated
    masks of one role keep the meaning of :mod:`app.regions`: each include mask is passed (AND),
    the stop and exclude masks act as their union."""
    grid = Grid.of(field_)
    return load_masks_on_reference(list(paths), what, grid.affine, grid.shape, notes)


def tracking_choices(method: str) -> dict[str, tuple[str, ...]]:
    """The fixed choices of a method's parameters (for forms and option lists)."""

    return dict({"deterministic": deterministic.CHOICES, "geodesic": geodesic_params.CHOICES}[method])


def tensor_field_of(document, volume: Volume) -> TensorField:
    """The tracking view (FA, fitted voxels) of a tensor layer's volume, computed once per
    volume and kept in ``document.derived`` while the volume lives."""
    return document.derived.get(
        volume,
        "tensor_field",
        None,
        lambda: TensorField.from_tensor(volume.data, volume.affine, volume.source or volume.name),
    )


def geodesic_metric_of(document, volume: Volume, metric=None, device: str = "auto"):
    """The pre-processed geodesic metric (:func:`gpu.geodesic_field.prepare_metric`) of a tensor
    layer's volume for ``metric``, kept in ``document.derived`` (live re-tracking reuses it)."""

    metric = metric or MetricParams()

    def compute():
        field_ = tensor_field_of(document, volume)
        return geodesic_field.prepare_metric(field_.tensor, field_.voxel_size, metric, device=device)

    return document.derived.get(volume, "geodesic_metric", (metric, device), compute)


def whole_brain_seeds(field_: TensorField, mask: np.ndarray | None, fa_threshold: float) -> np.ndarray:
    """Where whole-brain tracking seeds: the mask (or the fitted voxels) where FA ≥ the threshold."""
    region = field_.mask if mask is None else (mask & field_.mask)
    return region & (field_.fa >= fa_threshold)


def _tensor_seed_region(field_: TensorField, mask: np.ndarray | None, params) -> np.ndarray:
    seed_mask = whole_brain_seeds(field_, mask, params.fa_threshold)
    if not seed_mask.any():
        raise InputError(
            f"no voxel has FA ≥ {params.fa_threshold} inside the mask: nothing to seed",
            fix="Lower --fa-threshold or check the tensor input",
        )
    return seed_mask


@dataclass(frozen=True)
class TrackingEngine:
    """What :func:`deterministic_pipeline` tracks with: the tensor tracker by default; the fODF
    trackers (:mod:`.track_fod`) bring their own. ``prepare(field_, track_mask, stop_union)``
    gives what ``track`` (:func:`gpu.deterministic.track`'s signature) reads;
    ``seed_region(field_, mask, params)`` the whole-brain seed mask."""

    method: str
    prepare: Callable
    track: Callable
    seed_region: Callable


TENSOR_ENGINE = TrackingEngine(
    "deterministic",
    lambda f, mask, stop: deterministic.prepare_field(f.tensor, f.voxel_size, mask, stop),
    lambda *args, **kwargs: deterministic.track(*args, **kwargs),  # looked up at each run
    _tensor_seed_region,
)


def deterministic_pipeline(
    field_: TensorField,
    *,
    seed_mask: np.ndarray | None = None,
    seed_points: np.ndarray | None = None,
    whole_brain: bool = False,
    mask: np.ndarray | None = None,
    stop: Sequence[np.ndarray] = (),
    include: Sequence[np.ndarray] = (),
    exclude: Sequence[np.ndarray] = (),
    params: deterministic.DeterministicParams | None = None,
    seeds_per_voxel: int = SeedingParams.seeds_per_voxel,
    placement: str = SeedingParams.placement,
    rng_seed: int = SeedingParams.rng_seed,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    on_batch: Callable[[Tractogram], None] | None = None,
    notes: list[str] | None = None,
    name: str = "deterministic",
    max_batch: int | None = None,
    sink: Callable[[Tractogram], None] | None = None,
    engine: TrackingEngine = TENSOR_ENGINE,
) -> TrackResult:
    """Deterministic tracking on ``field_`` (see :mod:`gpu.deterministic` for the rules).

    Exactly one of ``seed_mask``, ``seed_points`` (voxel coordinates) and
    ``whole_brain`` chooses the seeds. ``include`` masks (waypoints, targets) must all be
    passed and ``exclude`` masks avoided; streamlines failing that are dropped batch by
    batch, before ``on_batch`` sees them.

    The streamlines come as tractogram parts of bounded size (:mod:`app.pipelines.track_parts`);
    with ``sink`` (e.g. :meth:`app.io.tractogram_stream.TractogramWriter.append`) each part goes
    there and none is kept (``result.tractogram`` is None), else they are joined at the end.
    ``engine`` (:class:`TrackingEngine`) is the tracker: the tensor's, or an fODF tracker of
    :mod:`.track_fod` (``field_`` then an fODF volume and ``params`` its parameters).

    Parameters
    ----------
    field_ : TensorField
        The tensors to track in (:func:`load_tensor_field`: a tensor file or folder, or a fit of a
        DWI series).
    seed_mask : numpy.ndarray, optional
        (X, Y, Z) bool on the field's grid: ``seeds_per_voxel`` seeds in every voxel.
    seed_points : numpy.ndarray, optional
        (N, 3) seeds in voxel coordinates.
    whole_brain : bool
        Seed every voxel of the mask whose FA reaches the threshold.
    mask : numpy.ndarray, optional
        Tracking mask: streamlines stop on leaving it (the fitted voxels without one).
    stop, include, exclude : sequence of numpy.ndarray
        Masks on the field's grid: stop regions, waypoints/targets that must all be passed,
        regions to avoid.
    params : DeterministicParams, optional
        Step (mm), FA threshold, maximum angle (degrees), lengths (mm), integrator, method.
    seeds_per_voxel, placement, rng_seed : int, str, int
        Seeds per seed voxel, ``random`` or ``grid`` placement, and the random seed: a run
        reproduces exactly on the same backend.
    device : {"auto", "cpu", "gpu"}
        Where to track.
    progress, cancelled, on_batch, sink : callable, optional
        ``progress(done, total)``, a cancellation check, a callback for each batch of kept
        streamlines as it comes (the window draws them), and a writer that takes the parts
        instead of keeping them.

    Returns
    -------
    TrackResult
        ``tractogram`` (voxel coordinates and the field's affine; FA per point as ``fa``,
        length in mm per streamline), the ``provenance`` (seeds, streamlines, why their ends
        stopped, timings, device) and ``notes`` for the user.

    Raises
    ------
    InputError
        Not exactly one seeding, masks off the field's grid, an unusable device.

    References
    ----------
    .. [1] Basser PJ, Pajevic S, Pierpaoli C, Duda J, Aldroubi A. In vivo fiber tractography
       using DT-MRI data. Magn Reson Med 44:625-632 (2000).
    .. [2] Weinstein D, Kindlmann G, Lundberg E. Tensorlines: advection-diffusion based
       propagation through diffusion tensor fields. IEEE Visualization (1999) 249-253.

    Examples
    --------
    Track the demo's arc bundle from its seed ROI, keeping what reaches its target:

    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_mask
    >>> from tractlens.app.pipelines.track import deterministic_pipeline, load_tensor_field
    >>> field = load_tensor_field(dwi=demo_path() / "dwi.nii.gz", device="cpu")  # fits the tensors
    >>> seed = load_mask(demo_path() / "roi_arc_seed.nii.gz")
    >>> target = load_mask(demo_path() / "roi_arc_target.nii.gz")
    >>> result = deterministic_pipeline(field, seed_mask=seed, include=[target], device="cpu")
    >>> tract = result.tractogram
    >>> len(tract) > 0, sorted(tract.point_scalars)
    (True, ['fa'])
    >>> result.provenance["streamlines"] == len(tract)
    True
    """
    params = params or deterministic.DeterministicParams()
    notes = list(field_.notes) + list(notes or [])
    if field_.not_positive_definite:
        notes.append("deterministic tracking follows their main eigenvector where FA is above the threshold")
    check_device(device)  # an unusable device (gpu forced, none there) is refused before any work
    shape = field_.shape
    if sum(x is not None and x is not False for x in (seed_mask, seed_points, whole_brain or None)) != 1:
        raise InputError("give exactly one of: a seed mask, seed points, or whole-brain seeding")
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != shape:
            raise InputError(f"the tracking mask has shape {mask.shape}, the tensor field {shape}")
        if not mask.any():
            raise InputError("the tracking mask is empty", fix="Give a mask with at least one voxel")
    try:
        if whole_brain:
            seed_mask = engine.seed_region(field_, mask, params)
        if seed_mask is not None:
            seed_mask = np.asarray(seed_mask, dtype=bool)
            if seed_mask.shape != shape:
                raise InputError(f"the seed mask has shape {seed_mask.shape}, the tensor field {shape}")
            if not seed_mask.any():
                raise InputError("the seed region is empty", fix="Paint or give a seed region with at least one voxel")
            seeds = seeds_in_mask(seed_mask, seeds_per_voxel, placement=placement, rng_seed=rng_seed)
        else:
            seeds = check_points(seed_points, shape)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if mask is not None and seed_mask is not None and not (seed_mask & mask).any():
        notes.append("the seed region lies entirely outside the tracking mask: no streamline can start")
    stop_union = np.logical_or.reduce([np.asarray(s, bool) for s in stop]) if len(stop) else None
    choice = decide_device(engine.method, len(seeds) * params.max_length_mm / params.step_mm, requested=device)
    device = choice.argument
    track_mask = mask if mask is not None else field_.mask
    tf = engine.prepare(field_, track_mask, stop_union)
    if choice.argument == "cpu":  # refused before any work when the host cannot hold it (app.memory_guard)
        _check_host_memory(engine, tf, seeds, params, max_batch, sink is None)

    parts: list[Tractogram] = []  # kept when there is no sink
    path_length = PathLength(field_.affine)
    stop_counts = np.zeros(len(STOP_REASONS), np.int64)
    counts = {"started": 0, "left_seed": 0, "long_enough": 0, "tracked": 0, "reached": 0, "filtered_out": 0}
    counts.update(streamlines=0, points=0)
    t0 = time.perf_counter()
    first_batch_s = None
    used: list = []  # the backends that ran (the GPU, then the CPU if it ran out of memory)

    to_file_only = sink is not None and on_batch is None and not (include or exclude)

    def start(engine_backend, first: int):
        """The batches over seeds[first:], numbered as seeds of the whole run."""
        used.append(engine_backend)
        shifted = None if progress is None else (lambda done, total: progress(first + done, first + total))
        scalars = device_scalars(engine_backend, field_, to_file_only)
        for part in engine.track(
            tf, seeds[first:], params, device=engine_backend, progress=shifted, cancelled=cancelled,
            max_batch=max_batch, scalars=scalars,
        ):  # fmt: skip
            part.seed_index = part.seed_index + first
            yield part
            del part  # not held while the next batch is tracked

    batches = batches_with_cpu_fallback(start, lambda b: b.provenance["seeds"], device, notes, "deterministic tracking")
    for batch in batches:
        counts["tracked"] += len(batch)
        for key in ("started", "left_seed", "long_enough"):
            counts[key] += int(batch.provenance.get(key, 0))
        if len(batch) and (include or exclude):
            selection = select_streamlines(batch.points, batch.offsets, list(include), list(exclude), device=used[-1])
            all_included = np.uint32((1 << len(include)) - 1)
            counts["reached"] += int(((selection.bits & all_included) == all_included).sum())
            counts["filtered_out"] += int((~selection.selected).sum())
            batch = batch.subset(selection.selected)
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t0
        stop_counts += np.bincount(batch.stop.ravel(), minlength=len(stop_counts))
        for piece in batch.pieces(PIECE_POINTS):  # a GPU batch can be a whole brain: bounded host work
            part = deterministic_part(piece, field_.fa, field_.affine, field_.shape, name, path_length)
            counts["streamlines"] += len(part)
            counts["points"] += part.n_points
            if sink is not None and len(part):
                sink(part)
            elif sink is None:
                parts.append(part)
            if on_batch is not None and len(part):
                on_batch(part)
        del batch, piece, part  # not held while the next batch is tracked
    track_s = time.perf_counter() - t0
    tractogram = None if sink is not None else join_parts(parts, to_tractogram(StreamlineBatch.empty(), field_, name))
    del parts
    provenance = {
        "method": engine.method,
        "parameters": asdict(params),
        "seeding": "whole brain" if whole_brain else ("mask" if seed_points is None else "points"),
        "seeds_per_voxel": seeds_per_voxel if seed_points is None else None,
        "seed_placement": placement if seed_points is None else None,
        "rng_seed": rng_seed,
        "backend": " then ".join(b.name for b in used),
        "device": " then ".join(b.device_name for b in used),
        "device_choice": choice.reason,
        "seeds": len(seeds),
        "streamlines_tracked": counts["tracked"],
        "streamlines_removed_by_rois": counts["filtered_out"],
        "streamlines": counts["streamlines"],
        "points": counts["points"],
        "tracking_s": track_s,
        "first_batch_s": first_batch_s,
        "seeds_per_s": len(seeds) / track_s if track_s > 0 else None,
        "stop_reasons": stop_reason_totals(stop_counts),
        "tensor": field_.source,
    }
    if counts["streamlines"] == 0:
        counts["seeds"] = len(seeds)
        provenance["empty_reason"] = empty_result_reason(counts, params, n_include=len(include))
        notes.append(f"0 streamlines: {provenance['empty_reason']}")
    return TrackResult(tractogram, provenance, notes)


def device_scalars(backend, field_: TensorField, to_file_only: bool) -> StreamlineScalars | None:
    """What the tracker computes before its points leave the device: on a GPU, FA per point and
    lengths; and the points' millimetres when they only go to a file (nothing on the host reads
    their voxel coordinates: no ROI filter, no window). None on the CPU (the host does it all)."""
    return StreamlineScalars(field_.fa, field_.affine, world=to_file_only) if backend.is_gpu else None


def _check_host_memory(engine: TrackingEngine, tf, seeds: np.ndarray, params, max_batch, kept: bool) -> None:
    """Estimate the job's host memory from a sample of its seeds, tracked on the CPU, and refuse it
    when that is not free."""
    from tractlens.gpu.host import host_threads

    from ..memory_guard import SAMPLE_SEEDS, check_host_memory, runtime_bytes, tracking_host_need

    if not len(seeds):
        return
    runtime = runtime_bytes("deterministic_loops")  # before the sample loads the compiled loop
    sample = seeds[np.unique(np.linspace(0, len(seeds) - 1, min(SAMPLE_SEEDS, len(seeds))).astype(np.int64))]
    points = sum(len(b.points) for b in engine.track(tf, sample, params, device="cpu"))
    batch = min(len(seeds), max_batch or max(4096, 1024 * host_threads()))
    need = tracking_host_need(
        points / len(sample), len(seeds), batch, tracking.batch_bytes(params), kept=kept, piece_points=PIECE_POINTS,
        runtime=runtime,
    )  # fmt: skip
    check_host_memory(need, "Seed fewer voxels or fewer seeds per voxel, write the streamlines to a file, or use a GPU")


def to_tractogram(batch: StreamlineBatch, field_: TensorField, name: str) -> Tractogram:
    """Streamlines in voxel coordinates of the tensor grid, with FA per point and length per streamline."""
    fa = trilinear(np, field_.fa[..., None], batch.points.astype(np.float64))[:, 0] if len(batch.points) else []
    segments = np.linalg.norm(np.diff(batch.points @ (field_.affine[:3, :3].T), axis=0), axis=1)
    lengths = np.zeros(len(batch))
    if len(batch):
        cumulative = np.concatenate([[0.0], np.cumsum(segments)])
        ends = batch.offsets[1:] - 1
        lengths = cumulative[ends] - cumulative[batch.offsets[:-1]]
    return Tractogram(
        batch.points,
        batch.offsets,
        affine=field_.affine,
        dimensions=field_.shape,
        point_scalars={"fa": np.asarray(fa, dtype=np.float32)},
        streamline_scalars={"length_mm": lengths.astype(np.float32)},
        name=name,
    )


def deterministic_from_regions(
    field_: TensorField, regions: Regions, *, whole_brain: bool = False, **options
) -> TrackResult:
    """Deterministic tracking with a document's ROIs in their roles (:mod:`app.regions`): seeds
    in the seed union (or the whole brain), every target and waypoint passed, the exclusion
    union avoided, the stop union ending streamlines. ``options`` go to
    :func:`deterministic_pipeline`."""
    if not whole_brain:
        require_seed(regions)
    return deterministic_pipeline(
        field_,
        seed_mask=None if whole_brain else regions.seed,
        whole_brain=whole_brain,
        stop=[] if regions.stop is None else [regions.stop],
        include=regions.must_pass,
        exclude=[] if regions.exclusion is None else [regions.exclusion],
        notes=list(regions.notes) + list(options.pop("notes", None) or []),
        **options,
    )
