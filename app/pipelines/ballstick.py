"""Use case: fit ball & sticks to a DWI series and write a bedpostX folder.

Shared by ``tractlens fit-ballstick``, the GUI's DWI layer menu and Python
scripts. Angles are fitted in FSL's bvec frame, so the folder is what FSL's
bedpostx would write and probtrackx reads it unchanged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import get_backend
from tractlens.gpu.ballstick import FLAG_NOT_FITTED, BallStickParams
from tractlens.gpu.ballstick_fit import BallStickFit, fit_ballstick
from tractlens.gpu.engines import decide_device

from ..errors import InputError
from ..estimates import ANNOUNCE_S, BALLSTICK_CPU_VOXELS_PER_S, ballstick_estimate
from ..io import DWI, bedpostx_cache, fsl_to_voxel_vectors
from ..io.bedpostx import (
    BEDPOSTX_MODEL2_OUTPUTS,
    BEDPOSTX_OUTPUTS,
    BedpostSamples,
    dyad_volume,
    save_bedpostx_masked,
    source_files,
)
from ..io.dwi import require_weighted
from ..io.nifti import load_image
from ..io.output_set import output_set
from ..model import Volume
from ..provenance import write_json_summary
from ._fallback import run_with_cpu_fallback
from ._fitted import require_fitted
from .dti import choose_mask, masked_signal
from .warmup import join_background_warmup

log = logging.getLogger(__name__)

#: Voxels per second of the NumPy engine (see :mod:`app.estimates`): used to warn before a long CPU run.
CPU_VOXELS_PER_S = BALLSTICK_CPU_VOXELS_PER_S
CPU_WARN_S = ANNOUNCE_S


@dataclass
class BallStickResult:
    """The fit's samples of the voxels in ``mask`` (host arrays, FSL frame) plus its provenance
    and notes. The samples stay masked until written (:func:`write_ballstick_outputs` streams
    them into the bedpostX files); :attr:`samples`, :attr:`s0` and :attr:`d` are the grid arrays,
    made on first use (for the GUI's layers and scripts)."""

    mask: np.ndarray
    affine: np.ndarray
    fit: BallStickFit
    bvals: np.ndarray
    bvecs: np.ndarray  # voxel axes, as DWI holds them
    mask_source: str
    warnings: list[str] = field(default_factory=list)
    path: str = ""

    def _grid(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.mask.shape + values.shape[1:], dtype=np.float32)
        out[self.mask] = values
        return out

    @cached_property
    def samples(self) -> BedpostSamples:
        """θ, φ, f as (X, Y, Z, n_fibres, n_samples), FSL frame."""
        fit = self.fit
        theta, phi, f = self._grid(fit.theta), self._grid(fit.phi), self._grid(fit.f)
        return BedpostSamples(theta=theta, phi=phi, f=f, mask=self.mask, affine=self.affine, path=self.path)

    @cached_property
    def s0(self) -> np.ndarray:
        """(X, Y, Z, n_samples)."""
        return self._grid(self.fit.s0)

    @cached_property
    def d(self) -> np.ndarray:
        """(X, Y, Z, n_samples), mm²/s."""
        return self._grid(self.fit.d)

    def dyads(self) -> Volume:
        """Mean stick directions and fractions as a ``dyads`` display volume (voxel axes)."""
        return dyad_volume(self.samples, "dyads")

    def mean_f(self, stick: int = 0) -> np.ndarray:
        return self._grid(self.fit.f[:, stick, :].mean(axis=-1))

    def summary(self) -> dict:
        fit = self.fit
        ok = fit.flags & FLAG_NOT_FITTED == 0
        means = {}
        if ok.any():
            fmean = fit.f[ok].mean(axis=2)  # (n, L)
            for i in range(fmean.shape[1]):
                means[f"f{i + 1}_mean"] = float(fmean[:, i].mean())
            means["d_mean"] = float(fit.d[ok].mean())
            if fit.d_std is not None:
                means["d_std_mean"] = float(fit.d_std[ok].mean())
        return {
            "voxels_fitted": int(self.mask.sum()),
            "mask": self.mask_source,
            "samples": int(self.fit.theta.shape[2]),
            "flags": fit.flag_counts(),
            "acceptance_mean": [float(a) for a in fit.acceptance[ok].mean(axis=0)] if ok.any() else None,
            **means,
            "warnings": self.warnings,
            **fit.provenance,
        }


def fit_ballstick_pipeline(
    dwi: DWI,
    *,
    mask: np.ndarray | None = None,
    mask_path: str | os.PathLike | None = None,
    params: BallStickParams | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> BallStickResult:
    """Fit ball & sticks inside the mask (given array, file, or computed from b=0) of a loaded DWI."""
    params = params or BallStickParams(b0_threshold=dwi.b0_threshold)
    require_weighted(dwi, params.b0_threshold, "ball & sticks")
    warnings = list(dwi.warnings)
    mask, mask_source = choose_mask(dwi, mask, mask_path, device, warnings)
    dw = int(np.count_nonzero(dwi.bvals > params.b0_threshold))
    if dw < 2 + 3 * params.n_fibres:
        raise InputError(
            f"{dw} diffusion-weighted volumes cannot determine {params.n_fibres} sticks "
            f"({2 + 3 * params.n_fibres} parameters)",
            path=dwi.path,
            fix="Use fewer sticks per voxel or a series with more directions",
        )
    if params.model == 1:
        weighted = np.round(dwi.bvals[dwi.bvals > params.b0_threshold] / 100.0)  # shells 100 s/mm² apart
        if len(np.unique(weighted)) > 1:
            warnings.append(
                "multi-shell data fitted with model 1 (one diffusivity); model 2, FSL's default, models "
                "the diffusivity spread across shells (fewer spurious crossings) and takes about 12 times as long"
            )
    iterations = params.burnin + params.njumps
    join_background_warmup()  # the device choice sees the start-up paid in the background
    choice = decide_device("fit-ballstick", int(mask.sum()) * len(dwi.bvals) * iterations, requested=device)
    device = choice.argument
    if not get_backend(device).is_gpu:
        estimate = ballstick_estimate(int(mask.sum()), len(dwi.bvals), params.burnin, params.njumps, "cpu")
        if estimate.seconds > CPU_WARN_S:
            note = (
                f"no GPU: fitting {int(mask.sum())} voxels with the NumPy engine will take "
                f"{estimate.text}; a GPU takes seconds (or give a smaller mask)"
            )
            log.warning("%s", note)
    t0 = time.perf_counter()
    signal = masked_signal(dwi.data, mask)
    bvecs_fsl = fsl_to_voxel_vectors(dwi.bvecs, dwi.affine)
    try:
        fit = run_with_cpu_fallback(
            lambda backend: fit_ballstick(
                signal, dwi.bvals, bvecs_fsl, params, device=backend, progress=progress, cancelled=cancelled
            ),
            device,
            warnings,
            "the ball & sticks fit",
        )
    except ValueError as exc:  # the engine's word on an unusable gradient table
        raise InputError(str(exc), path=dwi.bvec_path or dwi.path) from exc
    fit.provenance["total_s"] = time.perf_counter() - t0
    fit.provenance["device_choice"] = choice.reason
    require_fitted(fit.flags, FLAG_NOT_FITTED, "fit-ballstick", dwi.path)
    for name, count in fit.flag_counts().items():
        warnings.append(f"{count} voxel(s) flagged '{name}'")

    return BallStickResult(mask, dwi.affine.copy(), fit, dwi.bvals, dwi.bvecs, mask_source, warnings, path=dwi.path)


def write_ballstick_outputs(
    result: BallStickResult, outdir: str | os.PathLike, *, cache: bool = True
) -> dict[str, str]:
    """Write the bedpostX folder (:data:`app.io.bedpostx.BEDPOSTX_OUTPUTS`, and for model 2
    :data:`~app.io.bedpostx.BEDPOSTX_MODEL2_OUTPUTS`) and ``fit_ballstick.json``.

    With ``cache`` (and the bedpostX cache enabled) the folder's cache entry is written from the
    samples in hand, so the first ``track probabilistic`` on it maps them instead of inflating
    the files (:func:`app.io.bedpostx_cache.write_entry_masked`)."""
    fit = result.fit
    templates = (*BEDPOSTX_OUTPUTS, *BEDPOSTX_MODEL2_OUTPUTS, "bvals", "bvecs", "fit_ballstick.json")
    with output_set(outdir, "fit_ballstick.json", templates) as stage:  # one set: a rerun of fewer sticks leaves none
        staged = _write_bedpostx_files(result, stage, outdir)
    files = {name: str(Path(outdir) / name) for name in staged}
    if cache and bedpostx_cache.cache_enabled():
        sources = source_files(outdir)
        affine = load_image(sources[0], "bedpostX mask").affine  # as a read of the folder gives it
        samples = {"theta": fit.theta, "phi": fit.phi, "f": fit.f}
        bedpostx_cache.write_entry_masked(Path(outdir), sources, result.mask, affine, samples)
    return files


def _write_bedpostx_files(result: BallStickResult, stage: Path, outdir) -> list[str]:
    fit = result.fit
    files = save_bedpostx_masked(
        stage,
        result.mask,
        result.affine,
        fit.theta,
        fit.phi,
        fit.f,
        s0=fit.s0,
        d=fit.d,
        d_std=fit.d_std,
        bvals=result.bvals,
        bvecs=result.bvecs,
    )
    summary = stage / "fit_ballstick.json"
    write_json_summary(result.summary(), summary, inputs=(result.path,),
                       call=("tractlens.write_ballstick_outputs", "<result>", outdir))  # fmt: skip
    return [*files, "fit_ballstick.json"]


__all__ = [
    "BEDPOSTX_MODEL2_OUTPUTS",
    "BEDPOSTX_OUTPUTS",
    "BallStickParams",
    "BallStickResult",
    "fit_ballstick_pipeline",
    "write_ballstick_outputs",
]
