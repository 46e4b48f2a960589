"""Use case: fit a microstructure model (NODDI-Watson, NODDI-Bingham, ball & sticks, or a
model the user declared) to a DWI series and write its maps.

Shared by ``tractlens fit-model``, the GUI's DWI layer menu and Python scripts::

    from tractlens.app.io import load_dwi
    from tractlens.app.pipelines.fit_model import fit_model_pipeline, write_fit_model_outputs

    result = fit_model_pipeline(load_dwi("dwi.nii.gz"), "noddi-watson")   # or a gpu.models.Model
    write_fit_model_outputs(result, "noddi/")

The acquisition is checked against the model first (b = 0 present, enough shells,
measurements and b-values inside the model's range), with messages a user can act on.
Orientations are fitted in the voxel axes the DWI holds its gradients in and written as
world (RAS+) unit vectors.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from tractlens import __version__
from tractlens.gpu.backend import get_backend
from tractlens.gpu.models import MODELS, Model, ModelFit, ModelFitParams, fit_model, shells
from tractlens.gpu.models.fit import FLAG_NOT_FITTED

from ..errors import InputError
from ..io import DWI
from ..io._atomic import write_text_atomic
from ..io.dwi import require_weighted
from ..io.nifti import save_volume
from ..io.output_set import output_set
from ..io.outputs import check_output_folder
from ._fallback import run_with_cpu_fallback
from ._fitted import require_fitted
from .dti import choose_mask, masked_signal

log = logging.getLogger(__name__)

MODEL_NAMES = tuple(MODELS)

#: Seconds per voxel of the NumPy path, measured on 2 cores with 288 measurements
#: (tests/benchmarks/results/models_cpu_2cores.json); used to warn before a long CPU run.
CPU_S_PER_VOXEL = {"noddi-watson": 0.007, "noddi-bingham": 0.1, "ball-sticks": 0.004}
CPU_WARN_S = 120.0


def cpu_time_note(model: Model, voxels: int, measurements: int, method: str) -> str | None:
    """A warning when the NumPy path will take minutes (None when it will not, or for a model
    of the user's, whose cost is unknown)."""
    per_voxel = CPU_S_PER_VOXEL.get(model.name)
    if per_voxel is None:
        return None
    seconds = per_voxel * voxels * measurements / 288 * (10 if method == "mcmc" else 1)
    if seconds < CPU_WARN_S:
        return None
    return (
        f"no GPU: fitting {model.name} to {voxels} voxels on the CPU will take about {seconds / 60:.0f} min "
        "(a GPU takes seconds; or give a smaller mask)"
    )


def resolve_model(model: str | Model, params: ModelFitParams) -> Model:
    """A shipped model by name (with the fit's d_par, d_iso), or the user's :class:`Model`."""
    if isinstance(model, Model):
        return model
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}", fix=f"Choose one of {', '.join(MODEL_NAMES)}")
    return MODELS[model](params.d_par, params.d_iso)


def check_acquisition(model: Model, bvals: np.ndarray, b0_threshold: float, path: str = "") -> None:
    """Raise :class:`InputError` when the gradient table cannot support ``model``."""
    b = np.asarray(bvals, dtype=np.float64)
    where = path or None
    if not (b <= b0_threshold).any():
        raise InputError(
            f"no b=0 volume (all b-values above {b0_threshold:g} s/mm²)",
            path=where,
            fix="The fit normalises by the b=0 signal: use a series with at least one b=0 volume",
        )
    dw = b[b > b0_threshold]
    lo, hi = model.b_range
    outside = np.unique(dw[(dw < lo) | (dw > hi)])
    if outside.size:
        shown = ", ".join(f"{v:g}" for v in outside[:5])
        raise InputError(
            f"b-values {shown} s/mm² are outside the range {model.name} is meant for ({lo:g} to {hi:g} s/mm²)",
            path=where,
            fix="Check the bval file's units (s/mm²), or drop those volumes before fitting",
        )
    found = shells(b, b0_threshold)
    if len(found) < model.min_shells:
        what = "single-shell" if len(found) == 1 else f"{len(found)}-shell"
        raise InputError(
            f"{model.name} needs at least {model.min_shells} non-zero b-value shells; this series is {what} "
            f"(b = {', '.join(f'{v:g}' for v in found) or 'none'} s/mm²)",
            path=where,
            fix="Use multi-shell data (e.g. b = 1000 and 2000 s/mm²), or fit the tensor (fit-dti) instead",
        )
    needed = 1 + len(model.parameters)
    if dw.size < needed:
        raise InputError(
            f"{dw.size} diffusion-weighted volumes cannot determine the {needed} parameters of {model.name}",
            path=where,
            fix="Use a series with more diffusion-weighted directions",
        )


@dataclass
class FitModelResult:
    """The fit of the voxels in ``mask`` plus what is needed to write and show it."""

    model: Model
    mask: np.ndarray
    affine: np.ndarray
    fit: ModelFit
    params: ModelFitParams
    mask_source: str
    inputs: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def _grid(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.mask.shape + values.shape[1:], dtype=np.float32)
        out[self.mask] = values
        return out

    def map_names(self) -> dict[str, str]:
        """{parameter: map name} for the parameters written as maps (angles are not)."""
        renamed = self.model.extra.get("map_names", {})
        angles = {name for pair in self.model.orientations for name in pair}
        return {p.name: renamed.get(p.name, p.name) for p in self.model.parameters if p.name not in angles}

    def maps(self) -> dict[str, np.ndarray]:
        """Every output map by file stem: derived maps (NDI, ODI, FWF, ...), parameters not among
        them, S0, orientations (``dir``, ``dir2``, ...: X×Y×Z×3, world RAS+ unit vectors),
        ``residual`` and, after MCMC, ``<map>_std``."""
        fit = self.fit
        out = {name: self._grid(v) for name, v in fit.derived.items()}
        for param, name in self.map_names().items():
            out.setdefault(name, self._grid(fit.values[param]))
        out["S0"] = self._grid(fit.values["s0"])
        for k in range(fit.directions.shape[1]):
            out["dir" if k == 0 else f"dir{k + 1}"] = self._grid(world_directions(fit.directions[:, k], self.affine))
        out["residual"] = self._grid(fit.residual)
        if fit.std is not None:
            for param, name in self.map_names().items():
                out[f"{name}_std"] = self._grid(fit.std[param])
        return out

    def summary(self) -> dict:
        fit = self.fit
        ok = fit.flags == 0
        means = {f"{k}_mean": float(v[ok].mean()) for k, v in fit.derived.items() if ok.any()}
        return {
            "model": self.model.name,
            "description": self.model.description,
            "voxels_fitted": int(self.mask.sum()),
            "mask": self.mask_source,
            "inputs": self.inputs,
            "params": asdict(self.params),
            "version": __version__,
            "flags": fit.flag_counts(),
            **means,
            "warnings": self.warnings,
            "provenance": fit.provenance,
        }


def world_directions(vectors: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Voxel-axis unit vectors (N, 3) as world RAS+ unit vectors (sign: largest component positive)."""
    world = vectors @ np.asarray(affine, dtype=np.float64)[:3, :3].T
    norm = np.linalg.norm(world, axis=1, keepdims=True)
    world = np.where(norm > 0, world / np.where(norm > 0, norm, 1.0), 0.0)
    big = np.take_along_axis(world, np.abs(world).argmax(axis=1)[:, None], axis=1)
    return world * np.where(big < 0, -1.0, 1.0)


def fit_model_pipeline(
    dwi: DWI,
    model: str | Model = "noddi-watson",
    *,
    mask: np.ndarray | None = None,
    mask_path: str | os.PathLike | None = None,
    params: ModelFitParams | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    on_batch: Callable[[np.ndarray, ModelFit], None] | None = None,
) -> FitModelResult:
    """Fit ``model`` (a name of :data:`MODEL_NAMES` or a declared :class:`Model`) inside the mask
    (given array, file, or computed from b = 0) of a loaded DWI."""
    params = params or ModelFitParams(b0_threshold=dwi.b0_threshold)
    chosen = resolve_model(model, params)
    require_weighted(dwi, params.b0_threshold, "the model fit")
    check_acquisition(chosen, dwi.bvals, params.b0_threshold, dwi.bval_path or dwi.path)
    warnings = list(dwi.warnings)
    mask, mask_source = choose_mask(dwi, mask, mask_path, device, warnings)
    if not get_backend(device).is_gpu:
        note = cpu_time_note(chosen, int(mask.sum()), len(dwi.bvals), params.method)
        if note:
            log.warning("%s", note)
            warnings.append(note)
    t0 = time.perf_counter()
    signal = masked_signal(dwi.data, mask)
    try:
        fit = run_with_cpu_fallback(
            lambda backend: fit_model(
                chosen,
                signal,
                dwi.bvals,
                dwi.bvecs,
                params,
                device=backend,
                progress=progress,
                cancelled=cancelled,
                on_batch=on_batch,
            ),
            device,
            warnings,
            f"the {chosen.name} fit",
        )
    except ValueError as exc:
        raise InputError(str(exc), path=dwi.bvec_path or dwi.path) from exc
    fit.provenance["total_s"] = time.perf_counter() - t0
    require_fitted(fit.flags, FLAG_NOT_FITTED, "fit-model", dwi.path)
    for name, count in fit.flag_counts().items():
        warnings.append(f"{count} voxel(s) flagged '{name}'")
    inputs = {"dwi": dwi.path, "bval": dwi.bval_path, "bvec": dwi.bvec_path, "mask": str(mask_path or "")}
    return FitModelResult(chosen, mask, dwi.affine.copy(), fit, params, mask_source, inputs, warnings)


def write_fit_model_outputs(
    result: FitModelResult, outdir: str | os.PathLike, command_line: list[str] | None = None
) -> dict[str, str]:
    """Write every map of :meth:`FitModelResult.maps` as NIfTI, the mask, and ``fit_model.json``
    (inputs, parameters, version, command line, timings); each file atomically."""
    out = check_output_folder(outdir)
    t0 = time.perf_counter()
    names = []
    # one set: another model's maps from an earlier run into this folder do not stay beside these
    with output_set(out, "fit_model.json") as stage:
        for name, volume in result.maps().items():
            save_volume(volume, result.affine, stage / f"{name}.nii.gz", dtype=np.float32)
            names.append(f"{name}.nii.gz")
        save_volume(result.mask, result.affine, stage / "mask.nii.gz", dtype=np.uint8)
        summary = result.summary()
        summary["command_line"] = list(sys.argv if command_line is None else command_line)
        summary["provenance"]["write_s"] = time.perf_counter() - t0
        write_text_atomic(json.dumps(summary, indent=2, default=str), stage / "fit_model.json")
    return {name: str(out / name) for name in (*names, "mask.nii.gz", "fit_model.json")}


__all__ = [
    "MODEL_NAMES",
    "FitModelResult",
    "ModelFitParams",
    "check_acquisition",
    "fit_model_pipeline",
    "resolve_model",
    "world_directions",
    "write_fit_model_outputs",
]
