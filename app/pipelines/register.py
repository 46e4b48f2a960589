"""Image registration through DIPY's ``align``: rigid and affine by mutual information, then SyN.

The stages, as ``antsRegistration`` runs them: the centres of mass are aligned, then a rigid and
(for ``affine`` and ``syn``) an affine transform are optimised by Mattes-style mutual information
(DIPY's :class:`~dipy.align.imaffine.AffineRegistration`, multi-resolution, L-BFGS-B), then for
``syn`` the symmetric diffeomorphic normalisation of Avants et al. (2008) with a cross-correlation
metric (DIPY's :class:`~dipy.align.imwarp.SymmetricDiffeomorphicRegistration`), which gives the
forward and the inverse displacement fields together.

Why DIPY (against ANTsPy and SimpleITK, measured in this project's registration benchmark): it is
already what the test suite compares the tensor fit with, its wheels carry no NumPy or SciPy upper
pin (``antspyx`` 0.6 pins ``numpy<2.4`` and ``scipy<1.16``, which would downgrade both for every
user), its SyN is the one pyAFQ uses for MNI registration, and it was as accurate as SimpleITK on
the benchmark's rigid and affine cases.

Optimisation runs on a working grid no finer than :attr:`RegisterParams.spacing_mm` over the fixed
image's field of view: registration accuracy at 1 mm does not need every 1 mm voxel, and the
nonlinear fields live on that grid (ANTs fields can have any grid; ``antsApplyTransforms`` and
nitransforms resample them).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from tractlens.gpu.backend import Cancelled

from ..errors import InputError
from ..grid import Grid
from ..params import RegisterParams
from ..registration import Registration, affine_chain


@dataclass
class RegistrationRun:
    """What :func:`register_arrays` returns: the registration, the moving image on the fixed grid and
    the numbers ``registration.json`` records."""

    registration: Registration
    moving_in_fixed: np.ndarray
    metric_before: float
    metric_after: float
    overlap: float
    shared: float
    seconds: dict[str, float]
    engine: str = ""


def _dipy():
    """DIPY's imaffine, imwarp, metrics and transforms, without the workflow API that the package
    ``dipy.align`` imports first (:mod:`app._dipy_start`: half of DIPY's import time)."""
    from .._dipy_start import import_align

    try:
        imaffine, imwarp, metrics, transforms = import_align()
    except ImportError as exc:
        raise InputError(
            f"registration uses DIPY, which comes with the anatomy extra and could not be imported ({exc})",
            fix="Install it: pip install 'tractlens[anatomy]'",
        ) from None
    return imaffine, imwarp, metrics, transforms


def one_blas_thread():
    """A context in which NumPy's BLAS runs on one thread (threadpoolctl, of the anatomy extra; nothing
    without it). DIPY's optimisers call ``ndarray.dot`` on small matrices about five times per
    iteration: threaded BLAS spends more starting its threads than computing, and the affine stages
    took longer on the 16-core machine than pinned to 2 cores (rigid 3.2 against 2.2 s, SyN 12.8
    against 9.4 s; here 1,248 of these products cost 0.05 s on one thread, 2.2 s threaded under load)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def working_grid(fixed: Grid, moving: Grid, spacing_mm: float) -> Grid:
    """The fixed field of view on isotropic voxels of the coarsest of ``spacing_mm`` and the two
    images' voxel sizes (their mean edge)."""
    spacing = max(spacing_mm, float(np.mean(fixed.voxel_sizes)), float(np.mean(moving.voxel_sizes)))
    extent = np.array(fixed.shape) * fixed.voxel_sizes
    shape = tuple(int(n) for n in np.maximum(np.ceil(extent / spacing), 1))
    directions = fixed.affine[:3, :3] / fixed.voxel_sizes
    affine = np.eye(4)
    affine[:3, :3] = directions * spacing
    # the same centre as the fixed grid
    centre = fixed.affine[:3, :3] @ ((np.array(fixed.shape) - 1) / 2) + fixed.affine[:3, 3]
    affine[:3, 3] = centre - affine[:3, :3] @ ((np.array(shape) - 1) / 2)
    return Grid(affine, shape)


def _signal(image: np.ndarray) -> np.ndarray:
    """Voxels whose magnitude is above 5 % of the 99th percentile of the positive ones."""
    magnitude = np.abs(image)
    positive = magnitude[magnitude > 0]
    if positive.size == 0:
        return np.zeros(image.shape, bool)
    return magnitude > 0.05 * np.percentile(positive, 99)


def foreground(image: np.ndarray) -> np.ndarray:
    """The head: voxels whose magnitude is above 5 % of its 99th percentile, holes filled (so that dark
    CSF in a T1 and dark white matter in a b=0 image count alike)."""
    mask = _signal(image)
    if not mask.any():
        return mask
    return ndimage.binary_fill_holes(ndimage.binary_closing(mask, iterations=2))


def mutual_information(a: np.ndarray, b: np.ndarray, mask: np.ndarray, bins: int = 32) -> float:
    """Mutual information (nats) of two images' intensities over ``mask`` (joint histogram)."""
    return _information(a, b, mask, bins)[0]


def _information(a: np.ndarray, b: np.ndarray, mask: np.ndarray, bins: int) -> tuple[float, float]:
    """(mutual information, entropy of ``a``) over ``mask``, in nats."""
    if mask.sum() < 2:
        return 0.0, 0.0
    joint, _, _ = np.histogram2d(a[mask].ravel(), b[mask].ravel(), bins=bins)
    p = joint / joint.sum()
    pa, pb = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nz = p > 0
    entropy = float(-(pa[pa > 0] * np.log(pa[pa > 0])).sum())
    return float((p[nz] * np.log(p[nz] / (pa @ pb)[nz])).sum()), entropy


def shared_information(a: np.ndarray, b: np.ndarray, mask: np.ndarray, bins: int = 32) -> float:
    """The share of ``a``'s entropy that ``b`` explains (mutual information / H(a), 0 to 1; Theil's
    uncertainty coefficient): a few hundredths for unrelated images, tenths for registered anatomy
    of any two contrasts."""
    mi, entropy = _information(a, b, mask, bins)
    return mi / entropy if entropy > 0 else 0.0


def _normalised(image: np.ndarray) -> np.ndarray:
    fg = foreground(image)
    if not fg.any():
        return image
    lo, hi = np.percentile(image[fg], [1, 99])
    return np.clip((image - lo) / max(hi - lo, 1e-6), 0, 1).astype(np.float32) * fg


def register_arrays(
    moving: np.ndarray,
    moving_grid: Grid,
    fixed: np.ndarray,
    fixed_grid: Grid,
    params: RegisterParams | None = None,
    *,
    moving_mask: np.ndarray | None = None,
    fixed_mask: np.ndarray | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    device: str = "auto",
) -> RegistrationRun:
    """Register ``moving`` onto ``fixed`` (3-D float arrays on their grids) with ``params``.

    Every stage runs through DIPY on the CPU, whatever ``device`` says (the engine line of the
    summary says so): a CuPy implementation of the mutual-information stages was built and measured
    on the H100 machine, slower than DIPY on two CPU cores (3.0 against 2.2 s for the rigid stage of
    a 1 mm T1 onto a 2 mm b=0) and less accurate (0.48 against 0.27 mm), so it was not kept."""
    params = params or RegisterParams()
    imaffine, imwarp, metrics, transforms = _dipy()
    check = cancelled or (lambda: False)
    stages = (
        ["centre", "rigid"]
        + (["affine"] if params.type in ("affine", "syn") else [])
        + (["syn"] if params.type == "syn" else [])
    )
    total = len(stages) + 1
    report = progress or (lambda done, total: None)
    seconds: dict[str, float] = {}
    moving = np.nan_to_num(np.asarray(moving, np.float32)) * (1 if moving_mask is None else moving_mask)
    fixed = np.nan_to_num(np.asarray(fixed, np.float32)) * (1 if fixed_mask is None else fixed_mask)
    for name, image in (("moving", moving), ("fixed", fixed)):
        if not _signal(image).any():  # the foreground's seed: the same verdict without its morphology
            raise InputError(
                f"the {name} image holds no signal (all voxels are 0 or not finite)",
                fix="Check the file, the --volume choice or the mask",
            )
    work = working_grid(fixed_grid, moving_grid, params.spacing_mm)
    started = time.perf_counter()
    static = _affine_resample(_smoothed(fixed, fixed_grid, work), fixed_grid, work)
    # The moving image on a grid as coarse as the working grid too: its pyramid and gradients, which
    # DIPY builds at every level, then cost what the fixed side's do (a 1 mm T1 is 8x more voxels).
    moving_work = working_grid(moving_grid, moving_grid, float(np.mean(work.voxel_sizes)))
    moving_full, moving_full_grid = moving, moving_grid
    moving = _affine_resample(_smoothed(moving, moving_grid, moving_work), moving_grid, moving_work)
    moving_grid = moving_work
    static_mask = foreground(static)
    report(0, total)

    def stage_done(name: str, t0: float) -> None:
        seconds[name] = round(time.perf_counter() - t0, 3)
        report(stages.index(name) + 1, total)
        if check():
            raise Cancelled()

    t0 = time.perf_counter()
    centre = centres_of_mass(static, work, moving, moving_grid)
    before = mutual_information(static, _affine_resample(moving, moving_grid, work, centre), static_mask, params.bins)
    stage_done("centre", t0)
    with one_blas_thread():
        affine = _dipy_affine(
            imaffine, transforms, static, work, moving, moving_grid, centre, params, stages, stage_done
        )
    warp = inverse = None
    grid = fixed_grid
    if params.type == "syn":
        t0 = time.perf_counter()
        with one_blas_thread():
            warp, inverse = _syn(imwarp, metrics, static, work, moving, moving_grid, affine, params, check)
        grid = work
        stage_done("syn", t0)
    registration = Registration(grid, moving_full_grid, affine, warp, inverse, kind=params.type, metric=params.metric)
    on_work = (  # the working copy, through the whole transform
        registration.pull(moving, moving_grid, work, "fixed", device="cpu")
        if registration.nonlinear
        else _affine_resample(moving, moving_grid, work, affine)
    )
    after = mutual_information(static, on_work, static_mask, params.bins)
    shared = shared_information(static, on_work, static_mask, params.bins)
    overlap = float((foreground(on_work) & static_mask).sum() / max(static_mask.sum(), 1))
    seconds["total"] = round(time.perf_counter() - started, 3)
    moving_in_fixed = on_work if grid is work else _affine_resample(moving_full, moving_full_grid, fixed_grid, affine)
    report(total, total)
    engine = "DIPY on the CPU" + (" (registration has no GPU path)" if device == "gpu" else "")
    return RegistrationRun(registration, moving_in_fixed, before, after, overlap, shared, seconds, engine)


def _smoothed(image: np.ndarray, grid: Grid, target: Grid) -> np.ndarray:
    """``image`` low-passed before it is resampled onto the coarser ``target`` (Gaussian of half the
    ratio of voxel sizes, in the image's voxels), so the coarse copy is not aliased."""
    ratio = np.mean(target.voxel_sizes) / grid.voxel_sizes
    sigma = np.where(ratio > 1.01, 0.5 * ratio, 0.0)
    return ndimage.gaussian_filter(image, sigma) if sigma.any() else image


def centres_of_mass(static: np.ndarray, work: Grid, moving: np.ndarray, moving_grid: Grid) -> np.ndarray:
    """The translation that puts the moving image's centre of mass on the fixed one's (fixed -> moving)."""
    out = np.eye(4)
    centres = []
    for image, grid in ((static, work), (moving, moving_grid)):
        weights = np.clip(image, 0, None)
        ijk = np.array(ndimage.center_of_mass(weights)) if weights.sum() > 0 else (np.array(image.shape) - 1) / 2
        centres.append(grid.affine[:3, :3] @ ijk + grid.affine[:3, 3])
    out[:3, 3] = centres[1] - centres[0]
    return out


#: The fewest working-grid voxels the mutual information is sampled on (the finest level; DIPY
#: takes the same share at the coarser ones): a small image (a slab, a phantom, a 24³ test head) is
#: sampled more densely than :attr:`RegisterParams.sampling` says, or its metric is too noisy to
#: optimise (the 24³ test pair diverged at 5 %: 690 points). At 10,000 the demo's 56×56×24 label
#: image (13 % of it) diverged under a 4 mm shift every time, while 20,000, 30,000, 40,000 and
#: 50,000 found it; 30,000 leaves the 2 mm whole-head grids (~0.9 M voxels) at 5 %.
MIN_SAMPLED_VOXELS = 30_000


def sampled_share(sampling: float, voxels: int) -> float:
    """The share of the working grid's voxels the metric is computed on: ``sampling``, raised to
    :data:`MIN_SAMPLED_VOXELS` points on a small grid (1: all)."""
    return float(min(1.0, max(sampling, MIN_SAMPLED_VOXELS / max(int(voxels), 1))))


def _dipy_affine(
    imaffine, transforms, static, work: Grid, moving, moving_grid: Grid, start, params, stages, stage_done
):
    """The rigid and affine stages through DIPY's AffineRegistration (the CPU path)."""
    share = sampled_share(params.sampling, static.size)
    metric = imaffine.MutualInformationMetric(nbins=params.bins, sampling_proportion=None if share >= 1 else share)
    levels = len(params.affine_iterations)

    def optimiser(iterations):
        return imaffine.AffineRegistration(
            metric=metric,
            level_iters=list(iterations),
            sigmas=[float(2 ** (levels - 1 - i) - 1) for i in range(levels)],
            factors=[2 ** (levels - 1 - i) for i in range(levels)],
            verbosity=0,
        )

    # A rigid stage followed by the affine one runs at the coarsest level only (0 iterations at the
    # others: it brings the head close; the affine stage then refines at every level): on the
    # benchmark's T1 -> b=0 case the same error (0.27 mm mean, 0.92 max) from 36 % fewer metric
    # evaluations weighted by their voxels, the finer levels being where each costs most. (Not a
    # one-level optimiser: DIPY's finest level is always the whole image, whatever its factor.)
    rigid_iterations = params.affine_iterations
    if "affine" in stages and levels > 1:
        rigid_iterations = (params.affine_iterations[0], *[0] * (levels - 1))
    affine = start
    state = np.random.get_state()  # noqa: NPY002 (DIPY samples with the legacy global generator)
    try:
        for name, transform, iterations in (
            ("rigid", transforms.RigidTransform3D(), rigid_iterations),
            ("affine", transforms.AffineTransform3D(), params.affine_iterations),
        ):
            if name not in stages:
                continue
            t0 = time.perf_counter()
            np.random.seed(params.rng_seed)  # noqa: NPY002 (DIPY's sampled points jitter with it)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                affine = optimiser(iterations).optimize(
                    static, moving, transform, None, static_grid2world=np.array(work.affine),
                    moving_grid2world=np.array(moving_grid.affine), starting_affine=affine,
                ).affine  # fmt: skip
            stage_done(name, t0)
    finally:
        np.random.set_state(state)  # noqa: NPY002
    return affine


def _affine_resample(data: np.ndarray, source: Grid, reference: Grid, affine: np.ndarray | None = None) -> np.ndarray:
    """``data`` drawn on ``reference`` through an affine (RAS, reference -> source; the identity by
    default), trilinear: one composed voxel map (:func:`app.registration.affine_chain`) through DIPY's
    compiled :class:`~dipy.align.imaffine.AffineMap`, the interpolation its optimiser measures the
    metric with (zero beyond the edge, interpolated towards it within one voxel). On the benchmark's
    images it is 1.4 to 4 times faster than SciPy's ``affine_transform`` (0.05 against 0.20 s of CPU
    for the 1 mm T1 onto the 2 mm fixed grid) and gives its values to float32 rounding (1e-7 of the
    largest intensity; the two differ only within a voxel of the source's edge, background in a
    head image). The identity map on the same shape returns ``data`` (a fixed image already on the
    working grid)."""
    chain = affine_chain(source, reference, affine).linear
    data = np.asarray(data, np.float32)
    if data.shape == tuple(reference.shape) and np.allclose(chain, np.eye(4), rtol=0, atol=1e-9):
        return data
    imaffine = _dipy()[0]
    mapping = imaffine.AffineMap(chain, domain_grid_shape=tuple(reference.shape), codomain_grid_shape=data.shape)
    return np.asarray(mapping.transform(data, interpolation="linear"), np.float32)


def _syn(imwarp, metrics, static, work: Grid, moving, moving_grid: Grid, affine, params: RegisterParams, check):
    """The nonlinear stage on the working grid; returns the ANTs-convention fields (RAS mm on ``work``)."""
    pre = _affine_resample(moving, moving_grid, work, affine)  # moving, affinely on the working grid
    if params.metric == "cc":
        metric = metrics.CCMetric(3, sigma_diff=2.0, radius=params.syn_radius)
    else:  # different contrasts: the EM metric learns the intensity mapping as it goes (Arce-Santana et al. 2014)
        metric = metrics.EMMetric(3, smooth=20.0, q_levels=64)

    def callback(_optimizer, _stage):
        if check():
            raise Cancelled()

    optimiser = imwarp.SymmetricDiffeomorphicRegistration(
        metric, level_iters=list(params.syn_iterations), callback=callback
    )
    mapping = optimiser.optimize(
        _normalised(static),
        _normalised(pre),
        static_grid2world=np.array(work.affine),
        moving_grid2world=np.array(work.affine),
    )
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in work.shape], indexing="ij"), -1).reshape(-1, 3)
    x = ijk @ work.affine[:3, :3].T + work.affine[:3, 3]
    # DIPY's forward map sends a working-grid point x to x' in the affinely pre-aligned space; the
    # whole transform is then affine · x'. In ANTs' form affine · (x + w(x)): w = x' − x.
    forward = mapping.transform_points(x) - x
    backward = mapping.transform_points_inverse(x) - x
    return forward.reshape(*work.shape, 3).astype(np.float32), backward.reshape(*work.shape, 3).astype(np.float32)
