"""What a COMMIT run hands to the panel: the job that runs :func:`app.usecases.commit.filter_with_commit`
on a worker and builds the result layers there (the weighted tractogram, the fit's NRMSE map),
and the snapshot the job works on. The panel (:mod:`widgets.commit_panel`) only shows them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tractlens.app.fiber_cache import FiberArrayCache
from tractlens.app.model import Layer, Tractogram, Volume
from tractlens.app.pipelines.commit import (
    WEIGHT_SCALAR,
    CommitParams,
    CommitResult,
    weighted_tractogram,
)
from tractlens.app.regions import RoiCopy
from tractlens.app.selection import shown_of
from tractlens.app.usecases.commit import filter_with_commit

WEIGHT = WEIGHT_SCALAR
NRMSE_NAME = "fit NRMSE"
NRMSE_CLIM = (0.0, 0.5)


@dataclass
class CommitOutcome:
    """What a finished job hands to the GUI thread (everything built on the worker)."""

    token: int
    source: Layer  # the tractogram layer that was filtered
    layer: Layer  # every streamline, with commit_weight
    nrmse: Layer
    weights: np.ndarray
    summary: dict
    notes: list[str]
    seconds: float
    result: CommitResult  # the fit itself (what Save outputs… writes)


def snapshot_tractogram(tract: Tractogram) -> Tractogram:
    """A copy of a tractogram's arrays (the job must not see later edits of the layer); a .trx's
    memory-mapped positions are shared, not converted and copied (a file is never edited)."""
    return Tractogram(
        tract.mapped if tract.mapped is not None else tract.points.copy(),
        tract.offsets.copy(),
        tract.affine.copy(),
        tract.dimensions,
        {k: np.array(v, copy=True) for k, v in tract.point_scalars.items()},
        {k: np.array(v, copy=True) for k, v in tract.streamline_scalars.items()},
        name=tract.name,
    )


def weighted_layer(name: str, tractogram: Tractogram, top: float, fiber_arrays: FiberArrayCache) -> Layer:
    """A tractogram layer coloured by ``commit_weight`` over 0 … ``top``, display arrays
    prepared (call it on a worker)."""
    layer = Layer(name, tractogram, "tractogram", colormap="viridis", color_by=WEIGHT)
    layer.clim = (0.0, top if top > 0 else 1.0)
    fiber_arrays.prepare(layer)
    return layer


def commit_job(
    dwi,
    tract: Tractogram,
    source: Layer,
    params: CommitParams,
    token: int,
    device: str,
    *,
    mask: RoiCopy | None = None,
    peaks: Path | None = None,
    fiber_arrays: FiberArrayCache,
):
    """The work of one COMMIT run for :meth:`widgets.jobs.JobRunner.submit`: the fit, then the
    result layers, all on the worker; returns a :class:`CommitOutcome`."""
    name = f"{source.name} (COMMIT)"

    def job(ctx):
        start = time.perf_counter()
        ctx.progress(0, params.max_iter, "COMMIT: building the model")
        result = filter_with_commit(
            dwi,
            tract,
            mask=mask,
            mask_name=None if mask is None else mask.name,
            peaks=peaks,
            tractogram_name=source.name,
            params=params,
            device=device,
            progress=lambda it, n: ctx.progress(it, n, "COMMIT: fitting"),
            cancelled=ctx.cancelled,
        )
        ctx.check()
        weights = np.asarray(result.weights, dtype=np.float64)
        layer = weighted_layer(
            name,
            weighted_tractogram(tract, weights, name),
            float(weights.max()) if len(weights) else 1.0,
            fiber_arrays,
        )
        nrmse_layer = Layer(
            NRMSE_NAME,
            Volume(NRMSE_NAME, result.maps()["fit_NRMSE"], result.affine),
            "scalar",
            colormap="hot",
            clim=NRMSE_CLIM,
            visible=False,
        )
        return CommitOutcome(
            token, source, layer, nrmse_layer, weights, result.summary(), list(result.notes),
            time.perf_counter() - start, result,
        )  # fmt: skip

    return job


def shown_label(threshold: float | None, mask: np.ndarray | None, shown_layer: Layer | None) -> str:
    """The panel's "shown" line: what the weight threshold keeps and, when the ROI (or a
    connectivity) selection hides some of those, what the views really show."""
    if mask is None:
        return "all shown"
    selection = shown_of(shown_layer) if shown_layer is not None else None
    selected = selection is not None and selection.hides
    verb = "kept" if selected else "shown"
    if threshold is None:
        text = f"all {len(mask):,} {verb}" + (" by weight" if selected else "")
    else:
        text = f"weight ≤ {threshold:.4g} hidden: {int(mask.sum()):,} of {len(mask):,} {verb}"
    return f"{text}; {selection.text}" if selected else text
