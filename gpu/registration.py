"""Rigid and affine registration by mutual information, on CuPy or NumPy.

The metric is Mattes et al.'s (2003) mutual information: a joint histogram of the fixed image's
intensity (nearest bin) and the moving image's (a cubic B-spline Parzen window, so the metric is
smooth in the transform), over points sampled on the fixed grid. Its gradient is analytic:

    dMI/dθ = (1/N) Σ_i Σ_l log(p(k_i, l) / p_m(l)) · β'(b_i − l) · ∇m(y_i) · ∂y_i/∂θ

with k_i the fixed bin of point i, b_i the moving intensity in bin units at its mapped point y_i,
β' the derivative of the cubic B-spline and ∇m the moving image's gradient (world units). The
optimiser is SciPy's L-BFGS-B on the host; the images, the interpolation, the histogram and the
gradient sums stay on the device. Levels coarse to fine, each a Gaussian-smoothed, downsampled copy.

It is the GPU path of ``app.pipelines.register``; DIPY's ``AffineRegistration`` is the CPU path and
the reference the tests compare with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import ndimage, optimize

from .backend import Backend, Cancelled, get_backend

TRANSFORMS = ("rigid", "affine")


@dataclass
class Level:
    """One resolution level: the fixed sample points (world mm), their bins, and the moving image."""

    points: object  # (N, 3) world mm, device
    fixed_bins: object  # (N,) int32, device
    moving: object  # (X, Y, Z) float32, device, in bin units
    gradient: object  # (3, X, Y, Z) float32, device: d moving / d voxel index
    world_to_voxel: np.ndarray  # 4x4 of the moving image of this level


def _cubic(t, xp):
    """The cubic B-spline and its derivative at t (any shape)."""
    a = xp.abs(t)
    value = xp.where(a < 1, 2 / 3 - a**2 + a**3 / 2, xp.where(a < 2, (2 - a) ** 3 / 6, 0.0))
    slope = xp.where(a < 1, -2 * a + 1.5 * a**2, xp.where(a < 2, -((2 - a) ** 2) / 2, 0.0)) * xp.sign(t)
    return value, slope


def _trilinear(volume, vox, xp):
    """Trilinear samples of ``volume`` at voxel coordinates (3, N); points outside give NaN."""
    shape = volume.shape
    inside = (vox[0] >= 0) & (vox[1] >= 0) & (vox[2] >= 0)
    inside &= (vox[0] <= shape[0] - 1) & (vox[1] <= shape[1] - 1) & (vox[2] <= shape[2] - 1)
    base = [xp.clip(xp.floor(vox[d]), 0, shape[d] - 2).astype(xp.int32) for d in range(3)]
    frac = [vox[d] - base[d] for d in range(3)]
    out = xp.zeros(vox.shape[1], dtype=xp.float32)
    for dx in (0, 1):
        wx = frac[0] if dx else 1 - frac[0]
        for dy in (0, 1):
            wy = frac[1] if dy else 1 - frac[1]
            for dz in (0, 1):
                wz = frac[2] if dz else 1 - frac[2]
                out += (wx * wy * wz) * volume[base[0] + dx, base[1] + dy, base[2] + dz]
    return xp.where(inside, out, xp.nan)


def _to_bins(image: np.ndarray, bins: int, pad: int) -> tuple[np.ndarray, float, float]:
    """Intensities mapped to [pad, bins - 1 - pad] by the foreground's 0.5..99.5 percentiles."""
    values = image[image > 0] if np.any(image > 0) else image.ravel()
    lo, hi = np.percentile(values, [0.5, 99.5])
    scale = (bins - 1 - 2 * pad) / max(hi - lo, 1e-6)
    return (np.clip(image, lo, hi) - lo) * scale + pad, lo, scale


def _level_images(image: np.ndarray, affine: np.ndarray, factor: int, sigma: float):
    """A smoothed copy of ``image`` subsampled by ``factor`` and its affine."""
    smoothed = ndimage.gaussian_filter(image, sigma) if sigma > 0 else image
    sub = smoothed[::factor, ::factor, ::factor]
    scaled = affine @ np.diag([factor, factor, factor, 1.0])
    return np.ascontiguousarray(sub, dtype=np.float32), scaled


def _rotation(omega: np.ndarray) -> np.ndarray:
    """Rotation matrix of a rotation vector (Rodrigues)."""
    angle = float(np.linalg.norm(omega))
    if angle < 1e-12:
        return np.eye(3)
    k = omega / angle
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * kx + (1 - np.cos(angle)) * kx @ kx


class MutualInformationRegistration:
    """Optimises ``fixed point -> moving point`` (a 4x4 in world mm) by mutual information."""

    def __init__(self, backend: Backend, bins: int = 32):
        self.backend = backend
        self.xp = backend.xp
        self.bins = bins

    def prepare(self, fixed, fixed_affine, moving, moving_affine, factor: int, sampling: float, seed: int) -> Level:
        xp = self.xp
        sigma = 0.0 if factor == 1 else float(factor) / 2
        fixed_l, fixed_aff = _level_images(np.asarray(fixed, np.float32), fixed_affine, factor, sigma)
        moving_l, moving_aff = _level_images(np.asarray(moving, np.float32), moving_affine, factor, sigma)
        fixed_bins, _, _ = _to_bins(fixed_l, self.bins, 0)
        moving_bins, _, _ = _to_bins(moving_l, self.bins, 2)
        mask = fixed_l > 0
        index = np.flatnonzero(mask.ravel())
        if sampling < 1:
            rng = np.random.default_rng(seed)
            index = np.sort(rng.choice(index, size=max(1000, int(len(index) * sampling)), replace=False))
        ijk = np.stack(np.unravel_index(index, fixed_l.shape), 1).astype(np.float64)
        points = ijk @ fixed_aff[:3, :3].T + fixed_aff[:3, 3]
        gradient = np.stack(np.gradient(moving_bins.astype(np.float32)), 0)
        return Level(
            xp.asarray(points, dtype=xp.float32),
            xp.asarray(np.clip(np.round(fixed_bins.ravel()[index]), 0, self.bins - 1), dtype=xp.int32),
            xp.asarray(moving_bins, dtype=xp.float32),
            xp.asarray(gradient, dtype=xp.float32),
            np.linalg.inv(moving_aff),
        )

    def value_and_gradient(self, level: Level, transform: np.ndarray, centre: np.ndarray) -> tuple[float, np.ndarray]:
        """−MI and its gradient with respect to the 12 entries (A, t) of ``transform`` = the map
        x -> A (x - centre) + centre + t (fixed world mm -> moving world mm)."""
        xp, bins = self.xp, self.bins
        a = transform[:3, :3]
        offset = transform[:3, 3]
        to_vox = level.world_to_voxel
        # moving voxel coordinates of every point: W (A (x - c) + c + t)
        m = to_vox[:3, :3] @ a
        shift = to_vox[:3, :3] @ (centre - a @ centre + offset) + to_vox[:3, 3]
        pts = level.points
        vox = (pts @ xp.asarray(m.T, dtype=xp.float32) + xp.asarray(shift, dtype=xp.float32)).T
        values = _trilinear(level.moving, vox, xp)
        valid = ~xp.isnan(values)
        count = int(valid.sum())
        if count < 100:
            return 0.0, np.zeros(12)
        values = xp.where(valid, values, 0)
        weight = valid.astype(xp.float32)
        base = xp.floor(values).astype(xp.int32)
        joint = xp.zeros(bins * bins, dtype=xp.float64)
        taps = []
        for tap in (-1, 0, 1, 2):
            column = base + tap
            w, dw = _cubic(values - column, xp)
            ok = (column >= 0) & (column < bins)
            index = level.fixed_bins * bins + xp.clip(column, 0, bins - 1)
            joint += xp.bincount(index, weights=(w * weight * ok).astype(xp.float64), minlength=bins * bins)
            taps.append((index, dw * weight * ok))
        p = (joint / count).reshape(bins, bins)
        pf, pm = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
        nz = p > 0
        mi = float(xp.sum(xp.where(nz, p * xp.log(xp.where(nz, p, 1) / xp.where(nz, pf * pm, 1)), 0)))
        table = xp.where(nz, xp.log(xp.where(nz, p, 1) / xp.where(pm > 0, pm, 1)), 0).ravel()
        # dMI/db_i (bin units): sum over taps of log(p/pm) at the tap times the window's slope (sign:
        # the window is β(b − l), so d/db = β')
        dmi_db = xp.zeros_like(values)
        for index, dw in taps:
            dmi_db += table[index] * dw
        dmi_db /= count
        grad_vox = xp.stack([_trilinear(level.gradient[d], vox, xp) for d in range(3)], 0)
        grad_vox = xp.where(xp.isnan(grad_vox), 0, grad_vox)
        # d b_i / d y (world) = W^T ∇_vox; y = A (x - c) + c + t
        u = (xp.asarray(to_vox[:3, :3].T, dtype=xp.float32) @ grad_vox) * dmi_db  # (3, N)
        rel = (pts - xp.asarray(centre, dtype=xp.float32)).T  # (3, N)
        d_a = u @ rel.T  # dMI/dA[j, k] = Σ u_j (x - c)_k
        d_t = u.sum(1)
        gradient = np.concatenate([self.backend.to_host(d_a).ravel(), self.backend.to_host(d_t)])
        return -mi, -gradient.astype(np.float64)


def _matrix(params: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(A, t) of the parameters: a rotation vector and a translation, or I + M and a translation."""
    if kind == "rigid":
        return _rotation(params[:3]), params[3:6]
    return np.eye(3) + params[:9].reshape(3, 3), params[9:12]


def _chain(params: np.ndarray, kind: str, d_a: np.ndarray, d_t: np.ndarray) -> np.ndarray:
    """The gradient in the parameters from the gradient in (A, t)."""
    if kind == "affine":
        return np.concatenate([d_a.ravel(), d_t])
    out = np.zeros(6)
    out[3:] = d_t
    for j in range(3):  # dR/dω by central differences of the parametrisation alone (cheap and smooth)
        step = np.zeros(3)
        step[j] = 1e-6
        d_r = (_rotation(params[:3] + step) - _rotation(params[:3] - step)) / 2e-6
        out[j] = float(np.sum(d_a * d_r))
    return out


def register_affine(
    fixed: np.ndarray,
    fixed_affine: np.ndarray,
    moving: np.ndarray,
    moving_affine: np.ndarray,
    start: np.ndarray,
    kind: str = "affine",
    *,
    iterations: tuple[int, ...] = (100, 50, 20),
    bins: int = 32,
    sampling: float = 0.1,
    seed: int = 0,
    backend: Backend | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """The 4x4 ``fixed world -> moving world`` map of highest mutual information, starting at ``start``
    (e.g. the centres of mass aligned). ``kind``: 'rigid' (6 parameters) or 'affine' (12).

    The map is ``start · T`` with ``T(x) = c + A (x − c) + t`` about the fixed grid's centre ``c``; each
    level starts from the previous level's parameters."""
    if kind not in TRANSFORMS:
        raise ValueError(f"kind is one of {TRANSFORMS}")
    backend = get_backend(backend or "auto")
    engine = MutualInformationRegistration(backend, bins)
    centre = fixed_affine[:3, :3] @ ((np.array(fixed.shape) - 1) / 2) + fixed_affine[:3, 3]
    prealigned = np.linalg.inv(start) @ moving_affine  # the moving image seen through `start`
    params = np.zeros(6 if kind == "rigid" else 12)
    levels = len(iterations)
    for number, steps in enumerate(iterations):
        if cancelled is not None and cancelled():
            raise Cancelled()
        level = engine.prepare(fixed, fixed_affine, moving, prealigned, 2 ** (levels - 1 - number), sampling, seed)

        def objective(x, level=level):
            a, t = _matrix(x, kind)
            transform = np.eye(4)
            transform[:3, :3], transform[:3, 3] = a, t
            value, gradient = engine.value_and_gradient(level, transform, centre)
            return value, _chain(x, kind, gradient[:9].reshape(3, 3), gradient[9:])

        params = optimize.minimize(objective, params, jac=True, method="L-BFGS-B", options={"maxiter": steps}).x
    a, t = _matrix(params, kind)
    about = np.eye(4)
    about[:3, :3] = a
    about[:3, 3] = centre - a @ centre + t
    return start @ about
