"""Batched symmetric 3x3 matrices (diffusion tensors) as six-component arrays.

Tensors are stored as ``(..., 6)`` arrays in the order ``xx, xy, xz, yy, yz, zz``
(FSL's upper-triangular order, the engine's one internal order). Everything here
is written once against an array module ``xp`` (NumPy or CuPy) and is
element-wise over the leading axes, so it runs unchanged on either backend.

The eigen-solver is the non-iterative method of D. Eberly, "A Robust
Eigensolver for 3x3 Symmetric Matrices" (Geometric Tools, 2014): eigenvalues in
closed form from the trigonometric solution of the characteristic cubic on the
scaled, trace-free matrix, then the eigenvector of the best separated eigenvalue
by cross products, the second by a 2x2 problem in the plane orthogonal to it,
and the third by a cross product. Unlike a textbook cross-product solver it
stays accurate for the prolate (λ2 ≈ λ3) and oblate (λ1 ≈ λ2) tensors that
fill white matter.
"""

from __future__ import annotations

import math

XX, XY, XZ, YY, YZ, ZZ = range(6)


def components(tensor):
    """Split a ``(..., 6)`` tensor array into its six component arrays."""
    return tuple(tensor[..., i] for i in range(6))


def to_matrix(xp, tensor):
    """``(..., 6)`` components -> ``(..., 3, 3)`` full symmetric matrices."""
    a, b, c, d, e, f = components(tensor)
    rows = [xp.stack([a, b, c], -1), xp.stack([b, d, e], -1), xp.stack([c, e, f], -1)]
    return xp.stack(rows, -2)


def from_matrix(xp, matrix):
    """``(..., 3, 3)`` symmetric matrices -> ``(..., 6)`` components (upper triangle)."""
    idx = [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]
    return xp.stack([matrix[..., i, j] for i, j in idx], -1)


def trace(tensor):
    return tensor[..., XX] + tensor[..., YY] + tensor[..., ZZ]


def determinant(tensor):
    a, b, c, d, e, f = components(tensor)
    return a * (d * f - e * e) - b * (b * f - c * e) + c * (b * e - c * d)


def inverse(xp, c):
    """Inverse of symmetric 3x3 tensors (6 components) by cofactors."""
    a, b, cc, d, e, f = (c[..., i] for i in range(6))
    i00 = d * f - e * e
    i01 = cc * e - b * f
    i02 = b * e - cc * d
    i11 = a * f - cc * cc
    i12 = b * cc - a * e
    i22 = a * d - b * b
    det = a * i00 + b * i01 + cc * i02
    return xp.stack([i00, i01, i02, i11, i12, i22], -1) / det[..., None]


def fractional_anisotropy_from_invariants(xp, tensor):
    """FA = sqrt(1 - I2/I4) without eigenvalues (Basser & Pierpaoli 1996's FA in invariants).

    I1 = trace, I2 = sum of the principal 2x2 minors, I4 = I1² - 2 I2 = ‖D‖²_F.
    Equal to the eigenvalue formula for any symmetric tensor; 0 where D = 0.
    """
    a, b, c, d, e, f = components(tensor)
    i1 = a + d + f
    i2 = a * d + a * f + d * f - b * b - c * c - e * e
    i4 = i1 * i1 - 2.0 * i2
    safe = xp.where(i4 > 0, i4, 1.0)
    return xp.where(i4 > 0, xp.sqrt(xp.clip(1.0 - i2 / safe, 0.0, None)), 0.0)


def _cross(u, v):
    return (
        u[1] * v[2] - u[2] * v[1],
        u[2] * v[0] - u[0] * v[2],
        u[0] * v[1] - u[1] * v[0],
    )


def _dot(u, v):
    return u[0] * v[0] + u[1] * v[1] + u[2] * v[2]


def _select(xp, cond, u, v):
    return tuple(xp.where(cond, ui, vi) for ui, vi in zip(u, v, strict=True))


def _normalise(xp, u, fallback):
    norm = xp.sqrt(_dot(u, u))
    ok = norm > 0
    safe = xp.where(ok, norm, 1.0)
    return _select(xp, ok, tuple(ui / safe for ui in u), fallback)


def _eigenvector_by_cross(xp, comps, eigval, fallback):
    """Null vector of (A - λI): the longest cross product of two of its rows."""
    a, b, c, d, e, f = comps
    r0 = (a - eigval, b, c)
    r1 = (b, d - eigval, e)
    r2 = (c, e, f - eigval)
    candidates = [_cross(r0, r1), _cross(r0, r2), _cross(r1, r2)]
    norms = [_dot(v, v) for v in candidates]
    best = candidates[0]
    best_norm = norms[0]
    for vec, nrm in zip(candidates[1:], norms[1:], strict=True):
        better = nrm > best_norm
        best = _select(xp, better, vec, best)
        best_norm = xp.where(better, nrm, best_norm)
    return _normalise(xp, best, fallback)


def _orthonormal_complement(xp, w):
    """Two unit vectors u, v with (u, v, w) orthonormal, for unit w."""
    use_x = xp.abs(w[0]) > xp.abs(w[1])
    zero = xp.zeros_like(w[0])
    # Pick the larger of (-wz, 0, wx) and (0, wz, -wy) for stability.
    inv_x = 1.0 / xp.sqrt(xp.where(use_x, w[0] * w[0] + w[2] * w[2], 1.0))
    inv_y = 1.0 / xp.sqrt(xp.where(use_x, 1.0, w[1] * w[1] + w[2] * w[2]))
    u_x = (-w[2] * inv_x, zero, w[0] * inv_x)
    u_y = (zero, w[2] * inv_y, -w[1] * inv_y)
    u = _select(xp, use_x, u_x, u_y)
    v = _cross(w, u)
    return u, v


def _apply(comps, vec):
    a, b, c, d, e, f = comps
    x, y, z = vec
    return (a * x + b * y + c * z, b * x + d * y + e * z, c * x + e * y + f * z)


def _eigenvector_in_plane(xp, comps, first, eigval):
    """Eigenvector of λ orthogonal to ``first`` (Eberly's ComputeEigenvector1)."""
    u, v = _orthonormal_complement(xp, first)
    au, av = _apply(comps, u), _apply(comps, v)
    m00 = _dot(u, au) - eigval
    m01 = _dot(u, av)
    m11 = _dot(v, av) - eigval
    abs00, abs01, abs11 = xp.abs(m00), xp.abs(m01), xp.abs(m11)
    # Null vector of the larger row of the 2x2 block [[m00, m01], [m01, m11]]:
    # row (m00, m01) -> m01*u - m00*v; row (m01, m11) -> m11*u - m01*v.
    row0 = abs00 >= abs11
    cu = xp.where(row0, m01, m11)
    cv = xp.where(row0, -m00, -m01)
    big = xp.maximum(xp.maximum(abs00, abs01), abs11)
    vec = tuple(cu * ui + cv * vi for ui, vi in zip(u, v, strict=True))
    vec = _normalise(xp, vec, u)
    # All of the 2x2 block is zero: every vector of the plane is an eigenvector.
    return _select(xp, big > 0, vec, u)


def _eigenvalues(xp, tensor):
    """Eberly's closed-form eigenvalues on the scaled, trace-free tensor.

    Returns the scaled components, the three scaled eigenvalues (descending), whether
    λ1 is the better separated end (``hi_first``), the scale, and the masks
    ``nonzero`` and ``anisotropic``.
    """
    comps = components(tensor)
    # Scale to unit max-abs entry to keep the cubic's coefficients O(1).
    scale = comps[0] * 0
    for comp in comps:
        scale = xp.maximum(scale, xp.abs(comp))
    nonzero = scale > 0
    scale_safe = xp.where(nonzero, scale, 1.0)
    a, b, c, d, e, f = (comp / scale_safe for comp in comps)
    q = (a + d + f) / 3.0
    b00, b11, b22 = a - q, d - q, f - q
    p2 = b00 * b00 + b11 * b11 + b22 * b22 + 2.0 * (b * b + c * c + e * e)
    p = xp.sqrt(p2 / 6.0)
    anisotropic = p > 0
    p_safe = xp.where(anisotropic, p, 1.0)
    c00, c11, c22 = b00 / p_safe, b11 / p_safe, b22 / p_safe
    c01, c02, c12 = b / p_safe, c / p_safe, e / p_safe
    half_det = 0.5 * (c00 * (c11 * c22 - c12 * c12) - c01 * (c01 * c22 - c02 * c12) + c02 * (c01 * c12 - c02 * c11))
    half_det = xp.clip(half_det, -1.0, 1.0)
    angle = xp.arccos(half_det) / 3.0
    beta_hi = 2.0 * xp.cos(angle)
    beta_lo = 2.0 * xp.cos(angle + 2.0 * math.pi / 3.0)
    # Rounding can push the middle root past a nearly equal neighbour: keep the order.
    beta_mid = xp.clip(-(beta_hi + beta_lo), beta_lo, beta_hi)
    lams = (q + p * beta_hi, q + p * beta_mid, q + p * beta_lo)
    return (a, b, c, d, e, f), lams, q, half_det >= 0, scale_safe, nonzero, anisotropic


def _unit_axes(xp, like):
    zeros, ones = xp.zeros_like(like), xp.ones_like(like)
    return (ones, zeros, zeros), (zeros, ones, zeros), (zeros, zeros, ones)


def eigh(xp, tensor):
    """Eigenvalues (descending) and unit eigenvectors of symmetric 3x3 tensors.

    Parameters
    ----------
    tensor : ``(..., 6)`` array, order ``xx, xy, xz, yy, yz, zz``.

    Returns
    -------
    evals : ``(..., 3)``, λ1 ≥ λ2 ≥ λ3.
    evecs : ``(..., 3, 3)``, ``evecs[..., :, j]`` is the eigenvector of ``evals[..., j]``
        (DIPY's column convention). The sign of each eigenvector is arbitrary.
    """
    scaled, (lam_hi, lam_mid, lam_lo), q, hi_first, scale_safe, nonzero, anisotropic = _eigenvalues(xp, tensor)
    ex, ey, ez = _unit_axes(xp, q)
    # Start from the eigenvalue farthest from the middle one (best conditioned).
    lam_first = xp.where(hi_first, lam_hi, lam_lo)
    v_first = _eigenvector_by_cross(xp, scaled, lam_first, ex)
    v_mid = _eigenvector_in_plane(xp, scaled, v_first, lam_mid)
    v_last = _cross(v_first, v_mid)
    v_hi = _select(xp, hi_first, v_first, v_last)
    v_lo = _select(xp, hi_first, v_last, v_first)

    # Isotropic (incl. zero) tensors: any basis works; use the image axes.
    iso = ~(anisotropic & nonzero)
    v_hi = _select(xp, iso, ex, v_hi)
    v_mid = _select(xp, iso, ey, v_mid)
    v_lo = _select(xp, iso, ez, v_lo)
    lam_hi, lam_mid, lam_lo = _unscale(xp, (lam_hi, lam_mid, lam_lo), q, iso, scale_safe, nonzero)

    evals = xp.stack([lam_hi, lam_mid, lam_lo], -1)
    columns = [xp.stack(v, -1) for v in (v_hi, v_mid, v_lo)]
    evecs = xp.stack(columns, -1)
    return evals, evecs


def _unscale(xp, lams, q, iso, scale_safe, nonzero):
    q_full = q * scale_safe
    return tuple(xp.where(nonzero, xp.where(iso, q_full, lam * scale_safe), 0.0) for lam in lams)


def principal(xp, tensor):
    """Eigenvalues (descending) and the main eigenvector only, for tracking.

    The same arithmetic as :func:`eigh` (the main eigenvector of a prolate tensor by
    cross products, of an oblate one inside the plane orthogonal to the best separated
    third eigenvector) without building the other vectors. Returns ``(l1, l2, l3)``
    and ``(x, y, z)`` as tuples of arrays; isotropic tensors get ``e1 = x``.
    """
    scaled, lams, q, hi_first, scale_safe, nonzero, anisotropic = _eigenvalues(xp, tensor)
    lam_hi, _lam_mid, lam_lo = lams
    ex = _unit_axes(xp, q)[0]
    v_first = _eigenvector_by_cross(xp, scaled, xp.where(hi_first, lam_hi, lam_lo), ex)
    v_in_plane = _eigenvector_in_plane(xp, scaled, v_first, lam_hi)
    e1 = _select(xp, hi_first, v_first, v_in_plane)
    iso = ~(anisotropic & nonzero)
    e1 = _select(xp, iso, ex, e1)
    return _unscale(xp, lams, q, iso, scale_safe, nonzero), e1


def flip_x_frame(tensor):
    """Change of frame that negates the x axis: the xy and xz components change sign.

    Used between FSL's bvec frame and voxel axes when the affine has a positive
    determinant (FSL's bvecs are given in a radiological voxel frame). Its own inverse.
    """
    out = tensor.copy()
    out[..., XY] = -out[..., XY]
    out[..., XZ] = -out[..., XZ]
    return out


def rotate(xp, tensor, rotation):
    """R D Rᵀ for a 3x3 rotation ``rotation`` applied to ``(..., 6)`` tensors."""
    mat = to_matrix(xp, tensor)
    rot = xp.asarray(rotation, dtype=mat.dtype)
    return from_matrix(xp, rot @ mat @ rot.T)
