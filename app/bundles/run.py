"""Use case: track the named bundles of a subject (``tractlens bundles``, Track ▸ Named bundles…).

:func:`run_bundles` warps each protocol's MNI regions to the subject grid through the MNI
registration (:mod:`.masks`), tracks every chosen bundle in one run with one engine (the data
loaded once; :mod:`.engines`), and writes OUTDIR (the layout of ``docs/bundles.md``):
``NAME.trx``, ``NAME_density.nii.gz`` (visitation / waytotal, XTRACT's ``density_norm``) and
``bundles.json``. A bundle whose regions miss the subject's brain, or that no streamline
completes, is reported by name with its counts (status ``regions-missed`` or ``empty``) and a
warning, never left silently empty. OUTDIR is built beside its final name and renamed into place:
bad input, a failure or a cancel leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..io import atomic_folder, save_tractogram, save_volume
from ..io.outputs import check_output_folder, check_replaceable_folder
from ..io.transforms import load_registration
from ..jobs import JobContext
from ..model import Tractogram
from ..params import BundleParams, FodProbabilisticParams, ProbParams
from .engines import BundleTrack, open_engine
from .masks import SubjectInMni, missed_regions, protocol_masks
from .protocols import bundle_names, choose_bundles, load_protocols, protocol_of

log = logging.getLogger("tractlens.bundles")

FORMAT = "tractlens-bundles"
VERSION = 1
SUMMARY_FILE = "bundles.json"


def bundle_files() -> tuple[str, ...]:
    """What a bundles folder holds: each named bundle's streamlines and density, and the summary
    (any other file in it is the user's, and keeps the folder from being replaced)."""
    return (*(f"{n}{ext}" for n in bundle_names() for ext in (".trx", "_density.nii.gz")), SUMMARY_FILE)


@dataclass
class BundleOutcome:
    """One bundle of a run: what bundles.json says of it, and its streamlines (None when missed)."""

    name: str
    status: str  # 'ok' | 'empty' | 'regions-missed'
    message: str
    record: dict
    tractogram: Tractogram | None = None
    seconds: float = 0.0  # warping its regions (waiting for them), tracking it, its density (not its writing)
    #: seconds per stage: regions_s, prepare_s, tracking_s, retrace_s (and retrace_trace_s, retrace_polylines_s,
    #: retrace_to_host_s), density_s, write_s (on the writer thread, beside the next bundle), and counts:
    #: launched (streamlines tracked), retraced (streamlines traced again for the kept sample)
    stages: dict = field(default_factory=dict)


@dataclass
class BundlesResult:
    output: Path
    summary: dict
    bundles: dict[str, BundleOutcome] = field(default_factory=dict)

    @property
    def problems(self) -> list[BundleOutcome]:
        return [b for b in self.bundles.values() if b.status != "ok"]


def _check_output(output: Path, inputs: tuple) -> None:
    """An output folder that can be written, and is new, empty or an earlier bundles folder (which
    is replaced whole) holding none of the inputs."""
    check_output_folder(output, "bundles folder")
    check_replaceable_folder(output, SUMMARY_FILE, "bundles folder", inputs, bundle_files())


def _write_trx(tractogram: Tractogram, path: Path) -> None:
    """The .trx with its zip entries dated 1980-01-01, so the same streamlines give the same bytes."""
    save_tractogram(tractogram, path)
    staged = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(staged, "w") as target:
        for info in source.infolist():
            fixed = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            fixed.compress_type, fixed.external_attr = info.compress_type, info.external_attr
            target.writestr(fixed, source.read(info.filename))
    os.replace(staged, path)


def _bundle_record(name, protocol, version, status, message, masks_voxels, track: BundleTrack | None, volume_mm3):
    return {
        "file": f"{name}.trx",
        "density": f"{name}_density.nii.gz",
        "streamlines": 0 if track is None else len(track.tractogram),
        "waytotal": 0 if track is None else track.waytotal,
        "tracked": 0 if track is None else track.tracked,
        "volume_mm3": volume_mm3,
        "status": status,
        "message": message,
        "region_voxels": masks_voxels,
        "colour": list(protocol.colour),
        "title": protocol.title,
        "notes": [] if track is None else track.notes,
        "tracking": {} if track is None else track.provenance,
        "protocol": protocol.record(version),
    }


def run_bundles(
    *,
    registration: str | os.PathLike,
    output: str | os.PathLike,
    samples: str | os.PathLike | None = None,
    fod: str | os.PathLike | None = None,
    tensor: str | os.PathLike | None = None,
    names: Sequence[str] | str | None = None,
    params: BundleParams | None = None,
    device: str = "auto",
    seed_rng: int | None = None,
    context: JobContext | None = None,
    prob_params: ProbParams | None = None,
    fod_params: FodProbabilisticParams | None = None,
) -> BundlesResult:
    """Track the named bundles ``names`` (None: all) of one subject and write OUTDIR.

    Exactly one of ``samples`` (bedpostX folder, or :class:`~app.io.BedpostSamples` already read:
    probabilistic engine), ``fod`` (fit-csd folder:
    iFOD1 on the fODF) or ``tensor`` (dtifit / fit-dti folder: deterministic tensor tracking).
    ``registration``: a ``tractlens register … mni`` folder (subject ↔ MNI152). ``seed_rng``
    seeds every random draw (the probabilistic engine's streams, the seed points), so the same
    inputs give the same files on the same engine; None takes ``prob_params.seed`` (0).
    ``context`` reports progress per bundle and is polled for cancellation. Raises
    :class:`~app.errors.InputError` for bad input, before anything is written."""
    params = params or BundleParams()
    prob_params = prob_params or ProbParams()
    fod_params = fod_params or FodProbabilisticParams()
    seed = prob_params.seed if seed_rng is None else int(seed_rng)
    if seed < 0:
        raise InputError(f"--seed-rng must be a non-negative integer, got {seed}")
    if prob_params.seed != seed:
        prob_params = ProbParams(**{**prob_params.__dict__, "seed": seed})
    context = context or JobContext()
    output = Path(output)
    chosen = choose_bundles(names)
    inputs = tuple(x for x in (samples, fod, tensor, registration) if isinstance(x, str | os.PathLike))
    _check_output(output, inputs)
    opened = time.perf_counter()
    reg = load_registration(registration)
    engine = open_engine(samples=samples, fod=fod, tensor=tensor, prob_params=prob_params, fod_params=fod_params,
                         bundle=params, device=device, rng_seed=seed)  # fmt: skip
    engine_s = time.perf_counter() - opened
    subject = SubjectInMni(reg, engine.grid, engine.brain)
    subject_s = time.perf_counter() - opened - engine_s
    protocols = load_protocols()
    t0 = time.perf_counter()
    with atomic_folder(output, SUMMARY_FILE, "bundles folder", inputs, bundle_files()) as staging:
        result = _track_all(chosen, engine, subject, params, protocols.version, staging, context)
        summary = {
            "format": FORMAT,
            "version": VERSION,
            "engine": engine.name,
            "device": next(
                (o.record["tracking"].get("device") for o in result.values() if o.record["tracking"].get("device")),
                device,
            ),
            "device_requested": device,
            "seed_rng": seed,
            "registration": str(registration),
            "registration_kind": reg.kind,
            "reference": engine.reference or None,
            "protocols_version": protocols.version,
            "protocols_adaptation": protocols.adaptation,
            "source": engine.describe(),
            "parameters": {k: getattr(params, k) for k in params.__dataclass_fields__},
            "bundles": {name: outcome.record for name, outcome in result.items()},
        }
        (staging / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    # times in the returned summary only (the CLI's --json): the file stays the same from run to run
    # engine: reading the registration and the data, the samples' field and its upload; subject: the brain in MNI
    summary["seconds"] = {"total": time.perf_counter() - opened, "engine": engine_s, "subject": subject_s,
                          "engine_stages": dict(getattr(engine, "stages", {})), "bundles": time.perf_counter() - t0, **{n: o.seconds for n, o in result.items()}}  # fmt: skip
    summary["stages"] = {n: o.stages for n, o in result.items()}
    return BundlesResult(output, summary, result)


def _track_all(chosen, engine, subject, params, version, folder: Path, context: JobContext) -> dict[str, BundleOutcome]:
    """Track the bundles one after the other. The regions of every chosen bundle are warped on
    worker threads from the start (a bundle waits only for its own), and each bundle's files are
    written on a thread while the next is tracked (the GPU need not wait for the compression of a
    density or a .trx)."""
    workers = max(1, min(8, (os.cpu_count() or 2) - 1))
    with (
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="bundle-writer") as writer,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bundle-regions") as regions,
    ):
        for name in chosen:
            subject.prefetch(protocol_of(name).shapes(), regions)
        written: dict = {}
        try:
            outcomes = _track_each(chosen, engine, subject, params, version, folder, context, writer, written)
        finally:
            regions.shutdown(wait=True, cancel_futures=True)
        for name, future in written.items():
            outcomes[name].stages["write_s"] = future.result()  # a failed write fails the run (the staging goes)
    context.progress(len(chosen), len(chosen), "done")
    return outcomes


def _write_bundle(tractogram: Tractogram, density: np.ndarray, affine: np.ndarray, folder: Path, name: str) -> float:
    """Write the bundle's .trx and density; the seconds it took (on the writer thread)."""
    t0 = time.perf_counter()
    _write_trx(tractogram, folder / f"{name}.trx")
    save_volume(density, affine, folder / f"{name}_density.nii.gz", dtype=np.float32)
    return time.perf_counter() - t0


def _track_each(chosen, engine, subject, params, version, folder, context, writer, written) -> dict[str, BundleOutcome]:
    outcomes: dict[str, BundleOutcome] = {}
    voxel_mm3 = float(abs(np.linalg.det(engine.grid.affine[:3, :3])))
    for number, name in enumerate(chosen):
        started = time.perf_counter()
        context.check()
        context.progress(number, len(chosen), name)
        protocol = protocol_of(name)
        masks = protocol_masks(protocol, subject, engine.brain, params.region_threshold)
        missed = missed_regions(masks)
        regions_s = time.perf_counter() - started
        track = None
        if missed:
            status = "regions-missed"
            message = (
                f"{name}: the {' and the '.join(missed)} region(s) hold no voxel of the subject's brain after warping "
                f"({', '.join(f'{k} {v}' for k, v in masks.voxels.items())} voxels); nothing was tracked. "
                "Check the registration to MNI and the brain mask (a lesion or a cropped field of view)"
            )
        else:
            track = engine.track(masks, name, cancelled=context.cancelled)
            if track.waytotal == 0:
                status = "empty"
                message = (
                    f"{name}: no streamline of {track.tracked} passed every target while avoiding the exclusion "
                    f"region ({', '.join(f'{k} {v}' for k, v in masks.voxels.items())} voxels)"
                )
            else:
                status, message = "ok", ""
        t_density = time.perf_counter()
        visitation = np.zeros(engine.grid.shape) if track is None else track.visitation
        density = (visitation / track.waytotal if track is not None and track.waytotal else visitation).astype(
            np.float32
        )
        volume_mm3 = float((density >= params.volume_threshold).sum() * voxel_mm3) if track and track.waytotal else 0.0
        tractogram = track.tractogram if track is not None else Tractogram.from_list(
            [], affine=engine.grid.affine, dimensions=engine.grid.shape, name=name
        )  # fmt: skip
        density_s = time.perf_counter() - t_density
        written[name] = writer.submit(_write_bundle, tractogram, density, engine.grid.affine, folder, name)
        if status != "ok":
            log.warning(message)
        record = _bundle_record(name, protocol, version, status, message, masks.voxels, track, round(volume_mm3, 3))
        kept = tractogram if status == "ok" else None
        stages = {"regions_s": regions_s, **(track.stages if track is not None else {}), "density_s": density_s}
        outcomes[name] = BundleOutcome(name, status, message, record, kept, time.perf_counter() - started, stages)
    return outcomes
