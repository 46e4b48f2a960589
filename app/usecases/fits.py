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
    as its source). ``batch_voxels``: voxels per batch (small: a cancel is quick).

    The use case of the window's Fit CSD… and, through the same pipeline, ``tractlens fit-csd``.

    Parameters
    ----------
    dwi : DWI
        A loaded series (:func:`tractlens.app.io.load_dwi`).
    params : CSDParams
        Maximum SH order, single-shell or multi-shell multi-tissue (``msmt``), response
        selection (FA of single-fibre voxels), regularisation.
    peak_params : PeakParams, optional
        Number of peaks, relative threshold and minimum separation (degrees).
    folder : pathlib.Path, optional
        Write ``fod.nii.gz`` (MRtrix3 basis, world frame), ``peaks.nii.gz``, ``response.txt``…
        there.
    device : {"auto", "cpu", "gpu"}
        Where to fit.
    name : str
        Prefix of the layers' names.
    batch_voxels : int, optional
        Voxels per batch.
    ctx : JobContext, optional
        Progress, cancellation and partial results (the window's job runner passes one).

    Returns
    -------
    layers : list of Layer
        The fODF layer (SH coefficients, (X, Y, Z, C)), its peaks, and GM/CSF maps with ``msmt``.
    result : CSDResult
        ``fod()``, ``peaks()`` (world directions × amplitude), ``mask``, the responses' notes and
        ``warnings``.

    References
    ----------
    .. [1] Tournier JD, Calamante F, Connelly A. Robust determination of the fibre orientation
       distribution in diffusion MRI: non-negativity constrained super-resolved spherical
       deconvolution. NeuroImage 35:1459-1472 (2007).
    .. [2] Jeurissen B et al. Multi-tissue constrained spherical deconvolution for improved
       analysis of multi-shell diffusion MRI data. NeuroImage 103:411-426 (2014).

    Examples
    --------
    On a small block of the demo phantom (a whole brain works the same, it only takes longer):

    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_dwi
    >>> from tractlens.app.io.dwi import DWI
    >>> from tractlens.app.usecases.fits import fit_csd
    >>> from tractlens.gpu.csd import CSDParams
    >>> dwi = load_dwi(demo_path() / "dwi.nii.gz")
    >>> block = DWI(dwi.data[20:26, 20:26, 10:13], dwi.affine, dwi.bvals, dwi.bvecs)
    >>> layers, result = fit_csd(block, CSDParams(), device="cpu")
    >>> [layer.name for layer in layers]
    ['CSD peaks', 'CSD fODF']
    >>> result.fod().shape  # 45 coefficients at lmax 8
    (6, 6, 3, 45)
    """
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
    the outputs written to ``folder`` when given.

    The use case of the window's model fit; ``tractlens fit-model`` runs the same pipeline.

    Parameters
    ----------
    dwi : DWI
        A loaded multi-shell series (NODDI needs b=0 volumes and two non-zero shells).
    model_name : {"noddi-watson", "noddi-bingham", "ball-sticks"}
        The model.
    params : ModelFitParams
        Method (``lm``, or ``mcmc`` for posterior means and ``*_std`` maps), NODDI's fixed
        diffusivities (mm²/s), iterations, random seed.
    folder : pathlib.Path, optional
        Write the maps (``NDI``, ``ODI``, ``FWF``…) and ``fit_model.json`` there.
    device : {"auto", "cpu", "gpu"}
        Where to fit.
    roi : tuple of numpy.ndarray, optional
        ``(mask, affine)``: fit only there (resampled onto the DWI grid when needed).
    shown : sequence of str
        Maps to send as partial results while the fit runs.
    ctx : JobContext, optional
        Progress, cancellation and partial results.

    Returns
    -------
    FitModelResult
        ``maps()`` by file stem, each (X, Y, Z) (``dir`` (X, Y, Z, 3) world unit vectors), the
        ``mask``, ``summary`` and ``warnings``.

    References
    ----------
    .. [1] Zhang H, Schneider T, Wheeler-Kingshott CA, Alexander DC. NODDI: practical in vivo
       neurite orientation dispersion and density imaging of the human brain. NeuroImage
       61:1000-1016 (2012).
    .. [2] Hernandez-Fernandez M et al. Using GPUs to accelerate computational diffusion MRI:
       from microstructure estimation to tractography and connectomes. NeuroImage 188:598-615
       (2019) (cuDIMOT).

    Examples
    --------
    NODDI inside one of the demo's bundles (coherent fibres: low orientation dispersion):

    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_dwi, load_mask
    >>> from tractlens.app.usecases.fits import fit_model
    >>> from tractlens.gpu.models import ModelFitParams
    >>> dwi = load_dwi(demo_path() / "dwi.nii.gz")
    >>> bundle = load_mask(demo_path() / "roi_crossing_lr_seed.nii.gz")
    >>> result = fit_model(dwi, "noddi-watson", ModelFitParams(), roi=(bundle, dwi.affine), device="cpu")
    >>> maps = result.maps()
    >>> sorted(maps)
    ['FWF', 'NDI', 'ODI', 'S0', 'dir', 'kappa', 'residual']
    >>> bool(maps["ODI"][bundle].mean() < 0.1), bool(0.3 < maps["NDI"][bundle].mean() < 0.9)
    (True, True)
    """
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
