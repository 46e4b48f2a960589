"""Use case: probabilistic tractography from a bedpostX folder, probtrackx style.

Shared by ``tractlens track probabilistic``, the GUI's probabilistic panel and Python
scripts. Masks on another grid than the samples are resampled to it (nearest neighbour)
with a notice. The ROI roles mean what :mod:`app.regions` says: each target is a
classification target of its own (``seeds_to_{target}``), the waypoints are passed as
``waycond`` says, exclusion and stop are unions (:func:`prepare_from_regions`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import BackendError, get_backend, gpu_backends
from tractlens.gpu.ballstick import angles_to_vectors
from tractlens.gpu.engines import decide_device
from tractlens.gpu.probabilistic import iter_track, largest_batch, path_positions, trace_kept
from tractlens.gpu.probabilistic_kernel import upload_field
from tractlens.gpu.probabilistic_params import (
    MAX_TARGETS,
    MAX_WAYPOINTS,
    ProbParams,
    ProbResult,
    SampleField,
    check_seed_matrix,
    mask_bits,
)
from tractlens.gpu.probabilistic_split import track_split

from ..errors import InputError
from ..io import BedpostSamples, bedpostx_cache, load_bedpostx, save_volume
from ..io._atomic import atomic_path, split_suffix, write_text_atomic
from ..io.dwi import x_flip_needed
from ..io.output_set import output_set
from ..model import Tractogram
from ..provenance import write_json_summary
from ..regions import Regions
from ..timing import phase
from ._fallback import batches_with_cpu_fallback
from .select import load_masks_on_reference
from .warmup import join_background_warmup

#: Files written by :func:`write_probabilistic_outputs` ({target}: the target file's stem).
PROB_OUTPUTS = {
    "fdt_paths.nii.gz": "path distribution: kept streamlines visiting each voxel (each counts a voxel once)",
    "waytotal": "kept streamlines (after exclusion and waypoints)",
    "seeds_to_{target}.nii.gz": "per seed voxel, kept streamlines reaching the target",
    "matrix_seeds_to_all_targets.csv": "seed voxels (i, j, k) × targets, the same counts (also .npy)",
    "matrix_seeds_to_seeds.npy": "with --seed-matrix: seed × seed counts, kept streamlines from seed voxel a "
    "visiting seed voxel b (rows in the order of matrix_seeds_to_all_targets.csv)",
    "matrix_seeds_to_seeds.csv": "the same, non-zero entries only: i_a, j_a, k_a, i_b, j_b, k_b, count",
    "probtrackx.json": "summary: parameters, masks, counts, timings, device",
}


__all__ = [
    "PROB_OUTPUTS",
    "ProbParams",
    "ProbResult",
    "ProbabilisticRun",
    "device_field_of",
    "max_batch_streamlines",
    "prepare_from_regions",
    "prepare_probabilistic",
    "prepare_probabilistic_masks",
    "sample_field",
    "sample_field_of",
    "summarise",
    "write_probabilistic_outputs",
]


def sample_field_of(document, volume) -> SampleField:
    """The engine's field of a dyads volume's posterior samples (``volume.samples``), made once
    per volume and kept in ``document.derived`` while the volume lives (it is the costly part)."""
    return document.derived.get(volume, "sample_field", None, lambda: sample_field(volume.samples))


def device_field_of(document, volume, device: str) -> tuple | None:
    """The field of a dyads volume's samples on the GPU of ``device`` (:func:`upload_field`),
    copied once per volume and kept in ``document.derived`` while the volume lives, so that
    re-tracking (the live mode's every stroke) copies no gigabytes; None when it does not fit
    (each run then copies what it needs, or falls back to the CPU)."""
    backend = get_backend(device)

    def upload():
        try:
            return upload_field(backend, sample_field_of(document, volume))
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            backend.free_cached_memory()
            return None

    return document.derived.get(volume, "sample_field_device", backend.device_name, upload)


def max_batch_streamlines(n_voxels: int, device: str = "auto") -> int:
    """The most streamlines one batch may hold on ``device`` (:func:`gpu.probabilistic.largest_batch`):
    the engine's own batch on a GPU or with the compiled CPU loop, what the NumPy reference's
    visited-voxel bitmap allows over ``n_voxels`` voxels without numba."""
    return largest_batch(n_voxels, get_backend(device))


def sample_field(samples: BedpostSamples) -> SampleField:
    """bedpostX samples (FSL frame) as the engine's field: stick directions in voxel axes.
    Samples from the bedpostX cache keep their field beside them once made (the same arrays,
    mapped: a later run skips the trigonometry and reordering of every sample)."""

    voxel_size = np.sqrt((samples.affine[:3, :3] ** 2).sum(axis=0))
    entry = getattr(samples, "cache_entry", None)
    n, n_fibres, n_samples = int(samples.mask.sum()), samples.n_fibres, samples.n_samples
    shapes = {
        "field_dirs": (n, n_samples, n_fibres, 3),
        "field_f": (n, n_samples, n_fibres),
        "field_index": samples.mask.shape,
    }
    if entry is not None and (kept := bedpostx_cache.load_derived(entry, shapes)) is not None:
        return SampleField(kept["field_dirs"], kept["field_f"], kept["field_index"], voxel_size)
    field_ = _sample_field(samples, voxel_size)
    derived = {"field_dirs": field_.dirs, "field_f": field_.f, "field_index": field_.index}
    pending = getattr(samples, "pending_cache", None)
    if entry is not None:
        bedpostx_cache.save_derived(entry, derived)
    elif pending is not None:  # a first read: kept beside the entry once it is written behind the read
        pending.when_ready(lambda published: bedpostx_cache.save_derived(published, derived))
    return field_


#: Voxels converted at a time by :func:`_sample_field`'s threads (~30 MB of samples each).
FIELD_BLOCK = 16384


def _sample_field(samples: BedpostSamples, voxel_size: np.ndarray) -> SampleField:
    """The field made in blocks of voxels on threads (NumPy lets go of the GIL for its array work;
    the sines and cosines of a whole HCP brain's 150 M sticks take a core several seconds). Each
    block is the same element-wise arithmetic as the whole at once, so the field is the same."""
    mask = samples.mask
    inside = np.flatnonzero(mask)
    n, n_fibres, n_samples = len(inside), samples.n_fibres, samples.n_samples
    dirs = np.empty((n, n_samples, n_fibres, 3), dtype=np.float32)
    f = np.empty((n, n_samples, n_fibres), dtype=np.float32)
    flip = x_flip_needed(samples.affine)

    def block(start: int) -> None:
        ijk = np.unravel_index(inside[start : start + FIELD_BLOCK], mask.shape)
        vectors = angles_to_vectors(np, samples.theta[ijk], samples.phi[ijk]).astype(np.float32)  # (b, L, S, 3)
        if flip:
            vectors[..., 0] *= -1.0
        dirs[start : start + FIELD_BLOCK] = vectors.transpose(0, 2, 1, 3)
        f[start : start + FIELD_BLOCK] = samples.f[ijk].transpose(0, 2, 1)

    starts = range(0, n, FIELD_BLOCK)
    workers = max(1, min(16, os.cpu_count() or 1, len(starts)))
    if workers == 1:
        for start in starts:
            block(start)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sample-field") as pool:
            for done in [pool.submit(block, start) for start in starts]:
                done.result()
    index = np.full(mask.shape, -1, dtype=np.int32)
    index[mask] = np.arange(n, dtype=np.int32)
    return SampleField(dirs, f, index, voxel_size)


@dataclass
class ProbabilisticRun:
    """A prepared run: the field, the mask bits, the seeds, and what the masks were."""

    samples: BedpostSamples
    field: SampleField
    bits: np.ndarray
    seeds: np.ndarray  # (n, 3) seed voxels
    targets: list[str]
    n_waypoints: int
    params: ProbParams
    notes: list[str] = field(default_factory=list)
    seed_matrix: bool = False  # also count seed x seed (probtrackx's matrix1)

    def run(
        self,
        *,
        device: str = "auto",
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        batch_streamlines: int | None = None,
        first_batch: int | None = None,
        device_field=None,
    ) -> Iterator[ProbResult]:
        """Running totals after each batch (see :func:`gpu.probabilistic.iter_track`;
        ``batch_streamlines`` sets how often they come, ``first_batch`` the size of a coarse
        first one; ``device_field``: the field already on the GPU, used when the run is there). If the GPU runs out of memory even
        for the smallest batch and ``device`` is ``"auto"``, the run starts again on the CPU
        (running totals cannot be carried from one engine's streams to the other's batches
        mid-way; the CPU totals restart from zero) and a note says so in ``notes``."""
        work = len(self.seeds) * self.params.n_samples * self.params.n_steps
        choice = decide_device("probabilistic", work, requested=device)

        def start(backend, _first: int):
            return iter_track(
                self.field,
                self.bits,
                self.seeds,
                self.params,
                n_targets=len(self.targets),
                n_waypoints=self.n_waypoints,
                device=backend,
                progress=progress,
                cancelled=cancelled,
                batch_streamlines=batch_streamlines,
                seed_matrix=self.seed_matrix,
                first_batch=first_batch,
                device_field=device_field if backend.is_gpu else None,
            )

        for totals in batches_with_cpu_fallback(
            start, lambda _totals: 0, choice.argument, self.notes, "probabilistic tracking"
        ):
            totals.provenance["device_choice"] = choice.reason
            yield totals

    def paths_tractogram(
        self,
        most: int = 10_000,
        *,
        device: str = "auto",
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        device_field=None,
        most_kept: int | None = None,
        timings: dict | None = None,
    ) -> tuple[Tractogram, int]:
        """The kept streamlines among ``most`` of the run's (all when there are fewer; else the
        first samples of every seed voxel alike), traced again with the run's random streams: (tractogram on the
        samples' grid with the per-streamline ``seed_voxel`` number, streamlines traced). ``most_kept``: only the
        first that many kept ones (the tracing stops there). ``device_field``: the samples already on the GPU
        (:func:`gpu.probabilistic_kernel.upload_field`). ``timings``: seconds per stage added to it
        (:func:`gpu.probabilistic.trace_kept`)."""
        total = len(self.seeds) * self.params.n_samples
        positions = path_positions(total, most)
        points, offsets, seed_of, traced = trace_kept(
            self.field,
            self.bits,
            self.seeds,
            self.params,
            positions,
            most_kept=most_kept,
            n_waypoints=self.n_waypoints,
            device=device,
            progress=progress,
            cancelled=cancelled,
            device_field=device_field if get_backend(device).is_gpu else None,
            timings=timings,
        )
        tract = Tractogram(
            points,
            offsets,
            affine=self.samples.affine,
            dimensions=self.samples.mask.shape,
            streamline_scalars={"seed_voxel": seed_of.astype(np.float32)},
            name="probabilistic paths",
        )
        return tract, traced if most_kept is not None else len(positions)

    def track(self, *, gpus: int = 1, **options) -> ProbResult:
        """The final totals of :meth:`run` (same options); with ``gpus`` > 1 the run is shared
        out over that many GPUs (:meth:`track_on_gpus`)."""
        if gpus > 1:
            options.pop("device", None)
            options.pop("batch_streamlines", None)
            return self.track_on_gpus(gpus, **options)
        return deque(self.run(**options), maxlen=1)[0]  # the seed mask is never empty

    def track_on_gpus(
        self,
        gpus: int,
        *,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        backends=None,
    ) -> ProbResult:
        """The run split over the first ``gpus`` GPUs of this host (:mod:`gpu.probabilistic_split`):
        chunks of streamlines handed out as the GPUs ask, the totals added on the first GPU; the
        same counts as on one GPU. A GPU that fails is named; its share is tracked on the
        others (a note says so) or, with none left, the run stops with that message and nothing
        is written. ``backends`` replaces the GPUs (tests share one device, or simulated GPUs)."""

        try:
            backends = backends or gpu_backends(gpus)
        except BackendError as exc:
            raise InputError(str(exc), fix="Give --gpus at most the number of GPUs here (tractlens info)") from None
        t0 = time.perf_counter()
        result = track_split(
            self.field, self.bits, self.seeds, self.params, backends, n_targets=len(self.targets),
            n_waypoints=self.n_waypoints, seed_matrix=self.seed_matrix, progress=progress, cancelled=cancelled,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        self.notes.extend(result.provenance.pop("notes", []))  # a device that failed, named
        names = sorted({b.device_name for b in backends})
        result.provenance.update(
            backend=backends[0].name,
            device=f"{len(backends)} × " + ", ".join(names),
            gpus=len(backends),
            tracking_s=seconds,
            streamlines_per_s=result.streamlines / seconds if seconds > 0 else None,
        )
        return result


def prepare_probabilistic(
    samples_dir: str | os.PathLike,
    seed: str | os.PathLike,
    *,
    targets: Sequence[str | os.PathLike] = (),
    waypoints: Sequence[str | os.PathLike] = (),
    exclude: str | os.PathLike | None = None,
    stop: str | os.PathLike | None = None,
    params: ProbParams | None = None,
    seed_matrix: bool = False,
) -> ProbabilisticRun:
    """Load the bedpostX folder and the mask files, check them, and build the engine's inputs."""
    with phase("read"):
        samples = load_bedpostx(samples_dir)
    if len(targets) > MAX_TARGETS or len(waypoints) > MAX_WAYPOINTS:
        raise InputError(f"at most {MAX_TARGETS} targets and {MAX_WAYPOINTS} waypoint masks")
    notes: list[str] = []
    grid = (samples.affine, samples.mask.shape)

    def masks(paths, what):
        return load_masks_on_reference(list(paths), what, *grid, notes) if paths else []

    names = [split_suffix(Path(t))[0] for t in targets]
    if len(set(names)) != len(names):
        raise InputError("two target masks have the same file name; their outputs would collide")
    seed_mask = masks([seed], "seed mask")[0]
    regions = {
        "targets": list(zip(names, masks(targets, "target mask"), strict=True)),
        "waypoints": masks(waypoints, "waypoint mask"),
        "exclude": masks([exclude], "exclusion mask")[0] if exclude else None,
        "stop": masks([stop], "stop mask")[0] if stop else None,
    }
    join_background_warmup()  # the files are read: the GPU start-up (if any) is waited for here
    return prepare_probabilistic_masks(
        samples, seed_mask, **regions, params=params, notes=notes, seed_name=str(seed), seed_matrix=seed_matrix
    )


def prepare_probabilistic_masks(
    samples: BedpostSamples,
    seed_mask: np.ndarray,
    *,
    targets: Sequence[tuple[str, np.ndarray]] = (),
    waypoints: Sequence[np.ndarray] = (),
    exclude: np.ndarray | None = None,
    stop: np.ndarray | None = None,
    params: ProbParams | None = None,
    notes: list[str] | None = None,
    seed_name: str = "seed",
    field_: SampleField | None = None,
    seed_matrix: bool = False,
) -> ProbabilisticRun:
    """The engine's inputs from masks already on the samples' grid (the GUI's ROI layers,
    resampled): ``targets`` as (name, mask) pairs. ``field_``: the samples' field when the
    caller keeps one (it is the large part)."""
    params = params or ProbParams()
    notes = list(notes or [])
    shape = samples.mask.shape
    named = [("seed mask", seed_mask), *((f"target {n}", m) for n, m in targets)]
    named += [(f"waypoint mask {i + 1}", m) for i, m in enumerate(waypoints)]
    named += [(what, m) for what, m in (("exclusion mask", exclude), ("stop mask", stop)) if m is not None]
    for what, mask in named:
        if np.shape(mask) != shape:
            raise InputError(f"the {what} has shape {np.shape(mask)}, not the samples' grid {shape}")
    if len(targets) > MAX_TARGETS or len(waypoints) > MAX_WAYPOINTS:
        raise InputError(f"at most {MAX_TARGETS} targets and {MAX_WAYPOINTS} waypoint masks")
    names = [name for name, _ in targets]
    if len(set(names)) != len(names):
        raise InputError("two target masks have the same name; their outputs would collide")
    seed_mask = np.asarray(seed_mask, dtype=bool)
    if not seed_mask.any():
        raise InputError("the seed mask is empty", path=seed_name, fix="Give (or paint) a non-empty seed region")
    # count_nonzero and flatnonzero, not sum and argwhere: 15 ms less of every live stroke on an HCP grid
    outside = int(np.count_nonzero(seed_mask & ~samples.mask))
    if outside == int(np.count_nonzero(seed_mask)):
        raise InputError(
            "no seed voxel lies inside the bedpostX brain mask (nodif_brain_mask)",
            path=seed_name,
            fix="Check that the seed mask belongs to this subject and space",
        )
    if outside:
        notes.append(f"{outside} seed voxel(s) lie outside the brain mask; their streamlines end at once")
    bits = mask_bits(samples.mask, exclude, stop, list(waypoints), [m for _, m in targets])
    seeds = np.stack(np.unravel_index(np.flatnonzero(seed_mask), shape), axis=1)  # as argwhere: C order
    if seed_matrix:
        try:
            check_seed_matrix(len(seeds))
        except ValueError as exc:
            raise InputError(str(exc), path=seed_name) from None
    field_ = field_ or sample_field(samples)
    return ProbabilisticRun(samples, field_, bits, seeds, names, len(waypoints), params, notes, seed_matrix)


def prepare_from_regions(
    samples: BedpostSamples,
    regions: Regions,
    *,
    params: ProbParams | None = None,
    field_: SampleField | None = None,
    seed_matrix: bool = False,
) -> ProbabilisticRun:
    """:func:`prepare_probabilistic_masks` with a document's ROIs in their roles
    (:mod:`app.regions`, on the samples' grid): the seed union, one named target per target
    ROI, one waypoint mask per waypoint ROI, the exclusion and stop unions."""
    if regions.seed is None:
        raise InputError(
            "no seed ROI lies on the samples' grid" + (": " + " ".join(regions.notes) if regions.notes else ""),
            fix="Paint or open a seed ROI inside the image",
        )
    return prepare_probabilistic_masks(
        samples,
        regions.seed,
        targets=[(region.name, region.mask) for region in regions.targets],
        waypoints=[region.mask for region in regions.waypoints],
        exclude=regions.exclusion,
        stop=regions.stop,
        params=params,
        notes=list(regions.notes),
        seed_name=f"seed ROI {', '.join(regions.seed_names)}",
        field_=field_,
        seed_matrix=seed_matrix,
    )


def write_probabilistic_outputs(run: ProbabilisticRun, result: ProbResult, outdir: str | os.PathLike) -> dict[str, str]:
    """Write :data:`PROB_OUTPUTS` into ``outdir`` as one set (an earlier run's targets and
    matrices do not stay beside this run's: :func:`~app.io.output_set.output_set`)."""
    final = Path(outdir)
    templates = (*PROB_OUTPUTS, "matrix_seeds_to_all_targets.npy", "matrix_seeds_to_seeds.csv", "probtrackx.json")
    with output_set(final, "probtrackx.json", templates) as stage:
        names = _write_probabilistic_files(run, result, stage, final)
    return {name: str(final / name) for name in names}


def _write_probabilistic_files(run: ProbabilisticRun, result: ProbResult, out: Path, final: Path) -> list[str]:
    aff = run.samples.affine
    files = {"fdt_paths.nii.gz": save_volume(result.paths.astype(np.float32), aff, out / "fdt_paths.nii.gz")}
    files["waytotal"] = write_text_atomic(f"{result.waytotal}\n", out / "waytotal")
    for j, name in enumerate(run.targets):
        volume = np.zeros(run.samples.mask.shape, dtype=np.float32)
        volume[tuple(run.seeds.T)] = result.seed_targets[:, j]
        files[f"seeds_to_{name}.nii.gz"] = save_volume(volume, aff, out / f"seeds_to_{name}.nii.gz")
    if run.targets:
        table = np.concatenate([run.seeds, result.seed_targets], axis=1)
        with atomic_path(out / "matrix_seeds_to_all_targets.csv") as tmp:
            np.savetxt(tmp, table, fmt="%d", delimiter=",", header=",".join(["i", "j", "k", *run.targets]), comments="")
        with atomic_path(out / "matrix_seeds_to_all_targets.npy") as tmp:
            np.save(tmp, result.seed_targets)
        files["matrix_seeds_to_all_targets.csv"] = out / "matrix_seeds_to_all_targets.csv"
        files["matrix_seeds_to_all_targets.npy"] = out / "matrix_seeds_to_all_targets.npy"
    if result.seed_matrix is not None:
        with atomic_path(out / "matrix_seeds_to_seeds.npy") as tmp:
            np.save(tmp, result.seed_matrix)
        a, b = np.nonzero(result.seed_matrix)
        rows = np.concatenate([run.seeds[a], run.seeds[b], result.seed_matrix[a, b][:, None]], axis=1)
        with atomic_path(out / "matrix_seeds_to_seeds.csv") as tmp:
            header = "i_a,j_a,k_a,i_b,j_b,k_b,count"
            np.savetxt(tmp, rows, fmt="%d", delimiter=",", header=header, comments="")
        files["matrix_seeds_to_seeds.npy"] = out / "matrix_seeds_to_seeds.npy"
        files["matrix_seeds_to_seeds.csv"] = out / "matrix_seeds_to_seeds.csv"
    summary = summarise(run, result)
    files["probtrackx.json"] = write_json_summary(summary, out / "probtrackx.json", inputs=(run.samples.path or None,),
                                                  call=("tractlens.write_probabilistic_outputs", "<result>", str(final)))  # fmt: skip
    return list(files)


def summarise(run: ProbabilisticRun, result: ProbResult) -> dict:
    return {
        "seed_voxels": len(run.seeds),
        "streamlines": result.streamlines,
        "waytotal": result.waytotal,
        "mean_steps_per_streamline": round(result.steps / result.streamlines, 1) if result.streamlines else 0,
        "targets": {name: int(result.seed_targets[:, j].sum()) for j, name in enumerate(run.targets)},
        "waypoints": run.n_waypoints,
        "notes": run.notes,
        **result.provenance,
    }
