"""Use case: fit fibre orientation distributions by constrained spherical deconvolution.

Shared by ``tractlens fit-csd``, the GUI and scripts. The fit runs in the world (RAS) frame:
the gradient directions are turned from voxel axes to world directions first, so the SH
coefficients and peaks written are MRtrix's (``dwi2fod``, ``sh2peaks``) as they are.
Responses come from ``--response`` or from the data (:mod:`gpu.csd_response`), the tensor
needed to find single-fibre and tissue voxels being fitted on b=0 and the lowest shell.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.csd import FLAG_NONFINITE_SIGNAL, CSDFit, CSDModel, CSDParams, build_model, fit_csd
from tractlens.gpu.csd_peaks import PeakParams
from tractlens.gpu.csd_response import (
    SHELL_TOLERANCE,
    Response,
    anisotropic_response,
    find_shells,
    isotropic_response,
    select_single_fibre,
    tissue_masks,
)
from tractlens.gpu.dti import DTIFitParams, fit_dti
from tractlens.gpu.engines import decide_device

from ..errors import InputError
from ..io import DWI, save_volume
from ..io.dwi import require_weighted
from ..io.fod import read_response, save_fod, world_rotation, write_response
from ..io.output_set import output_set
from ..io.outputs import check_output_folder
from ..provenance import write_json_summary
from ._fallback import run_with_cpu_fallback
from ._fitted import require_fitted
from .dti import choose_mask, masked_signal

#: Files :func:`write_csd_outputs` writes, with what each holds.
CSD_OUTPUTS = {
    "fod.nii.gz": "WM fODF, SH coefficients (MRtrix basis, world RAS frame), one volume per coefficient",
    "peaks.nii.gz": "up to 3 peaks, 3 volumes each: world RAS direction × amplitude (as MRtrix sh2peaks)",
    "response.txt": "(WM) response, MRtrix format: zonal SH coefficients, one row per shell",
    "mask.nii.gz": "voxels fitted",
    "flags.nii.gz": "per-voxel flags: 1 non-finite signal (not fitted), 2 solver did not converge",
    "fit_csd.json": "summary, responses, timings, device, notes",
}
MSMT_OUTPUTS = {
    "gm.nii.gz": "grey matter: l=0 SH coefficient of its isotropic ODF (as MRtrix msmt_csd)",
    "csf.nii.gz": "CSF: l=0 SH coefficient of its isotropic ODF",
    "response_gm.txt": "grey-matter response, MRtrix format",
    "response_csf.txt": "CSF response, MRtrix format",
}


@dataclass
class CSDResult:
    """The fit on the DWI grid (host arrays), with the model and notes."""

    affine: np.ndarray
    mask: np.ndarray
    fit: CSDFit
    model: CSDModel
    shape: tuple[int, int, int]
    mask_source: str
    response_notes: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def _scatter(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.shape + values.shape[1:], dtype=np.float32)
        out[self.mask] = values
        return out

    def fod(self) -> np.ndarray:
        return self._scatter(self.fit.sh)

    def peaks(self) -> np.ndarray:
        """(X, Y, Z, 3P): each peak's world direction scaled by its amplitude."""
        scaled = self.fit.peaks * self.fit.peak_values[:, :, None]
        return self._scatter(scaled.reshape(len(scaled), -1))

    def peaks_voxel(self) -> tuple[np.ndarray, np.ndarray]:
        """Unit peak directions in voxel axes (N, P, 3) and amplitudes, for tracking."""
        rotation = world_rotation(self.affine)
        return self.fit.peaks @ rotation, self.fit.peak_values

    def tissue(self, name: str) -> np.ndarray:
        return self._scatter(self.fit.tissues[:, self.model.tissues.index(name) - 1])

    def summary(self) -> dict:
        fitted = self.fit.flags == 0
        counts = (self.fit.peak_values > 0).sum(axis=1)
        return {
            "voxels_fitted": int(self.mask.sum()),
            "mask": self.mask_source,
            "flags": self.fit.flag_counts(),
            "peaks_per_voxel": {
                str(k): int(np.count_nonzero(counts[fitted] == k)) for k in range(counts.max(initial=0) + 1)
            },
            "responses": {
                tissue: {
                    "shells": [float(b) for b in response.bvalues],
                    "zonal": response.zonal.round(6).tolist(),
                    "voxels": response.voxels,
                    "source": self.response_notes.get(tissue, ""),
                }
                for tissue, response in self.model.responses.items()
            },
            "warnings": self.warnings,
            **self.fit.provenance,
        }


def _tensor_maps(signal, dwi: DWI, bvecs_world, params: CSDParams, device) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FA, MD and the main direction (world frame) from b=0 and the lowest shell."""
    shells = find_shells(dwi.bvals, params.b0_threshold)
    lowest = shells.bvalues[shells.weighted[0]]
    use = (dwi.bvals <= params.b0_threshold) | (np.abs(dwi.bvals - lowest) <= SHELL_TOLERANCE)
    tensor = fit_dti(
        np.ascontiguousarray(signal[:, use]),
        dwi.bvals[use],
        bvecs_world[use],
        DTIFitParams(b0_threshold=params.b0_threshold),
        device=device,
    )
    return tensor.fa, tensor.md, tensor.evecs[:, :, 0]


def estimate_responses(signal, dwi: DWI, bvecs_world, params: CSDParams, device="cpu") -> tuple[dict, dict]:
    """Responses from the data: WM from single-fibre voxels; GM and CSF too for MSMT."""
    shells = find_shells(dwi.bvals, params.b0_threshold)
    finite = np.isfinite(signal).all(axis=1)
    fa, md, e1 = _tensor_maps(np.where(finite[:, None], signal, 0), dwi, bvecs_world, params, device)
    fa = np.where(finite, fa, 0.0)
    notes: dict[str, str] = {}
    responses: dict[str, Response] = {}
    if params.msmt:
        masks = tissue_masks(
            fa,
            md,
            wm_fa=params.fa_threshold,
            gm_fa=params.gm_fa,
            gm_md=params.gm_md,
            csf_fa=params.csf_fa,
            csf_md=params.csf_md,
        )
        for tissue, rule in (
            ("gm", f"FA < {params.gm_fa:g}, MD < {params.gm_md:g}"),
            ("csf", f"FA < {params.csf_fa:g}, MD > {params.csf_md:g}"),
        ):
            chosen = np.flatnonzero(masks[tissue])
            if chosen.size == 0:
                raise InputError(
                    f"no {tissue.upper()} voxels ({rule} mm²/s) to estimate its response from",
                    path=dwi.path or None,
                    fix="Check the mask covers the brain, or give a mask that includes "
                    + ("grey matter" if tissue == "gm" else "the ventricles"),
                )
            responses[tissue] = isotropic_response(signal[chosen], shells, params.lmax, tissue)
            notes[tissue] = f"{chosen.size} voxels with {rule} mm²/s"
    chosen, notes["wm"] = select_single_fibre(fa, params.fa_threshold)
    if chosen.size == 0:
        raise InputError(
            "no single-fibre voxels (FA > 0) to estimate the response from",
            path=dwi.path or None,
            fix="Check the mask and the b-vectors, or pass --response",
        )
    responses["wm"] = anisotropic_response(signal[chosen], bvecs_world, e1[chosen], shells, params.lmax)
    return responses, notes


def fit_csd_pipeline(
    dwi: DWI,
    *,
    mask: np.ndarray | None = None,
    mask_path: str | os.PathLike | None = None,
    params: CSDParams | None = None,
    peak_params: PeakParams | None = None,
    response_path: str | os.PathLike | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_voxels: int | None = None,
) -> CSDResult:
    """Fit fODFs (and GM/CSF for MSMT) inside the mask of a loaded DWI. ``batch_voxels``: most
    voxels per batch (None: as many as memory allows); ``cancelled`` is polled between batches,
    so the window keeps them small enough for Cancel to answer within seconds."""
    params = params or CSDParams(b0_threshold=dwi.b0_threshold)
    require_weighted(dwi, params.b0_threshold, "CSD")
    warnings = list(dwi.warnings)
    mask, mask_source = choose_mask(dwi, mask, mask_path, device, warnings)
    t0 = time.perf_counter()
    shells = find_shells(dwi.bvals, params.b0_threshold)
    if params.msmt and len(shells.weighted) < 2:
        b = ", ".join(f"{v:g}" for v in shells.bvalues)
        raise InputError(
            f"--msmt needs at least two diffusion-weighted shells; this series has b = {b}",
            path=dwi.bval_path or dwi.path or None,
            fix="Fit single-shell CSD (without --msmt), or give multi-shell data",
        )
    bvecs_world = dwi.bvecs @ world_rotation(dwi.affine).T
    signal = masked_signal(dwi.data, mask)
    choice = decide_device("fit-csd", signal.size, requested=device)
    if response_path is not None:
        responses = {"wm": read_response(response_path, "wm", shells.bvalues)}
        notes = {"wm": f"read from {response_path}"}
        if params.msmt:
            estimated, estimated_notes = estimate_responses(signal, dwi, bvecs_world, params, choice.argument)
            responses.update({k: estimated[k] for k in ("gm", "csf")})
            notes.update({k: estimated_notes[k] for k in ("gm", "csf")})
            warnings.append("GM and CSF responses were estimated from the data (--response gives the WM one)")
    else:
        responses, notes = estimate_responses(signal, dwi, bvecs_world, params, choice.argument)
    try:
        model = build_model(dwi.bvals, bvecs_world, responses, params)
    except ValueError as exc:
        raise InputError(
            str(exc),
            path=dwi.bval_path or dwi.path or None,
            fix="Check the b-values and b-vectors, --lmax and --response",
        ) from exc
    fit = run_with_cpu_fallback(
        lambda backend: fit_csd(
            signal,
            model,
            params,
            peak_params,
            device=backend,
            progress=progress,
            cancelled=cancelled,
            batch_voxels=batch_voxels,
        ),
        choice.argument,
        warnings,
        "the CSD fit",
    )
    fit.provenance["total_s"] = time.perf_counter() - t0
    require_fitted(fit.flags, FLAG_NONFINITE_SIGNAL, "fit-csd", dwi.path)
    fit.provenance["device_choice"] = choice.reason
    nonfinite = int(np.count_nonzero(fit.flags & FLAG_NONFINITE_SIGNAL))
    if nonfinite:
        warnings.append(f"{nonfinite} voxel(s) with NaN or Inf signals were left out (zero fODF; see flags.nii.gz)")
    unconverged = fit.flag_counts().get("not converged", 0)
    if unconverged:
        warnings.append(f"{unconverged} voxel(s) reached the solver's iteration limit (see flags.nii.gz)")
    return CSDResult(dwi.affine, mask, fit, model, dwi.shape3, mask_source, notes, warnings)


def write_csd_outputs(result: CSDResult, outdir: str | os.PathLike) -> dict[str, str]:
    """Write :data:`CSD_OUTPUTS` (and :data:`MSMT_OUTPUTS` for a multi-tissue fit) atomically."""
    out = check_output_folder(outdir)
    # one set: a single-tissue fit after a multi-tissue one leaves no gm/csf of the earlier fit
    with output_set(out, "fit_csd.json", (*CSD_OUTPUTS, *MSMT_OUTPUTS)) as stage:
        names = _write_csd_files(result, stage, outdir)
    return {name: str(out / name) for name in names}


def _write_csd_files(result: CSDResult, out: Path, outdir) -> dict:
    aff = result.affine
    save_fod(result.fod(), aff, out / "fod.nii.gz")
    save_volume(result.peaks(), aff, out / "peaks.nii.gz", dtype=np.float32)
    save_volume(result.mask, aff, out / "mask.nii.gz", dtype=np.uint8)
    save_volume(result._scatter(result.fit.flags), aff, out / "flags.nii.gz", dtype=np.uint8)
    write_response(result.model.responses["wm"], out / "response.txt")
    names = dict(CSD_OUTPUTS)
    if result.model.msmt:
        for tissue in ("gm", "csf"):
            save_volume(result.tissue(tissue), aff, out / f"{tissue}.nii.gz", dtype=np.float32)
            write_response(result.model.responses[tissue], out / f"response_{tissue}.txt")
        names.update(MSMT_OUTPUTS)
    write_json_summary(result.summary(), out / "fit_csd.json", call=("tractlens.write_csd_outputs", "<result>", outdir))
    return names
