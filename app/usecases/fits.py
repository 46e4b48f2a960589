"""Use cases: fit a model to a DWI series in the window — ball & sticks, CSD fODFs, a
microstructure model — and hand back the layers to add.

Each function is the whole action (the region brought onto the DWI's grid, the fit, the optional
output folder, the result layers), run on a worker by the window's job runner; progress, partial
maps and cancellation go through the plain :class:`app.jobs.JobContext`. Nothing reaches the
document here: the caller adds the returned layers, so a cancelled or failed fit changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..fod_layers import csd_result_layers
from ..grid import Grid
from ..io.dwi import DWI
from ..jobs import JobContext
from ..loaders import bedpostx_layers
from ..model import Layer
from ..pipelines.ballstick import BallStickParams, BallStickResult, fit_ballstick_pipeline, write_ballstick_outputs
from ..pipelines.csd import CSDParams, CSDResult, PeakParams, fit_csd_pipeline, write_csd_outputs
from ..pipelines.dti import choose_mask
from ..pipelines.fit_model import FitModelResult, ModelFitParams, fit_model_pipeline, write_fit_model_outputs

__all__ = ["fit_ballstick", "fit_csd", "fit_model", "region_on_dwi"]


def region_on_dwi(dwi: DWI, roi: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray | None:
    """A region snapshot ``(mask, affine)`` on the DWI's grid (nearest neighbour; None: none)."""
    if roi is None:
        return None
    mask, affine = roi
    return Grid.of(dwi).resample_nearest(mask, Grid(affine, mask.shape))


def fit_ballstick(
    dwi: DWI,
    params: BallStickParams,
    *,
    folder: Path | None = None,
    device: str = "auto",
    roi: tuple[np.ndarray, np.ndarray] | None = None,
    ctx: JobContext | None = None,
) -> tuple[list[Layer], BallStickResult]:
    """Ball & sticks inside the brain (the pipeline's mask from the b=0 images) or ``roi``;
    the bedpostX folder written to ``folder`` when given. Returns (the sticks and the first
    stick's mean fraction as layers, the result)."""
    ctx = ctx or JobContext()
    ctx.progress(0, 1, "fitting ball & sticks")
    result = fit_ballstick_pipeline(
        dwi, mask=region_on_dwi(dwi, roi), params=params, device=device, progress=ctx.progress,
        cancelled=ctx.cancelled,
    )  # fmt: skip
    if folder is not None:
        ctx.check()
        ctx.progress(1, 1, f"writing {folder.name}")
        write_ballstick_outputs(result, folder)
    return bedpostx_layers(result.dyads(), result.mean_f(0), f1_visible=False), result


def fit_csd(
    dwi: DWI,
    params: CSDParams,
    peak_params: PeakParams | None = None,
    *,
    folder: Path | None = None,
    device: str = "auto",
    name: str = "CSD",
    batch_voxels: int | None = None,
    ctx: JobContext | None = None,
) -> tuple[list[Layer], CSDResult]:
    """CSD fODFs and their peaks (and GM/CSF maps of a multi-tissue fit) as layers named after
    ``name``; the outputs written to ``folder`` when given (the fODF layer then keeps that file
    as its source). ``batch_voxels``: voxels per batch (small: a cancel is quick)."""
    ctx = ctx or JobContext()
    ctx.progress(0, 1, "fitting fODFs (CSD)")
    result = fit_csd_pipeline(
        dwi, params=params, peak_params=peak_params, device=device, progress=ctx.progress,
        cancelled=ctx.cancelled, batch_voxels=batch_voxels,
    )  # fmt: skip
    ctx.check()
    layers = csd_result_layers(result, name)
    if folder is not None:
        ctx.progress(1, 1, f"writing {folder.name}")
        written = write_csd_outputs(result, folder)
        for layer in layers:  # a session then keeps the fODF as this file (app.fod_layers)
            if layer.kind == "fod":
                layer.data.source = written["fod.nii.gz"]
    return layers, result


def fit_model(
    dwi: DWI,
    model_name: str,
    params: ModelFitParams,
    *,
    folder: Path | None = None,
    device: str = "auto",
    roi: tuple[np.ndarray, np.ndarray] | None = None,
    shown: Sequence[str] = (),
    ctx: JobContext | None = None,
) -> FitModelResult:
    """A microstructure model inside the brain (from the b=0 images) or ``roi``; after each batch
    the maps named in ``shown`` so far go out as a partial result ``{name: (X, Y, Z) array}``;
    the outputs written to ``folder`` when given."""
    ctx = ctx or JobContext()
    ctx.progress(0, 1, f"fitting {model_name}")
    mask, _source = choose_mask(dwi, region_on_dwi(dwi, roi), None)
    where = np.flatnonzero(mask.ravel())
    maps: dict[str, np.ndarray] = {}

    def on_batch(indices, partial) -> None:
        for name, values in partial.derived.items():
            if name in shown:
                volume = maps.setdefault(name, np.zeros(mask.shape, dtype=np.float32))
                volume.ravel()[where[indices]] = values
        ctx.partial({name: volume.copy() for name, volume in maps.items()})

    result = fit_model_pipeline(
        dwi, model_name, mask=mask, params=params, device=device, progress=ctx.progress,
        cancelled=ctx.cancelled, on_batch=on_batch,
    )  # fmt: skip
    if folder is not None:
        ctx.check()
        ctx.progress(1, 1, f"writing {folder.name}")
        write_fit_model_outputs(result, folder, command_line=[f"window: {model_name} on {dwi.path}"])
    return result
