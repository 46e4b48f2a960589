"""Use case: streamline tractography on fibre orientation distributions (fODFs).

The fODF trackers of :mod:`gpu.fod_tracking` — deterministic (MRtrix3's SD_STREAM: the peak
nearest the incoming direction) and probabilistic (iFOD1: draws ∝ amplitude in a cone) — run
through :func:`app.pipelines.track.deterministic_pipeline`, the tensor tracker's use case,
with an fODF :class:`~app.pipelines.track.TrackingEngine`: the same seeding (a seed mask,
points or the whole brain), tracking mask, stop, include and exclude regions, batches while
tracking (``on_batch``), a ``sink`` for streamed writing, progress, cancelling, the CPU
fallback and the provenance. The fODF comes from ``fit-csd``'s folder (``fod.nii.gz``) or a
fODF image of MRtrix3 or DIPY (:func:`app.io.fod.load_fod`).

Per point the streamlines carry the generalized FA (Tuch 2004) of the fODF, under the name
``fa`` that every tracker's output uses; whole-brain seeding takes the voxels of the mask
where the fODF's largest amplitude reaches the cut-off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from tractlens.gpu import fod_tracking
from tractlens.gpu.backend import get_backend
from tractlens.gpu.fod_params import FodDeterministicParams, FodProbabilisticParams
from tractlens.gpu.sh import lmax_of, sh_basis

from ..errors import InputError
from ..io.fod import load_fod, world_rotation
from ..params import SeedingParams
from ..regions import Regions
from .track import TrackingEngine, TrackResult, deterministic_from_regions, deterministic_pipeline

__all__ = [
    "FodDeterministicParams",
    "FodProbabilisticParams",
    "FodVolume",
    "fod_engine",
    "fod_from_regions",
    "fod_tracking_pipeline",
    "load_fod_volume",
]

FOD_FILE = "fod.nii.gz"


@dataclass
class FodVolume:
    """An fODF on a grid: SH coefficients (X, Y, Z, C) in MRtrix's basis and the world frame,
    the voxels where it is defined (``mask``: any coefficient non-zero), its generalized FA."""

    sh: np.ndarray
    affine: np.ndarray
    lmax: int
    source: str
    mask: np.ndarray
    fa: np.ndarray  # generalized FA, the per-point scalar of the streamlines
    notes: list[str] = field(default_factory=list)
    not_positive_definite: int = 0  # a tensor notion: none here (deterministic_pipeline reads it)
    #: the coefficients uploaded by :meth:`from_sh` on a GPU, for the seed amplitudes and the
    #: field of the run that follows; given up once the field is made (:func:`fod_engine`)
    device_sh: object = field(default=None, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.sh.shape[:3])

    @property
    def voxel_size(self) -> np.ndarray:
        return np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0))

    @classmethod
    def from_sh(
        cls, sh: np.ndarray, affine: np.ndarray, source: str = "", notes=None, device: str = "cpu"
    ) -> FodVolume:
        """The volume of coefficients ``sh``; with ``device`` a GPU (or ``"auto"`` and a GPU there)
        and a whole-brain grid, its mask and generalized FA are computed there and the upload
        is kept for the tracking run (:attr:`device_sh`)."""
        sh = np.asarray(sh, dtype=np.float32)
        if sh.ndim != 4:
            raise InputError(f"an fODF is 4-D (X, Y, Z, coefficients), got shape {sh.shape}")

        try:
            lmax = lmax_of(int(sh.shape[-1]))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if lmax > fod_tracking.DEGREE:
            raise InputError(
                f"fODF tracking handles lmax up to {fod_tracking.DEGREE}; this fODF has lmax {lmax}",
                fix="Fit the CSD with --lmax 8 or lower",
            )
        notes = list(notes or [])
        backend = _summary_backend(device, sh)
        summary = None
        if backend is not None:
            try:
                summary = fod_tracking.summarise(sh, backend)
            except Exception as exc:  # no room on the device: the host does it, as it would without a GPU
                if not backend.is_out_of_memory(exc):
                    raise
                backend.free_cached_memory()
        if summary is not None:
            clean = sh
            if summary.nonfinite:
                notes.append(f"{summary.nonfinite} voxels have NaN or infinite fODF coefficients: treated as empty")
                clean = np.where(np.isfinite(sh).all(axis=-1)[..., None], sh, np.float32(0.0))
            volume = cls(clean, np.asarray(affine, np.float64), lmax, source, summary.mask, summary.gfa, notes)
            volume.device_sh = summary.coefficients
            return volume
        finite = np.isfinite(sh).all(axis=-1)
        clean = sh if finite.all() else np.where(finite[..., None], sh, np.float32(0.0))  # no copy when clean
        if (~finite).any():
            notes.append(f"{int((~finite).sum())} voxels have NaN or infinite fODF coefficients: treated as empty")
        power = np.einsum("...c,...c->...", clean, clean, dtype=np.float64)
        mask = power > 0
        gfa = np.sqrt(np.clip(1.0 - clean[..., 0].astype(np.float64) ** 2 / np.where(mask, power, 1.0), 0.0, 1.0))
        return cls(clean, np.asarray(affine, np.float64), lmax, source, mask, (gfa * mask).astype(np.float32), notes)

    def largest_amplitude(self, region: np.ndarray) -> np.ndarray:
        """The fODF's largest amplitude on :data:`gpu.fod_tracking.SEED_DIRECTIONS` in the
        voxels of ``region`` (0 elsewhere), by chunks of voxels (on the GPU when the
        coefficients are there)."""
        out = np.zeros(self.shape, np.float32)
        voxels = np.flatnonzero(region)
        if self.device_sh is not None:
            out.reshape(-1)[voxels] = fod_tracking.largest_amplitudes(self.device_sh, voxels, self.lmax, "gpu")
            return out
        basis = sh_basis(np, fod_tracking.SEED_DIRECTIONS, self.lmax).astype(np.float32)  # (D, C)
        flat = self.sh.reshape(-1, self.sh.shape[-1])
        for a in range(0, len(voxels), 1 << 18):
            chunk = voxels[a : a + (1 << 18)]
            out.reshape(-1)[chunk] = (flat[chunk] @ basis.T).max(axis=1)
        return out


#: Grids of at least this many voxels are summarised on the GPU when one is used (whole-brain
#: grids: the upload then serves the tracking run too); smaller ones on the host.
DEVICE_SUMMARY_VOXELS = 1 << 20


def _summary_backend(device: str, sh: np.ndarray):
    """The GPU backend to summarise ``sh`` on, or None for the host."""
    if str(device).lower() == "cpu" or int(np.prod(sh.shape[:3])) < DEVICE_SUMMARY_VOXELS:
        return None

    try:
        backend = get_backend(device)
    except (RuntimeError, ValueError):  # a GPU asked for and none there: the pipeline says so itself
        return None
    return backend if backend.is_gpu else None


def load_fod_volume(path: str | os.PathLike, basis: str = "auto", device: str = "cpu") -> FodVolume:
    """An fODF from ``fit-csd``'s output folder (its ``fod.nii.gz``) or an fODF image."""
    path = Path(path)
    if path.is_dir():
        if not (path / FOD_FILE).is_file():
            raise InputError(
                f"the folder has no {FOD_FILE}",
                path=path,
                fix="Give the folder written by 'tractlens fit-csd -o DIR', or the fODF image itself",
            )
        path = path / FOD_FILE
    sh, affine, _lmax, basis_read = load_fod(path, basis)
    return FodVolume.from_sh(sh, affine, f"{path} ({basis_read} basis)", device=device)


def _seed_region(volume: FodVolume, mask: np.ndarray | None, params) -> np.ndarray:
    region = volume.mask if mask is None else (mask & volume.mask)
    seed_mask = region & (volume.largest_amplitude(region) >= params.cutoff)
    if not seed_mask.any():
        raise InputError(
            f"no voxel inside the mask has an fODF amplitude ≥ the cut-off {params.cutoff}: nothing to seed",
            fix="Lower --cutoff or check the fODF input",
        )
    return seed_mask


def fod_engine(params, rng_seed: int = 0, device: str = "auto") -> TrackingEngine:
    """The fODF tracker of ``params`` (:class:`FodDeterministicParams` or
    :class:`FodProbabilisticParams`) as a :class:`~app.pipelines.track.TrackingEngine`; the
    field is converted on ``device`` (the GPU when there is one and it is not ``"cpu"``)."""
    probabilistic = isinstance(params, FodProbabilisticParams)

    def prepare(volume: FodVolume, mask, stop):
        where = "cpu" if str(device).lower() == "cpu" else "auto"
        sh = volume.device_sh if volume.device_sh is not None and where != "cpu" else volume.sh
        volume.device_sh = None  # the field is made from it: the device memory goes to tracking
        try:
            return fod_tracking.prepare_field(
                sh, volume.voxel_size, rotation=world_rotation(volume.affine), mask=mask, stop=stop, device=where,
            )  # fmt: skip
        except ValueError as exc:
            raise InputError(str(exc)) from exc

    def track(field_, seeds, params_, **kwargs):
        return fod_tracking.track(field_, seeds, params_, rng_seed=rng_seed, **kwargs)

    return TrackingEngine("fod-probabilistic" if probabilistic else "fod-deterministic", prepare, track, _seed_region)


def fod_tracking_pipeline(
    volume: FodVolume,
    *,
    params: FodDeterministicParams | FodProbabilisticParams | None = None,
    rng_seed: int = SeedingParams.rng_seed,
    device: str = "auto",
    name: str | None = None,
    **options,
) -> TrackResult:
    """fODF tracking on ``volume``: deterministic with :class:`FodDeterministicParams` (the
    default), probabilistic with :class:`FodProbabilisticParams`. ``rng_seed`` places the seeds
    and drives the probabilistic draws. The other ``options`` (seeds, masks, regions,
    callbacks, ``sink``) are :func:`~app.pipelines.track.deterministic_pipeline`'s."""
    params = params or FodDeterministicParams()
    engine = fod_engine(params, rng_seed, device)
    result = deterministic_pipeline(
        volume, params=params, rng_seed=rng_seed, device=device, engine=engine, name=name or engine.method,
        **options,
    )  # fmt: skip
    result.provenance["fod"] = result.provenance.pop("tensor", volume.source)
    result.provenance["point_scalar_fa"] = "generalized FA of the fODF"
    return result


def fod_from_regions(volume: FodVolume, regions: Regions, *, whole_brain: bool = False, **options) -> TrackResult:
    """fODF tracking with a document's ROIs in their roles (as
    :func:`~app.pipelines.track.deterministic_from_regions`)."""
    params = options.pop("params", None) or FodDeterministicParams()
    rng_seed = options.pop("rng_seed", SeedingParams.rng_seed)
    device = options.pop("device", "auto")
    engine = fod_engine(params, rng_seed, device)
    result = deterministic_from_regions(
        volume, regions, whole_brain=whole_brain, params=params, rng_seed=rng_seed, device=device, engine=engine,
        **{"name": engine.method, **options},
    )  # fmt: skip
    result.provenance["fod"] = result.provenance.pop("tensor", volume.source)
    return result


def track_fod_deterministic(source, regions: Regions, *, params=None, basis: str = "auto", **options) -> TrackResult:
    """The window's door to fODF tracking: deterministic (SD_STREAM) tracking on ``source`` — an
    fODF file or fit-csd folder, or ``(coefficients, affine)`` of a fit made in the window — with
    a document's ROIs in their roles. ``params`` may be the tensor tracker's
    :class:`DeterministicParams` (the panel's form): its step, angle, lengths and truncation
    carry over, the amplitude cut-off keeps its default. The other ``options`` are
    :func:`fod_from_regions`'s."""
    device = options.get("device", "auto")
    if isinstance(source, (str, os.PathLike)):
        volume = load_fod_volume(source, basis, device)
    else:
        coefficients, affine = source
        volume = FodVolume.from_sh(np.asarray(coefficients), np.asarray(affine), "fODF layer", device=device)
    if params is not None and not isinstance(params, (FodDeterministicParams, FodProbabilisticParams)):
        shared = {f.name for f in fields(FodDeterministicParams)} & {f.name for f in fields(params)}
        params = FodDeterministicParams(**{name: getattr(params, name) for name in shared})
    return fod_from_regions(volume, regions, params=params, **options)
