"""A synthetic MNI-space phantom of the named bundles, for validation and benchmarks.

Each bundle is a tube of radius ``radius_mm`` along a smooth curve (a centripetal Catmull-Rom
spline) through the textbook ``course`` points of its protocol (:mod:`.protocols`); a voxel of the
tube carries the curve's tangent at its nearest point. Where tubes cross, a voxel carries up to
three fibre populations (nearly parallel ones merge). The phantom is written the way a subject's
data is: bedpostX-style posterior samples (directions dispersed by ``dispersion_deg``), an FSL
tensor (prolate along the main population) or fODF coefficients (a sum of sharp lobes, MRtrix
basis), on an MNI-aligned grid, and an identity registration folder to MNI. Voxels of the brain
outside every tube are isotropic (samples of random direction and small fraction, a spherical
tensor, a flat fODF below the cut-off), so a streamline that leaves its tube soon stops.

The true bundle of a name is its tube: :func:`share_inside` says which streamlines keep to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

from ..grid import Grid
from ..registration import Registration
from .protocols import protocol_of

#: MNI152 2 mm grid (FSL's MNI152_T1_2mm): the registration's fixed grid.
MNI_2MM = Grid(np.array([[-2.0, 0, 0, 90], [0, 2.0, 0, -126], [0, 0, 2.0, -72], [0, 0, 0, 1]]), (91, 109, 91))
#: HCP's MNINonLinear diffusion grid (1.25 mm, 145 × 174 × 145).
HCP_GRID = Grid(np.array([[-1.25, 0, 0, 90], [0, 1.25, 0, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]]), (145, 174, 145))
#: The brain of the phantom: an ellipsoid (centre, semi-axes in mm) holding every course.
BRAIN_CENTRE = np.array([0.0, -18.0, 12.0])
BRAIN_AXES = np.array([72.0, 94.0, 74.0])


def course_curve(points: np.ndarray, spacing_mm: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """(points, unit tangents) every ``spacing_mm`` along a centripetal Catmull-Rom spline through
    the (K, 3) ``points`` (ends extended by reflection)."""
    p = np.asarray(points, dtype=np.float64)
    ext = np.vstack([2 * p[0] - p[1], p, 2 * p[-1] - p[-2]])
    out = []
    for i in range(1, len(ext) - 2):
        p0, p1, p2, p3 = ext[i - 1 : i + 3]
        t0 = 0.0
        t1 = t0 + np.linalg.norm(p1 - p0) ** 0.5
        t2 = t1 + np.linalg.norm(p2 - p1) ** 0.5
        t3 = t2 + np.linalg.norm(p3 - p2) ** 0.5
        n = max(2, int(np.ceil(np.linalg.norm(p2 - p1) / spacing_mm)) + 1)
        t = np.linspace(t1, t2, n)[:, None]
        a1 = (t1 - t) / (t1 - t0) * p0 + (t - t0) / (t1 - t0) * p1
        a2 = (t2 - t) / (t2 - t1) * p1 + (t - t1) / (t2 - t1) * p2
        a3 = (t3 - t) / (t3 - t2) * p2 + (t - t2) / (t3 - t2) * p3
        b1 = (t2 - t) / (t2 - t0) * a1 + (t - t0) / (t2 - t0) * a2
        b2 = (t3 - t) / (t3 - t1) * a2 + (t - t1) / (t3 - t1) * a3
        c = (t2 - t) / (t2 - t1) * b1 + (t - t1) / (t2 - t1) * b2
        out.append(c if i == len(ext) - 3 else c[:-1])
    curve = np.vstack(out)
    tangent = np.gradient(curve, axis=0)
    tangent /= np.linalg.norm(tangent, axis=1, keepdims=True)
    return curve, tangent


@dataclass
class Phantom:
    """The phantom on its grid: up to three fibre populations per voxel (directions in RAS,
    fractions), the brain mask and each bundle's tube."""

    grid: Grid
    dirs: np.ndarray  # (X, Y, Z, 3, 3) RAS unit vectors
    f: np.ndarray  # (X, Y, Z, 3)
    brain: np.ndarray  # (X, Y, Z) bool
    tubes: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (X, Y, Z) bool
    radius_mm: float = 4.0

    @property
    def affine(self) -> np.ndarray:
        return self.grid.affine


def phantom_grid(voxel_mm: float = 2.5, margin_mm: float = 6.0) -> Grid:
    """An MNI-aligned grid (x decreasing along the first axis, as MNI152) holding the phantom's brain."""
    low = BRAIN_CENTRE - BRAIN_AXES - margin_mm
    high = BRAIN_CENTRE + BRAIN_AXES + margin_mm
    shape = tuple(int(np.ceil((high[i] - low[i]) / voxel_mm)) + 1 for i in range(3))
    affine = np.diag([-voxel_mm, voxel_mm, voxel_mm, 1.0])
    affine[:3, 3] = [high[0], low[1], low[2]]
    return Grid(affine, shape)


def make_phantom(names, grid: Grid | None = None, radius_mm: float = 4.0, anisotropic_f: float = 0.7) -> Phantom:
    """The phantom of the bundles ``names`` on ``grid`` (:func:`phantom_grid` by default)."""
    grid = grid or phantom_grid()
    ijk = np.indices(grid.shape).reshape(3, -1).T
    centres = grid.to_mm(ijk)
    brain = (((centres - BRAIN_CENTRE) / BRAIN_AXES) ** 2).sum(axis=1) <= 1.0
    n = len(centres)
    best = np.full((n, 4), np.inf)  # distance of up to 4 candidate populations per voxel
    cand = np.zeros((n, 4, 3))
    tubes = {}
    in_brain = np.flatnonzero(brain)
    for name in names:
        curve, tangent = course_curve(protocol_of(name).course)
        # only the brain's voxels near the curve's bounding box can lie in its tube
        near = in_brain[
            np.all((centres[in_brain] >= curve.min(0) - radius_mm) & (centres[in_brain] <= curve.max(0) + radius_mm), 1)
        ]
        dist, nearest = cKDTree(curve).query(centres[near], distance_upper_bound=radius_mm, workers=-1)
        found = np.isfinite(dist)
        inside = near[found]
        tubes[name] = np.zeros(n, dtype=bool)
        tubes[name][inside] = True
        d_in, t_in = dist[found], tangent[nearest[found]]
        slot = np.argmax(best[inside], axis=1)  # replace the farthest candidate when closer
        closer = d_in < best[inside, slot]
        rows = inside[closer]
        best[rows, slot[closer]] = d_in[closer]
        cand[rows, slot[closer]] = t_in[closer]
    order = np.argsort(best, axis=1)
    best = np.take_along_axis(best, order, axis=1)
    cand = np.take_along_axis(cand, order[..., None], axis=1)
    dirs = np.zeros((n, 3, 3))
    f = np.zeros((n, 3))
    count = np.zeros(n, dtype=np.int64)
    for k in range(4):
        has = np.isfinite(best[:, k])
        v = cand[:, k]
        merged = np.zeros(n, dtype=bool)
        for j in range(3):  # nearly parallel to a population already there: the same population
            same = has & (j < count) & (np.abs((dirs[:, j] * v).sum(axis=1)) > 0.95)
            merged |= same
        new = has & ~merged & (count < 3)
        rows = np.flatnonzero(new)
        dirs[rows, count[rows]] = v[rows]
        count[rows] += 1
    for j in range(3):
        f[:, j] = np.where(j < count, anisotropic_f / np.maximum(count, 1), 0.0)
    shape = grid.shape
    return Phantom(
        grid,
        dirs.reshape(*shape, 3, 3),
        f.reshape(*shape, 3),
        brain.reshape(shape),
        {k: v.reshape(shape) for k, v in tubes.items()},
        radius_mm,
    )


def _to_voxel_axes(grid: Grid, vectors: np.ndarray) -> np.ndarray:
    """RAS directions as directions along the grid's voxel axes (physical lengths)."""
    rotation = grid.affine[:3, :3] / grid.voxel_sizes
    return vectors @ rotation  # rotation.T @ v for each v


def _dispersed(rng, v: np.ndarray, n_samples: int, dispersion_deg: float) -> np.ndarray:
    """(N, S, 3) unit vectors scattered around the (N, 3) ``v`` by ``dispersion_deg`` (s.d.)."""
    noise = rng.normal(0.0, np.deg2rad(dispersion_deg), size=(len(v), n_samples, 3))
    out = v[:, None, :] + noise
    return out / np.linalg.norm(out, axis=-1, keepdims=True)


def masked_samples(phantom: Phantom, n_samples: int = 16, dispersion_deg: float = 6.0, seed: int = 0,
                   chunk: int = 100_000):  # fmt: skip
    """bedpostX samples of the brain's voxels (C order): (theta, phi, f) as (N, 3, S) float32 in
    FSL's frame, made ``chunk`` voxels at a time (an HCP-sized brain holds a million)."""
    from ..io.dwi import x_flip_needed

    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(phantom.brain.ravel())
    theta = np.zeros((len(idx), 3, n_samples), np.float32)
    phi, fs = np.zeros_like(theta), np.zeros_like(theta)
    flip = x_flip_needed(phantom.affine)
    all_dirs, all_f = phantom.dirs.reshape(-1, 3, 3), phantom.f.reshape(-1, 3)
    for start in range(0, len(idx), chunk):
        rows = slice(start, start + chunk)
        dirs, f = all_dirs[idx[rows]], all_f[idx[rows]]
        for j in range(3):
            has = f[:, j] > 0
            samples = _dispersed(rng, _to_voxel_axes(phantom.grid, dirs[:, j]), n_samples, dispersion_deg)
            random = rng.normal(size=samples.shape)  # isotropic voxels: a random direction per sample
            random /= np.linalg.norm(random, axis=-1, keepdims=True)
            samples = np.where(has[:, None, None], samples, random)
            if flip:
                samples[..., 0] *= -1
            theta[rows, j] = np.arccos(np.clip(samples[..., 2], -1, 1))
            phi[rows, j] = np.arctan2(samples[..., 1], samples[..., 0])
            fs[rows, j] = np.where(has, f[:, j], 0.02 if j == 0 else 0.0)[:, None]
    return theta, phi, fs


def write_bedpostx(phantom: Phantom, folder: str | os.PathLike, n_samples: int = 16, dispersion_deg: float = 6.0,
                   seed: int = 0) -> Path:  # fmt: skip
    """The phantom as a bedpostX folder (3 fibres, ``n_samples`` posterior samples)."""
    from ..io.bedpostx import save_bedpostx_masked

    theta, phi, f = masked_samples(phantom, n_samples, dispersion_deg, seed)
    save_bedpostx_masked(folder, phantom.brain, phantom.affine, theta, phi, f)
    return Path(folder)


def write_tensor(phantom: Phantom, folder: str | os.PathLike) -> Path:
    """The phantom as a dtifit-style folder (``dti_tensor.nii.gz``): prolate tensors along the
    main population (λ = 1.7, 0.3, 0.3 µm²/ms), spherical ones elsewhere in the brain."""
    from ..io.tensor import save_tensor

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    v = _to_voxel_axes(phantom.grid, phantom.dirs[..., 0, :])
    has = phantom.f[..., 0] > 0
    outer = v[..., :, None] * v[..., None, :]
    eye = np.eye(3)
    tensor = np.where(has[..., None, None], 0.3e-3 * eye + 1.4e-3 * outer, 0.8e-3 * eye)
    tensor[~phantom.brain] = 0.0
    rows, cols = (0, 0, 0, 1, 1, 2), (0, 1, 2, 1, 2, 2)  # xx, xy, xz, yy, yz, zz
    save_tensor(tensor[..., rows, cols], phantom.affine, folder / "dti_tensor.nii.gz")
    return folder


def write_fod(phantom: Phantom, folder: str | os.PathLike, lmax: int = 8) -> Path:
    """The phantom as a fit-csd folder (``fod.nii.gz``): per population a truncated delta along
    its direction weighted by its fraction (peak amplitude about 1 for one population), a small
    isotropic part elsewhere in the brain."""
    from tractlens.gpu.sh import sh_basis

    from ..io.fod import save_fod
    from ..pipelines.track_fod import FOD_FILE

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n_coef = sh_basis(np, np.array([[0.0, 0.0, 1.0]]), lmax).shape[1]
    peak = float((sh_basis(np, np.array([[0.0, 0.0, 1.0]]), lmax) ** 2).sum())
    sh = np.zeros((*phantom.grid.shape, n_coef), np.float32)
    for j in range(3):
        has = phantom.f[..., j] > 0
        basis = sh_basis(np, phantom.dirs[..., j, :][has], lmax)
        sh[has] += (basis * (phantom.f[..., j][has] / 0.7 / peak)[:, None]).astype(np.float32)
    y00 = float(sh_basis(np, np.array([[0.0, 0.0, 1.0]]), 0)[0, 0])
    sh[phantom.brain, 0] += 0.02 / y00
    save_fod(sh, phantom.affine, folder / FOD_FILE)
    return folder


def write_identity_registration(grid: Grid, folder: str | os.PathLike) -> Path:
    """A registration folder joining the phantom's grid (moving: the subject) to MNI (fixed) by
    the identity: the phantom is drawn in MNI coordinates already."""
    from ..io.transforms import save_registration

    reg = Registration(MNI_2MM, grid, np.eye(4), kind="identity", fixed_name="mni", moving_name="phantom",
                       template="mni", template_side="fixed")  # fmt: skip
    return save_registration(reg, folder, {"note": "synthetic phantom drawn in MNI coordinates"})


def distance_to_course(name: str, points_mm: np.ndarray) -> np.ndarray:
    """Distance (mm) of each point to the bundle's course curve."""
    curve, _ = course_curve(protocol_of(name).course)
    return cKDTree(curve).query(np.asarray(points_mm, dtype=np.float64).reshape(-1, 3))[0]


def share_inside(name: str, points_mm: np.ndarray, offsets: np.ndarray, radius_mm: float, tolerance_mm: float,
                 point_share: float = 0.95) -> tuple[float, np.ndarray]:  # fmt: skip
    """(share of streamlines inside the true bundle, per-streamline verdict): a streamline is inside
    when at least ``point_share`` of its points lie within ``radius_mm + tolerance_mm`` of the
    bundle's course (its tube, widened by the tolerance, e.g. one voxel)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(offsets) < 2:
        return 0.0, np.zeros(0, dtype=bool)
    near = distance_to_course(name, points_mm) <= radius_mm + tolerance_mm
    counts = np.diff(offsets)
    owner = np.repeat(np.arange(len(counts)), counts)
    share = np.bincount(owner, weights=near, minlength=len(counts)) / np.maximum(counts, 1)
    inside = share >= point_share
    return float(inside.mean()), inside
