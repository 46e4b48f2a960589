"""The three engines named bundles are tracked with, behind one interface.

An engine holds the subject's data, loaded once for every bundle of a run (the posterior samples'
field, and on a GPU its upload; the tensor field; the fODF), and tracks one bundle's masks at a
time (:meth:`Engine.track`), giving a :class:`BundleTrack`: the streamlines kept, the visitation
map (kept streamlines visiting each voxel, each counted once) and the waytotal.

- ``probabilistic`` (bedpostX samples; :mod:`app.pipelines.probabilistic`, probtrackx style):
  seeds in the seed region, every target a waypoint (AND), the exclusion avoided, the stop
  region ending streamlines; the visitation is probtrackx's ``fdt_paths``, the waytotal the kept
  streamlines. The kept streamlines written are a sample: the first ones of the run's order
  (the first samples of every seed voxel alike), traced again with the run's random streams, up
  to ``keep_streamlines``.
- ``fod`` (fit-csd's fODF, iFOD1 probabilistic streamlines) and ``deterministic`` (a tensor):
  ``seeds_per_voxel`` seeds per seed voxel, every target to be passed, the exclusion avoided,
  the stop region ending streamlines (:func:`app.pipelines.track.deterministic_pipeline`); every
  kept streamline is written and the visitation is counted from them
  (:func:`app.envelopes.streamline_visitation`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import get_backend

from ..envelopes import streamline_visitation
from ..errors import InputError
from ..grid import Grid
from ..io import BedpostSamples, load_bedpostx
from ..model import Tractogram
from ..params import BundleParams, DeterministicParams, FodProbabilisticParams, ProbParams
from ..pipelines.probabilistic import prepare_probabilistic_masks, sample_field
from .masks import ProtocolMasks

ENGINES = ("probabilistic", "fod", "deterministic")
#: Provenance that changes from run to run (timings, free memory): kept out of bundles.json, so the same inputs
#: give the same bytes; the run's returned summary has the times.
TIMING_KEYS = ("tracking_s", "streamlines_per_s", "first_batch_s", "seeds_per_s", "device_choice")


def _steady(provenance: dict) -> dict:
    return {k: v for k, v in provenance.items() if k not in TIMING_KEYS and k != "params"}


@dataclass
class BundleTrack:
    """One bundle tracked: streamlines kept (all, or a sample), visitation, counts."""

    tractogram: Tractogram
    visitation: np.ndarray  # (X, Y, Z) float, kept streamlines visiting each voxel
    waytotal: int  # kept streamlines
    tracked: int  # streamlines started
    notes: list[str] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)  # seconds per stage ('..._s') and counts; not in bundles.json


class Engine:
    """The data of one subject and how to track a bundle in it."""

    name = ""
    grid: Grid
    brain: np.ndarray
    reference: str  # the file whose grid the outputs are on

    def track(self, masks: ProtocolMasks, name: str, *, progress=None, cancelled=None) -> BundleTrack:
        raise NotImplementedError

    def describe(self) -> dict:
        return {}


class ProbabilisticEngine(Engine):
    name = "probabilistic"

    def __init__(self, path, params: ProbParams, bundle: BundleParams, device: str):
        t0 = time.perf_counter()
        self.samples = path if isinstance(path, BedpostSamples) else load_bedpostx(path)
        t1 = time.perf_counter()
        self.params, self.bundle, self.device = params, bundle, device
        self.grid = Grid(self.samples.affine, self.samples.mask.shape)
        self.brain = np.asarray(self.samples.mask, dtype=bool)
        folder = str(getattr(self.samples, "path", "") or ("" if isinstance(path, BedpostSamples) else path))
        masks = sorted(Path(folder).glob("nodif_brain_mask.nii*")) if folder and Path(folder).is_dir() else []
        self.reference = str(masks[0]) if masks else folder  # the samples' grid as an image
        self.samples_path = folder
        self.field = sample_field(self.samples)
        t2 = time.perf_counter()
        self.backend = get_backend(device)
        self.device_field = None
        if self.backend.is_gpu:  # one upload of the samples for every bundle of the run
            from tractlens.gpu.probabilistic_kernel import upload_field

            self.device_field = upload_field(self.backend, self.field)
            self.backend.synchronize()
        self.stages = {"read_s": t1 - t0, "field_s": t2 - t1, "upload_s": time.perf_counter() - t2}

    def track(self, masks, name, *, progress=None, cancelled=None) -> BundleTrack:
        t0 = time.perf_counter()
        run = prepare_probabilistic_masks(
            self.samples, masks.seed & self.brain, waypoints=masks.targets, exclude=masks.exclude, stop=masks.stop,
            params=self.params, seed_name=f"{name} seed region", field_=self.field,
        )  # fmt: skip
        t1 = time.perf_counter()
        result = run.track(device=self.device, progress=progress, cancelled=cancelled, device_field=self.device_field)
        t2 = time.perf_counter()
        keep = self.bundle.keep_streamlines
        stages = {"prepare_s": t1 - t0, "tracking_s": t2 - t1, "launched": int(result.streamlines), "retraced": 0}
        tractogram = Tractogram.from_list([], affine=self.grid.affine, dimensions=self.grid.shape, name=name)
        if result.waytotal:
            # the first `keep` kept streamlines of the run's order, traced again among its first `most`
            most = min(result.streamlines, math.ceil(keep * result.streamlines / result.waytotal * 1.2) + 64)
            timings: dict = {}
            tractogram, stages["retraced"] = run.paths_tractogram(
                most, device=self.device, cancelled=cancelled, device_field=self.device_field, most_kept=keep,
                timings=timings,
            )  # fmt: skip
            stages.update({f"retrace_{k}": v for k, v in timings.items()})
        stages["retrace_s"] = time.perf_counter() - t2
        tractogram.name = name
        provenance = _steady(result.provenance)
        return BundleTrack(tractogram, result.paths.astype(np.float64), int(result.waytotal), int(result.streamlines),
                           list(run.notes), provenance, stages)  # fmt: skip

    def describe(self) -> dict:
        return {
            "samples": self.samples_path,
            "parameters": {f.name: getattr(self.params, f.name) for f in fields(self.params)},
        }


class StreamlineEngine(Engine):
    """The fODF and tensor engines: every kept streamline, visitation counted from them."""

    def __init__(
        self, kind: str, path, params: FodProbabilisticParams, bundle: BundleParams, device: str, rng_seed: int
    ):
        self.name, self.bundle, self.device, self.rng_seed = kind, bundle, device, rng_seed
        if kind == "fod":
            from ..pipelines.track_fod import load_fod_volume

            self.volume = load_fod_volume(path, device="cpu")
            self.params = params
        else:
            from ..pipelines.track import load_tensor_field

            self.volume = load_tensor_field(tensor=path, device=device)
            shared = {f.name for f in fields(DeterministicParams)} & {f.name for f in fields(params)}
            self.params = DeterministicParams(**{n: getattr(params, n) for n in shared})
        self.grid = Grid(self.volume.affine, self.volume.shape)
        self.brain = np.asarray(self.volume.mask, dtype=bool)
        self.reference = str(self.volume.source).split(" (")[0] or str(path)

    def track(self, masks, name, *, progress=None, cancelled=None) -> BundleTrack:
        t0 = time.perf_counter()
        options = dict(
            seed_mask=masks.seed & self.brain, include=masks.targets,
            exclude=[] if masks.exclude is None else [masks.exclude], stop=[] if masks.stop is None else [masks.stop],
            seeds_per_voxel=self.bundle.seeds_per_voxel, rng_seed=self.rng_seed, device=self.device,
            progress=progress, cancelled=cancelled, name=name,
        )  # fmt: skip
        if self.name == "fod":
            from ..pipelines.track_fod import fod_tracking_pipeline

            result = fod_tracking_pipeline(self.volume, params=self.params, **options)
        else:
            from ..pipelines.track import deterministic_pipeline

            result = deterministic_pipeline(self.volume, params=self.params, **options)
        tractogram = result.tractogram
        tractogram.name = name
        t1 = time.perf_counter()
        visitation = (
            streamline_visitation(tractogram.points, tractogram.offsets, self.grid.shape).astype(np.float64)
            if len(tractogram)
            else np.zeros(self.grid.shape)
        )
        provenance = _steady({k: result.provenance.get(k) for k in ("backend", "device", "seeds", "empty_reason")})
        tracked = int(result.provenance.get("streamlines_tracked", 0))
        stages = {"tracking_s": t1 - t0, "visitation_s": time.perf_counter() - t1, "launched": tracked}
        return BundleTrack(tractogram, visitation, len(tractogram), tracked, list(result.notes), provenance, stages)

    def describe(self) -> dict:
        what = "fod" if self.name == "fod" else "tensor"
        return {what: self.reference, "parameters": {f.name: getattr(self.params, f.name) for f in fields(self.params)},
                "seeds_per_voxel": self.bundle.seeds_per_voxel}  # fmt: skip


def open_engine(
    *, samples=None, fod=None, tensor=None, prob_params: ProbParams, fod_params: FodProbabilisticParams,
    bundle: BundleParams, device: str, rng_seed: int,
) -> Engine:  # fmt: skip
    """The engine of the one input given (InputError when none or several are)."""
    given = [(k, v) for k, v in (("probabilistic", samples), ("fod", fod), ("deterministic", tensor)) if v is not None]
    if len(given) != 1:
        raise InputError(
            "give exactly one of --samples (bedpostX folder), --fod (fit-csd folder) or --tensor (dtifit folder)"
            + (f"; got {', '.join(k for k, _ in given)}" if given else ""),
            fix="Choose the data to track the bundles in",
        )
    kind, path = given[0]
    if not isinstance(path, BedpostSamples) and not os.path.exists(path):
        raise InputError("does not exist", path=path, fix="Check the path")
    if kind == "probabilistic":
        return ProbabilisticEngine(path, prob_params, bundle, device)
    return StreamlineEngine(kind, path, fod_params, bundle, device, rng_seed)
