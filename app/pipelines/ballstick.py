"""Use case: fit ball & sticks to a DWI series and write a bedpostX folder.

Shared by ``tractlens fit-ballstick``, the GUI's DWI layer menu and Python
scripts. Angles are fitted in FSL's bvec frame, so the folder is what FSL's
bedpostx would write and probtrackx reads it unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import get_backend
from tractlens.gpu.ballstick import FLAG_NOT_FITTED, BallStickFit, BallStickParams, fit_ballstick
from tractlens.gpu.engines import decide_device

from ..errors import InputError
from ..estimates import ANNOUNCE_S, BALLSTICK_CPU_VOXELS_PER_S, ballstick_estimate
from ..io import DWI, fsl_to_voxel_vectors
from ..io._atomic import write_text_atomic
from ..io.bedpostx import BEDPOSTX_OUTPUTS, BedpostSamples, dyad_volume, save_bedpostx
from ..model import Volume
from ._fallback import run_with_cpu_fallback
from .dti import choose_mask, masked_signal
from .warmup import join_background_warmup

log = logging.getLogger(__name__)

#: Voxels per second of the NumPy engine (see :mod:`app.estimates`): used to warn before a long CPU run.
CPU_VOXELS_PER_S = BALLSTICK_CPU_VOXELS_PER_S
CPU_WARN_S = ANNOUNCE_S


@dataclass
class BallStickResult:
    """Samples on the DWI grid (host arrays) plus the fit's provenance and notes."""

    samples: BedpostSamples  # θ, φ, f: (X, Y, Z, n_fibres, n_samples), FSL frame
    s0: np.ndarray  # (X, Y, Z, n_samples)
    d: np.ndarray  # (X, Y, Z, n_samples), mm²/s
    fit: BallStickFit
    bvals: np.ndarray
    bvecs: np.ndarray  # voxel axes, as DWI holds them
    mask_source: str
    warnings: list[str] = field(default_factory=list)

    def dyads(self) -> Volume:
        """Mean stick directions and fractions as a ``dyads`` display volume (voxel axes)."""
        return dyad_volume(self.samples, "dyads")

    def mean_f(self, stick: int = 0) -> np.ndarray:
        return self.samples.f[..., stick, :].mean(axis=-1)

    def summary(self) -> dict:
        fit = self.fit
        ok = fit.flags & FLAG_NOT_FITTED == 0
        means = {}
        if ok.any():
            fmean = fit.f[ok].mean(axis=2)  # (n, L)
            for i in range(fmean.shape[1]):
                means[f"f{i + 1}_mean"] = float(fmean[:, i].mean())
            means["d_mean"] = float(fit.d[ok].mean())
        return {
            "voxels_fitted": int(self.samples.mask.sum()),
            "mask": self.mask_source,
            "samples": self.samples.n_samples,
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
    warnings = list(dwi.warnings)
    mask, mask_source = choose_mask(dwi, mask, mask_path)
    dw = int(np.count_nonzero(dwi.bvals > params.b0_threshold))
    if dw < 2 + 3 * params.n_fibres:
        raise InputError(
            f"{dw} diffusion-weighted volumes cannot determine {params.n_fibres} sticks "
            f"({2 + 3 * params.n_fibres} parameters)",
            path=dwi.path,
            fix="Use fewer sticks (--nfibres) or a series with more directions",
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
    for name, count in fit.flag_counts().items():
        warnings.append(f"{count} voxel(s) flagged '{name}'")

    def grid(values: np.ndarray) -> np.ndarray:
        out = np.zeros(dwi.shape3 + values.shape[1:], dtype=np.float32)
        out[mask] = values
        return out

    samples = BedpostSamples(
        theta=grid(fit.theta), phi=grid(fit.phi), f=grid(fit.f), mask=mask, affine=dwi.affine.copy(), path=dwi.path
    )
    return BallStickResult(samples, grid(fit.s0), grid(fit.d), fit, dwi.bvals, dwi.bvecs, mask_source, warnings)


def write_ballstick_outputs(result: BallStickResult, outdir: str | os.PathLike) -> dict[str, str]:
    """Write the bedpostX folder (:data:`app.io.bedpostx.BEDPOSTX_OUTPUTS`) and ``fit_ballstick.json``."""
    files = save_bedpostx(outdir, result.samples, s0=result.s0, d=result.d, bvals=result.bvals, bvecs=result.bvecs)
    summary = Path(outdir) / "fit_ballstick.json"
    write_text_atomic(json.dumps(result.summary(), indent=2, default=str), summary)
    files["fit_ballstick.json"] = str(summary)
    return files


__all__ = [
    "BEDPOSTX_OUTPUTS",
    "BallStickParams",
    "BallStickResult",
    "fit_ballstick_pipeline",
    "write_ballstick_outputs",
]
