"""The Riemannian metrics that geodesic ray tracing can follow, built from the pre-processed tensor.

Every metric is given to the tracker as ``C = G⁻¹`` (the tensor whose inverse is the metric)
and the derivatives of ``G``: the geodesic equation and the kernel are the same for all.

- ``inverse``: ``G = D⁻¹`` (O'Donnell et al. 2002; Lenglet et al. 2004; seeds 002 and 004),
  optionally sharpened (``D`` raised to an integer power below an FA threshold).
- ``adjugate``: ``G = adj(D) = det(D) · D⁻¹`` (Fuster, Dela Haije, Tristán-Vega, Plantinga,
  Westin, Florack, "Adjugate diffusion tensors for geodesic tractography in white matter",
  J. Math. Imaging Vis. 54, 2016). The adjugate is the inverse tensor times the conformal
  factor ``det(D)``: its eigenvalues are ``(λ2λ3, λ1λ3, λ1λ2)``, so a step along the main
  eigenvector of a prolate tensor costs ``sqrt(λ2 λ3)``, far less than in isotropic tissue
  of the same mean diffusivity (``λ``), while ``D⁻¹`` makes the two nearly alike. Geodesics
  are therefore refracted back into bundles, as light in an optical fibre, instead of
  running straight across a curved one. Here ``det(D)`` is divided by its median over the
  fitted voxels (a constant: the geodesics are unchanged, CM stays near 1).
  Sharpening, when asked for, applies to ``D`` before the adjugate is taken (the paper's
  sharpened adjugate ``adj(D^p)``).

- ``adaptive`` (the default): ``G = e^{2φ} D⁻¹`` with the conformal factor fitted to the data
  (Hao, Whitaker & Fletcher, "Adaptive Riemannian metrics for improved geodesic tracking of
  white matter", IPMI 2011): ``φ`` makes the curves of the main eigenvector as nearly geodesics
  as a smooth field can (:func:`adaptive_conformal_factor`). Geodesics of ``D⁻¹`` and of its
  adjugate run nearly straight through a bundle of alike tensors and leave a curved one after a
  few voxels; those of the adaptive metric bend with it (measured in
  ``tests/benchmarks/geodesic_validation.py``; the README has the table).

``conformal_power`` ``k`` multiplies the metric by ``(det D / median)^k`` more (the adjugate is
``k = 1`` of the inverse).

The fitted factor is computed by conjugate gradients over the whole grid with array
operations (NumPy or CuPy), once per tensor field and metric (the pipelines cache it); the
tracker and its CUDA kernel see only ``G⁻¹`` and ``∂G``, whichever metric made them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from . import sym3
from .backend import Cancelled

METRICS = ("inverse", "adjugate", "adaptive")
#: ``auto`` picks per way of joining seed points to targets (:func:`metric_for`).
METRIC_CHOICES = ("auto", *METRICS)
#: What ``auto`` is, per method (measured in ``tests/benchmarks/geodesic_validation.py``; the
#: README has the table): the metric and the extra power of ``det(D)`` over it.
AUTO_METRICS = {"rays": ("adaptive", 0.0), "two-point": ("inverse", 0.0), "eikonal": ("adjugate", 1.0)}
MAX_PHI = 5.0
SLAB_VOXELS = 32  # planes per slab of the curvature field
PROGRESS_EVERY = 10  # conjugate-gradient iterations between progress calls


def metric_for(params, method: str = "rays"):
    """``params`` with ``metric="auto"`` made concrete for ``method`` (``rays``, ``two-point`` or
    ``eikonal``, :data:`AUTO_METRICS`): ray tracing follows curved bundles best in the adaptive
    metric, shooting in ``D⁻¹``, and the distance map separates true from false connections
    best in ``det(D)² D⁻¹`` (the adjugate with one more power of the determinant). A metric
    named explicitly is kept as it is."""
    if params.metric != "auto":
        return params
    metric, power = AUTO_METRICS[method]
    return replace(params, metric=metric, conformal_power=min(4.0, params.conformal_power + power))


def conformal_exponent(metric: str, conformal_power: float) -> float:  # adaptive: on the inverse
    """The total power of ``det(D)`` that multiplies ``D⁻¹``."""
    if metric not in METRICS:
        raise ValueError(f"the metric must be one of {', '.join(METRICS)}, got {metric!r}")
    return (1.0 if metric == "adjugate" else 0.0) + float(conformal_power)


def metric_inverse(xp, b, fitted, exponent: float):
    """``C = G⁻¹`` for ``G = (det B / m)^exponent · B⁻¹``: ``B · (det B / m)^-exponent``, with
    ``m`` the median determinant over the ``fitted`` voxels (the tensors that were fitted, not
    the identities put in for empty or repaired ones, which keep factor 1)."""
    if exponent == 0:
        return b, 1.0
    det = sym3.determinant(b)
    chosen = det[fitted]
    reference = float(xp.median(chosen)) if int(chosen.size) else 1.0
    if not reference > 0:
        reference = 1.0
    factor = xp.where(fitted, (xp.clip(det, 1e-30, None) / reference) ** (-exponent), 1.0)
    return b * factor[..., None], reference


# ------------------------------------------------------------------ adaptive conformal factor
def _central(xp, f, axis: int, h: float):
    """``np.gradient`` along ``axis`` (central inside, one-sided on the borders)."""
    return xp.gradient(f, h, axis=axis) if f.shape[axis] > 1 else xp.zeros_like(f)


def _central_adjoint(xp, y, axis: int, h: float):
    """The adjoint of :func:`_central` (so that the normal equations are symmetric)."""
    n = y.shape[axis]
    out = xp.zeros_like(y)
    if n < 2:
        return out

    def sl(a, b=None):
        index = [slice(None)] * y.ndim
        index[axis] = slice(a, b)
        return tuple(index)

    if n > 2:  # interior rows i = 1..n-2: (y_i / 2h) into i+1, -(y_i / 2h) into i-1
        out[sl(2, n)] += y[sl(1, n - 1)] / (2 * h)
        out[sl(0, n - 2)] -= y[sl(1, n - 1)] / (2 * h)
    out[sl(0, 1)] -= y[sl(0, 1)] / h
    out[sl(1, 2)] += y[sl(0, 1)] / h
    out[sl(n - 1, n)] += y[sl(n - 1, n)] / h
    out[sl(n - 2, n - 1)] -= y[sl(n - 1, n)] / h
    return out


def _forward_normal(xp, f, axis: int, h: float):
    """``Dᵀ D f`` for the forward differences ``D`` along ``axis`` (a Neumann Laplacian, negated)."""
    if f.shape[axis] < 2:
        return xp.zeros_like(f)
    d = xp.diff(f, axis=axis) / h
    out = xp.zeros_like(f)
    index_lo = [slice(None)] * f.ndim
    index_hi = [slice(None)] * f.ndim
    index_lo[axis], index_hi[axis] = slice(0, -1), slice(1, None)
    out[tuple(index_lo)] -= d / h
    out[tuple(index_hi)] += d / h
    return out


def geodesic_curvature(xp, c, voxel_size):
    """The curvature vector ``κ = ∇_T T`` of the main-eigenvector field in the metric ``g = c⁻¹``
    (``T = e1 / |e1|_g``), per voxel, as a covector ``g κ`` with the direction ``g T`` that the
    conformal factor may leave free. The sign of ``e1`` does not matter: ``∂_T T`` is taken from
    the derivative of ``T Tᵀ`` (``(∂_T (T Tᵀ)) g T = ∂_T T`` up to a multiple of ``T``)."""
    g = sym3.inverse(xp, c)  # the cofactor inverse used for the metric itself
    _lams, e1 = sym3.principal(xp, c)
    e = xp.stack(e1, -1)
    ge = xp.stack(sym3._apply(sym3.components(g), tuple(xp.moveaxis(e, -1, 0))), -1)
    norm = xp.sqrt(xp.clip(xp.sum(e * ge, -1), 1e-30, None))
    t = e / norm[..., None]
    gt = ge / norm[..., None]
    outer = t[..., :, None] * t[..., None, :]
    dt = xp.zeros_like(t)  # (∂_T (T Tᵀ)) g T
    dg = []
    for axis in range(3):
        d_outer = _central(xp, outer, axis, float(voxel_size[axis]))
        dt += t[..., axis : axis + 1] * xp.einsum("...ij,...j->...i", d_outer, gt)
        dg.append(_central(xp, g, axis, float(voxel_size[axis])))
    # Γ(T, T) = C (w − q/2), w = (Σ_α T_α ∂_α G) T, q_σ = Tᵀ ∂_σ G T (as the tracker's acceleration)
    tt = tuple(xp.moveaxis(t, -1, 0))
    mv = [xp.stack(sym3._apply(sym3.components(dg[k]), tt), -1) for k in range(3)]
    w = t[..., 0:1] * mv[0] + t[..., 1:2] * mv[1] + t[..., 2:3] * mv[2]
    q = xp.stack([xp.sum(mv[k] * t, -1) for k in range(3)], -1)
    gamma = xp.stack(sym3._apply(sym3.components(c), tuple(xp.moveaxis(w - 0.5 * q, -1, 0))), -1)
    kappa = dt + gamma
    k_cov = xp.stack(sym3._apply(sym3.components(g), tuple(xp.moveaxis(kappa, -1, 0))), -1)
    free = gt / xp.sqrt(xp.clip(xp.sum(gt * gt, -1, keepdims=True), 1e-30, None))
    return k_cov, free


def curvature_in_slabs(xp, c, voxel_size, slab: int = SLAB_VOXELS):
    """:func:`geodesic_curvature` computed ``slab`` planes (along the first axis) at a time, each
    with one plane of halo on either side (the central differences reach one voxel): the same
    values, with the temporaries (about 60 volumes of float64) sized to a slab, not the grid."""
    n = c.shape[0]
    if n <= slab + 2:
        return geodesic_curvature(xp, c, voxel_size)
    k_cov = xp.empty((*c.shape[:3], 3), dtype=c.dtype)
    free = xp.empty_like(k_cov)
    for a in range(0, n, slab):
        b = min(n, a + slab)
        lo, hi = max(0, a - 1), min(n, b + 1)
        k_part, f_part = geodesic_curvature(xp, c[lo:hi], voxel_size)
        k_cov[a:b], free[a:b] = k_part[a - lo : b - lo], f_part[a - lo : b - lo]
    return k_cov, free


def adaptive_conformal_factor(xp, c, weight, voxel_size, smoothness: float = 0.05, iterations: int = 400,
                              tolerance: float = 1e-6, progress=None, cancelled=None):  # fmt: skip
    """The conformal factor ``e^{2φ}`` that makes the main-eigenvector curves of ``g = c⁻¹`` as
    nearly geodesics as a smooth ``φ`` can (Hao, Whitaker & Fletcher, "Adaptive Riemannian
    metrics for improved geodesic tracking of white matter", IPMI 2011).

    In ``ĝ = e^{2φ} g`` a ``g``-unit field ``T`` has ``∇̂_T T = ∇_T T + 2 (∂_T φ) T − grad_g φ``, so
    its curves are geodesics where ``dφ = g ∇_T T`` up to a multiple of ``g T``. ``φ`` is the
    least-squares solution of that, weighted by ``weight`` (FA² of the fitted voxels: where the
    direction is known), plus ``smoothness`` × ``|∇φ|²`` over the whole grid (which also carries
    ``φ`` smoothly into the voxels without weight); conjugate gradients on the normal equations,
    matrix-free, on the array module given (NumPy or CuPy). Returns ``(φ, info)``.

    ``progress(iteration, iterations)`` is called every few iterations; ``cancelled()`` is
    checked every iteration and raises :class:`gpu.backend.Cancelled` when true. The curvature
    field is made slab by slab (:func:`curvature_in_slabs`), so that a whole-brain grid needs
    only the conjugate-gradient vectors at full size (about 12 volumes of float64)."""
    k_cov, free = curvature_in_slabs(xp, c, voxel_size)
    h = [float(v) for v in voxel_size]

    def project(v):
        return v - free * xp.sum(free * v, -1, keepdims=True)

    def grad(phi):
        return xp.stack([_central(xp, phi, a, h[a]) for a in range(3)], -1)

    def grad_adjoint(v):
        return sum(_central_adjoint(xp, v[..., a], a, h[a]) for a in range(3))

    scale = float(weight.mean()) if float(weight.mean()) > 0 else 1.0
    reg = smoothness * scale
    pin = 1e-6 * scale

    def normal(phi):
        out = grad_adjoint(weight[..., None] * project(grad(phi)))
        out += reg * sum(_forward_normal(xp, phi, a, h[a]) for a in range(3))
        return out + pin * phi

    rhs = grad_adjoint(weight[..., None] * project(k_cov))
    phi = xp.zeros_like(weight)
    r = rhs - normal(phi)
    p = r.copy()
    rr = float(xp.sum(r * r))
    target = tolerance**2 * max(float(xp.sum(rhs * rhs)), 1e-300)
    done = 0
    for iteration in range(1, iterations + 1):
        if cancelled is not None and cancelled():
            raise Cancelled()
        done = iteration
        if progress is not None and iteration % PROGRESS_EVERY == 0:
            progress(iteration, iterations)
        ap = normal(p)
        alpha = rr / max(float(xp.sum(p * ap)), 1e-300)
        phi += alpha * p
        r -= alpha * ap
        rr_new = float(xp.sum(r * r))
        if rr_new <= target:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    residual = project(grad(phi)) - project(k_cov)
    fitted = weight > 0
    info = {
        "iterations": done,
        "relative_residual": math.sqrt(rr / max(float(xp.sum(rhs * rhs)), 1e-300)),
        "curvature_explained": 1.0
        - float(xp.sum((weight * xp.sum(residual**2, -1))[fitted]))
        / max(float(xp.sum((weight * xp.sum(project(k_cov) ** 2, -1))[fitted])), 1e-300),
    }
    if bool(fitted.any()):
        phi = phi - float(xp.mean(phi[fitted]))
    # Bounded so that e^{2φ} stays far inside float32 (a factor of e^{±10} at most).
    return xp.clip(phi, -MAX_PHI, MAX_PHI), info
